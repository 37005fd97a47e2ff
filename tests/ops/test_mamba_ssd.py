"""``hexlayout.ops.ssd_scan`` / ``torch.ops.hexlayout.ssd_scan`` in the emulator against the
float64 sequential recurrence written here (not the chunked algorithm): several H / G / P / N
(P and N off the tile sizes), f16 / bf16, D [H] and [H, P], z, dt_bias, softplus, dt_limit,
initial and final states, cu_seqlens with empty and length-1 sequences, chunk sizes that do
not divide the lengths, sm_80 and sm_90a; fake tensors, torch.compile, bad arguments, and NVRTC
builds without spills."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops import ssd_scan  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError  # noqa: E402


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def _ref(x, dt, A, B, C, D=None, z=None, dt_bias=None, softplus=False, limit=(0.0, math.inf), init=None):
    """One sequence (x [L, H, P], dt [L, H], B / C [L, G, N]) in float64, step by step:
    h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t B_tᵀ, y_t = h_t C_t + D x_t (· silu(z_t))."""
    length, heads, p = x.shape
    groups, n = B.shape[1:]
    st = init.double().clone() if init is not None else torch.zeros(heads, p, n, dtype=torch.float64)
    y = torch.zeros(length, heads, p, dtype=torch.float64)
    for t in range(length):
        for h in range(heads):
            g = h // (heads // groups)
            d = dt[t, h].double() + (dt_bias[h].double() if dt_bias is not None else 0.0)
            d = torch.nn.functional.softplus(d) if softplus else d
            if limit != (0.0, math.inf):
                d = d.clamp(limit[0], limit[1])
            inp = d * x[t, h].double()[:, None] * B[t, g].double()[None]
            st[h] = torch.exp(d * A[h].double()) * st[h] + inp
            y[t, h] = st[h] @ C[t, g].double()
            if D is not None:
                y[t, h] += (D[h].double() if D.dim() == 2 else D[h].double()) * x[t, h].double()
            if z is not None:
                y[t, h] *= torch.nn.functional.silu(z[t, h].double())
    return y, st


def _inputs(batch, length, heads, groups, p, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, heads, p, generator=g).to(dtype)
    dt = torch.rand(batch, length, heads, generator=g) * 0.8 - 0.2
    A = -torch.rand(heads, generator=g) - 0.1
    B = torch.randn(batch, length, groups, n, generator=g).to(dtype)
    C = torch.randn(batch, length, groups, n, generator=g).to(dtype)
    return g, x, dt, A, B, C


def _close(got, want, dtype):
    tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
    if want.numel() == 0:
        assert got.numel() == 0
        return
    scale = max(1.0, float(want.abs().max()))
    assert (got.double() - want).abs().max() <= tol * scale, (got.double() - want).abs().max()


@pytest.mark.parametrize(
    ("dtype", "heads", "groups", "p", "n", "d_kind", "arch"),
    [(torch.float16, 4, 2, 8, 16, "H", "sm_80"), (torch.bfloat16, 2, 1, 12, 8, "HP", "sm_90a"),
     (torch.float16, 3, 3, 4, 32, None, "sm_80")],
)
def test_batched_matches_recurrence(monkeypatch, dtype, heads, groups, p, n, d_kind, arch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    g, x, dt, A, B, C = _inputs(2, 5, heads, groups, p, n, dtype, heads + p)
    D = {"H": torch.randn(heads, generator=g), "HP": torch.randn(heads, p, generator=g), None: None}[d_kind]
    z = torch.randn(x.shape, generator=g).to(dtype) if d_kind == "H" else None
    bias = torch.randn(heads, generator=g) if d_kind != "HP" else None
    limit = (0.05, 0.6) if d_kind == "HP" else (0.0, math.inf)
    init = torch.randn(2, heads, p, n, generator=g) if d_kind is not None else None
    y, final = ssd_scan(x, dt, A, B, C, chunk_size=3, D=D, z=z, dt_bias=bias, dt_softplus=d_kind == "H",
                        dt_limit=limit, initial_states=init, return_final_states=True)
    assert y.dtype == dtype and y.shape == x.shape and final.dtype == torch.float32
    for i in range(2):
        want, want_st = _ref(x[i], dt[i], A, B[i], C[i], D, None if z is None else z[i], bias, d_kind == "H",
                             limit, None if init is None else init[i])
        _close(y[i], want, dtype)
        assert torch.allclose(final[i].double(), want_st, atol=1e-4, rtol=1e-4)


def test_packed_sequences_and_chunk_size() -> None:
    """cu_seqlens [0, 19, 19, 20, 24]: lengths 19 (past the kernel's 16-position B / C chunk), 0, 1,
    4; each sequence starts from its own initial state (the empty one's final state is its
    initial state); chunk sizes 2 and 256 agree. x, B, C are strided views of one projection
    output [1, T, H·P + 2·G·N], as vLLM passes them."""
    dtype = torch.float16
    g, x, dt, A, B, C = _inputs(1, 24, 2, 1, 8, 16, dtype, 11)
    xbc = torch.cat([x.flatten(2), B.flatten(2), C.flatten(2)], 2)
    x, B = xbc[..., :16].view(1, 24, 2, 8), xbc[..., 16:32].view(1, 24, 1, 16)
    C = xbc[..., 32:].view(1, 24, 1, 16)
    cu = torch.tensor([0, 19, 19, 20, 24], dtype=torch.int32)
    init = torch.randn(4, 2, 8, 16, generator=g)
    D = torch.randn(2, generator=g)
    y, final = torch.ops.hexlayout.ssd_scan(x, dt, A, B, C, 2, D, None, None, True, 0.0, None, init, cu)
    y256 = ssd_scan(x, dt, A, B, C, chunk_size=256, D=D, dt_softplus=True, initial_states=init, cu_seqlens=cu)
    assert torch.equal(y, y256)
    for s in range(4):
        lo, hi = int(cu[s]), int(cu[s + 1])
        want, want_st = _ref(x[0, lo:hi], dt[0, lo:hi], A, B[0, lo:hi], C[0, lo:hi], D, softplus=True,
                             init=init[s])
        _close(y[0, lo:hi], want, dtype)
        assert torch.allclose(final[s].double(), want_st, atol=1e-4, rtol=1e-4)
    assert torch.equal(final[1], init[1])


def test_fake_tensors_and_compile() -> None:
    with FakeTensorMode():
        x = torch.empty(1, 6, 4, 8, dtype=torch.bfloat16)
        b = torch.empty(1, 6, 2, 16, dtype=torch.bfloat16)
        y, st = torch.ops.hexlayout.ssd_scan(x, torch.empty(1, 6, 4), torch.empty(4), b, b)
        assert y.shape == x.shape and st.shape == (1, 4, 8, 16) and st.dtype == torch.float32
        with pytest.raises(ArgumentError, match="B"):
            torch.ops.hexlayout.ssd_scan(x, torch.empty(1, 6, 4), torch.empty(4),
                                         b[:, :, :1].expand(1, 6, 3, 16), b)

    def f(x, dt, A, B, C):
        return torch.ops.hexlayout.ssd_scan(x, dt, A, B, C)[0] + 1

    _, x, dt, A, B, C = _inputs(1, 3, 2, 1, 8, 16, torch.float16, 5)
    got = torch.compile(f, backend="eager", fullgraph=True)(x, dt, A, B, C)
    _close(got[0] - 1, _ref(x[0], dt[0], A, B[0], C[0])[0], torch.float16)


def _args(**over):
    x = torch.zeros(1, 4, 2, 8, dtype=torch.float16)
    a = {"x": x, "dt": torch.zeros(1, 4, 2), "A": torch.zeros(2),
         "B": torch.zeros(1, 4, 1, 16, dtype=torch.float16),
         "C": torch.zeros(1, 4, 1, 16, dtype=torch.float16)}
    a.update(over)
    return a


@pytest.mark.parametrize(
    ("over", "arg", "match"),
    [({"x": torch.zeros(1, 4, 2, 8)}, "x", "float32"),
     ({"dt": torch.zeros(1, 4, 3)}, "dt", r"\[1, 4, 2\]"),
     ({"B": torch.zeros(1, 4, 3, 16, dtype=torch.float16)}, "B", "multiple of G"),
     ({"C": torch.zeros(1, 4, 1, 16)}, "C", "dtype"),
     ({"D": torch.zeros(3)}, "D", r"\[2\] or \[2, 8\]"),
     ({"z": torch.zeros(1, 4, 2, 4, dtype=torch.float16)}, "z", "x's"),
     ({"chunk_size": 0}, "chunk_size", "positive"),
     ({"dt_limit": (1.0, 0.5)}, "dt_limit", "lo <= hi"),
     ({"initial_states": torch.zeros(2, 2, 8, 16)}, "initial_states", r"\[1, 2, 8, 16\]"),
     ({"cu_seqlens": torch.tensor([0, 2, 5], dtype=torch.int32)}, "cu_seqlens", "at most 4")],
)
def test_bad_arguments_name_the_argument(over, arg, match) -> None:
    with pytest.raises(ArgumentError, match=match) as err:
        ssd_scan(**_args(**over))
    assert arg in str(err.value) and "ssd_scan" in str(err.value)
    with pytest.raises(ArgumentTypeError, match="dt_softplus"):
        ssd_scan(**_args(), dt_softplus=1)


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compiles_without_spills(arch: str) -> None:
    from hexlayout.ops.mamba.ssd import ssd_scan_consts
    from hexlayout.ops.mamba.ssd_kernels import ssd_scan_kernel

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    consts = {**ssd_scan_consts(64, 128), "SOFTPLUS": True, "CLAMP": True, "HAS_Z": True, "VARLEN": True,
              "FINAL": True}
    res = build(ssd_scan_kernel(hl.bf16), arch, **consts).compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res


def test_each_kernel_is_at_most_150_lines_of_the_language() -> None:
    """Each mamba kernel module - its kernels and the helpers they call - is at most 150 lines."""
    import inspect

    from hexlayout.ops.mamba import conv1d_kernels, ssd_kernels

    for mod, kernels in ((conv1d_kernels, ("causal_conv1d_kernel", "causal_conv1d_update_kernel")),
                         (ssd_kernels, ("ssd_scan_kernel",))):
        for name in kernels:
            assert "@hl.kernel" in inspect.getsource(getattr(mod, name).__wrapped__), name
        lines = len(inspect.getsource(mod).splitlines())
        assert lines <= 150, f"{mod.__name__}: {lines} lines"
