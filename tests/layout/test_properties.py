"""Hypothesis property tests: each operation's defining post-condition.

Layouts come from ``_layout_cases`` (compact layouts with permuted modes, optional gaps
and stride-0 modes, random nesting), so CuTe's divisibility preconditions hold by
construction; where an operation may still legitimately refuse (ValueError), the
property is checked on every input it accepts, and the tests assert that most inputs
are accepted.
"""

from __future__ import annotations

import random

import numpy as np
from _layout_cases import aligned_tiler, random_compact, random_divisor_layout, random_layout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hexlayout.layout import (
    Layout,
    Swizzle,
    blocked_product,
    coalesce,
    complement,
    composition,
    cosize,
    crd2idx,
    depth,
    downcast,
    filter,
    flat_divide,
    flat_product,
    flatten,
    idx2crd,
    left_inverse,
    logical_divide,
    logical_product,
    raked_product,
    right_inverse,
    size,
    tiled_divide,
    upcast,
    zipped_divide,
    zipped_product,
)
from hexlayout.layout.inttuple import is_tuple, unflatten

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
seeds = st.integers(0, 2**32 - 1)


def rng_of(seed: int) -> random.Random:
    return random.Random(seed)


def values(lay: Layout, n: int | None = None) -> np.ndarray:
    return np.asarray(lay(np.arange(size(lay) if n is None else n)))


# --- coordinates ----------------------------------------------------------------------

@SETTINGS
@given(seeds)
def test_crd2idx_idx2crd_inverse(seed: int) -> None:
    lay = random_layout(rng_of(seed))
    shp = lay.shape
    for i in range(size(lay)):
        c = idx2crd(i, shp)
        assert crd2idx(c, shp) == i
        assert lay(c) == lay(i)
    # numpy vectorization agrees
    idx = np.arange(size(lay))
    assert np.array_equal(lay(idx), [lay(i) for i in range(size(lay))])


# --- coalesce / filter ------------------------------------------------------------------

@SETTINGS
@given(seeds)
def test_coalesce(seed: int) -> None:
    lay = random_layout(rng_of(seed), zeros=True)
    c = coalesce(lay)
    assert size(c) == size(lay)
    assert depth(c) <= 1
    assert np.array_equal(values(c), values(lay))
    if lay.rank > 1:
        prof = tuple(1 for _ in range(lay.rank))
        cp = coalesce(lay, prof)
        assert cp.rank == lay.rank
        assert np.array_equal(values(cp), values(lay))
        assert all(size(cp[i]) == size(lay[i]) for i in range(lay.rank))


@SETTINGS
@given(seeds)
def test_filter(seed: int) -> None:
    lay = random_layout(rng_of(seed), zeros=True)
    f = filter(lay)
    assert depth(f) <= 1
    assert set(values(f).tolist()) == set(values(lay).tolist())
    flat_d = f.stride if is_tuple(f.stride) else (f.stride,)
    assert size(f) == 1 or 0 not in flat_d


# --- composition -------------------------------------------------------------------------

def _check_composition(a: Layout, b: object) -> bool:
    try:
        r = composition(a, b)
    except ValueError:
        return False
    if isinstance(b, tuple):
        assert r.rank == len(b)
        for i, bi in enumerate(b):
            if bi is None:
                assert r[i] == a[i]
            else:
                _check_composition(a[i], bi)
        return True
    bl = b if isinstance(b, Layout) else Layout(b)
    # compatible with B: same shape profile when B is a tuple shape, same size always
    assert size(r) == size(bl)
    if is_tuple(bl.shape):
        assert is_tuple(r.shape) and len(r.shape) == len(bl.shape)
        assert all(size(r[i]) == size(bl[i]) for i in range(len(bl.shape)))
    n = size(bl)
    assert np.array_equal(values(r), a(bl(np.arange(n)))), (str(a), str(bl), str(r))
    return True


@SETTINGS
@given(seeds)
def test_composition_within_domain(seed: int) -> None:
    rng = rng_of(seed)
    a = random_layout(rng, zeros=rng.random() < 0.3)
    assert _check_composition(a, aligned_tiler(rng, a))  # an admissible B is always accepted
    n = size(random_compact(rng))
    assert _check_composition(Layout(n, rng.choice((1, 2))), random_divisor_layout(rng, n))


