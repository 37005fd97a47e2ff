"""Bit operations on integer values: ``<< >> & | ^ ~``.

The operands are integers of one type (``int`` or ``uint`` kinds); the result has their
type. In the integer compute domain (``int``, or ``long long`` for 64-bit types: ``W``
bits) the operands are the values sign- or zero-extended from their type, so:

- ``a & b``, ``a | b``, ``a ^ b``, ``~a`` act on the two's complement bits; the result,
  truncated to the type, is the bitwise result of the operands' own bits.
- ``a << n``: the bits of ``a`` moved up by ``n``, zeros shifted in; ``n`` is read as an
  unsigned amount and an amount of at least ``W`` gives 0 (PTX ``shl`` clamps, C leaves it
  undefined, so the printed code clamps explicitly).
- ``a >> n``: arithmetic (sign-filling) for signed types, logical (zero-filling) for
  unsigned ones, as C's ``>>`` on the operand's own type; an amount of at least ``W``
  (read unsigned) gives the shift by ``W - 1`` then by 1: all sign bits, or 0.

Shifts by ``W`` or more of a narrow type (``u8`` by 12, say) are exact in the domain and
then truncated to the type (0 for ``<<`` and for logical ``>>``), as C's integer promotion
gives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import AluFunction, CDomain, alu_function, function_class

__all__ = ["Shl", "Shr", "BitAnd", "BitOr", "BitXor", "BitNot", "INTEGERS", "NIBBLE_PAIRS", "nibble_pair"]

INTEGERS = frozenset({"int", "uint"})


def _width(c: CDomain) -> int:
    """Bits of the integer compute domain ``c``."""
    return 64 if c.ctype == "long long" else 32


def _amount(n: Any) -> tuple[Any, Any]:
    """``(in_range, n)``: whether the amount, read unsigned, is below 64, and the amount
    with out-of-range entries replaced by 0 (numpy needs a shift below the width)."""
    n = np.asarray(n, dtype=np.int64)
    ok = (n >= 0) & (n < 64)
    return ok, np.where(ok, n, 0)


class _Bits(AluFunction):
    accepts = INTEGERS


class _Shift(_Bits):
    """A shift of ``a`` by the amount ``n`` read unsigned: ``shifted(a, ok, k)`` on the int64
    values, ``ok`` where the amount is below 64 and ``k`` the amount (0 where it is not)."""

    arity = 2

    def numpy(self, a: Any, n: Any) -> Any:
        ok, k = _amount(n)
        return self.shifted(np.asarray(a, dtype=np.int64), ok, k)

    def shifted(self, a: np.ndarray, ok: np.ndarray, k: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class Shl(_Shift):
    """``a << n``: zeros shifted in; ``n`` read unsigned, ``n >= W`` gives 0."""

    name = "shl"
    operator = "<<"

    def shifted(self, a: np.ndarray, ok: np.ndarray, k: np.ndarray) -> np.ndarray:
        return np.where(ok, np.left_shift(a, k), 0)

    def cuda(self, c: CDomain, a: str, n: str) -> str:
        w = _width(c)
        u = "unsigned long long" if w == 64 else "unsigned"
        return (f"(static_cast<unsigned long long>({n}) < {w}ull ? "
                f"static_cast<{c.ctype}>(static_cast<{u}>({a}) << ({n})) : static_cast<{c.ctype}>(0))")


class Shr(_Shift):
    """``a >> n``: arithmetic for signed, logical for unsigned types; ``n`` read unsigned,
    ``n >= W`` gives all sign bits (signed) or 0 (unsigned)."""

    name = "shr"
    operator = ">>"

    def shifted(self, a: np.ndarray, ok: np.ndarray, k: np.ndarray) -> np.ndarray:
        return np.right_shift(a, np.where(ok, k, 63))

    def cuda(self, c: CDomain, a: str, n: str) -> str:
        w = _width(c)
        return f"(static_cast<unsigned long long>({n}) < {w}ull ? ({a}) >> ({n}) : ({a}) >> {w - 1} >> 1)"


class _Bitwise(_Bits):
    """A binary bit-by-bit operation: numpy's ``ufunc`` on the int64 values, C's ``operator``."""

    arity = 2
    ufunc: Any = None

    def numpy(self, a: Any, b: Any) -> Any:
        return type(self).ufunc(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        return f"({a}) {self.operator} ({b})"


def _bitwise(cls: str, operator: str, ufunc: Any) -> type[_Bitwise]:
    """The bit-by-bit operation ``a <operator> b``, class ``cls`` named ``cls.lower()``."""
    return function_class(cls, _Bitwise, f"``a {operator} b``, bit by bit.", __name__, operator=operator,
                          ufunc=ufunc)


BitAnd = _bitwise("BitAnd", "&", np.bitwise_and)
BitOr = _bitwise("BitOr", "|", np.bitwise_or)
BitXor = _bitwise("BitXor", "^", np.bitwise_xor)


class BitNot(_Bits):
    """``~a``: every bit flipped."""

    name = "bitnot"
    operator = "~"

    def numpy(self, a: Any) -> Any:
        return np.invert(np.asarray(a, dtype=np.int64))

    def cuda(self, c: CDomain, a: str) -> str:
        return f"~({a})"


class _NibblePair(_Bits):
    """``((a >> sa) & 15) | (((b >> sb) & 15) << 4)``: the byte whose low nibble is the nibble
    of ``a`` at bit ``sa`` and whose high nibble is the nibble of ``b`` at bit ``sb`` (``sa``,
    ``sb`` 0 or 4: the low or high nibble of a byte). Unsigned bytes or words."""

    arity = 2
    accepts = frozenset({"uint"})
    sa: Any = 0
    sb: Any = 0

    def numpy(self, a: Any, b: Any) -> Any:
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        return ((a >> self.sa) & 15) | (((b >> self.sb) & 15) << 4)

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        return f"((({a}) >> {self.sa}) & 15) | (((({b}) >> {self.sb}) & 15) << 4)"


def _nibble_pair(cls: str, sa: int, sb: int) -> type[_NibblePair]:
    """The ``nibble_pair_<sa><sb>`` function class ``cls`` (also its module attribute: the build
    cache stores a build's classes by module and qualified name)."""
    return function_class(cls, _NibblePair, f"``((a >> {sa}) & 15) | (((b >> {sb}) & 15) << 4)``: a byte of "
                          f"the nibble of ``a`` at bit {sa} (low) and of ``b`` at bit {sb} (high), unsigned.",
                          __name__, name=f"nibble_pair_{sa}{sb}", sa=sa, sb=sb)


NibblePair00 = _nibble_pair("NibblePair00", 0, 0)
NibblePair04 = _nibble_pair("NibblePair04", 0, 4)
NibblePair40 = _nibble_pair("NibblePair40", 4, 0)
NibblePair44 = _nibble_pair("NibblePair44", 4, 4)
#: ``(sa, sb)`` -> the function taking the nibble of ``a`` at bit ``sa`` and of ``b`` at ``sb``
NIBBLE_PAIRS = {(0, 0): NibblePair00, (0, 4): NibblePair04, (4, 0): NibblePair40, (4, 4): NibblePair44}


def nibble_pair(sa: int, sb: int) -> AluFunction:
    """The registered ``nibble_pair_<sa><sb>`` function (``sa``, ``sb``: 0 or 4)."""
    return alu_function(NIBBLE_PAIRS[(sa, sb)].name)
