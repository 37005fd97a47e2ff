"""``hexlayout.ops.causal_conv1d`` / ``causal_conv1d_update`` (and ``torch.ops.hexlayout.*``) in
the emulator against a float64 convolution written here: batched and packed (``cu_seqlens``
with empty and length-1 sequences), widths 2-4, bias, SiLU, initial and final states, f16 /
bf16, sm_80 and sm_90a; the decode update with state indices (-1 skips), states longer than
``width-1`` and vLLM's channel-last layouts; fake tensors, torch.compile, bad arguments, and
NVRTC builds without spills."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops import causal_conv1d, causal_conv1d_update  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from hexlayout.runtime.args import ArgumentError  # noqa: E402


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def _ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, init: torch.Tensor | None,
         silu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence x [dim, n]: out[d, t] = act(b[d] + sum_k w[d, k] xs[d, t-(W-1)+k]) in float64,
    a loop over positions and taps; the final state is the last W-1 inputs of [init, x]."""
    dim, n = x.shape
    width = w.shape[1]
    xs = torch.cat([init.double() if init is not None else torch.zeros(dim, width - 1, dtype=torch.float64),
                    x.double()], 1)
    out = torch.zeros(dim, n, dtype=torch.float64)
    for t in range(n):
        acc = b.double().clone() if b is not None else torch.zeros(dim, dtype=torch.float64)
        for k in range(width):
            acc += w[:, k].double() * xs[:, t + k]
        out[:, t] = acc * torch.sigmoid(acc) if silu else acc
    return out, xs[:, xs.shape[1] - (width - 1):]


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    assert torch.allclose(got.double(), want, atol=tol, rtol=tol), (got.double() - want).abs().max()


@pytest.mark.parametrize(
    ("dtype", "width", "bias", "silu", "init", "arch"),
    [(torch.float16, 4, True, True, True, "sm_80"), (torch.bfloat16, 3, False, False, True, "sm_90a"),
     (torch.float16, 2, True, False, False, "sm_80")],
)
def test_batched_matches_reference(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, width: int,
                                   bias: bool, silu: bool, init: bool, arch: str) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    g = torch.Generator().manual_seed(width)
    batch, dim, n = 2, 40, 7                 # dim 40: a ragged 128-channel block
    x = torch.randn(batch, dim, n, generator=g).to(dtype)
    w = torch.randn(dim, width, generator=g).to(dtype)
    b = torch.randn(dim, generator=g).to(dtype) if bias else None
    st = torch.randn(batch, dim, width - 1, generator=g).to(dtype) if init else None
    out, final = causal_conv1d(x, w, b, activation="silu" if silu else None, initial_states=st,
                               return_final_states=True)
    assert out.shape == x.shape and out.dtype == dtype and final.shape == (batch, dim, width - 1)
    for i in range(batch):
        want, want_final = _ref(x[i], w, b, None if st is None else st[i], silu)
        _close(out[i], want, dtype)
        assert torch.equal(final[i].double(), want_final)


@pytest.mark.parametrize("channel_last", [True, False])
def test_packed_sequences_with_empty_and_length_one(channel_last: bool) -> None:
    """cu_seqlens [0, 5, 5, 6, 11]: lengths 5, 0, 1, 5 (shorter than the window for one); no
    input crosses a boundary; the empty sequence's final state is its initial state."""
    g = torch.Generator().manual_seed(7)
    dim, width, dtype = 24, 4, torch.bfloat16
    cu = torch.tensor([0, 5, 5, 6, 11], dtype=torch.int32)
    t = int(cu[-1])
    x = (torch.randn(t, dim, generator=g).to(dtype).t() if channel_last    # vLLM: [T, dim] transposed
         else torch.randn(dim, t, generator=g).to(dtype))
    w = torch.randn(dim, width, generator=g).to(dtype)
    b = torch.randn(dim, generator=g).to(dtype)
    st = torch.randn(4, dim, width - 1, generator=g).to(dtype)
    out, final = torch.ops.hexlayout.causal_conv1d(x, w, b, "silu", st, cu)
    for s in range(4):
        lo, hi = int(cu[s]), int(cu[s + 1])
        want, want_final = _ref(x[:, lo:hi], w, b, st[s], True)
        _close(out[:, lo:hi], want, dtype)
        assert torch.equal(final[s].double(), want_final)