@SETTINGS
@given(seeds)
def test_composition_past_size_and_stride0(seed: int) -> None:
    rng = rng_of(seed)
    a = random_layout(rng, zeros=rng.random() < 0.3)
    # B reaching past size(A): C++ extends A's last mode
    assert _check_composition(a, Layout(size(a) * rng.choice((2, 3, 4)), 1))
    # stride-0 modes of B stay stride 0
    z = Layout((rng.choice((2, 3)), size(a)), (0, 1))
    assert _check_composition(a, z)
    assert composition(a, z)[0].stride == 0


@SETTINGS
@given(seeds)
def test_composition_by_mode(seed: int) -> None:
    rng = rng_of(seed)
    a = random_layout(rng, zeros=rng.random() < 0.3)
    k = rng.randint(1, a.rank)
    tiler = tuple(None if rng.random() < 0.2 else aligned_tiler(rng, a[i]) for i in range(k))
    assert _check_composition(a, tiler)
    def prefix(m: Layout) -> int:  # an admissible integral tile: a prefix of the coalesced shape
        shp = coalesce(m).shape
        shp = list(shp) if is_tuple(shp) else [shp]
        return int(np.prod(shp[: rng.randint(0, len(shp))]))

    ints = tuple(prefix(a[i]) for i in range(k))
    assert _check_composition(a, ints)


# --- complement ---------------------------------------------------------------------------

