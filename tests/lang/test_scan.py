"""``hl.scan``: inclusive scans of register tiles against a float64 sequential recurrence.

Each fn (add, mul, max, min, linear) in both directions along both axes, over tiles whose
scanned axis lies in a thread's values, across lanes and across warps (and an outer repeat
of the values, an mma accumulator, a replicated reduction result, a thread mode of 12 rows), with
32 to 256 threads, f32, f16 and bf16, on ragged views (the padding takes part as the identity;
a reverse scan starts in it); ``init`` carries a per-row value in and ``carry=True`` the last
one out (a chunked recurrence). The printed kernel compiles with NVRTC for sm_80 and sm_90a
without spills and the PTX executor runs it; mistakes name the kernel, ``scan`` and the line.
"""

from __future__ import annotations

import os
import re

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
import hexlayout.runtime as rt
from hexlayout.lang import KernelError, bf16, f16, f32

M, N, P, Q = hl.dims("M N P Q")
_KERNELS: dict[tuple, hl.Kernel] = {}


def scan_kernel(dt, threads: int) -> hl.Kernel:
    """``y = hl.scan(x)`` of one (BM, BN) tile per block row (``init`` from ``h0`` when ``INIT``,
    the carry into ``last`` when ``CARRY``); ``FN="linear"``: ``y = hl.scan((a, x), ...)``."""
    key = (dt.name, threads)
    if key in _KERNELS:
        return _KERNELS[key]

    @hl.kernel(threads=threads)
    def scan_tile(x: dt[M, N].aligned(16), a: dt[M, N].aligned(16), h0: dt[P, Q], y: dt[M, N].aligned(16),
                  last: dt[P, Q], *,
                  BM: int = 16, BN: int = 32, AXIS: int = 1, FN: str = "add", REV: bool = False,
                  INIT: bool = False, CARRY: bool = True):
        pid = hl.grid(hl.spatial(hl.cdiv(x.shape[0], BM)))
        r = hl.register(dt, (BM, BN))
        hl.copy(hl.view(x, (BM, BN), (pid * BM, 0)), r)
        src = r
        if FN == "linear":
            ra = hl.register(dt, (BM, BN))
            hl.copy(hl.view(a, (BM, BN), (pid * BM, 0)), ra)
            src = (ra, r)
        init = None
        shape, origin = ((BM, 1), (pid * BM, 0)) if AXIS == 1 else ((1, BN), (pid, 0))
        if INIT:
            init = hl.register(dt, shape)
            hl.copy(hl.view(h0, shape, origin), init)
        if CARRY:
            out, c = hl.scan(src, AXIS, FN, REV, init, carry=True)
            hl.copy(c, hl.view(last, shape, origin))
        else:
            out = hl.scan(src, AXIS, FN, REV, init)
        hl.copy(out, hl.view(y, (BM, BN), (pid * BM, 0)))

    _KERNELS[key] = scan_tile
    return scan_tile


def reference(x: np.ndarray, a: np.ndarray, h0: np.ndarray | None, axis: int, fn: str,
              rev: bool) -> np.ndarray:
    """The sequential recurrence in float64, along ``axis`` of one block's tile."""
    x, a = np.moveaxis(x.astype(np.float64), axis, -1), np.moveaxis(a.astype(np.float64), axis, -1)
    out = np.empty_like(x)
    order = range(x.shape[-1] - 1, -1, -1) if rev else range(x.shape[-1])
    h = None if h0 is None else np.moveaxis(h0.astype(np.float64), axis, -1)[..., 0]
    for i in order:
        if fn == "linear":
            h = x[..., i] + (0.0 if h is None else a[..., i] * h)
        elif h is None:
            h = x[..., i]
        else:
            h = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[fn](h, x[..., i])
        out[..., i] = h
    return np.moveaxis(out, -1, axis)