@pytest.mark.parametrize(("x_rank", "state_len", "indexed"), [(2, 3, True), (3, 5, False)])
def test_update_matches_reference(x_rank: int, state_len: int, indexed: bool) -> None:
    """The state continues across calls: out equals the prefill convolution of [state, x] at x's
    positions; the state becomes the last SL columns; a -1 row is skipped (state kept, out 0)."""
    g = torch.Generator().manual_seed(x_rank)
    batch, dim, width, dtype, n = 3, 40, 4, torch.float16, 2
    x = torch.randn(batch, dim, *((n,) if x_rank == 3 else ()), generator=g).to(dtype)
    x3 = x if x_rank == 3 else x.unsqueeze(-1)
    # vLLM's layout: the state stored [rows, SL, dim] (here inside a larger per-row buffer),
    # passed as its [rows, dim, SL] transpose
    buf = torch.randn(5, state_len + 2, dim, generator=g).to(dtype)
    state = buf[:, 1:state_len + 1].transpose(1, 2)
    before = state.clone()
    w = torch.randn(dim, width, generator=g).to(dtype)
    b = torch.randn(dim, generator=g).to(dtype)
    idx = torch.tensor([4, -1, 1], dtype=torch.int32) if indexed else None
    out = causal_conv1d_update(x, state, w, b, activation="silu", conv_state_indices=idx)
    assert out.shape == x.shape
    rows = idx.tolist() if indexed else list(range(batch))
    for i, r in enumerate(rows):
        if r < 0:
            assert not out[i].any()
            continue
        full = torch.cat([before[r], x3[i]], 1)
        want, _ = _ref(x3[i], w, b, before[r][:, state_len - (width - 1):], True)
        _close(out[i] if x_rank == 3 else out[i].unsqueeze(-1), want, dtype)
        assert torch.equal(state[r], full[:, full.shape[1] - state_len:])
    untouched = [r for r in range(5) if r not in rows]
    assert torch.equal(state[untouched], before[untouched])


def test_fake_tensors_and_compile() -> None:
    with FakeTensorMode():
        x = torch.empty(2, 64, 9, dtype=torch.float16)
        out, final = torch.ops.hexlayout.causal_conv1d(x, torch.empty(64, 4, dtype=torch.float16))
        assert out.shape == (2, 64, 9) and final.shape == (2, 64, 3)
        y = torch.ops.hexlayout.causal_conv1d_update(x[:, :, 0], torch.empty(4, 64, 3, dtype=torch.float16),
                                                     torch.empty(64, 4, dtype=torch.float16))
        assert y.shape == (2, 64)
        with pytest.raises(ArgumentError, match="weight"):
            torch.ops.hexlayout.causal_conv1d(x, torch.empty(64, 5, dtype=torch.float16))

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.ops.hexlayout.causal_conv1d(x, w, None, "silu")[0] * 2

    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, 5, generator=g).half()
    w = torch.randn(16, 3, generator=g).half()
    got = torch.compile(f, backend="eager", fullgraph=True)(x, w)
    _close(got[0] / 2, _ref(x[0], w, None, None, True)[0], torch.float16)


def _args(**over: object) -> dict[str, object]:
    a: dict[str, object] = {"x": torch.zeros(2, 8, 5, dtype=torch.float16),
                            "weight": torch.zeros(8, 4, dtype=torch.float16)}
    a.update(over)
    return a


@pytest.mark.parametrize(
    ("over", "arg", "match"),
    [({"x": torch.zeros(2, 8, 5)}, "x", "float32"),
     ({"weight": torch.zeros(8, 5, dtype=torch.float16)}, "weight", "width 2-4"),
     ({"bias": torch.zeros(7, dtype=torch.float16)}, "bias", r"\[8\]"),
     ({"activation": "relu"}, "activation", "silu"),
     ({"initial_states": torch.zeros(2, 8, 2, dtype=torch.float16)}, "initial_states", "width-1"),
     ({"x": torch.zeros(8, 6, dtype=torch.float16), "cu_seqlens": torch.tensor([0, 4, 7], dtype=torch.int32)},
      "cu_seqlens", "at most 6"),
     ({"x": torch.zeros(8, 6, dtype=torch.float16), "cu_seqlens": torch.tensor([0, 4])},
      "cu_seqlens", "int32")],
)
def test_bad_arguments_name_the_argument(over: dict[str, object], arg: str, match: str) -> None:
    with pytest.raises(ArgumentError, match=match) as err:
        causal_conv1d(**_args(**over))  # type: ignore[arg-type]
    assert arg in str(err.value) and "causal_conv1d" in str(err.value)


def test_update_bad_arguments() -> None:
    x, w = torch.zeros(2, 8, dtype=torch.float16), torch.zeros(8, 4, dtype=torch.float16)
    with pytest.raises(ArgumentError, match="conv_state.*SL >= width-1"):
        causal_conv1d_update(x, torch.zeros(3, 8, 2, dtype=torch.float16), w)
    with pytest.raises(ArgumentError, match="conv_state_indices.*holds 3"):
        causal_conv1d_update(x, torch.zeros(3, 8, 3, dtype=torch.float16), w,
                             conv_state_indices=torch.tensor([0, 3], dtype=torch.int32))


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compiles_without_spills(arch: str) -> None:
    from hexlayout.ops.mamba.conv1d_kernels import causal_conv1d_kernel, causal_conv1d_update_kernel

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    for kern, consts in ((causal_conv1d_kernel(hl.bf16), {"WIDTH": 4, "SILU": True, "VARLEN": True,
                                                          "FINAL": True}),
                         (causal_conv1d_update_kernel(hl.f16), {"WIDTH": 4, "SILU": True, "INDEXED": True})):
        res = build(kern, arch, **consts).compiled.resources
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
