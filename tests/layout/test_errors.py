"""Bad arguments raise ValueError naming the operation and its operands.

Never an AssertionError, ZeroDivisionError, IndexError, AttributeError or TypeError from
deep inside, and never silent garbage: CuTe C++ rejects these statically (or computes a
wrong layout when the values are dynamic); hexlayout raises ValueError instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.layout import (
    ComposedLayout,
    Layout,
    Swizzle,
    append,
    blocked_product,
    coalesce,
    complement,
    composition,
    cosize,
    crd2idx,
    downcast,
    filter,
    group,
    idx2crd,
    left_inverse,
    logical_divide,
    logical_product,
    make_layout,
    make_layout_tv,
    raked_product,
    recast_layout,
    right_inverse,
    select,
    size,
    tile_to_shape,
    tiled_divide,
    upcast,
    zipped_divide,
)

L = Layout((4, 8))

CASES = [
    # (call, words the message must contain)
    (lambda: Layout((4, 0)), ["Layout", "(4,0)", "non-positive"]),
    (lambda: Layout(-2), ["Layout", "-2"]),
    (lambda: Layout((4, 8), (1,)), ["Layout", "(1)", "(4,8)", "congruent"]),
    (lambda: Layout((4, 8), (1, "a")), ["Layout stride", "'a'"]),
    (lambda: Layout(2.0), ["Layout shape", "2.0"]),
    (lambda: make_layout(1, 2, 3), ["make_layout"]),
    (lambda: complement(Layout((2, 2), (2, 3)), 24), ["complement", "(2,2):(2,3)", "injective"]),
    (lambda: complement(Layout(4, -1), 8), ["complement", "4:-1", "negative"]),
    (lambda: complement(Layout(4, 1), 0), ["complement", "4:1", "cotarget"]),
    (lambda: complement((4, 8), 8), ["complement", "(4, 8)"]),
    (lambda: composition(Layout((6, 2), (1, 10)), Layout(2, 7)), ["composition", "(6,2):(1,10)", "2:7",
                                                                  "divisibility"]),
    (lambda: composition(Layout((6, 4), (1, 10)), Layout(4, 4)), ["composition", "(6,4):(1,10)", "4:4",
                                                                  "divisibility"]),
    (lambda: composition(Layout((6, 2), (1, 6 * 3)), Layout(4, 2)), ["composition", "divisibility"]),
    (lambda: composition(Layout((4, 3), (1, 8)), Layout(6, 1)), ["composition", "(4,3):(1,8)", "6:1",
                                                                 "shape divisibility"]),
    (lambda: composition(L, (2, 2, 2)), ["composition", "(4,8):(1,4)", "(2,2,2)", "more modes"]),
    (lambda: composition(L, "x"), ["composition", "(4,8):(1,4)", "'x'"]),
    (lambda: composition(3, L), ["composition", "3"]),
    (lambda: composition(L, 0), ["composition", "0", "positive"]),
    (lambda: logical_divide(Layout((6, 4), (1, 10)), Layout(4, 1)),
     ["logical_divide", "(6,4):(1,10)", "4:1"]),
    (lambda: logical_divide(L, (2, 2, 2)), ["logical_divide", "(2,2,2)", "too many modes"]),
    (lambda: zipped_divide(L, (2, 2, 2)), ["divide", "(2,2,2)", "too many modes"]),
    (lambda: tiled_divide(Layout((4, 8)), (None, 2)), ["zip2_by", "rank-2"]),
    (lambda: logical_divide(L, "x"), ["logical_divide", "'x'"]),
    (lambda: logical_divide((4, 8), 2), ["logical_divide", "(4, 8)"]),
    (lambda: logical_product(L, (2, 2, 2)), ["logical_product", "too many modes"]),
    (lambda: logical_product(Layout((3, 8), (32, 1)), Layout((1, 6), (6, 1))),
     ["logical_product", "(3,8):(32,1)", "divisibility"]),
    (lambda: blocked_product(L, (2, 2)), ["blocked_product", "(2, 2)"]),
    (lambda: raked_product(L, "x"), ["raked_product", "'x'"]),
    (lambda: tile_to_shape(Layout((2, 2)), (6, 3)), ["tile_to_shape", "(6,3)", "divide"]),
    (lambda: tile_to_shape(Layout((2, 2, 2)), (4, 4)), ["tile_to_shape", "more modes"]),
    (lambda: L(1, 2, 3), ["(4,8):(1,4)", "(1,2,3)", "rank"]),
    (lambda: L(1.5), ["(4,8):(1,4)", "1.5", "coordinate"]),
    (lambda: L("a"), ["(4,8):(1,4)", "'a'"]),
    (lambda: L((1, 2), 3), ["crd2idx", "(1,2)"]),
    (lambda: L(np.array([1.0])), ["(4,8):(1,4)", "coordinate"]),
    (lambda: L(None, (1, 2)), ["slice", "(1,2)", "(4,8):(1,4)"]),
    (lambda: L[5], ["(4,8):(1,4)", "mode 5"]),
    (lambda: select(L, 3), ["select", "(4,8):(1,4)"]),
    (lambda: group(L, 1, 5), ["group", "(4,8):(1,4)"]),
    (lambda: left_inverse(Layout((2, 4), (3, 2))), ["left_inverse", "(2,4):(3,2)", "divisib"]),
    (lambda: left_inverse(Layout(4, -1)), ["left_inverse", "4:-1", "negative"]),
    (lambda: right_inverse((4, 8)), ["right_inverse", "(4, 8)"]),
    (lambda: upcast(Layout(4, 3), 2), ["upcast", "4:3", "2"]),
    (lambda: upcast(L, 0), ["upcast", "0"]),
    (lambda: downcast(Layout(4, 2), 2), ["downcast", "4:2", "adjacent"]),
    (lambda: upcast(Swizzle(3, 3, 3), 3), ["upcast", "Sw<3,3,3>", "power of two"]),
    (lambda: upcast(ComposedLayout(Swizzle(1, 1, 1), 3, Layout(8)), 2), ["upcast", "offset 3"]),
    (lambda: recast_layout(L, 0, 8), ["recast_layout", "(4,8):(1,4)"]),
    (lambda: Swizzle(3, 0, 2), ["Swizzle(3,0,2)", "shift"]),
    (lambda: Swizzle(-1, 0, 2), ["Swizzle(-1,0,2)"]),
    (lambda: ComposedLayout(Swizzle(1, 1, 1), 0, (4,)), ["ComposedLayout", "(4,)"]),
    (lambda: coalesce(L, (1, 1, 1)), ["coalesce", "(1,1,1)", "(4,8):(1,4)"]),
    (lambda: coalesce((4, 8)), ["coalesce", "(4, 8)"]),
    (lambda: filter((4, 8)), ["filter", "(4, 8)"]),
    (lambda: cosize((4, 8)), ["cosize", "(4, 8)"]),
    (lambda: append(L, (4,)), ["append", "(4,)"]),
    (lambda: size("x"), ["size", "'x'"]),
    (lambda: idx2crd((1, 2), 4), ["idx2crd", "(1,2)"]),
    (lambda: crd2idx((1, 2), 4, 1), ["crd2idx", "(1,2)"]),
    (lambda: make_layout_tv((4, 8), Layout(2)), ["raked_product", "(4, 8)"]),
]


@pytest.mark.parametrize("k", range(len(CASES)))
def test_raises_value_error_naming_operands(k: int) -> None:
    call, words = CASES[k]
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    for w in words:
        assert w in msg, (w, msg)


def test_mode_index_error_is_also_an_index_error() -> None:
    with pytest.raises(IndexError):
        L[2]
    assert [m.shape for m in L] == [4, 8]


def test_cpp_semantics_kept_where_valid() -> None:
    # CuTe pads a 1-D layout when the tile does not divide it (C++ semantics, not an error)
    assert str(logical_divide(Layout(6), Layout(4, 1))) == "(4,2):(1,4)"
    # coordinates are not bounds-checked: 1-D indices past size extend the last mode
    assert L(32) == 32 and L(3, 9) == 39
