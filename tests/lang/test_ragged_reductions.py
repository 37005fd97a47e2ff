"""Reductions over ragged views are never silently wrong (``hexlayout.ir.padding``).

The out-of-bounds elements of a view (its padding) count as the reduction's identity in
every reduction, through elementwise math between the load and the reduction, on sm_80 and
sm_90a (emulated against float64 on random data, 100 x 37 in 64 x 64 tiles); ``other=``
names the value a load's padding reads; programs where the padding's positions or value are
lost before a reduction or an mma are refused at trace time, naming the kernel, the op and
the line.
"""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.ir.tile import Reduce
from hexlayout.lang import f16, f32
from hexlayout.synth.solve import synthesize

M, N, P = hl.dims("M N P")
ARCHS = ("sm_80", "sm_90a")
SHAPE = (100, 37)         # ragged along both modes of 64 x 64 tiles


@hl.kernel(threads=128)
def softmax(x: f32[M, N].aligned(4), y: f32[M, N].aligned(4)):
    """A row softmax written without any mask."""
    pid = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 64)))
    r = hl.register(f32, (64, 64))
    hl.copy(hl.view(x, (64, 64), (pid * 64, 0)), r)
    e = hl.exp(r - hl.max_reduce(r, 1))
    hl.copy(e / hl.sum(e, 1), hl.view(y, (64, 64), (pid * 64, 0)))


@hl.kernel(threads=128)
def extrema(x: f32[M, N].aligned(4), rmax: f32[M, 1], rmin: f32[M, 1], cmax: f32[1, N].aligned(4),
            cmin: f32[1, N].aligned(4)):
    """Row and column maxima and minima of one 64 x 64 tile per block row (columns: block 0)."""
    pid = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 64)))
    r = hl.register(f32, (64, 64))
    hl.copy(hl.view(x, (64, 64), (pid * 64, 0)), r)
    hl.copy(hl.max_reduce(r, 1), hl.view(rmax, (64, 1), (pid * 64, 0)))
    hl.copy(hl.min_reduce(r, 1), hl.view(rmin, (64, 1), (pid * 64, 0)))
    # rows 64..99 of the second block: the padded rows must not count along axis 0
    hl.copy(hl.max_reduce(r, 0), hl.view(cmax, (1, 64), (0, 0)), mask=pid.eq(1))
    hl.copy(hl.min_reduce(r, 0), hl.view(cmin, (1, 64), (0, 0)), mask=pid.eq(1))


@hl.kernel(threads=128)
def layer_norm_stats(x: f16[M, N].aligned(2), mean: f32[M, 1], var: f32[M, 1], inv_n: f32):
    """Mean and centred variance of each row of an f16 tensor, in f32, without masks."""
    pid = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 64)))
    r = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, (64, 64), (pid * 64, 0)), r)
    xf = hl.cast(r, f32)
    mu = hl.sum(xf, 1) * inv_n
    d = xf - mu
    hl.copy(mu, hl.view(mean, (64, 1), (pid * 64, 0)))
    hl.copy(hl.sum(d * d, 1) * inv_n, hl.view(var, (64, 1), (pid * 64, 0)))


@hl.kernel(threads=128)
def chunked_rowmax(x: f32[M, N].aligned(4), y: f32[M, 1]):
    """A row max over a runtime loop of 64-column chunks (the last one ragged)."""
    pid = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 16)))
    acc = hl.full((16, 1), float("-inf"), f32)
    for k in hl.range(hl.cdiv(x.shape[1], 64)):
        r = hl.register(f32, (16, 64))
        hl.copy(hl.view(x, (16, 64), (pid * 16, k * 64)), r)
        hl.assign(acc, hl.maximum(acc, hl.max_reduce(hl.abs(r) * -1.0, 1)))
    hl.copy(acc, hl.view(y, (16, 1), (pid * 16, 0)))


@hl.kernel(threads=128)
def row_reduce_other(x: f32[M, N].aligned(4), y: f32[M, 1], *, FN: str = "sum", OTHER: float = 0.0):
    """A row reduction of a load whose padding reads ``OTHER``."""
    pid = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 64)))
    r = hl.register(f32, (64, 64))
    hl.copy(hl.view(x, (64, 64), (pid * 64, 0)), r, other=OTHER)
    hl.copy(hl.reduce(r, FN, 1), hl.view(y, (64, 1), (pid * 64, 0)))


