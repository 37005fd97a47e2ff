"""CuTe-notation parser: values, round trips with str(), errors with positions."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexlayout.layout import ComposedLayout, Layout, Swizzle
from hexlayout.layout.parse import parse_inttuple, parse_layout


@pytest.mark.parametrize(
    "text, shape, stride",
    [
        ("(4,8):(8,1)", (4, 8), (8, 1)),
        ("8:1", 8, 1),
        ("8:2", 8, 2),
        ("((4,8),(2,2)):((32,1),(16,8))", ((4, 8), (2, 2)), ((32, 1), (16, 8))),
        ("(_4,_8):(_8,_1)", (4, 8), (8, 1)),
        ("(4,8)", (4, 8), (1, 4)),  # default: column-major prefix products
        ("((2,3),4)", ((2, 3), 4), ((1, 2), 6)),
        ("_16", 16, 1),
        ("(4):(1)", (4,), (1,)),
        ("(4,2):(-1,0)", (4, 2), (-1, 0)),
        ("  ( 4 , 8 ) : ( 8 , 1 )  ", (4, 8), (8, 1)),
    ],
)
def test_parse_plain_layouts(text: str, shape: object, stride: object) -> None:
    assert parse_layout(text) == Layout(shape, stride)


def test_parsed_layout_evaluates_like_cute() -> None:
    layout = parse_layout("((4,8),(2,2)):((32,1),(16,8))")
    # thread (t0, t1) = (1, 2), value (v0, v1) = (1, 1): 32*1 + 1*2 + 16*1 + 8*1
    assert layout(((1, 2), (1, 1))) == 58
    assert parse_layout("(4,8)")(3, 5) == 3 + 4 * 5


def test_parse_swizzled_composed_layouts() -> None:
    expected = ComposedLayout(Swizzle(3, 3, 3), 0, Layout((8, 64), (64, 1)))
    assert parse_layout("Sw<3,3,3> o 0 o (8,64):(64,1)") == expected
    assert parse_layout("Sw<3,3,3> o (8,64):(64,1)") == expected
    assert parse_layout("Sw<3,3,3> o _0 o (_8,_64):(_64,_1)") == expected
    assert parse_layout("Swizzle<3,3,3> o 0 o (8,64):(64,1)") == expected
    assert parse_layout("Sw<2,4,3> o 32 o 64:1") == ComposedLayout(Swizzle(2, 4, 3), 32, Layout(64, 1))
    # A rank-1 inner layout right after 'o' is not mistaken for an offset.
    assert parse_layout("Sw<3,3,3> o 64:1") == ComposedLayout(Swizzle(3, 3, 3), 0, Layout(64, 1))
    # Row 1, column 0 is offset 64 = 0b1_000_000; the swizzle XORs bit 6 into bit 3: 64 ^ 8 = 72.
    assert parse_layout("Sw<3,3,3> o 0 o (8,64):(64,1)")(1, 0) == 72


@pytest.mark.parametrize(
    "text",
    [
        "(4,8):(8,1)", "8:1", "((4,8),(2,2)):((32,1),(16,8))", "(4):(1)", "(4,2):(-1,0)",
        "((2,(3,5)),7):((1,(2,6)),30)", "Sw<3,3,3> o 0 o (8,64):(64,1)", "Sw<2,4,3> o 32 o (8,32):(32,1)",
        "Sw<1,2,-3> o 0 o 64:1",
    ],
)
def test_round_trip_canonical_strings(text: str) -> None:
    layout = parse_layout(text)
    assert str(layout) == text
    assert parse_layout(str(layout)) == layout


def _inttuple(leaf: st.SearchStrategy[int]) -> st.SearchStrategy[object]:
    return st.recursive(leaf, lambda kids: st.lists(kids, min_size=1, max_size=3).map(tuple), max_leaves=6)


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    shape = draw(_inttuple(st.integers(1, 9)))

    def strides(s: object) -> object:
        if isinstance(s, tuple):
            return tuple(strides(e) for e in s)
        return draw(st.integers(-50, 50))

    return Layout(shape, strides(shape))


@settings(max_examples=60, deadline=None)
@given(layouts(), st.booleans(), st.integers(0, 3), st.integers(0, 4), st.integers(0, 256))
def test_round_trip_random(layout: Layout, swizzled: bool, b: int, m: int, offset: int) -> None:
    assert parse_layout(str(layout)) == layout
    if swizzled:
        composed = ComposedLayout(Swizzle(b, m, b + 1), offset, layout)
        assert parse_layout(str(composed)) == composed


def test_parse_inttuple() -> None:
    assert parse_inttuple("((4,8),_2)") == ((4, 8), 2)
    assert parse_inttuple("-3") == -3
    with pytest.raises(ValueError, match="position 6"):
        parse_inttuple("(4,8) x")


@pytest.mark.parametrize(
    "text, pos, fragment",
    [
        ("", 0, "empty"),
        ("(4,8", 4, "expected ',' or ')'"),
        ("(4,8):(8,x)", 9, "expected an integer or '('"),
        ("(4,,8)", 3, "expected an integer or '('"),
        ("(4,8):(1)", 6, "not congruent"),
        ("(4,8):((1,2),4)", 6, "not congruent"),
        ("4:1 extra", 4, "unexpected 'e'"),
        ("(0,4)", 0, "non-positive"),
        ("Sw<3,3> o 8:1", 6, "expected ','"),
        ("Sw<3,3,3> 8:1", 10, "expected 'o'"),
        ("Foo<1,2,3> o 8:1", 0, "expected 'Sw<B,M,S>'"),
        ("Sw<3,3,1> o 8:1", 0, "shift"),
        ("Sw<3,3,3> o 0 o", 15, "expected an integer or '('"),
        ("-", 1, "expected an integer"),
    ],
)
def test_errors_name_position_and_input(text: str, pos: int, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_layout(text)
    msg = str(info.value)
    assert f"position {pos}" in msg
    assert repr(text) in msg
    assert fragment in msg
    # The caret line points at the position under a copy of the input.
    lines = msg.split("\n")
    assert lines[-2] == "  " + text
    assert re.fullmatch(r" *\^", lines[-1]) and lines[-1].index("^") == 2 + pos


def test_non_string_input_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        parse_layout(42)  # type: ignore[arg-type]