def run_scan(fn: str, axis: int, rev: bool, threads: int, bm: int, bn: int, dt=f32, *, init: bool = False,
             mode: str = "ir", arch: str = "sm_80", rows: int | None = None, cols: int | None = None) -> None:
    """Emulate the scan of a ragged (2*bm - 3, bn - 5) problem and compare with ``reference``."""
    k = scan_kernel(dt, threads)
    rows, cols = rows or 2 * bm - 3, cols or bn - 5
    nblocks = -(-rows // bm)
    npdt = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[dt.name]
    rng = np.random.default_rng(threads + bm + bn + axis)
    lo = 0.8 if fn == "mul" else -1.0
    x = rng.uniform(lo, 1.2, (rows, cols)).astype(npdt)
    a = rng.uniform(0.5, 1.0, (rows, cols)).astype(npdt)
    h0 = rng.uniform(-1, 1, (rows, 1) if axis == 1 else (nblocks, cols)).astype(npdt)
    y, last = np.full((rows, cols), np.nan, npdt), np.full(h0.shape, np.nan, npdt)
    built = rt.build(k, arch, compile=False, BM=bm, BN=bn, AXIS=axis, FN=fn, REV=rev, INIT=init)
    rt.emulate(built, x, a, h0, y, last, mode=mode)
    tol = {"f32": 2e-5, "f16": 2e-2, "bf16": 6e-2}[dt.name]
    for b in range(nblocks):
        s = slice(b * bm, (b + 1) * bm)
        hb = None if not init else (h0[s] if axis == 1 else h0[b:b + 1])
        want = reference(x[s], a[s], hb, axis, fn, rev)
        atol = tol * max(1.0, np.abs(want).max())
        np.testing.assert_allclose(y[s].astype(np.float64), want, rtol=tol, atol=atol)
        got = last[s] if axis == 1 else last[b:b + 1]          # the carry: the last element of each row
        np.testing.assert_allclose(got.astype(np.float64), np.take(want, [0 if rev else -1], axis), rtol=tol,
                                   atol=atol)


# (fn, axis, reverse, threads, BM, BN): in-thread + lanes (axis 1), lanes + warps (axis 0, 16 rows over
# 128 threads), lanes + warps + an outer repeat (64 rows), a single warp, 256 threads over 8 warps
CASES = [
    ("add", 1, False, 128, 16, 32),
    ("add", 0, True, 128, 64, 32),
    ("mul", 1, True, 64, 16, 32),
    ("mul", 0, False, 32, 16, 16),
    ("max", 0, False, 128, 16, 32),
    ("max", 1, True, 32, 8, 64),
    ("min", 1, False, 256, 32, 32),
    ("min", 0, True, 256, 64, 16),
]


@pytest.mark.parametrize(("fn", "axis", "rev", "threads", "bm", "bn"), CASES)
def test_scan_matches_float64(fn: str, axis: int, rev: bool, threads: int, bm: int, bn: int) -> None:
    run_scan(fn, axis, rev, threads, bm, bn)


@pytest.mark.parametrize(("axis", "rev", "threads", "bm", "bn", "init"), [
    (1, False, 128, 16, 32, True),
    (1, True, 64, 8, 64, False),
    (0, True, 128, 64, 32, True),
    (0, False, 32, 16, 16, False),
])
def test_linear_recurrence_matches_float64(axis: int, rev: bool, threads: int, bm: int, bn: int,
                                          init: bool) -> None:
    """``h_i = a_i h_{i-1} + b_i`` (Mamba's recurrence), with and without ``init = h_{-1}``."""
    run_scan("linear", axis, rev, threads, bm, bn, init=init)


@pytest.mark.parametrize(("dt", "fn", "axis", "rev", "init"), [(f16, "add", 1, True, True),
                                                               (f16, "linear", 0, False, True),
                                                               (f16, "max", 0, True, False),
                                                               (bf16, "linear", 1, True, True)])
def test_16_bit_scans(dt, fn: str, axis: int, rev: bool, init: bool) -> None:
    """Arithmetic in the element type (each step rounded), against float64."""
    run_scan(fn, axis, rev, 128, 16, 32, dt, init=init)


def test_ragged_padding_is_the_identity() -> None:
    """A reverse product along a row that ends in padding: the zeros loaded there do not take
    part (the product would be 0 everywhere); likewise a reverse min (0 < every element)."""
    run_scan("mul", 1, True, 128, 16, 64, rows=5, cols=37)
    run_scan("linear", 1, True, 128, 16, 64, rows=5, cols=37)
    k = scan_kernel(f32, 128)
    built = rt.build(k, "sm_80", compile=False, BM=16, BN=64, AXIS=1, FN="mul", REV=True)
    text = str(built.tile_kernel)
    assert re.search(r"scan\.mul %r axis=1 reverse carry=%\w+ valid=min\(N, 64\)", text), text


@pytest.mark.parametrize(("fn", "axis", "rev", "init"), [("linear", 0, True, True), ("mul", 0, False, False)])
def test_rows_over_a_thread_mode_of_12(fn: str, axis: int, rev: bool, init: bool) -> None:
    """96 threads put the 12 rows of a (12, 32) tile on a thread mode of size 12 (no lane-bit
    digits): the scan goes through shared memory, one thread per row, one position after the other."""
    from hexlayout.ir.lowered import Shfl, walk_instrs

    run_scan(fn, axis, rev, 96, 12, 32, init=init)
    built = rt.build(scan_kernel(f32, 96), "sm_80", compile=False, BM=12, BN=32, AXIS=axis, FN=fn, REV=rev,
                     INIT=init)
    assert not any(isinstance(i, Shfl) for i in walk_instrs(built.lowered.body))


@hl.kernel(threads=128)
def chunked_recurrence(a: f32[M, N].aligned(4), b: f32[M, N].aligned(4), h: f32[M, N].aligned(4),
                       final: f32[M, 1], *, BN: int = 32):
    """``h_i = a_i h_{i-1} + b_i`` along rows of any length, in chunks of ``BN`` columns: each
    chunk's scan starts from the carry (``init``), the last element of the chunk before
    (``carry=True``); ``final`` is the last state, from the ragged last chunk."""
    pid = hl.grid(hl.spatial(hl.cdiv(a.shape[0], 16)))
    carry = hl.zeros((16, 1), f32)
    for k in hl.range(hl.cdiv(a.shape[1], BN)):
        ra, rb = hl.register(f32, (16, BN)), hl.register(f32, (16, BN))
        hl.copy(hl.view(a, (16, BN), (pid * 16, k * BN)), ra)
        hl.copy(hl.view(b, (16, BN), (pid * 16, k * BN)), rb)
        hk, last = hl.scan((ra, rb), 1, "linear", init=carry, carry=True)
        hl.copy(hk, hl.view(h, (16, BN), (pid * 16, k * BN)))
        hl.assign(carry, last)
    hl.copy(carry, hl.view(final, (16, 1), (pid * 16, 0)))


def test_chunked_recurrence_carries_the_state() -> None:
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.0, (20, 99)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, (20, 99)).astype(np.float32)
    h, final = np.full_like(a, np.nan), np.full((20, 1), np.nan, np.float32)
    rt.emulate(rt.build(chunked_recurrence, "sm_80", compile=False), a, b, h, final)
    want = reference(b, a, None, 1, "linear", False)
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(final[:, 0], want[:, -1], rtol=1e-5, atol=1e-5)


