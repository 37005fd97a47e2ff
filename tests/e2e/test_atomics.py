"""Atomic additions into global memory (``hl.atomic_add``, ``red.global.add``): split-K
partial products and a top-k combine (a scatter-add through an index tile with repeated
rows) in the emulator against float64, f32 / f16x2 / bf16x2 rounding against exact rational
arithmetic, CUDA and SASS, and refusals naming the kernel, the op and the line."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.emulator.atomics import add_bf16, add_f16, add_f32
from hexlayout.lang import bf16, f16, f32, i32
from hexlayout.runtime import build
from hexlayout.synth.solve import SynthesisError, synthesize

M, N, K, R, T = hl.dims("M N K R T")


@hl.kernel(threads=128)
def split_k(a: f16[M, K], b: f16[N, K], c: f32[M, N]):
    """c += a[:, kb] @ b[:, kb]^T for each 32-wide k slice kb, one block per slice."""
    kb = hl.grid(hl.spatial(hl.cdiv(a.shape[1], 32)))
    ra, rb = hl.register(f16, (64, 32)), hl.register(f16, (64, 32))
    hl.copy(a.tile((64, 32), (0, kb * 32)), ra)
    hl.copy(b.tile((64, 32), (0, kb * 32)), rb)
    acc = hl.zeros((64, 64), f32)
    hl.mma(ra, rb, acc)
    hl.atomic_add(c.tile((64, 64), (0, 0)), acc)


def _combine(dt: object) -> hl.Kernel:
    @hl.kernel(threads=128)
    def combine(y: dt[R, N], ids: i32[R], out: dt[T, N]):  # type: ignore[index]
        """out[ids[r]] += y[r]: 64 routed rows per block, several rows per token."""
        r0 = hl.grid(hl.spatial(hl.cdiv(ids.shape[0], 64))) * 64
        t = hl.register(dt, (64, 64))
        hl.copy(y[r0:r0 + 64, 0:64], t)
        rows = hl.register(i32, (64,))
        hl.copy(ids[r0:r0 + 64], rows)
        rows = hl.where(hl.iota((64,), 0) + r0 < ids.shape[0], rows, -1)
        hl.atomic_add(out[rows, 0:64], t)

    return combine


def test_split_k_sums_every_slice() -> None:
    syn = synthesize(split_k.trace(), "sm_80")
    assert "red.global.add.f32" in {i for _, i in syn.lowered.choices}
    rng = np.random.default_rng(0)
    # small integers: every partial sum is exact, whatever the order of the additions
    a = rng.integers(-3, 4, (64, 160)).astype(np.float16)
    b = rng.integers(-3, 4, (64, 160)).astype(np.float16)
    c = rng.integers(-8, 8, (64, 64)).astype(np.float32)
    want = c.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64).T
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    np.testing.assert_array_equal(c, want)
    # random data: within the rounding of 5 f32 additions
    a = rng.standard_normal((64, 160)).astype(np.float16)
    b = rng.standard_normal((64, 160)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("dt", "npt", "arch", "instr"), [
    (f16, np.float16, "sm_80", "red.global.add.f16x2"),
    (bf16, ml_dtypes.bfloat16, "sm_90a", "red.global.add.bf16x2"),
])
def test_top_k_combine_scatter_adds_repeated_rows(dt: object, npt: type, arch: str, instr: str) -> None:
    syn = synthesize(_combine(dt).trace(), arch)
    assert instr in {i for _, i in syn.lowered.choices}
    rng = np.random.default_rng(1)
    r, t = 150, 40                                      # ragged: 150 routed rows, repeated ids
    ids = rng.integers(0, t, r).astype(np.int32)
    y = rng.integers(-4, 5, (r, 64)).astype(npt)
    out = rng.integers(-4, 5, (t, 64)).astype(npt)
    want = out.astype(np.float64)
    np.add.at(want, ids, y.astype(np.float64))
    run(syn.lowered.kernel, {"y": y, "ids": ids, "out": out})
    np.testing.assert_array_equal(out.astype(np.float64), want)


# --- rounding, against exact rational arithmetic --------------------------------------------

def _finite_values(npt: type, bits_dtype: type) -> tuple[list[Fraction], np.ndarray]:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(bits_dtype)
    with np.errstate(invalid="ignore"):
        vals = bits.view(npt).astype(np.float64)
    keep = np.isfinite(vals)
    order = np.argsort(vals[keep], kind="stable")
    fin_bits = bits[keep][order]
    fracs = [Fraction(float(v)) for v in vals[keep][order]]
    return fracs, fin_bits


def _round_exact(s: Fraction, fracs: list[Fraction], fin_bits: np.ndarray, npt: type) -> float:
    """Round to nearest even among the format's finite values (overflow past the midpoint
    between the largest value and the next power of two goes to infinity)."""
    import bisect

    top = fracs[-1]
    ulp = top - fracs[-2]
    if s >= top + ulp / 2:
        return float("inf")
    if s <= -(top + ulp / 2):
        return float("-inf")
    i = bisect.bisect_left(fracs, s)
    if i < len(fracs) and fracs[i] == s:
        return float(fracs[i]) if s != 0 else 0.0
    lo, hi = i - 1, i
    dlo, dhi = s - fracs[lo], fracs[hi] - s
    if dlo < dhi:
        j = lo
    elif dhi < dlo:
        j = hi
    else:
        j = lo if int(fin_bits[lo]) % 2 == 0 else hi
    return float(np.array([fin_bits[j]]).view(npt)[0])


@pytest.mark.parametrize(("npt", "add"), [(np.float16, add_f16), (ml_dtypes.bfloat16, add_bf16)],
                         ids=["f16", "bf16"])
def test_16_bit_adds_round_once_to_nearest_even(npt: type, add: object) -> None:
    fracs, fin_bits = _finite_values(npt, np.uint16)
    rng = np.random.default_rng(2)
    a_bits = rng.integers(0, 1 << 16, 3000).astype(np.uint16)
    b_bits = rng.integers(0, 1 << 16, 3000).astype(np.uint16)
    b_bits[:1000] = (a_bits[:1000] + rng.integers(-40, 40, 1000)).astype(np.uint16)   # close pairs
    b_bits[1000:1200] = rng.integers(0, 0x400, 200).astype(np.uint16)                 # subnormals
    a, b = a_bits.view(npt), b_bits.view(npt)
    with np.errstate(invalid="ignore"):
        got = add(a, b).astype(np.float64)
        xs, ys = a.astype(np.float64), b.astype(np.float64)
    for x, y, g in zip(xs, ys, got):
        if not (np.isfinite(x) and np.isfinite(y)):
            with np.errstate(invalid="ignore"):
                want = x + y
            assert (np.isnan(want) and np.isnan(g)) or want == g, (x, y, g)
            continue
        want = _round_exact(Fraction(float(x)) + Fraction(float(y)), fracs, fin_bits, npt)
        assert want == g, (x, y, g, want)


def test_f32_adds_flush_subnormals() -> None:
    tiny = np.float32(2.0 ** -130)                       # a subnormal
    one = np.float32(1.0)
    x = np.array([tiny, one, np.float32(1.25 * 2.0 ** -126), np.float32(1.5), -tiny], np.float32)
    y = np.array([tiny, tiny, np.float32(-(2.0 ** -126)), np.float32(2.0 ** -24), one], np.float32)
    got = add_f32(x, y)
    # a subnormal sum (2^-128) flushes; 1.5 + 2^-24 ties to even (1.5)
    want = np.array([0.0, 1.0, 0.0, 1.5, 1.0], np.float32)
    np.testing.assert_array_equal(got, want)
    assert np.signbit(add_f32(np.array([-tiny]), np.array([-tiny]))[0])
    rng = np.random.default_rng(3)
    a = rng.standard_normal(1000).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)
    exact = [Fraction(float(p)) + Fraction(float(q)) for p, q in zip(a, b)]
    np.testing.assert_array_equal(add_f32(a, b), np.array([float(e) for e in exact]).astype(np.float32))


# --- code and refusals -----------------------------------------------------------------------

@pytest.mark.nvrtc
def test_red_instructions_in_the_cubin() -> None:
    k = build(split_k, "sm_80")
    assert "red.global.add.f32" in k.generated.source
    assert any(op.startswith("RED") and "F32" in op for op in k.compiled.sass_counts())
    h = build(_combine(f16), "sm_80")
    assert "red.global.add.noftz.f16x2" in h.generated.source and h.compiled.resources.spill_stores == 0
    assert any(op.startswith("RED") for op in h.compiled.sass_counts())
    g = build(_combine(bf16), "sm_90a")
    assert "red.global.add.noftz.bf16x2" in g.generated.source
    assert any(op.startswith("RED") for op in g.compiled.sass_counts())


def test_refusals_name_kernel_op_and_line() -> None:
    @hl.kernel(threads=128)
    def into_shared(c: f32[M, N]):
        s = hl.shared(f32, (64, 64))
        hl.atomic_add(s, hl.zeros((64, 64), f32))

    with pytest.raises(hl.KernelError, match=r"into_shared: atomic_add at .*must be a global view"):
        into_shared.trace()

    @hl.kernel(threads=128)
    def ints(c: i32[M, N]):
        hl.atomic_add(c.tile((64, 64), (0, 0)), hl.zeros((64, 64), i32))

    with pytest.raises(hl.KernelError, match=r"ints: atomic_add at .*takes f32, f16 and bf16"):
        ints.trace()

    with pytest.raises(SynthesisError,
                       match=r"combine: atomic_add at .*hl.atomic_add\(out\[rows.*needs sm_90a"):
        synthesize(_combine(bf16).trace(), "sm_80")
