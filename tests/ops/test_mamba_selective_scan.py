"""``hexlayout.ops.selective_scan`` / ``torch.ops.hexlayout.selective_scan`` (issue 24): the Mamba-1
selective scan run in the emulator on small shapes and compared with a float64 sequential
recurrence written here (not the kernel's chunked walk): ragged L (not a multiple of the chunk),
several dim / N / G, f16 / bf16 / f32, with and without D, z, delta_bias, softplus and the last
state, on sm_80 and sm_90a; fake tensors, torch.compile(fullgraph) and errors naming the argument."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops import selective_scan  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError  # noqa: E402


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, softplus=False):
    """``(out, last_state)`` in float64, one step at a time: h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t u_t,
    y_t = C_t · h_t + D u_t, out = y · silu(z)."""
    f = torch.float64
    batch, dim, length = u.shape
    g = B.shape[1] if B.dim() == 4 else 1
    Bx = (B if B.dim() == 4 else B[:, None]).to(f).repeat_interleave(dim // g, 1)  # [batch, dim, N, L]
    Cx = (C if C.dim() == 4 else C[:, None]).to(f).repeat_interleave(dim // g, 1)
    dt = delta.to(f) + (0 if delta_bias is None else delta_bias.to(f)[:, None])
    if softplus:
        dt = torch.nn.functional.softplus(dt)
    h = torch.zeros(batch, dim, A.shape[1], dtype=f)
    ys = []
    for t in range(length):
        h = (
            torch.exp(dt[:, :, t, None] * A.to(f)) * h
            + (dt[:, :, t] * u[:, :, t].to(f))[..., None] * Bx[..., t]
        )
        ys.append((h * Cx[..., t]).sum(-1))
    y = torch.stack(ys, -1)
    if D is not None:
        y = y + D.to(f)[:, None] * u.to(f)
    if z is not None:
        y = y * torch.nn.functional.silu(z.to(f))
    return y, h


def _inputs(batch, dim, n, length, g, dtype, seed, with_d=True, with_z=True, with_bias=True):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    u = r(batch, dim, length).to(dtype)
    delta = (torch.rand(batch, dim, length, generator=gen) * 0.6 - 0.2).to(dtype)
    A = -torch.rand(dim, n, generator=gen) - 0.1
    bshape = (batch, g, n, length) if g else (batch, n, length)
    B, C = r(*bshape).to(dtype), r(*bshape).to(dtype)
    D = r(dim) if with_d else None
    z = r(batch, dim, length).to(dtype) if with_z else None
    bias = r(dim) * 0.2 if with_bias else None
    return u, delta, A, B, C, D, z, bias


TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}


@pytest.mark.parametrize(
    ("arch", "batch", "dim", "n", "length", "g", "dtype", "opts", "softplus", "last"),
    [
        ("sm_80", 2, 12, 5, 37, 3, torch.float32, "dzb", True, True),  # grouped, ragged N, L, dim
        ("sm_90a", 1, 16, 16, 20, 0, torch.float16, "", False, True),  # [batch, N, L], nothing optional
        ("sm_80", 1, 8, 4, 40, 0, torch.bfloat16, "z", True, False),  # 16-byte rows: the vector build
        ("sm_90a", 2, 80, 8, 9, 2, torch.float16, "db", False, True),  # L < a chunk; 40 channels: 32 + 8
    ],
)
def test_matches_float64_recurrence(monkeypatch, arch, batch, dim, n, length, g, dtype, opts, softplus, last):
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    u, delta, A, B, C, D, z, bias = _inputs(
        batch,
        dim,
        n,
        length,
        g,
        dtype,
        seed=dim + length,
        with_d="d" in opts,
        with_z="z" in opts,
        with_bias="b" in opts,
    )
    got = selective_scan(u, delta, A, B, C, D, z, bias, delta_softplus=softplus, return_last_state=last)
    want, want_h = reference(u, delta, A, B, C, D, z, bias, softplus)
    out = got[0] if last else got
    assert out.dtype == dtype and out.shape == (batch, dim, length)
    scale = want.abs().max().item()
    assert (out.double() - want).abs().max().item() <= TOL[dtype] * max(1.0, scale)
    if last:
        assert got[1].dtype == torch.float32 and got[1].shape == (batch, dim, n)
        assert (got[1].double() - want_h).abs().max().item() <= TOL[torch.float32] * max(
            1.0, want_h.abs().max()
        )


def test_torch_op_and_strided_inputs() -> None:
    """The torch op returns ``(out, last_state)``; non-contiguous inputs are read as they are."""
    u, delta, A, B, C, D, z, bias = _inputs(1, 8, 6, 19, 0, torch.float32, seed=5)
    ut = u.transpose(1, 2).contiguous().transpose(1, 2)  # strided view of the same values
    out, last = torch.ops.hexlayout.selective_scan(ut, delta, A, B, C, D, z, bias, True, True)
    want, want_h = reference(u, delta, A, B, C, D, z, bias, True)
    assert torch.allclose(out.double(), want, atol=1e-4) and torch.allclose(last.double(), want_h, atol=1e-4)


def test_fake_tensors_and_torch_compile() -> None:
    with FakeTensorMode():
        u = torch.empty(2, 16, 40, dtype=torch.bfloat16)
        A = torch.empty(16, 8)
        B = torch.empty(2, 2, 8, 40, dtype=torch.bfloat16)
        out, last = torch.ops.hexlayout.selective_scan(u, u, A, B, B, None, u, None, True, True)
        assert out.shape == (2, 16, 40) and out.dtype == torch.bfloat16 and last.shape == (2, 16, 8)
        with pytest.raises(ArgumentError) as e:
            torch.ops.hexlayout.selective_scan(u, u, A.half(), B, B)
        assert e.value.arg == "A"
    u, delta, A, B, C, D, z, bias = _inputs(1, 8, 6, 11, 0, torch.float32, seed=2)

    def f(u, delta, A, B, C, D, z, bias):
        return selective_scan(u, delta, A, B, C, D, z, bias, delta_softplus=True, return_last_state=True)

    out, last = torch.compile(f, fullgraph=True, backend="aot_eager")(u, delta, A, B, C, D, z, bias)
    want, want_h = reference(u, delta, A, B, C, D, z, bias, True)
    assert torch.allclose(out.double(), want, atol=1e-4) and torch.allclose(last.double(), want_h, atol=1e-4)


def test_empty_sequence() -> None:
    u, delta, A, B, C, *_ = _inputs(2, 8, 4, 0, 0, torch.float16, seed=1)
    out, last = selective_scan(u, delta, A, B, C, return_last_state=True)
    assert out.shape == (2, 8, 0) and not last.any()


def _args(**over: object) -> dict[str, object]:
    u, delta, A, B, C, D, z, bias = _inputs(1, 8, 4, 6, 2, torch.float16, seed=0)
    a: dict[str, object] = {
        "u": u,
        "delta": delta,
        "A": A,
        "B": B,
        "C": C,
        "D": D,
        "z": z,
        "delta_bias": bias,
    }
    a.update(over)
    return a


@pytest.mark.parametrize(
    ("over", "arg", "match"),
    [
        ({"u": torch.zeros(1, 8, 6, dtype=torch.int32)}, "u", "supported"),
        ({"delta": torch.zeros(1, 8, 6)}, "delta", "float16"),
        ({"delta": torch.zeros(1, 8, 7, dtype=torch.float16)}, "delta", r"\[batch, dim, L\]"),
        ({"A": torch.zeros(8, 4, dtype=torch.float16)}, "A", "float32"),
        ({"A": torch.zeros(6, 4)}, "A", "dim = 8"),
        ({"B": torch.zeros(1, 3, 4, 6, dtype=torch.float16)}, "B", "groups"),
        ({"C": torch.zeros(1, 2, 5, 6, dtype=torch.float16)}, "C", r"\[batch, G, N, L\]"),
        ({"B": torch.zeros(1, 4, dtype=torch.float16)}, "B", "dimensions"),
        ({"D": torch.zeros(7)}, "D", r"\[dim\]"),
        ({"z": torch.zeros(1, 8, 6, dtype=torch.bfloat16)}, "z", "dtype"),
        ({"delta_bias": torch.zeros(8, dtype=torch.float16)}, "delta_bias", "float32"),
    ],
)
def test_bad_arguments_name_the_argument(over: dict[str, object], arg: str, match: str) -> None:
    with pytest.raises(ArgumentError, match=match) as e:
        selective_scan(**_args(**over))
    assert e.value.arg == arg
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(ArgumentError) as e2:
        torch.ops.hexlayout.selective_scan(**_args(**over))
    assert e2.value.arg == arg


def test_not_a_tensor() -> None:
    with pytest.raises(ArgumentTypeError) as e:
        selective_scan(**_args(C=[1.0]))
    assert e.value.arg == "C"


def reference_packed(u, delta, A, B, C, D, z, bias, cu, h0):
    """Packed sequences ``cu[s]:cu[s+1]`` of ``u`` [dim, T] (B, C [G, N, T]), each from its own
    initial state ``h0[s]`` (zeros when None), in float64, one step at a time."""
    f = torch.float64
    dim, total = u.shape
    g = B.shape[0]
    Bx, Cx = B.to(f).repeat_interleave(dim // g, 0), C.to(f).repeat_interleave(dim // g, 0)  # [dim, N, T]
    dt = torch.nn.functional.softplus(delta.to(f) + (0 if bias is None else bias.to(f)[:, None]))
    y = torch.zeros(dim, total, dtype=f)
    last = []
    for s in range(cu.numel() - 1):
        h = torch.zeros(dim, A.shape[1], dtype=f) if h0 is None else h0[s].to(f)
        for t in range(int(cu[s]), int(cu[s + 1])):
            h = torch.exp(dt[:, t, None] * A.to(f)) * h + (dt[:, t] * u[:, t].to(f))[:, None] * Bx[..., t]
            y[:, t] = (h * Cx[..., t]).sum(-1)
        last.append(h)
    if D is not None:
        y = y + D.to(f)[:, None] * u.to(f)
    if z is not None:
        y = y * torch.nn.functional.silu(z.to(f))
    return y, torch.stack(last)


@pytest.mark.parametrize(
    ("arch", "dtype", "opts", "lengths"),
    [
        ("sm_80", torch.float32, "dzbi", [17, 0, 1, 22]),  # empty and length-1 sequences, initial states
        ("sm_90a", torch.float16, "", [5, 16, 3]),  # nothing optional, zero initial states
    ],
)
def test_packed_sequences_with_initial_states(monkeypatch, arch, dtype, opts, lengths) -> None:
    """``cu_seqlens`` / ``initial_states`` (vLLM's chunked prefill): u [dim, T] packed, each sequence
    continuing its own state; the last states per sequence."""
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    total = sum(lengths)
    u, delta, A, B, C, D, z, bias = _inputs(1, 12, 5, total, 3, dtype, seed=total, with_d="d" in opts,
                                            with_z="z" in opts, with_bias="b" in opts)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    h0 = torch.randn(len(lengths), 12, 5, generator=torch.Generator().manual_seed(1)) if "i" in opts else None
    z2 = None if z is None else z[0]
    out, last = selective_scan(u[0], delta[0], A, B[0], C[0], D, z2, bias, delta_softplus=True,
                               initial_states=h0, cu_seqlens=cu, return_last_state=True)
    want, want_h = reference_packed(u[0], delta[0], A, B[0], C[0], D, z2, bias, cu, h0)
    assert out.shape == (12, total) and out.dtype == dtype and last.shape == (len(lengths), 12, 5)
    assert (out.double() - want).abs().max().item() <= TOL[dtype] * max(1.0, want.abs().max().item())
    assert (last.double() - want_h).abs().max().item() <= 1e-4 * max(1.0, want_h.abs().max().item())


def test_packed_fake_shapes_and_state_errors() -> None:
    """The fake implementation gives ``[S, dim, N]`` states; bad ``initial_states`` / ``cu_seqlens``
    are named."""
    with FakeTensorMode():
        u, A = torch.empty(1, 16, 40, dtype=torch.bfloat16), torch.empty(16, 8)
        B, cu = torch.empty(1, 8, 40, dtype=torch.bfloat16), torch.empty(4, dtype=torch.int32)
        out, last = torch.ops.hexlayout.selective_scan(u, u, A, B, B, None, None, None, True, True, None, cu)
        assert out.shape == (1, 16, 40) and last.shape == (3, 16, 8)
    a = _args()
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    for over, arg in (({"initial_states": torch.zeros(3, 8, 4)}, "initial_states"),
                      ({"initial_states": torch.zeros(2, 8, 4, dtype=torch.float16)}, "initial_states"),
                      ({"cu_seqlens": cu.long()}, "cu_seqlens"),
                      ({"cu_seqlens": torch.tensor([0, 7], dtype=torch.int32)}, "cu_seqlens")):
        with pytest.raises(ArgumentError) as e:
            selective_scan(**{**a, "cu_seqlens": cu, **over})
        assert e.value.arg == arg
