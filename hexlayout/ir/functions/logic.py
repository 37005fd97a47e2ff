"""Comparisons, logical functions and ``select``: their results are 0 / 1 (predicates).

Comparisons of floats are IEEE comparisons (false when an operand is NaN, ``-0 == +0``);
logical functions treat any non-zero operand as true.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import ANY, AluFunction, CDomain

__all__ = ["Lt", "Le", "Gt", "Ge", "Eq", "Ne", "And", "Or", "Not", "Select"]


class _Compare(AluFunction):
    """A comparison: numpy's ``ufunc``, C's ``symbol``."""

    arity = 2
    result = "pred"
    symbol = ""
    ufunc: Any = None

    def numpy(self, a: Any, b: Any) -> Any:
        return type(self).ufunc(a, b)

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        return c.from_bool(f"{a} {self.symbol} {b}")


class Lt(_Compare):
    """``a < b``."""

    name = "lt"
    symbol = operator = "<"
    ufunc = np.less


class Le(_Compare):
    """``a <= b``."""

    name = "le"
    symbol = operator = "<="
    ufunc = np.less_equal


class Gt(_Compare):
    """``a > b``."""

    name = "gt"
    symbol = operator = ">"
    ufunc = np.greater


class Ge(_Compare):
    """``a >= b``."""

    name = "ge"
    symbol = operator = ">="
    ufunc = np.greater_equal


class Eq(_Compare):
    """``a == b``."""

    name = "eq"
    accepts = ANY
    symbol = "=="
    ufunc = np.equal


class Ne(_Compare):
    """``a != b``."""

    name = "ne"
    accepts = ANY
    symbol = "!="
    ufunc = np.not_equal


class _Logic(AluFunction):
    accepts = frozenset({"pred"})
    result = "pred"


class And(_Logic):
    """``a and b``."""

    name = "and"
    arity = 2
    operator = "&"

    def numpy(self, a: Any, b: Any) -> Any:
        return (np.asarray(a) != 0) & (np.asarray(b) != 0)

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        return c.from_bool(f"({a}) != 0 && ({b}) != 0")


class Or(_Logic):
    """``a or b``."""

    name = "or"
    arity = 2
    operator = "|"

    def numpy(self, a: Any, b: Any) -> Any:
        return (np.asarray(a) != 0) | (np.asarray(b) != 0)

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        return c.from_bool(f"({a}) != 0 || ({b}) != 0")


class Not(_Logic):
    """``not a``."""

    name = "not"
    operator = "~"

    def numpy(self, a: Any) -> Any:
        return np.asarray(a) == 0

    def cuda(self, c: CDomain, a: str) -> str:
        return c.from_bool(f"({a}) == 0")


class Select(AluFunction):
    """``a`` where the predicate ``cond`` is non-zero, else ``b``."""

    name = "select"
    arity = 3
    accepts = ANY
    condition = True

    def numpy(self, cond: Any, a: Any, b: Any) -> Any:
        return np.where(np.asarray(cond) != 0, a, b)

    def cuda(self, c: CDomain, cond: str, a: str, b: str) -> str:
        return f"({cond}) != 0 ? ({a}) : ({b})"