@SETTINGS
@given(seeds, st.integers(1, 4), st.integers(0, 9))
def test_complement(seed: int, mult: int, extra: int) -> None:
    rng = rng_of(seed)
    lay = random_layout(rng, zeros=rng.random() < 0.3)
    cot = mult * cosize(lay) + extra
    c = complement(lay, cot)
    cv = values(c)
    lv = values(lay)
    assert cv[0] == 0
    assert np.all(np.diff(cv) > 0)  # ordered, strictly increasing
    assert not (set(cv[1:].tolist()) & set(lv.tolist()))  # disjoint (other than 0)
    # (L, C) is injective on the non-degenerate part of L
    f = filter(lay)
    joint = (values(f)[:, None] + cv[None, :]).reshape(-1)
    assert len(set(joint.tolist())) == joint.size
    # bounded by the cotarget: reaches it, with the last mode needed
    assert size(f) * size(c) >= cot / max(1, cosize(f) // size(f))
    assert cosize(Layout((f.shape, c.shape), (f.stride, c.stride))) >= min(cot, 1)
    if size(c) > 1:
        last_step = c(size(c) - 1)
        assert last_step < max(cot, cosize(f)) * 2 * cosize(f)


@SETTINGS
@given(seeds)
def test_complement_of_compact_tiler_tiles_exactly(seed: int) -> None:
    rng = rng_of(seed)
    n = rng.choice((8, 12, 16, 24, 32, 48, 64))
    t = random_divisor_layout(rng, n)
    c = complement(t, n)
    joint = (values(t)[:, None] + values(c)[None, :]).reshape(-1)
    assert sorted(joint.tolist()) == list(range(n))  # (T, C) is a bijection onto [0, n)


# --- inverses ---------------------------------------------------------------------------

@SETTINGS
@given(seeds)
def test_right_inverse(seed: int) -> None:
    lay = random_layout(rng_of(seed), zeros=True)
    r = right_inverse(lay)
    n = size(r)
    assert np.array_equal(lay(r(np.arange(n))), np.arange(n))


@SETTINGS
@given(seeds)
def test_right_inverse_of_bijection_is_full(seed: int) -> None:
    lay = random_compact(rng_of(seed))
    r = right_inverse(lay)
    assert size(r) == size(lay)
    assert np.array_equal(r(lay.indices()), np.arange(size(lay)))


@SETTINGS
@given(seeds)
def test_left_inverse(seed: int) -> None:
    lay = random_layout(rng_of(seed))  # injective: no stride-0 modes, divisible strides
    li = left_inverse(lay)
    assert np.array_equal(li(lay.indices()), np.arange(size(lay)))


# --- divides ----------------------------------------------------------------------------

@SETTINGS
@given(seeds)
def test_logical_divide(seed: int) -> None:
    rng = rng_of(seed)
    lay = random_compact(rng) if rng.random() < 0.5 else random_layout(rng)
    t = aligned_tiler(rng, lay)
    if rng.random() < 0.3:  # any ordered divisor tiler of a 1-D layout
        lay = Layout(size(lay))
        t = random_divisor_layout(rng, size(lay))
    d = logical_divide(lay, t)
    assert size(d) == size(lay)
    assert size(d[0]) == size(t)
    assert size(d[0]) * size(d[1]) == size(lay)
    # mode 0 is the tile: lay o t
    assert np.array_equal(values(d[0]), lay(t.indices()))
    # the divide permutes the layout's values
    assert sorted(values(d).tolist()) == sorted(values(lay).tolist())
    # zipped / tiled / flat forms have the same function
    for f in (zipped_divide, tiled_divide, flat_divide):
        assert np.array_equal(values(f(lay, t)), values(d))


@SETTINGS
@given(seeds)
def test_divide_by_mode(seed: int) -> None:
    rng = rng_of(seed)
    lay = random_compact(rng, max_modes=4)
    k = rng.randint(1, lay.rank)
    tiler = tuple(aligned_tiler(rng, lay[i]) for i in range(k))
    d = logical_divide(lay, tiler)
    assert d.rank == lay.rank
    for i in range(k):
        assert size(d[i][0]) == size(tiler[i])
    assert sorted(values(d).tolist()) == sorted(values(lay).tolist())
    z = zipped_divide(lay, tiler)
    assert z.rank == 2 and z[0].rank == k
    assert size(z[0]) == int(np.prod([size(t) for t in tiler]))
    assert sorted(values(z).tolist()) == sorted(values(lay).tolist())
    assert z.rank == 2 and np.array_equal(np.sort(values(tiled_divide(lay, tiler))), np.sort(values(z)))
    assert np.array_equal(values(flat_divide(lay, tiler)), values(tiled_divide(lay, tiler)))


# --- products ---------------------------------------------------------------------------

@SETTINGS
@given(seeds)
def test_products(seed: int) -> None:
    rng = rng_of(seed)
    a = random_compact(rng, max_modes=3, max_size=32)  # no gaps: every B is admissible
    b = random_layout(rng, max_modes=3, max_size=16)
    p = logical_product(a, b)
    assert p[0] == a  # mode 0 is the block
    assert size(p) == size(a) * size(b)
    c = complement(a, size(a) * cosize(b))
    assert np.array_equal(values(p[1]), c(b.indices()))
    assert len(set(values(p).tolist())) == size(p)  # injective block copies
    for f in (blocked_product, raked_product):
        q = f(a, b)
        assert q.rank == max(a.rank, b.rank)
        assert size(q) == size(a) * size(b)
        assert sorted(values(q).tolist()) == sorted(values(p).tolist())
    bq = blocked_product(a, b)
    r = max(a.rank, b.rank)
    if r > 1:
        # blocked: mode i is (A_i, B_i) with A_i innermost
        for i in range(min(a.rank, r)):
            assert size(bq[i][0]) == size(a[i])
    assert np.array_equal(values(zipped_product(a, b)), values(p))
    assert np.array_equal(np.sort(values(flat_product(a, b))), np.sort(values(p)))


# --- recast / swizzle ----------------------------------------------------------------------

@SETTINGS
@given(seeds, st.sampled_from([2, 4]))
def test_upcast_downcast_round_trip(seed: int, n: int) -> None:
    lay = random_compact(rng_of(seed), max_size=128)
    if size(lay) == 1:
        lay = Layout(2)
    # extent-1 modes get stride 0, as in CuTe's compact layouts
    if is_tuple(lay.shape):
        strides = [0 if e == 1 else d for e, d in zip(flatten(lay.shape), flatten(lay.stride))]
        lay = Layout(lay.shape, unflatten(strides, lay.shape))
    down = downcast(lay, n)
    assert size(down) == size(lay) * n
    # element j of old element i is new element n*L(i) + j
    flat_d = flatten(lay.stride) if is_tuple(lay.stride) else (lay.stride,)
    assert 1 in flat_d
    assert upcast(down, n) == lay
    vals = np.sort(values(down))
    assert np.array_equal(vals, np.sort((n * values(lay)[:, None] + np.arange(n)[None, :]).reshape(-1)))


@SETTINGS
@given(st.integers(0, 4), st.integers(0, 4), st.integers(-6, 6))
def test_swizzle_bijection(b: int, m: int, s: int) -> None:
    if abs(s) < b:
        return
    sw = Swizzle(b, m, s)
    p = sw.period()
    x = np.arange(p)
    y = sw(x)
    assert sorted(y.tolist()) == list(range(p))  # a bijection on its period
    assert np.array_equal(sw(y), x)  # an involution
    assert np.array_equal(sw(x + p), y + p)  # periodic
    assert np.array_equal(y & ((1 << m) - 1), x & ((1 << m) - 1))  # low M bits kept
