"""Random layouts whose strides satisfy CuTe's divisibility preconditions.

Shared by the property tests (through hypothesis's ``randoms()``) and the differential
tests against CuTe DSL (with a seeded ``random.Random``). Every generator takes a
``random.Random`` so the cases are reproducible.
"""

from __future__ import annotations

import random

from hexlayout.layout import Layout
from hexlayout.layout.inttuple import unflatten

EXTENTS = (1, 2, 2, 2, 3, 4, 4, 5, 6, 8)


def nest(rng: random.Random, flat: list[int]) -> object:
    """Random hierarchical grouping of consecutive leaves (a profile for ``unflatten``)."""
    n = len(flat)
    if n == 1:
        return 0 if rng.random() < 0.6 else (0,)
    out: list[object] = []
    i = 0
    while i < n:
        k = rng.randint(1, min(3, n - i))
        out.append(0 if k == 1 else nest(rng, [0] * k))
        i += k
    if len(out) == 1:
        return out[0]
    return tuple(out)


def _profile_leaves(p: object) -> int:
    return sum(_profile_leaves(e) for e in p) if isinstance(p, tuple) else 1


def random_flat_shape(rng: random.Random, max_modes: int = 4, max_size: int = 256) -> list[int]:
    n = rng.randint(1, max_modes)
    shp: list[int] = []
    size = 1
    for _ in range(n):
        e = rng.choice(EXTENTS)
        if size * e > max_size:
            e = 1
        shp.append(e)
        size *= e
    return shp


def random_layout(rng: random.Random, max_modes: int = 4, max_size: int = 256, gaps: bool = True,
                  zeros: bool = False, flat: bool = False) -> Layout:
    """A layout whose non-zero strides, sorted, each are multiples of the extent below them
    (compact layout with permuted modes, optionally with gaps and stride-0 modes)."""
    shp = random_flat_shape(rng, max_modes, max_size)
    order = list(range(len(shp)))
    rng.shuffle(order)
    strides = [0] * len(shp)
    cur = 1
    for k in order:
        if gaps and rng.random() < 0.3:
            cur *= rng.choice((2, 3, 4))
        strides[k] = cur
        cur *= shp[k]
    if zeros:
        for k in range(len(shp)):
            if rng.random() < 0.2:
                strides[k] = 0
    if flat or len(shp) == 1 and rng.random() < 0.5:
        if len(shp) == 1:
            return Layout(shp[0], strides[0])
        return Layout(tuple(shp), tuple(strides))
    prof = nest(rng, shp)
    while _profile_leaves(prof) != len(shp):
        prof = nest(rng, shp)
    return Layout(unflatten(shp, prof), unflatten(strides, prof))


def random_compact(rng: random.Random, max_modes: int = 4, max_size: int = 256) -> Layout:
    """A bijection onto [0, size): a compact layout with permuted modes."""
    return random_layout(rng, max_modes, max_size, gaps=False)


def random_divisor_layout(rng: random.Random, n: int, max_modes: int = 3) -> Layout:
    """A layout of size dividing ``n`` whose image lies in [0, n) and strides divide: a
    tiler for divides (shape factors of ``n``, ordered strides that are products of them)."""
    factors = []
    m = n
    p = 2
    while m > 1:
        while m % p == 0:
            factors.append(p)
            m //= p
        p += 1
    rng.shuffle(factors)
    # group factors into at most max_modes+1 chunks: the first chunks become modes, the
    # rest gaps
    chunks: list[int] = []
    for f in factors:
        if chunks and rng.random() < 0.5:
            chunks[-1] *= f
        else:
            chunks.append(f)
    if not chunks:
        return Layout(1, 0)
    kinds = [rng.random() < 0.7 for _ in chunks]  # True: a mode, False: a gap
    if not any(kinds):
        kinds[0] = True
    shp, strides = [], []
    cur = 1
    for c, is_mode in zip(chunks, kinds):
        if is_mode:
            shp.append(c)
            strides.append(cur)
        cur *= c
    idx = list(range(len(shp)))
    rng.shuffle(idx)
    shp = [shp[i] for i in idx][:max_modes]
    strides = [strides[i] for i in idx][:max_modes]
    if len(shp) == 1:
        return Layout(shp[0], strides[0])
    return Layout(tuple(shp), tuple(strides))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def aligned_tiler(rng: random.Random, lay: Layout) -> Layout:
    """A tiler admissible for ``lay`` (for composition and logical_divide): each of its
    modes ``t_k : P_k u_k`` lies inside one mode ``s_k`` of ``coalesce(lay)`` (``P_k`` the
    prefix product of the coalesced shape, ``t_k u_k | s_k``), modes in random order."""
    from hexlayout.layout import coalesce

    c = coalesce(lay)
    shp = list(c.shape) if isinstance(c.shape, tuple) else [c.shape]
    modes: list[tuple[int, int]] = []
    pre = 1
    for s in shp:
        t = rng.choice(_divisors(s))
        u = rng.choice(_divisors(s // t)) if rng.random() < 0.3 else 1
        if t > 1:
            modes.append((t, pre * u))
        pre *= s
    if not modes:
        return Layout(1, 0)
    rng.shuffle(modes)
    if len(modes) == 1:
        return Layout(*modes[0])
    return Layout(tuple(m[0] for m in modes), tuple(m[1] for m in modes))