def _emulate(kernel, arch: str, args: dict, **consts) -> None:
    run(synthesize(kernel.trace(**consts), arch).lowered.kernel, args)


@pytest.mark.parametrize("arch", ARCHS)
def test_row_softmax_without_masks(arch: str) -> None:
    rng = np.random.default_rng(11)
    x = (3 * rng.standard_normal(SHAPE)).astype(np.float32)
    y = np.full_like(x, np.nan)
    _emulate(softmax, arch, {"x": x, "y": y})
    xs = x.astype(np.float64)
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_row_and_column_extrema_of_one_signed_data(arch: str) -> None:
    """Maxima of all-negative rows and minima of all-positive rows: the padding (0) would win."""
    rng = np.random.default_rng(12)
    mag = (rng.random(SHAPE) + 0.5).astype(np.float32)
    for x in (-mag, mag):
        out = {k: np.full(s, np.nan, np.float32) for k, s in
               (("rmax", (100, 1)), ("rmin", (100, 1)), ("cmax", (1, 37)), ("cmin", (1, 37)))}
        _emulate(extrema, arch, {"x": x, **out})
        np.testing.assert_array_equal(out["rmax"][:, 0], x.max(axis=1))
        np.testing.assert_array_equal(out["rmin"][:, 0], x.min(axis=1))
        np.testing.assert_array_equal(out["cmax"][0], x[64:].max(axis=0))
        np.testing.assert_array_equal(out["cmin"][0], x[64:].min(axis=0))


