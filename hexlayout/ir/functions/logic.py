"""Comparisons, logical functions and ``select``: their results are 0 / 1 (predicates).

Comparisons of floats are IEEE comparisons (false when an operand is NaN, ``-0 == +0``);
logical functions treat any non-zero operand as true.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import ANY, NUMBERS, AluFunction, CDomain, function_class

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


def _comparison(cls: str, symbol: str, ufunc: Any, accepts: frozenset[str] = NUMBERS,
                operator: bool = True) -> type[_Compare]:
    """The comparison ``a <symbol> b``, class ``cls`` named ``cls.lower()``. ``operator``:
    messages spell it ``symbol``, the tile operator (``==`` and ``!=`` are not tile operators,
    ``Tile.eq`` / ``Tile.ne``: messages name them ``eq`` / ``ne``)."""
    return function_class(cls, _Compare, f"``a {symbol} b``.", __name__, symbol=symbol, ufunc=ufunc,
                          accepts=accepts, operator=symbol if operator else None)


Lt = _comparison("Lt", "<", np.less)
Le = _comparison("Le", "<=", np.less_equal)
Gt = _comparison("Gt", ">", np.greater)
Ge = _comparison("Ge", ">=", np.greater_equal)
Eq = _comparison("Eq", "==", np.equal, ANY, operator=False)
Ne = _comparison("Ne", "!=", np.not_equal, ANY, operator=False)


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
