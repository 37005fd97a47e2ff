"""``hexlayout.ops.selective_state_update`` / ``torch.ops.hexlayout.selective_state_update`` (issue 24):
one decode step for the Mamba-1 form (state ``[S, dim, N]``) and the Mamba-2 form (state
``[S, H, P, N]``), run in the emulator and compared with a float64 step written here; rows through
``state_batch_indices`` (-1 skips: the state is untouched, y is 0), a strided state (a slice of a
larger cache), f16 / bf16 / f32 states, sm_80 and sm_90a; fake tensors, torch.compile(fullgraph),
errors naming the argument."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops import selective_state_update  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from hexlayout.runtime.args import ArgumentError  # noqa: E402

F = torch.float64


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def reference(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, softplus=False, idx=None):
    """``(new_state, y)`` in float64, one batch row at a time, in the general form
    (Mamba-1 rows are heads of one group each: ``[S, G, dim / G, N]``)."""
    st = state.to(F).clone()
    m1 = state.dim() == 3
    g = B.shape[1] if B.dim() == 3 else 1
    s4 = st.unflatten(1, (g, -1)) if m1 else st  # [S, H, P, N]
    h, p, n = s4.shape[1:]
    rows = lambda t: t.to(F).reshape(x.shape[0], h, -1).expand(-1, -1, p)  # noqa: E731
    per_hp = lambda t: t.to(F).reshape(h, -1).expand(h, p)  # noqa: E731
    a = A.to(F).reshape(h, -1, 1 if A.dim() == 1 else n).expand(h, p, n)
    d = rows(dt) + (0 if dt_bias is None else per_hp(dt_bias))
    if softplus:
        d = torch.nn.functional.softplus(d)
    bg = B.to(F).reshape(x.shape[0], g, n).repeat_interleave(h // g, 1)  # [batch, H, N]
    cg = C.to(F).reshape(x.shape[0], g, n).repeat_interleave(h // g, 1)
    xs = rows(x)
    ys = torch.zeros(x.shape[0], h, p, dtype=F)
    for b in range(x.shape[0]):
        s = b if idx is None else int(idx[b])
        if s < 0:
            continue
        s4[s] = torch.exp(d[b, ..., None] * a) * s4[s] + (d[b] * xs[b])[..., None] * bg[b, :, None]
        y = (s4[s] * cg[b, :, None]).sum(-1)
        if D is not None:
            y = y + per_hp(D) * xs[b]
        if z is not None:
            y = y * torch.nn.functional.silu(rows(z)[b])
        ys[b] = y
    return st, ys.reshape(x.shape)


def _mamba1(batch, slots, dim, n, g, dtype, sdtype, seed):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    bshape = (batch, g, n) if g else (batch, n)
    return dict(
        state=r(slots, dim, n).to(sdtype),
        x=r(batch, dim).to(dtype),
        dt=(torch.rand(batch, dim, generator=gen) - 0.5).to(dtype),
        A=-torch.rand(dim, n, generator=gen),
        B=r(*bshape).to(dtype),
        C=r(*bshape).to(dtype),
        D=r(dim),
        z=r(batch, dim).to(dtype),
        dt_bias=r(dim) * 0.1,
    )


def _mamba2(batch, slots, h, p, n, g, dtype, sdtype, seed, per_head=True):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    dts = (batch, h) if per_head else (batch, h, p)
    return dict(
        state=r(slots, h, p, n).to(sdtype),
        x=r(batch, h, p).to(dtype),
        dt=(torch.rand(*dts, generator=gen) - 0.5).to(dtype),
        A=-torch.rand(h, generator=gen) if per_head else -torch.rand(h, 1, 1, generator=gen).expand(h, p, n),
        B=r(batch, g, n).to(dtype),
        C=r(batch, g, n).to(dtype),
        D=r(h) if per_head else r(h, p),
        z=r(batch, h, p).to(dtype),
        dt_bias=r(h) * 0.1 if per_head else r(h, p) * 0.1,
    )


TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}


def _check(args, idx, softplus, dtype, sdtype, drop=()):
    for k in drop:
        args[k] = None
    want_state, want_y = reference(**args, softplus=softplus, idx=idx)
    state = args["state"]
    before = state.clone()
    y = selective_state_update(**args, dt_softplus=softplus, state_batch_indices=idx)
    assert y.shape == args["x"].shape and y.dtype == dtype
    tol = max(TOL[dtype], TOL[sdtype])
    assert (y.to(F) - want_y).abs().max().item() <= tol * max(1.0, want_y.abs().max().item())
    assert (state.to(F) - want_state).abs().max().item() <= tol * max(1.0, want_state.abs().max().item())
    if idx is not None:
        for b in (idx < 0).nonzero().flatten().tolist():
            assert not y[b].any()
        untouched = [s for s in range(state.shape[0]) if s not in idx.tolist()]
        assert torch.equal(state[untouched], before[untouched])


@pytest.mark.parametrize(
    ("arch", "dim", "n", "g", "dtype", "sdtype", "softplus", "drop"),
    [
        ("sm_80", 12, 5, 0, torch.float16, torch.float32, True, ()),  # B [batch, N]
        ("sm_90a", 16, 16, 2, torch.bfloat16, torch.bfloat16, False, ("D", "z", "dt_bias")),
        ("sm_80", 8, 4, 4, torch.float32, torch.float32, True, ("z",)),
    ],
)
def test_mamba1_form(monkeypatch, arch, dim, n, g, dtype, sdtype, softplus, drop) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    args = _mamba1(3, 5, dim, n, g, dtype, sdtype, seed=dim + n)
    _check(args, torch.tensor([4, -1, 1], dtype=torch.int32), softplus, dtype, sdtype, drop)


@pytest.mark.parametrize(
    ("arch", "h", "p", "n", "g", "dtype", "sdtype", "per_head", "idx"),
    [
        ("sm_90a", 4, 8, 16, 2, torch.bfloat16, torch.float32, True, [2, -1, 0]),
        ("sm_80", 2, 6, 12, 1, torch.float16, torch.float16, False, [1, 3, -1]),  # vLLM's [H, P, N] A
        ("sm_80", 3, 4, 8, 3, torch.float32, torch.float32, True, None),  # rows in order
    ],
)
def test_mamba2_form(monkeypatch, arch, h, p, n, g, dtype, sdtype, per_head, idx) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    args = _mamba2(3, 3 if idx is None else 4, h, p, n, g, dtype, sdtype, seed=h * p + n, per_head=per_head)
    ids = None if idx is None else torch.tensor(idx, dtype=torch.int64)
    _check(args, ids, True, dtype, sdtype)


def test_strided_state_and_torch_compile() -> None:
    """The state is a slice of a larger cache tensor (vLLM's layout): updated in place there;
    the op traces under torch.compile(fullgraph)."""
    args = _mamba2(2, 3, 2, 4, 8, 1, torch.float32, torch.float32, seed=9)
    big = torch.randn(3, 2, 4, 8 + 8)
    args["state"] = big[..., 8:]
    idx = torch.tensor([0, 2], dtype=torch.int32)
    want_state, want_y = reference(**args, softplus=True, idx=idx)
    keep = big[..., :8].clone()

    def step(state, x, dt, idx):
        return selective_state_update(
            state,
            x,
            dt,
            args["A"],
            args["B"],
            args["C"],
            args["D"],
            args["z"],
            args["dt_bias"],
            dt_softplus=True,
            state_batch_indices=idx,
        )

    y = torch.compile(step, fullgraph=True, backend="aot_eager")(args["state"], args["x"], args["dt"], idx)
    assert torch.allclose(y.to(F), want_y, atol=1e-4)
    assert torch.allclose(big[..., 8:].to(F), want_state, atol=1e-4) and torch.equal(big[..., :8], keep)


def test_fake_tensors() -> None:
    with FakeTensorMode():
        args = _mamba2(4, 6, 8, 64, 16, 2, torch.bfloat16, torch.bfloat16, seed=1)
        y = torch.ops.hexlayout.selective_state_update(
            **args, dt_softplus=True, state_batch_indices=torch.zeros(4, dtype=torch.int32)
        )
        assert y.shape == (4, 8, 64) and y.dtype == torch.bfloat16
        args["A"] = torch.empty(8, 64)
        with pytest.raises(ArgumentError) as e:
            torch.ops.hexlayout.selective_state_update(**args)
        assert e.value.arg == "A"


@pytest.mark.parametrize(
    ("over", "arg", "match"),
    [
        ({"state": torch.zeros(5, 8, 4, dtype=torch.int8)}, "state", "supported"),
        ({"x": torch.zeros(3, 7, dtype=torch.float16)}, "x", r"\[batch, dim\]"),
        ({"dt": torch.zeros(3, 8)}, "dt", "dtype"),
        ({"A": torch.zeros(8, 5)}, "A", r"\[dim, N\]"),
        (
            {"B": torch.zeros(3, 3, 4, dtype=torch.float16), "C": torch.zeros(3, 3, 4, dtype=torch.float16)},
            "B",
            "groups",
        ),
        ({"C": torch.zeros(3, 5, dtype=torch.float16)}, "C", "N"),
        ({"D": torch.zeros(8, dtype=torch.float16)}, "D", "float32"),
        ({"dt_bias": torch.zeros(9)}, "dt_bias", r"\[dim\]"),
        ({"state_batch_indices": torch.tensor([0, 1, 5])}, "state_batch_indices", "outside"),
        ({"state_batch_indices": torch.tensor([0.0, 1.0, 2.0])}, "state_batch_indices", "int32"),
        ({"state_batch_indices": torch.tensor([0, 1])}, "state_batch_indices", r"\[batch\]"),
        ({"state": torch.zeros(4, 8, 4)}, "state", "state_batch_indices"),
    ],
)
def test_bad_arguments_name_the_argument(over: dict[str, object], arg: str, match: str) -> None:
    args = _mamba1(3, 5, 8, 4, 0, torch.float16, torch.float32, seed=0)
    args["state_batch_indices"] = torch.tensor([0, 1, 2], dtype=torch.int32)
    if arg == "state" and "state_batch_indices" in match:
        args["state_batch_indices"] = None
    args.update(over)
    with pytest.raises(ArgumentError, match=match) as e:
        selective_state_update(**args)
    assert e.value.arg == arg
