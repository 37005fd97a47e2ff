"""Complement of a layout: the layout that enumerates, in order, the offsets ``L`` skips.

``complement(L, cotarget)`` (CuTe C++) returns ``C`` such that ``(L, C)`` is injective
onto a range covering ``[0, cotarget)``: C's values are disjoint from L's (except 0),
strictly increasing, and ``size(L) * size(C) >= cotarget / ...`` (``cosize`` bounded by
the cotarget rounded up to L's extent). Built from ``filter(L)`` by sorting strides:
each gap ``d_{i+1} / (s_i d_i)`` becomes a mode, and the rest up to the cotarget follows.
"""

from __future__ import annotations

from .inttuple import IntTuple, ceil_div, fmt, is_tuple, product
from .layout import Layout, coalesce, cosize, filter

__all__ = ["complement"]


def complement(layout: Layout, cotarget: IntTuple | None = None) -> Layout:
    """CuTe's ``complement(layout, cotarget)``; ``cotarget`` defaults to ``cosize(filter(layout))``."""
    if not isinstance(layout, Layout):
        raise ValueError(f"complement: {layout!r} is not a Layout")
    f = filter(layout)
    if cotarget is None:
        cotarget = cosize(f)
    if isinstance(cotarget, Layout):
        cotarget = cotarget.shape
    shapes = list(f.shape) if is_tuple(f.shape) else [f.shape]
    strides = list(f.stride) if is_tuple(f.stride) else [f.stride]
    if len(strides) == 1 and strides[0] == 0:
        return Layout(product(cotarget))
    if any(d < 0 for d in strides):
        raise ValueError(f"complement({layout}, {fmt(cotarget)}): negative strides are not supported")
    result_shape: list[int] = []
    result_stride: list[int] = [1]
    while True:
        i = min(range(len(strides)), key=lambda k: strides[k])
        d, s = strides[i], shapes[i]
        if d % result_stride[-1] != 0 or d // result_stride[-1] == 0:
            raise ValueError(
                f"complement({layout}, {fmt(cotarget)}): the layout is not injective or its strides "
                f"do not divide (stride {d} after extent {result_stride[-1]})"
            )
        result_shape.append(d // result_stride[-1])
        del strides[i], shapes[i]
        if not strides:
            last_stride = d * s
            break
        result_stride.append(d * s)
    rest_shape = product(ceil_div(cotarget, last_stride))
    return coalesce(Layout((tuple(result_shape), rest_shape), (tuple(result_stride), last_stride)))
