"""Indirect addressing: scalars loaded from global memory (loop bounds, view origins,
conditions, indices), gathers and scatters through index tiles computed in registers along
any mode, views of gathered views and of 4-mode shared tiles; emulated against numpy,
compiled with NVRTC; errors name the kernel, the op and the line."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.lang import f16, f32, i32
from hexlayout.runtime import build
from hexlayout.synth.solve import SynthesisError, synthesize

B, N, M, K = hl.dims("B N M K")


@hl.kernel(threads=128)
def segment_sums(spans: i32[B, 2], x: f32[N], y: f32[B, 128]):
    """y[s] = sum over 128-element chunks of x[start : start + length] (zeros past it), for
    (start, length) = spans[s] loaded as one 64-bit vector; rows of empty spans untouched."""
    s = hl.grid(hl.spatial(spans.shape[0]))
    start, length = hl.load(spans, (s, 0), count=2)
    acc = hl.zeros((128,), f32)
    for j in hl.range(hl.cdiv(length, 128)):
        t = hl.register(f32, (128,))
        hl.copy(x[start + j * 128:start + j * 128 + 128], t)
        ok = hl.iota((128,), 0) + j * 128 < length
        acc += hl.where(ok, t, 0.0)
    with hl.if_(length > 0):
        hl.copy(acc, y[s, :])


def _segment_reference(spans: np.ndarray, x: np.ndarray, y0: np.ndarray) -> np.ndarray:
    y = y0.astype(np.float64)
    for s, (start, n) in enumerate(spans):
        if n == 0:
            continue
        y[s] = 0
        for j in range(-(-n // 128)):
            lo = j * 128
            seg = x[start + lo:start + min(n, lo + 128)].astype(np.float64)
            y[s, :len(seg)] += seg
    return y


def test_scalar_loads_bound_loops_place_views_and_branch() -> None:
    syn = synthesize(segment_sums.trace(), "sm_80")
    lds = [i for i in _walk(syn.lowered.kernel.body) if type(i).__name__ == "LdGlobal" and i.bits == 64]
    assert len(lds) == 1                                    # start and length: one 64-bit load
    rng = np.random.default_rng(0)
    lens = np.array([300, 0, 129, 5, 128], np.int32)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int32)
    spans = np.stack([starts, lens], axis=1).astype(np.int32)
    x = rng.standard_normal(int(lens.sum())).astype(np.float32)
    y = np.full((5, 128), 7.0, np.float32)
    run(syn.lowered.kernel, {"spans": spans, "x": x, "y": y})
    np.testing.assert_allclose(y, _segment_reference(spans, x, np.full((5, 128), 7.0)), rtol=1e-5, atol=1e-5)


@pytest.mark.nvrtc
def test_scalar_loads_compile() -> None:
    b = build(segment_sums, "sm_80")
    assert "spans_ld[1]" in b.generated.source
    assert b.compiled.resources.spill_stores == 0


@hl.kernel(threads=128)
def column_gather(x: f16[M, K], perm: i32[K], y: f16[M, K], z: f16[M, K]):
    """y[:, c] = x[:, perm[c]] (a gather along mode 1 through a loaded index tile) and
    z[:, perm[c]] = x[:, c] (a scatter), 64 columns at a time, rows from the grid."""
    m0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 32))) * 32
    for c0 in hl.range(hl.cdiv(x.shape[1], 64)):
        cols = hl.iota((64,), 0) + c0 * 64
        src = hl.register(i32, (64,))
        hl.copy(perm[c0 * 64:c0 * 64 + 64], src)
        src = hl.where(cols < x.shape[1], src, -1)
        t = hl.register(f16, (32, 64))
        hl.copy(x[m0:m0 + 32, src], t)
        hl.copy(t, y[m0:m0 + 32, c0 * 64:c0 * 64 + 64])
        u = hl.register(f16, (32, 64))
        hl.copy(x[m0:m0 + 32, c0 * 64:c0 * 64 + 64], u)
        hl.copy(u, z[m0:m0 + 32, src])


@pytest.mark.parametrize(("m", "k"), [(64, 128), (50, 104)])
def test_gather_and_scatter_along_mode_1(m: int, k: int) -> None:
    syn = synthesize(column_gather.trace(), "sm_80")
    rng = np.random.default_rng(m + k)
    x = rng.standard_normal((m, k)).astype(np.float16)
    perm = rng.permutation(k).astype(np.int32)
    y = np.zeros_like(x)
    z = np.zeros_like(x)
    run(syn.lowered.kernel, {"x": x, "perm": perm, "y": y, "z": z})
    np.testing.assert_array_equal(y, x[:, perm])
    want = np.zeros_like(x)
    want[:, perm] = x
    np.testing.assert_array_equal(z, want)


@hl.kernel(threads=128)
def window_of_gather(x: f16[M, K], ids: i32[N], y: f16[N, K], z: f16[N]):
    """y[r] = x[ids[r]] for 128 rows, through two windows of one gathered view, and
    z[r] = x[ids[r], 5] through a slice of its transpose."""
    rows = hl.register(i32, (128,))
    hl.copy(ids[0:128], rows)
    g = x[rows, 0:64]                          # (128, 64) gathered
    for r0 in (0, 64):
        t = hl.register(f16, (64, 64))
        hl.copy(g[r0:r0 + 64, :], t)
        hl.copy(t, y[r0:r0 + 64, 0:64])
    col = hl.register(f16, (128,))
    hl.copy(g.T[5, :], col)                    # column 5 of the gathered rows
    hl.copy(col, z[0:128])


def test_views_of_a_gathered_view() -> None:
    syn = synthesize(window_of_gather.trace(), "sm_80")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((90, 64)).astype(np.float16)
    ids = rng.integers(0, 90, size=128).astype(np.int32)
    y = np.zeros((128, 64), np.float16)
    z = np.zeros(128, np.float16)
    run(syn.lowered.kernel, {"x": x, "ids": ids, "y": y, "z": z})
    np.testing.assert_array_equal(y, x[ids])
    np.testing.assert_array_equal(z, x[ids, 5])


@hl.kernel(threads=128)
def staged_quadrants(x: f16[M, K], y: f16[M, K]):
    """A 4-mode shared tile (2 x 2 quadrants) written and read through slices."""
    sh = hl.shared(f16, (2, 2, 32, 64))
    for i in hl.range(2, unroll=True):
        for j in hl.range(2, unroll=True):
            hl.copy(x.tile((32, 64), (i * 32, j * 64)), sh[i, j])
    hl.commit_group()
    hl.wait_group(0)
    hl.syncthreads()
    r = hl.register(f16, (32, 64))
    hl.copy(sh[1, 0], r)
    hl.copy(r, y.tile((32, 64), (0, 0)))
    r2 = hl.register(f16, (16, 64))
    hl.copy(sh[0, 1, 8:24, :], r2)
    hl.copy(r2, y.tile((16, 64), (32, 64)))


def test_slices_of_a_four_mode_shared_tile() -> None:
    syn = synthesize(staged_quadrants.trace(), "sm_80")
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float16)
    y = np.zeros_like(x)
    report = run(syn.lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y[:32, :64], x[32:, :64])
    np.testing.assert_array_equal(y[32:48, 64:], x[8:24, 64:])
    assert report.totals["bank_conflicts"] == 0


# --- errors ------------------------------------------------------------------------------

def test_load_errors_name_kernel_op_and_line() -> None:
    @hl.kernel(threads=128)
    def floats(x: f32[N]):
        n = x[0]  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"floats: load at .*n = x\[0\].*x holds f32"):
        floats.trace()

    @hl.kernel(threads=128)
    def wide(x: i32[N]):
        a = hl.load(x, (0,), count=3)  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"wide: load at .*count=3"):
        wide.trace()

    @hl.kernel(threads=128)
    def outside(x: i32[4]):
        a = x[4]  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"outside: load .*coordinate 4 is out of range"):
        outside.trace()


def test_gather_errors_name_kernel_op_and_line() -> None:
    @hl.kernel(threads=128)
    def float_index(x: f16[M, K]):
        idx = hl.zeros((64,), f32)
        g = x[idx, :]  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"float_index: gather at .*x\[idx, :\].*must hold integers"):
        float_index.trace()

    @hl.kernel(threads=128)
    def mismatch(x: f16[M, K]):
        a = hl.iota((64,), 0)
        b = hl.iota((32,), 0)
        g = x[a, b]  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"mismatch: gather .*do not broadcast"):
        mismatch.trace()


def test_a_gathered_slice_between_offsets_of_one_runtime_start_has_its_width() -> None:
    """``x[rows, c + 64 : c + 128]`` (``c`` a block index: the arithmetic folds both ends to
    ``c' + 64``, ``c' + 128``) is a 64-wide slice; ends with other runtime terms are refused."""

    @hl.kernel(threads=128)
    def second_tile(x: f16[M, K], ids: i32[N]):
        c = hl.grid(hl.spatial(2)) * 128
        rows = hl.register(i32, (16,))
        hl.copy(ids[0:16], rows)
        g = x[rows, c + 64:c + 64 + 64]
        assert g.shape == (16, 64)

    second_tile.trace()

    @hl.kernel(threads=128)
    def two_starts(x: f16[M, K], ids: i32[N]):
        c = hl.grid(hl.spatial(2)) * 128
        rows = hl.register(i32, (16,))
        hl.copy(ids[0:16], rows)
        g = x[rows, c:ids.shape[0] + 64]  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"two_starts: gather .*static positive width"):
        two_starts.trace()


@hl.kernel(threads=128)
def rewritten_index(x: f16[M, K], ids: i32[N], y: f16[M, K]):
    idx = hl.register(i32, (64,))
    hl.copy(ids[0:64], idx)
    hl.assign(idx, idx + 1)
    t = hl.register(f16, (64, 64))
    hl.copy(x[idx, 0:64], t)
    hl.copy(t, y[0:64, 0:64])


def test_an_index_that_cannot_be_recomputed_is_a_synthesis_error() -> None:
    with pytest.raises(SynthesisError, match=r"rewritten_index: copy at .*x\[idx, 0:64\].*index tile %idx "
                       r"must be computed by exactly one op .*Copy at .*Elementwise at"):
        synthesize(rewritten_index.trace(), "sm_80")


def _walk(body: list) -> list:
    out = []
    for ins in body:
        out.append(ins)
        for attr in ("body", "then_body", "else_body"):
            out += _walk(getattr(ins, attr, []) or [])
    return out


@hl.kernel(threads=128)
def floor_div_mod(a: i32[M, K], b: i32[M, K], q: i32[M, K], r: i32[M, K]):
    x, y = hl.register(i32, (32, 64)), hl.register(i32, (32, 64))
    hl.copy(a.tile((32, 64), (0, 0)), x)
    hl.copy(b.tile((32, 64), (0, 0)), y)
    hl.copy(x // y, q.tile((32, 64), (0, 0)))
    hl.copy(x % y, r.tile((32, 64), (0, 0)))


def test_floor_division_and_modulo_of_integer_tiles() -> None:
    """``//`` and ``%`` on integer tiles are Python's (floor, the sign of the divisor)."""
    syn = synthesize(floor_div_mod.trace(), "sm_80")
    rng = np.random.default_rng(4)
    a = rng.integers(-1000, 1000, (32, 64)).astype(np.int32)
    b = rng.integers(-30, 30, (32, 64)).astype(np.int32)
    b[b == 0] = 7
    b[0, :4] = (1, -1, 16, -16)
    q, r = np.zeros_like(a), np.zeros_like(a)
    run(syn.lowered.kernel, {"a": a, "b": b, "q": q, "r": r})
    np.testing.assert_array_equal(q, a // b)
    np.testing.assert_array_equal(r, a % b)


@hl.kernel(threads=128)
def stage_from_memory(x: f16[M, K], stage: i32[N], y: f16[M, K]):
    """A loaded scalar picks the stage of a shared buffer; a 2-D gather (rows and columns
    through two broadcast index tiles) reads x[2r, 63 - c]."""
    n = stage[0]
    s = hl.shared(f16, (64, 64, 4))
    hl.copy(x.tile((64, 64), (0, 0)), s[:, :, n])
    hl.commit_group()
    hl.wait_group(0)
    hl.syncthreads()
    r = hl.register(f16, (64, 64))
    hl.copy(s[:, :, n], r)
    hl.copy(r, y.tile((64, 64), (0, 0)))
    t = hl.register(f16, (64, 64))
    hl.copy(x[hl.iota((64, 1), 0) * 2, 63 - hl.iota((1, 64), 1)], t)
    hl.copy(t, y.tile((64, 64), (64, 0)))


def test_a_loaded_stage_index_and_a_two_mode_gather() -> None:
    syn = synthesize(stage_from_memory.trace(), "sm_80")
    x = np.random.default_rng(5).standard_normal((128, 64)).astype(np.float16)
    y = np.zeros_like(x)
    run(syn.lowered.kernel, {"x": x, "stage": np.array([2], np.int32), "y": y})
    np.testing.assert_array_equal(y[:64], x[:64])
    np.testing.assert_array_equal(y[64:], x[0:128:2, ::-1])


@hl.kernel(threads=128)
def scatter_from_shared(x: f16[M, K], ids: i32[N], y: f16[M, K]):
    """y[ids[r]] = x[r]: a shared tile stored through a gathered view (never TMA)."""
    s = hl.shared(f16, (64, 64))
    hl.copy(x.tile((64, 64), (0, 0)), s)
    hl.commit_group()
    hl.wait_group(0)
    hl.syncthreads()
    rows = hl.register(i32, (64,))
    hl.copy(ids[0:64], rows)
    hl.copy(s, y[rows, 0:64])


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_scatter_from_shared_memory(arch: str) -> None:
    syn = synthesize(scatter_from_shared.trace(), arch)
    assert not any("TMA" in i for _, i in syn.lowered.choices)
    x = np.random.default_rng(6).standard_normal((64, 64)).astype(np.float16)
    ids = np.random.default_rng(7).permutation(64).astype(np.int32)
    y = np.zeros_like(x)
    run(syn.lowered.kernel, {"x": x, "ids": ids, "y": y})
    want = np.zeros_like(x)
    want[ids] = x
    np.testing.assert_array_equal(y, want)
