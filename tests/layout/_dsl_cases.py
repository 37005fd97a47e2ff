"""Random differential cases: (op name, our callable args, JSON-encoded args for the driver)."""

from __future__ import annotations

import random

from _layout_cases import random_compact, random_divisor_layout, random_layout

from hexlayout.layout import Layout, Swizzle, size


def enc(x: object) -> object:
    if isinstance(x, Layout):
        return {"L": [x.shape, x.stride]}
    if isinstance(x, Swizzle):
        return {"S": [x.bits, x.base, x.shift]}
    if isinstance(x, tuple):
        return [enc(e) for e in x]
    return x


def make_cases(seed: int = 0, n_per_op: int = 30) -> list[tuple]:
    rng = random.Random(seed)
    cases: list[tuple] = []

    def add(op: str, *args: object) -> None:
        cases.append((op, *args))

    for _ in range(n_per_op):
        a = random_layout(rng, zeros=rng.random() < 0.3)
        # composition: B inside A's domain, past it, and by-mode tilers
        b = random_divisor_layout(rng, size(a)) if size(a) > 1 else Layout(1, 0)
        add("composition", a, b)
        add("composition", a, random_layout(rng, max_modes=3, max_size=64, zeros=True))
        add("composition", a, Layout(rng.choice((2, 4, 8)) * size(a), rng.choice((1, 2))))
        if a.rank >= 2:
            t = tuple(random_divisor_layout(rng, size(a[i])) if rng.random() < 0.8 else None
                      for i in range(rng.randint(1, a.rank)))
            add("composition", a, t)
        # complement
        c = random_layout(rng, zeros=rng.random() < 0.3)
        add("complement", c, rng.choice((1, 2, 4)) * (c.cosize() + rng.randint(0, 7)))
        add("complement", c, (rng.choice((2, 4, 6)), rng.choice((8, 16, 24))))
        # inverses
        add("right_inverse", random_layout(rng, zeros=rng.random() < 0.3))
        add("left_inverse", random_layout(rng))
        add("coalesce", random_layout(rng, zeros=True))
        add("filter", random_layout(rng, zeros=True))
        # divides
        d = random_compact(rng) if rng.random() < 0.6 else random_layout(rng)
        add("logical_divide", d, random_divisor_layout(rng, size(d)))
        if d.rank >= 2:
            t = tuple(random_divisor_layout(rng, size(d[i])) if rng.random() < 0.8 else None
                      for i in range(rng.randint(1, d.rank)))
            for op in ("logical_divide", "zipped_divide", "tiled_divide", "flat_divide"):
                add(op, d, t)
        else:
            for op in ("zipped_divide", "tiled_divide", "flat_divide"):
                add(op, d, random_divisor_layout(rng, size(d)))
        # products
        p = random_layout(rng, max_modes=3, max_size=32)
        q = random_layout(rng, max_modes=3, max_size=16)
        for op in ("logical_product", "blocked_product", "raked_product"):
            add(op, p, q)
        # recast (16-bit <-> 8/32-bit units)
        r = random_compact(rng, max_size=128)
        add("recast_layout", r, 16, 32)
        add("recast_layout", r, 16, 8)
        # thread-value layouts
        thr = random_compact(rng, max_modes=2, max_size=32)
        val = random_compact(rng, max_modes=2, max_size=8)
        if thr.rank == 2 and val.rank == 2:
            add("make_layout_tv", thr, val)
    return cases
