"""Arithmetic ALU functions: + - * / neg abs max min fma rcp.

Floating results are IEEE operations of the compute domain (``float`` / ``double``), so
the printed code and the emulator agree bit for bit; ``max`` / ``min`` return the other
operand when one is NaN (PTX ``max.f32``, C ``fmaxf``). Integer results wrap (two's
complement); integer division truncates toward zero (a zero divisor gives 0 in the
emulator; the device result is unspecified, as C leaves it).
"""

from __future__ import annotations

import math
import operator as pyop
from fractions import Fraction
from typing import Any

import numpy as np

from .base import FLOAT, AluFunction, CDomain, function_class, is_integer_array

__all__ = ["Add", "Sub", "Mul", "Div", "Neg", "Abs", "Max", "Min", "Fma", "Rcp"]


class _Infix(AluFunction):
    """``a <operator> b``: Python's ``py`` on the numpy operands, in C ``form`` (a format of
    ``a`` and ``b``, parenthesized where C's precedence needs it)."""

    arity = 2
    py: Any = None
    form = ""

    def numpy(self, a: Any, b: Any) -> Any:
        return type(self).py(a, b)

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        return self.form.format(a=a, b=b)


def _infix(cls: str, operator: str, py: Any, form: str) -> type[_Infix]:
    """The operation ``a <operator> b``, class ``cls`` named ``cls.lower()``."""
    return function_class(cls, _Infix, f"``a {operator} b``.", __name__, operator=operator, py=py, form=form)


Add = _infix("Add", "+", pyop.add, "{a} + {b}")
Sub = _infix("Sub", "-", pyop.sub, "{a} - ({b})")
Mul = _infix("Mul", "*", pyop.mul, "({a}) * ({b})")


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C integer division (truncation toward zero); 0 where ``b`` is 0."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    safe = np.where(b == 0, 1, b)
    q = np.floor_divide(a, safe)
    q = np.where((a - q * safe != 0) & ((a < 0) != (safe < 0)), q + 1, q)
    return np.where(b == 0, 0, q)


class Div(_Infix):
    """``a / b`` (integers: truncated toward zero)."""

    name = "div"
    operator = "/"
    form = "({a}) / ({b})"

    def numpy(self, a: Any, b: Any) -> Any:
        if is_integer_array(a) and is_integer_array(b):
            return _int_div(a, b)
        return a / b


class Neg(AluFunction):
    """``-a``."""

    name = "neg"
    operator = "unary -"

    def numpy(self, a: Any) -> Any:
        return np.negative(a)

    def cuda(self, c: CDomain, a: str) -> str:
        return f"-({a})"


class Abs(AluFunction):
    """``|a|`` (of the most negative integer: itself, as two's complement wraps)."""

    name = "abs"
    accepts = frozenset({"float", "int"})
    operator = "abs"

    def numpy(self, a: Any) -> Any:
        return np.abs(a)

    def cuda(self, c: CDomain, a: str) -> str:
        return f"fabs{'f' if c.ctype == 'float' else ''}({a})" if c.floating else f"abs({a})"


class _Extremum(AluFunction):
    """``max`` / ``min`` of two values; of a NaN and a number, the number (numpy's ``ufunc``,
    C's ``f<name>f`` on floats, ``<name>`` on integers)."""

    arity = 2
    ufunc: Any = None

    def numpy(self, a: Any, b: Any) -> Any:
        return type(self).ufunc(a, b)

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        return f"{c.math('f' + self.name)}({a}, {b})" if c.floating else f"{self.name}({a}, {b})"


class Max(_Extremum):
    """``max(a, b)``; of a NaN and a number, the number (``fmaxf``)."""

    name = "max"
    ufunc = np.fmax


class Min(_Extremum):
    """``min(a, b)``; of a NaN and a number, the number (``fminf``)."""

    name = "min"
    ufunc = np.fmin


def _fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` of float32 values rounded once to float32 (``fmaf``).

    The product is exact in float64; the sum is rounded to odd in float64 (TwoSum gives
    its exact error), and a round-to-odd float64 rounds correctly to float32 (53 >= 24 + 2)."""
    a64, b64, c64 = (np.asarray(x, dtype=np.float64) for x in (a, b, c))
    p = a64 * b64
    s = p + c64
    bp = s - p
    err = (p - (s - bp)) + (c64 - bp)
    odd = (s.view(np.int64) & 1) == 1 if s.ndim else (np.asarray(s).view(np.int64) & 1) == 1
    fix = np.isfinite(s) & (err != 0) & ~odd
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _fma_exact(a: float, b: float, c: float) -> float:
    """``a * b + c`` rounded once to float64 (exact rational arithmetic; IEEE for non-finite)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b + c
    if not math.isfinite(c):
        return c                               # a finite product (even one past float64's range)
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return a * b + c                       # the sign of an exact zero, as IEEE gives it
    try:
        return float(exact)                    # int / int division rounds correctly
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


_fma_f64 = np.frompyfunc(_fma_exact, 3, 1)


class Fma(AluFunction):
    """``a * b + c`` rounded once (``fmaf`` / ``fma``)."""

    name = "fma"
    arity = 3

    def numpy(self, a: Any, b: Any, c: Any) -> Any:
        dt = np.result_type(a, b, c)
        if dt == np.float32:
            return _fma_f32(*np.broadcast_arrays(a, b, c))
        if dt == np.float64:
            return _fma_f64(a, b, c).astype(np.float64)
        return a * b + c

    def cuda(self, c: CDomain, a: str, b: str, d: str) -> str:
        return f"{c.math('fma')}({a}, {b}, {d})" if c.floating else f"({a}) * ({b}) + {d}"


class Rcp(AluFunction):
    """``1 / a`` (correctly rounded, ``__frcp_rn``)."""

    name = "rcp"
    accepts = FLOAT
    floating = True

    def numpy(self, a: Any) -> Any:
        return 1 / a

    def cuda(self, c: CDomain, a: str) -> str:
        return f"{c.one()} / ({a})" if c.ctype == "double" else f"__frcp_rn({a})"