@pytest.mark.parametrize("arch", ARCHS)
def test_layer_norm_variance_without_masks(arch: str) -> None:
    rng = np.random.default_rng(13)
    x = (2 + rng.standard_normal(SHAPE)).astype(np.float16)   # a mean far from 0: padding would show
    mean = np.full((100, 1), np.nan, np.float32)
    var = np.full((100, 1), np.nan, np.float32)
    _emulate(layer_norm_stats, arch, {"x": x, "mean": mean, "var": var, "inv_n": np.float32(1 / 37)})
    xs = x.astype(np.float64)
    np.testing.assert_allclose(mean[:, 0], xs.mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(var[:, 0], xs.var(axis=1), rtol=1e-5)


def test_reduction_in_a_loop_over_ragged_chunks() -> None:
    rng = np.random.default_rng(14)
    x = rng.standard_normal((40, 150)).astype(np.float32)
    y = np.full((40, 1), np.nan, np.float32)
    _emulate(chunked_rowmax, "sm_80", {"x": x, "y": y})
    np.testing.assert_array_equal(y[:, 0], (-np.abs(x)).max(axis=1))


def test_where_the_masks_go() -> None:
    """Only where padding reaches the reduced axis with a value other than the identity."""
    valid = {op.fn: op.valid for op in softmax.trace().body.walk() if isinstance(op, Reduce)}
    assert str(valid["max"]) == "min(N, 64)" and str(valid["sum"]) == "min(N, 64)"
    ln = [op for op in layer_norm_stats.trace().body.walk() if isinstance(op, Reduce)]
    assert ln[0].valid is None                   # a sum of the load's zeros: nothing to select
    assert ln[1].valid is not None               # (x - mean)^2 is not 0 in the padding
    ex = [op.valid for op in extrema.trace().body.walk() if isinstance(op, Reduce)]
    assert [str(v) for v in ex] == ["min(N, 64)"] * 2 + ["min(M - blockIdx.x * 64, 64)"] * 2
    assert "valid=min(N, 64) overwrite" in str(softmax.trace())   # nobody else needs r and e padding


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fn,other", [("sum", 1.5), ("max", float("-inf")), ("min", 4.0)])
def test_other_is_the_value_of_the_padding(arch: str, fn: str, other: float) -> None:
    """With ``other=`` the padding holds that value and takes part like any element."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    y = np.full((100, 1), np.nan, np.float32)
    _emulate(row_reduce_other, arch, {"x": x, "y": y}, FN=fn, OTHER=other)
    padded = np.full((100, 64), other)
    padded[:, :37] = x
    want = {"sum": padded.sum(axis=1), "max": padded.max(axis=1), "min": padded.min(axis=1)}[fn]
    np.testing.assert_allclose(y[:, 0], want, rtol=1e-5, atol=1e-5)


def test_other_checks() -> None:
    @hl.kernel(threads=128)
    def bad_scope(x: f32[M, N]):
        s = hl.shared(f32, (64, 64))
        hl.copy(hl.view(x, (64, 64)), s, other=1.0)

    with pytest.raises(hl.KernelError, match=r"bad_scope: copy at .*other= is the value a global -> "):
        bad_scope.trace()

    @hl.kernel(threads=128)
    def bad_int(x: hl.i8[M, N]):
        r = hl.register(hl.i8, (64, 64))
        hl.copy(hl.view(x, (64, 64)), r, other=300)

    with pytest.raises(hl.KernelError, match=r"other=300 is outside the range \[-128, 127\]"):
        bad_int.trace()


# --- refusals -------------------------------------------------------------------------------

@hl.kernel(threads=128)
def lost_through_shared(x: f32[M, N].aligned(4), y: f32[M, 1]):
    r = hl.register(f32, (64, 64))
    hl.copy(hl.view(x, (64, 64)), r)
    s = hl.shared(f32, (64, 64, 2))
    hl.copy(r, s[:, :, 0])                   # padding written into a part of another buffer
    hl.syncthreads()
    t = hl.register(f32, (64, 64))
    hl.copy(s[:, :, 1], t)
    hl.copy(hl.max_reduce(t, 1), hl.view(y, (64, 1)))


@hl.kernel(threads=128)
def exp_into_mma(a: f16[M, N].aligned(2), b: f16[M, N].aligned(2), c: f32[M, M]):
    ra = hl.register(f16, (64, 64))
    rb = hl.register(f16, (64, 64))
    hl.copy(hl.view(a, (64, 64)), ra)
    hl.copy(hl.view(b, (64, 64)), rb)
    acc = hl.zeros((64, 64), f32)
    hl.mma(hl.exp(ra), hl.exp(rb), acc)      # exp(0) = 1 in both operands' padding along K: 1 x 1
    hl.copy(acc, hl.view(c, (64, 64)))


@hl.kernel(threads=128)
def exp_times_zero_padding(a: f16[M, N].aligned(2), b: f16[M, N].aligned(2), c: f32[M, M]):
    ra = hl.register(f16, (64, 64))
    rb = hl.register(f16, (64, 64))
    hl.copy(hl.view(a, (64, 64)), ra)
    hl.copy(hl.view(b, (64, 64)), rb)
    acc = hl.zeros((64, 64), f32)
    hl.mma(hl.exp(ra), rb, acc)              # exp(0) = 1 times b's zero padding (same K extent): 0
    hl.copy(acc, hl.view(c, (64, 64)))


@hl.kernel(threads=128)
def prefetched_in_registers(x: f32[M, N].aligned(4), y: f32[M, 1]):
    r = hl.register(f32, (16, 64))
    hl.copy(hl.view(x, (16, 64), (0, 0)), r)
    acc = hl.full((16, 1), float("-inf"), f32)
    for k in hl.range(hl.cdiv(x.shape[1], 64)):
        hl.assign(acc, hl.maximum(acc, hl.max_reduce(r, 1)))   # r holds the previous chunk
        hl.copy(hl.view(x, (16, 64), (0, (k + 1) * 64)), r)
    hl.copy(acc, hl.view(y, (16, 1)))


def test_refuses_padding_lost_through_shared_memory() -> None:
    pattern = (r"lost_through_shared: reduce at test_ragged_reductions\.py:\d+ `hl\.copy\(hl\.max_reduce\(t, "
               r"1\).*lost through the copy into a part of %s .*other=")
    with pytest.raises(hl.KernelError, match=pattern) as e:
        lost_through_shared.trace()
    assert e.value.op == "reduce" and e.value.loc is not None


def test_refuses_non_zero_padding_along_mma_k() -> None:
    pattern = (r"exp_into_mma: mma at test_ragged_reductions\.py:\d+ .*operand a .*past its in-bounds "
               r"extent along K\) holding 1\.0.*other=0\.0")
    with pytest.raises(hl.KernelError, match=pattern):
        exp_into_mma.trace()


def test_non_zero_padding_along_k_against_zero_padding_is_accepted_and_right() -> None:
    """One operand's padding along K is 0 over the same extent: every padded product is 0, so
    the mma is right (the dequantized int4 weights of a W4A16 GEMM against zero-padded rows)."""
    from hexlayout.runtime import build
    from hexlayout.runtime.emulate import emulate

    rng = np.random.default_rng(4)
    a = (0.3 * rng.standard_normal((64, 40))).astype(np.float16)
    b = rng.standard_normal((64, 40)).astype(np.float16)
    c = np.full((64, 64), np.nan, np.float32)
    emulate(build(exp_times_zero_padding, "sm_80", compile=False), a, b, c)
    want = np.exp(a.astype(np.float64)) @ b.astype(np.float64).T
    np.testing.assert_allclose(c, want, rtol=2e-2, atol=2e-2)


def test_refuses_padding_carried_across_loop_iterations() -> None:
    with pytest.raises(hl.KernelError, match=r"prefetched_in_registers: reduce at .*lost through the loop at "
                                             r".*pad it differently"):
        prefetched_in_registers.trace()


def test_explicit_mask_and_zero_padding_into_mma_are_accepted() -> None:
    """A ``where`` mask clears lost padding; a load's zeros along K are right for an mma."""
    @hl.kernel(threads=128)
    def masked(x: f32[M, N].aligned(4), y: f32[M, 1]):
        r = hl.register(f32, (64, 64))
        hl.copy(hl.view(x, (64, 64)), r)
        s = hl.shared(f32, (64, 64, 2))
        hl.copy(r, s[:, :, 0])
        hl.syncthreads()
        t = hl.register(f32, (64, 64))
        hl.copy(s[:, :, 0], t)
        t = hl.where(hl.iota((64, 64), 1) < x.shape[1], t, float("-inf"))
        hl.copy(hl.max_reduce(t, 1), hl.view(y, (64, 1)))

    masked.trace()

    @hl.kernel(threads=128)
    def gemm(a: f16[M, N].aligned(2), b: f16[M, N].aligned(2), c: f32[M, M]):
        ra = hl.register(f16, (64, 64))
        rb = hl.register(f16, (64, 64))
        hl.copy(hl.view(a, (64, 64)), ra)
        hl.copy(hl.view(b, (64, 64)), rb)
        acc = hl.zeros((64, 64), f32)
        hl.mma(ra * 2.0, rb, acc)             # 2 * 0 = 0: still the dot product's identity
        hl.copy(acc, hl.view(c, (64, 64)))

    gemm.trace()


    @hl.kernel(threads=128)
    def where_then_mma(a: f16[M, N].aligned(2), b: f16[M, N].aligned(2), c: f32[M, M]):
        ra = hl.register(f16, (64, 64))
        rb = hl.register(f16, (64, 64))
        hl.copy(hl.view(a, (64, 64)), ra)
        hl.copy(hl.view(b, (64, 64)), rb)
        p = hl.exp(hl.where(hl.iota((64, 64), 1) < a.shape[1], hl.cast(ra, f32), float("-inf")))
        acc = hl.zeros((64, 64), f32)
        hl.mma(hl.cast(p, f16), rb, acc)      # the kernel masked: its choice reaches the mma
        hl.copy(acc, hl.view(c, (64, 64)))

    where_then_mma.trace()


@hl.kernel(threads=128)
def rowmax_and_gemm(a: f16[M, N].aligned(2), b: f16[P, N].aligned(2), c: f32[M, P].aligned(4),
                    m: f16[M, 1]):
    """One ragged tile both reduced and fed to an mma: its padding must stay 0 for the mma."""
    pid = hl.grid(hl.spatial(hl.cdiv(a.shape[0], 64)))
    ra = hl.register(f16, (64, 64))
    rb = hl.register(f16, (64, 64))
    hl.copy(hl.view(a, (64, 64), (pid * 64, 0)), ra)
    hl.copy(hl.view(b, (64, 64)), rb)
    hl.copy(hl.max_reduce(ra, 1), hl.view(m, (64, 1), (pid * 64, 0)))
    acc = hl.zeros((64, 64), f32)
    hl.mma(ra, rb, acc)
    hl.copy(acc, hl.view(c, (64, 64), (pid * 64, 0)))


def test_a_reduced_tile_cast_into_an_mma_is_not_overwritten() -> None:
    """The max's -inf must not reach the mma through the cast: no overwrite, no refusal."""
    @hl.kernel(threads=128)
    def max_then_mma(a: f16[M, N].aligned(2), b: f16[M, N].aligned(2), c: f32[M, M], m: f32[M, 1]):
        ra = hl.register(f16, (64, 64))
        rb = hl.register(f16, (64, 64))
        hl.copy(hl.view(a, (64, 64)), ra)
        hl.copy(hl.view(b, (64, 64)), rb)
        x = hl.cast(ra, f32) * 2.0
        hl.copy(hl.max_reduce(x, 1), hl.view(m, (64, 1)))
        acc = hl.zeros((64, 64), f32)
        hl.mma(hl.cast(x, f16), rb, acc)
        hl.copy(acc, hl.view(c, (64, 64)))

    red = [op for op in max_then_mma.trace().body.walk() if isinstance(op, Reduce)]
    assert red[0].valid is not None and not red[0].overwrite


def test_a_reduced_mma_operand_keeps_its_zero_padding() -> None:
    red = [op for op in rowmax_and_gemm.trace().body.walk() if isinstance(op, Reduce)]
    assert red[0].valid is not None and not red[0].overwrite
    rng = np.random.default_rng(16)
    a = -np.abs(rng.standard_normal(SHAPE)).astype(np.float16)
    b = rng.standard_normal((50, 37)).astype(np.float16)
    c = np.full((100, 50), np.nan, np.float32)
    m = np.full((100, 1), np.nan, np.float16)
    _emulate(rowmax_and_gemm, "sm_80", {"a": a, "b": b, "c": c, "m": m})
    np.testing.assert_array_equal(m[:, 0], a.max(axis=1))
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90a"])
def test_masked_reduction_compiles(arch: str) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from hexlayout.runtime import build

    built = build(softmax, arch)
    assert built.compiled.resources.spill_stores == 0


# --- accumulators of zero-padded tiles ------------------------------------------------------

@hl.kernel(threads=128)
def chunked_sum_of_squares(x: f16[M, N].aligned(2), y: f32[M, 1], *, ADD: bool = True):
    """Row sums of ``x^2`` over a runtime loop of 64-column chunks (the last one ragged): the
    squares accumulate element by element (``acc + x^2``, or ``acc - (-x^2)``), one reduction
    after the loop."""
    pid = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 16)))
    acc = hl.zeros((16, 64), f32)
    for k in hl.range(hl.cdiv(x.shape[1], 64)):
        r = hl.register(f16, (16, 64))
        hl.copy(hl.view(x, (16, 64), (pid * 16, k * 64)), r)
        xf = hl.cast(r, f32)
        hl.assign(acc, acc + xf * xf if ADD else acc - (xf * xf) * -1.0)
    hl.copy(hl.sum(acc, 1), hl.view(y, (16, 1), (pid * 16, 0)))


