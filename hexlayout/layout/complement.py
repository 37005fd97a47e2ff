"""Complement of a layout: the layout that enumerates, in order, the offsets ``L`` skips.

``complement(L, cotarget)`` (CuTe C++, ``cute/layout.hpp``) works on ``F = filter(L)``
(flat, no stride-0 or size-1 modes). Taking F's modes ``s_i:d_i`` in increasing stride
order, it emits a mode ``d_i / (s_{i-1} d_{i-1}) : s_{i-1} d_{i-1}`` for every gap
between consecutive modes (``s_{-1} d_{-1} = 1``, integer division as in C++) and a last
mode ``ceil_div(cotarget, s_n d_n) : s_n d_n`` that reaches the cotarget (a tuple
cotarget is divided mode by mode, CuTe's ``ceil_div``); the result is coalesced.
Post-conditions (for layouts whose sorted strides divide one another):

- ``C(0) == 0`` and ``C`` is strictly increasing;
- ``C(i) != L(j)`` for ``i > 0`` (disjoint images), ``(L, C)`` is injective;
- ``size(C) >= ceil(cotarget / cosize(F))`` and ``cosize((L, C)) >= cotarget``.

A stride-0 layout (``filter(L) == 1:0``) has the compact complement ``product(cotarget):1``.

Deliberate deviations from C++ (which cannot check dynamic values): a layout whose
sorted strides overlap (``d_i < s_{i-1} d_{i-1}``, the case C++ rejects statically as
"Non-injective Layout detected in complement") and negative strides raise ValueError.
"""

from __future__ import annotations

from .inttuple import IntTuple, as_inttuple, ceil_div, flatten, fmt, is_tuple, product
from .layout import Layout, coalesce, cosize, filter

__all__ = ["complement"]


def complement(layout: Layout, cotarget: IntTuple | Layout | None = None) -> Layout:
    """CuTe's ``complement(layout, cotarget)``; ``cotarget`` defaults to ``cosize(filter(layout))``.

    A Layout given as cotarget stands for its shape (CuTe's ``shape(cotarget)``).
    """
    if not isinstance(layout, Layout):
        raise ValueError(f"complement: {layout!r} is not a Layout")
    f = filter(layout)
    if cotarget is None:
        cotarget = cosize(f)
    if isinstance(cotarget, Layout):
        cotarget = cotarget.shape
    try:
        cotarget = as_inttuple(cotarget, "complement cotarget")
    except ValueError as e:
        raise ValueError(f"complement({layout}, {cotarget!r}): {e}") from None
    for c in flatten(cotarget) if is_tuple(cotarget) else (cotarget,):
        if c <= 0:
            raise ValueError(f"complement({layout}, {fmt(cotarget)}): the cotarget must be positive")
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
        gap = d // result_stride[-1]
        if gap == 0:
            raise ValueError(
                f"complement({layout}, {fmt(cotarget)}): the layout is not injective (mode {s}:{d} "
                f"overlaps the modes below stride {result_stride[-1]})"
            )
        result_shape.append(gap)
        del strides[i], shapes[i]
        if not strides:
            last_stride = d * s
            break
        result_stride.append(d * s)
    rest_shape = product(ceil_div(cotarget, last_stride))
    return coalesce(Layout((tuple(result_shape), rest_shape), (tuple(result_stride), last_stride)))
