"""Functional composition of layouts: ``R = A o B`` with ``R(c) = A(B(c))`` for every ``c`` in B's domain.

``composition(A, B)`` follows CuTe C++ (``cute/layout.hpp``): ``A`` is first flattened
and coalesced preserving its values past ``size(A)`` (its last mode is extended, so a
``B`` reaching past ``size(A)`` reads A's last stride further, exactly as in C++);
``B`` distributes over its modes (right-distributivity), stride-0 modes of ``B``
stay stride 0, and each integral mode ``s:d`` of ``B`` is threaded through A's modes
by dividing out ``d`` and then modding out ``s``. The result is compatible with B.

``B`` may also be a tiler: a tuple of layouts / shapes / ``None`` (``_``) applied
mode by mode to A (modes of A past the tiler's rank are dropped, as in CuTe), or an
integer ``n`` meaning ``n:1``. ``A`` may be a ``Swizzle`` or ``ComposedLayout``; the
result is then a ``ComposedLayout``.

Deliberate deviation from C++: the divisibility conditions are always checked, and a
violation raises ValueError (C++ checks only static values and otherwise returns a wrong
layout): for a mode ``s:d`` of B (``s > 1``) and a mode of A of extent ``a`` that B steps
over, ``a | d``; that B leaves part-way, ``d | a`` and the remaining extent divisible.
Conversely a size-1 mode of B is never rejected (C++ asserts statically there too).
Known limitation shared with C++: the check is per mode of B, so a B whose modes are
each admissible but jointly straddle a mode boundary of A (``A = (6,4):(144,36)``,
``B = (5,2):(1,5)``) still yields ``(A o B0, A o B1)``, which differs from ``A(B(c))``.
"""

from __future__ import annotations

from typing import Any

from .composed import ComposedLayout
from .inttuple import IntTuple, ceil_div, fmt, is_int, is_tuple, signum
from .layout import Layout, _trusted, coalesce_x, make_layout
from .swizzle import Swizzle

__all__ = ["composition", "with_shape", "Tiler"]

Tiler = Any  # Layout | int | None | tuple[Tiler, ...]


def _impl(ls: Any, ld: Any, rs: Any, rd: Any, lhs: Layout, rhs: Any) -> Layout:
    """CuTe's ``detail::composition_impl`` on a flat (coalesced) ``ls:ld`` and any ``rs:rd``."""
    if is_tuple(rs):
        modes = [_impl(ls, ld, s, d, lhs, rhs) for s, d in zip(rs, rd)]
        return _trusted(tuple(m.shape for m in modes), tuple(m.stride for m in modes))
    if rd == 0:
        return _trusted(rs, 0)
    if not is_tuple(ls):
        return _trusted(rs, rd * ld)
    result_shape: list[int] = []
    result_stride: list[int] = []
    rest_shape, rest_stride = rs, rd
    for curr_shape, curr_stride in zip(ls[:-1], ld[:-1]):
        abs_stride = abs(rest_stride)
        next_shape = ceil_div(curr_shape, abs_stride)
        next_stride = ceil_div(abs_stride, curr_shape) * signum(rest_stride)
        if rest_shape == 1:
            rest_stride = next_stride
            continue
        # Stride divisibility: B steps over this mode of A (next_shape == 1) only if its
        # stride is a multiple of the mode's extent; B crosses out of this mode
        # (next_shape < rest_shape) only if its stride divides the mode's extent.
        if next_shape == 1:
            if abs_stride % curr_shape != 0:
                raise ValueError(
                    f"composition({lhs}, {rhs}): stride divisibility condition fails: stride "
                    f"{rest_stride} of the right operand vs. extent {curr_shape} of the left operand"
                )
            rest_stride = next_stride
            continue
        new_shape = min(next_shape, rest_shape)
        if new_shape < rest_shape:
            if curr_shape % abs_stride != 0:
                raise ValueError(
                    f"composition({lhs}, {rhs}): stride divisibility condition fails: stride "
                    f"{rest_stride} of the right operand does not divide extent {curr_shape} "
                    "of the left operand"
                )
            if rest_shape % new_shape != 0:
                raise ValueError(
                    f"composition({lhs}, {rhs}): shape divisibility condition fails: "
                    f"{rest_shape} is not divisible by {new_shape}"
                )
        result_shape.append(new_shape)
        result_stride.append(rest_stride * curr_stride)
        rest_shape //= new_shape
        rest_stride = next_stride
    if not result_shape:
        return _trusted(rest_shape, rest_stride * ld[-1])
    if rest_shape == 1:
        if len(result_shape) == 1:
            return _trusted(result_shape[0], result_stride[0])
        return _trusted(tuple(result_shape), tuple(result_stride))
    return _trusted(tuple(result_shape) + (rest_shape,), tuple(result_stride) + (rest_stride * ld[-1],))


def composition(lhs: Any, rhs: Tiler) -> Any:
    """``lhs o rhs`` (CuTe's composition); see the module docstring for the cases."""

    if isinstance(lhs, Swizzle):
        if rhs is None:
            return lhs
        return ComposedLayout(lhs, 0, _as_layout_tiler(rhs))
    if isinstance(lhs, ComposedLayout):
        return ComposedLayout(lhs.layout_a, lhs.offset, composition(lhs.layout_b, rhs))
    if not isinstance(lhs, Layout):
        raise ValueError(f"composition: left operand {lhs!r} is not a Layout, Swizzle or ComposedLayout")
    if rhs is None:
        return lhs
    if isinstance(rhs, ComposedLayout):
        raise ValueError(f"composition({lhs}, {rhs}): a Layout cannot be composed with a ComposedLayout")
    if isinstance(rhs, Layout):
        flat = coalesce_x(lhs)
        return _impl(flat.shape, flat.stride, rhs.shape, rhs.stride, lhs, rhs)
    if is_tuple(rhs):
        if len(rhs) > lhs.rank:
            raise ValueError(f"composition({lhs}, {fmt(rhs)}): the tiler has more modes than the layout")
        modes = [composition(lhs[i], rhs[i]) for i in range(len(rhs))]
        if len(modes) == 1:
            return Layout((modes[0].shape,), (modes[0].stride,))
        return make_layout(*modes)
    if is_int(rhs):
        if rhs <= 0:
            raise ValueError(f"composition({lhs}, {rhs}): a tile size must be positive")
        flat = coalesce_x(lhs)
        return _impl(flat.shape, flat.stride, int(rhs), 1, lhs, rhs)
    raise ValueError(f"composition({lhs}, {rhs!r}): the right operand is not a Layout or tiler")


def _as_layout_tiler(t: Tiler) -> Layout:
    if isinstance(t, Layout):
        return t
    if is_int(t):
        return Layout(int(t))
    if is_tuple(t):
        modes = [_as_layout_tiler(e) for e in t]
        return Layout(tuple(m.shape for m in modes), tuple(m.stride for m in modes))
    raise ValueError(f"composition: {t!r} is not a layout or tiler")


def with_shape(layout: Any, *shape: IntTuple) -> Any:
    """``layout o Layout(shape)`` (CuTe's ``Layout::with_shape``): the same codomain over a
    domain reshaped to ``shape``; for a ``ComposedLayout`` ``A o off o B`` it is
    ``A o off o with_shape(B, shape)``."""
    shp = shape[0] if len(shape) == 1 else tuple(shape)
    if isinstance(layout, ComposedLayout):
        return ComposedLayout(layout.layout_a, layout.offset, with_shape(layout.layout_b, shp))
    return composition(layout, Layout(shp))