@hl.kernel(threads=128)
def chunked_sum_of_exp(x: f32[M, N].aligned(4), y: f32[M, 1]):
    """The same with ``exp``: its padding holds 1, not 0, so the accumulator's padding is lost."""
    acc = hl.zeros((16, 64), f32)
    for k in hl.range(hl.cdiv(x.shape[1], 64)):
        r = hl.register(f32, (16, 64))
        hl.copy(hl.view(x, (16, 64), (0, k * 64)), r)
        hl.assign(acc, acc + hl.exp(r))
    hl.copy(hl.sum(acc, 1), hl.view(y, (16, 1)))


@pytest.mark.parametrize("add", [True, False], ids=["add", "sub"])
def test_an_accumulator_of_zero_padded_tiles_has_no_padding(add: bool) -> None:
    """``acc + t`` where ``t``'s padding holds 0 is ``acc`` there: real data, not padding, so a
    reduction after the loop needs no mask (150 columns: chunks of 64, the last ragged)."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal((40, 150)).astype(np.float16)
    y = np.full((40, 1), np.nan, np.float32)
    reduces = [op for op in chunked_sum_of_squares.trace(ADD=add).body.walk() if isinstance(op, Reduce)]
    assert len(reduces) == 1 and reduces[0].valid is None
    _emulate(chunked_sum_of_squares, "sm_80", {"x": x, "y": y}, ADD=add)
    np.testing.assert_allclose(y[:, 0], (x.astype(np.float64) ** 2).sum(axis=1), rtol=1e-5)


def test_an_accumulator_of_non_zero_padding_is_refused() -> None:
    with pytest.raises(hl.KernelError, match=r"chunked_sum_of_exp: reduce at .*lost"):
        chunked_sum_of_exp.trace()