@hl.kernel(threads=128)
def scan_of_product(a: f16[M, N].aligned(16), b: f16[P, N].aligned(16), c: f32[M, P].aligned(16), *,
                    AXIS: int = 1):
    """The cumulative sum of an mma accumulator: positions interleave a thread's values with lane
    bits (m16n8's two columns, four lanes, then the next n8 tile), and warps along M."""
    ra, rb = hl.register(f16, (64, 32)), hl.register(f16, (64, 32))
    hl.copy(hl.view(a, (64, 32), (0, 0)), ra)
    hl.copy(hl.view(b, (64, 32), (0, 0)), rb)
    acc = hl.zeros((64, 64), f32)
    hl.mma(ra, rb, acc)
    hl.copy(hl.scan(acc, AXIS, "add", AXIS == 0), hl.view(c, (64, 64), (0, 0)))


@pytest.mark.parametrize("axis", [0, 1])
def test_scan_of_an_mma_accumulator(axis: int) -> None:
    rng = np.random.default_rng(axis)
    a, b = (rng.standard_normal((64, 32)).astype(np.float16) for _ in range(2))
    c = np.full((64, 64), np.nan, np.float32)
    rt.emulate(rt.build(scan_of_product, "sm_80", compile=False, AXIS=axis), a, b, c)
    p = a.astype(np.float64) @ b.astype(np.float64).T
    want = np.flip(np.cumsum(np.flip(p, 0), 0), 0) if axis == 0 else np.cumsum(p, 1)
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)


