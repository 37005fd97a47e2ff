"""Changing the element width a layout counts in.

- ``upcast(L, n)``: n old elements become one new element. The stride-1 (or -1) mode
  shrinks ``s -> ceil(s / n)``; every other stride ``d -> ceil(d / n)`` (CuTe C++).
- ``downcast(L, n)``: one old element becomes n new ones: the stride-±1 mode grows
  ``s -> s * n``; every other stride ``d -> d * n``.
- ``recast_layout(L, old_bits, new_bits)``: upcast / downcast by the ratio of widths.

A ``Swizzle<B,M,S>`` changes its base: ``upcast(Sw, 2^k) = Sw<B,M-k,S>`` (when
``k > M``: ``Sw<max(B+M-k,0),0,S>``, as in C++), ``downcast(Sw, 2^k) = Sw<B,M+k,S>``;
a ``ComposedLayout`` recasts all three parts (its offset must divide by n on upcast).

Post-conditions: ``upcast(downcast(L, n), n) == L`` when L has a stride-1 mode and all
other strides are non-zero; ``downcast(L, n)(n*i + j) == n*L(i) + j`` for the stride-1
mode's elements.

Deliberate deviations from C++ (static asserts there): upcast raises ValueError when a
stride and ``n`` do not divide one another; downcast raises ValueError when no mode has
stride +-1 ("Downcast requires adjacent elements"); non-power-of-two factors raise for
swizzles.
"""

from __future__ import annotations

from math import gcd
from typing import Any

from .inttuple import ceil_div, flatten, is_int, is_tuple, signum
from .layout import Layout

__all__ = ["upcast", "downcast", "recast_layout"]


def _log2(n: int, op: str) -> int:
    if n <= 0 or n & (n - 1):
        raise ValueError(f"{op}: factor {n} must be a power of two for a swizzle")
    return n.bit_length() - 1


def upcast(layout: Any, n: int) -> Any:
    from .composed import ComposedLayout
    from .swizzle import Swizzle

    if not is_int(n) or n <= 0:
        raise ValueError(f"upcast({layout}, {n!r}): the factor must be a positive int")
    if isinstance(layout, Swizzle):
        k = _log2(n, f"upcast({layout}, {n})")
        if layout.base >= k:
            return Swizzle(layout.bits, layout.base - k, layout.shift)
        return Swizzle(max(layout.bits + layout.base - k, 0), 0, layout.shift)
    if isinstance(layout, ComposedLayout):
        if layout.offset % n:
            raise ValueError(f"upcast({layout}, {n}): the offset {layout.offset} is not divisible by {n}")
        return ComposedLayout(upcast(layout.layout_a, n), layout.offset // n, upcast(layout.layout_b, n))
    if not isinstance(layout, Layout):
        raise ValueError(f"upcast({layout!r}, {n}): not a Layout, Swizzle or ComposedLayout")

    def rec(s: Any, d: Any) -> tuple[Any, Any]:
        if is_tuple(s):
            pairs = [rec(a, b) for a, b in zip(s, d)]
            return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
        if d == 0:
            return s, 0
        if abs(d) % n != 0 and n % abs(d) != 0:
            raise ValueError(f"upcast({layout}, {n}): stride {d} and {n} do not divide each other")
        return ceil_div(s, ceil_div(n, abs(d))), signum(d) * ceil_div(abs(d), n)

    s, d = rec(layout.shape, layout.stride)
    return Layout(s, d)


def downcast(layout: Any, n: int) -> Any:
    from .composed import ComposedLayout
    from .swizzle import Swizzle

    if not is_int(n) or n <= 0:
        raise ValueError(f"downcast({layout}, {n!r}): the factor must be a positive int")
    if isinstance(layout, Swizzle):
        k = _log2(n, f"downcast({layout}, {n})")
        return Swizzle(layout.bits, layout.base + k, layout.shift)
    if isinstance(layout, ComposedLayout):
        return ComposedLayout(downcast(layout.layout_a, n), layout.offset * n, downcast(layout.layout_b, n))

    if not isinstance(layout, Layout):
        raise ValueError(f"downcast({layout!r}, {n}): not a Layout, Swizzle or ComposedLayout")
    flat_d = flatten(layout.stride) if is_tuple(layout.stride) else (layout.stride,)
    if 1 not in flat_d and -1 not in flat_d:
        raise ValueError(f"downcast({layout}, {n}): downcast requires adjacent elements (a stride-1 mode)")

    def rec(s: Any, d: Any) -> tuple[Any, Any]:
        if is_tuple(s):
            pairs = [rec(a, b) for a, b in zip(s, d)]
            return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
        if d in (1, -1):
            return s * n, d
        return s, d * n

    s, d = rec(layout.shape, layout.stride)
    return Layout(s, d)


def recast_layout(layout: Any, old_bits: int, new_bits: int) -> Any:
    """Re-express ``layout`` (in units of ``old_bits``) in units of ``new_bits``."""
    if old_bits <= 0 or new_bits <= 0:
        raise ValueError(f"recast_layout({layout}, {old_bits}, {new_bits}): widths must be positive")
    g = gcd(old_bits, new_bits)
    num, den = new_bits // g, old_bits // g
    out = layout
    if num != 1:
        out = upcast(out, num)
    if den != 1:
        out = downcast(out, den)
    return out
