"""Parse CuTe notation back into layouts: the inverse of ``str(layout)``.

Grammar (whitespace is allowed between tokens)::

    top      := composed | layout
    composed := swizzle "o" [int "o"] layout          # Sw<B,M,S> o offset o shape:stride
    swizzle  := ("Sw" | "Swizzle") "<" int "," int "," int ">"
    layout   := inttuple [":" inttuple]               # no stride: compact column-major
    inttuple := int | "(" [inttuple ("," inttuple)*] ")"
    int      := ["-"] ["_"] ["-"] digits              # "_4" is CuTe's static Int<4>

So ``(4,8):(8,1)``, ``8:1``, ``((4,8),(2,2)):((32,1),(16,8))``, ``(_4,_8):(_8,_1)``,
``(4,8)`` (strides ``(1,4)``: the prefix products of the shape), ``Sw<3,3,3> o 0 o
(8,64):(64,1)`` and ``Sw<3,3,3> o (8,64):(64,1)`` (offset 0) are accepted. A shape and
its stride must be congruent (same nesting). For every ``Layout`` and every
``ComposedLayout`` whose outer function is a ``Swizzle``,
``parse_layout(str(L)) == L``.

Errors are ``ValueError`` naming the position (0-based character offset) and pointing
at it under a copy of the input.
"""

from __future__ import annotations

from .composed import ComposedLayout
from .inttuple import IntTuple, congruent, fmt
from .layout import Layout
from .swizzle import Swizzle

__all__ = ["parse_layout", "parse_inttuple"]


class _Parser:
    """A recursive-descent parser over the characters of ``text``."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"parse_layout: expected a string, got {type(text).__name__}")
        self.text = text
        self.pos = 0

    # --- helpers ---------------------------------------------------------------------
    def error(self, msg: str, pos: int | None = None) -> ValueError:
        p = self.pos if pos is None else pos
        return ValueError(
            f"cannot parse layout {self.text!r}: {msg} at position {p}\n  {self.text}\n  {' ' * p}^"
        )

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip_ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def at_end(self) -> bool:
        return self.peek() == ""

    def describe_here(self) -> str:
        c = self.peek()
        return "end of input" if c == "" else repr(c)

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise self.error(f"expected {ch!r}, found {self.describe_here()}")
        self.pos += 1

    def word(self) -> str:
        """An identifier (letters only) at the current position, without consuming it."""
        self.skip_ws()
        end = self.pos
        while end < len(self.text) and self.text[end].isalpha():
            end += 1
        return self.text[self.pos:end]

    # --- grammar ---------------------------------------------------------------------
    def integer(self) -> int:
        self.skip_ws()
        start = self.pos
        neg = False
        if self.peek() == "-":
            neg, self.pos = True, self.pos + 1
        if self.pos < len(self.text) and self.text[self.pos] == "_":
            self.pos += 1
            if not neg and self.pos < len(self.text) and self.text[self.pos] == "-":
                neg, self.pos = True, self.pos + 1
        digits_start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isdigit():
            self.pos += 1
        if self.pos == digits_start:
            found = self.text[digits_start] if digits_start < len(self.text) else None
            what = "end of input" if found is None else repr(found)
            raise self.error(f"expected an integer, found {what}", digits_start if found is None else start)
        value = int(self.text[digits_start:self.pos])
        return -value if neg else value

    def inttuple(self) -> IntTuple:
        if self.peek() == "(":
            self.pos += 1
            items: list[IntTuple] = []
            if self.peek() == ")":
                self.pos += 1
                return ()
            while True:
                items.append(self.inttuple())
                c = self.peek()
                if c == ",":
                    self.pos += 1
                    continue
                if c == ")":
                    self.pos += 1
                    return tuple(items)
                raise self.error(f"expected ',' or ')' in a tuple, found {self.describe_here()}")
        c = self.peek()
        if c == "" or not (c.isdigit() or c in "_-"):
            raise self.error(f"expected an integer or '(', found {self.describe_here()}")
        return self.integer()

    def layout(self) -> Layout:
        self.skip_ws()
        start = self.pos
        shape = self.inttuple()
        if self.peek() == ":":
            self.pos += 1
            stride_pos = self.pos
            stride = self.inttuple()
            if not congruent(shape, stride):
                raise self.error(f"stride {fmt(stride)} is not congruent with shape {fmt(shape)}", stride_pos)
            try:
                return Layout(shape, stride)
            except ValueError as e:
                raise self.error(str(e), start) from None
        try:
            return Layout(shape)
        except ValueError as e:
            raise self.error(str(e), start) from None

    def swizzle(self) -> Swizzle:
        self.skip_ws()
        start = self.pos
        name = self.word()
        if name not in ("Sw", "Swizzle"):
            raise self.error(f"expected 'Sw<B,M,S>', found {name!r}")
        self.pos += len(name)
        self.expect("<")
        b = self.integer()
        self.expect(",")
        m = self.integer()
        self.expect(",")
        s = self.integer()
        self.expect(">")
        try:
            return Swizzle(b, m, s)
        except ValueError as e:
            raise self.error(str(e), start) from None

    def keyword_o(self) -> None:
        if self.word() != "o":
            raise self.error(f"expected 'o' (composition), found {self.describe_here()}")
        self.pos += 1

    def top(self) -> Layout | ComposedLayout:
        if self.at_end():
            raise self.error("empty layout string")
        if self.peek().isalpha():
            sw = self.swizzle()
            self.keyword_o()
            # Optional integer offset: "Sw o 0 o L". An offset is a bare integer followed by 'o';
            # a bare integer followed by ':' or the end is the (rank-1) layout itself.
            save = self.pos
            offset = 0
            c = self.peek()
            if c and (c.isdigit() or c in "_-"):
                value = self.integer()
                if self.word() == "o":
                    self.pos += 1
                    offset = value
                else:
                    self.pos = save
            layout = self.layout()
            result: Layout | ComposedLayout = ComposedLayout(sw, offset, layout)
        else:
            result = self.layout()
        if not self.at_end():
            raise self.error(f"unexpected {self.describe_here()} after the layout")
        return result


def parse_layout(text: str) -> Layout | ComposedLayout:
    """Parse CuTe notation into a ``Layout`` or a swizzled ``ComposedLayout``.

    ``"(4,8):(8,1)"`` is the layout ``(m, n) -> 8m + n``; without ``:stride`` the strides
    are the column-major prefix products of the shape (``"(4,8)"`` is ``(4,8):(1,4)``);
    ``"Sw<B,M,S> o k o L"`` is ``c -> Sw(k + L(c))``. Raises ``ValueError`` (with the
    position) on malformed input.
    """
    return _Parser(text).top()


def parse_inttuple(text: str) -> IntTuple:
    """Parse one IntTuple such as ``"((4,8),2)"`` or ``"_16"``."""
    p = _Parser(text)
    if p.at_end():
        raise p.error("empty string")
    t = p.inttuple()
    if not p.at_end():
        raise p.error(f"unexpected {p.describe_here()} after the tuple")
    return t