@hl.kernel(threads=128)
def suffix_of_row_sums(x: f32[M, N].aligned(16), y: f32[M, 1]):
    """A reverse scan of a reduction's result (a layout replicated over the lanes that reduced)."""
    r = hl.register(f32, (64, 32))
    hl.copy(hl.view(x, (64, 32), (0, 0)), r)
    hl.copy(hl.scan(hl.sum(r, 1), 0, "add", reverse=True), hl.view(y, (64, 1), (0, 0)))


def test_scan_of_a_replicated_reduction() -> None:
    x = np.random.default_rng(4).uniform(0, 1, (61, 32)).astype(np.float32)
    y = np.full((61, 1), np.nan, np.float32)
    rt.emulate(rt.build(suffix_of_row_sums, "sm_80", compile=False), x, y)
    want = np.flip(np.cumsum(np.flip(x.astype(np.float64).sum(1))))
    np.testing.assert_allclose(y[:, 0], want, rtol=1e-5)


def test_sum_is_add() -> None:
    """``fn="sum"`` (``hl.reduce``'s spelling) is the add scan."""
    k = scan_kernel(f32, 128)
    assert "scan.add %r axis=0" in str(k.trace(FN="sum", AXIS=0))


@pytest.mark.parametrize(("arch", "axis", "rev", "shfl", "sass"), [
    ("sm_80", 0, True, "__shfl_down_sync", "SHFL.DOWN"),   # one row position per thread: Kogge-Stone, warps
    ("sm_90a", 1, False, "__shfl_sync", "SHFL.IDX"),       # 4 positions per thread: in order, per lane bit
])
def test_scan_compiles_without_spills(arch: str, axis: int, rev: bool, shfl: str, sass: str) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from hexlayout.runtime.sass import count_prefix

    k = scan_kernel(f32, 128)
    built = rt.build(k, arch, BM=64, BN=32, AXIS=axis, FN="linear", REV=rev, INIT=True)
    res = built.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0
    assert shfl in built.generated.source
    counts = built.compiled.sass_counts()
    assert count_prefix(counts, sass) >= 2, sorted(counts)
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0


def test_ptx_executor_runs_the_scan() -> None:
    """The NVRTC PTX of the printed kernel (shuffles across lanes, shared memory across warps)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    run_scan("linear", 0, False, 128, 64, 32, init=True, mode="ptx")
    run_scan("max", 1, True, 64, 16, 32, mode="ptx")


# --- mistakes ------------------------------------------------------------------------------------

def _line(fn, snippet: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(lines) if snippet in s)


@hl.kernel(threads=128)
def bad_scan(x: f32[M, N], *, CASE: str = "axis"):
    r = hl.register(f32, (16, 32))
    q = hl.register(f32, (16, 16))
    if CASE == "axis":
        hl.scan(r, 2)
    elif CASE == "fn":
        hl.scan(r, 1, "xor")
    elif CASE == "pair":
        hl.scan((r, q), 1, "linear")
    elif CASE == "single":
        hl.scan(r, 1, "linear")
    elif CASE == "init":
        hl.scan(r, 1, "add", init=q)
    elif CASE == "shared":
        hl.scan(hl.shared(f32, (16, 32)), 1)


@pytest.mark.parametrize(("case", "snippet", "words"), [
    ("axis", "hl.scan(r, 2)", ("axis 2 out of range", "%r")),
    ("fn", 'hl.scan(r, 1, "xor")', ("unknown scan function 'xor'", "linear")),
    ("pair", 'hl.scan((r, q), 1, "linear")', ("%r", "%q", "(16,32)", "(16,16)", "one shape")),
    ("single", 'hl.scan(r, 1, "linear")', ("pair of tiles (a, b)",)),
    ("init", 'hl.scan(r, 1, "add", init=q)', ("init %q", "(16,1)")),
    ("shared", "hl.scan(hl.shared(f32, (16, 32)), 1)", ("must be a register tile",)),
])
def test_mistakes_name_the_kernel_op_and_line(case: str, snippet: str, words: tuple[str, ...]) -> None:
    with pytest.raises(KernelError) as e:
        bad_scan.trace(CASE=case)
    err, msg = e.value, str(e.value)
    assert err.kernel == "bad_scan" and err.op == "scan"
    assert err.loc is not None and err.loc.line == _line(bad_scan.fn, snippet), msg
    assert f"{os.path.basename(__file__)}:{err.loc.line}" in msg and snippet in msg
    for w in words:
        assert w in msg, msg
