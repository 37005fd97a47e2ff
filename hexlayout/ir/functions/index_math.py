"""Floor division and modulo of integers, as Python spells them: ``a // b``, ``a % b``.

Index arithmetic (``pos // block_size``, ``pos % block_size``) rounds toward negative
infinity, so ``a == (a // b) * b + a % b`` and ``a % b`` has the sign of ``b``. A zero
divisor gives 0 for both; ``a // -1`` is ``-a`` wrapping as two's complement (the most
negative value stays itself) and ``a % -1`` is 0. The printed C guards both cases, so no
input traps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import AluFunction, CDomain
from .bits import INTEGERS

__all__ = ["FloorDiv", "Mod"]


def _split(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    special = (b == 0) | (b == -1)
    return a, b, np.where(special, 1, b)


class FloorDiv(AluFunction):
    """``floor(a / b)`` of integers (0 for ``b == 0``; ``-a``, wrapping, for ``b == -1``)."""

    name = "floordiv"
    arity = 2
    accepts = INTEGERS
    operator = "//"

    def numpy(self, a: Any, b: Any) -> Any:
        a, b, safe = _split(a, b)
        with np.errstate(over="ignore"):
            neg = (np.zeros_like(a).astype(np.uint64) - a.astype(np.uint64)).astype(np.int64)
        return np.where(b == 0, 0, np.where(b == -1, neg, np.floor_divide(a, safe)))

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        t = c.ctype
        neg = f"static_cast<{t}>(0ULL - static_cast<unsigned long long>({a}))"
        floor = f"({a}) / ({b}) - static_cast<{t}>((({a}) % ({b}) != 0) && ((({a}) < 0) != (({b}) < 0)))"
        m1 = f"(({b}) < 0 && ({b}) == -1)"        # false for every unsigned divisor
        return f"(({b}) == 0 ? static_cast<{t}>(0) : {m1} ? {neg} : {floor})"


class Mod(AluFunction):
    """``a - floor(a / b) * b`` of integers: the sign of ``b`` (0 for ``b`` in {0, -1})."""

    name = "mod"
    arity = 2
    accepts = INTEGERS
    operator = "%"

    def numpy(self, a: Any, b: Any) -> Any:
        a, b, safe = _split(a, b)
        return np.where((b == 0) | (b == -1), 0, np.mod(a, safe))

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        t = c.ctype
        r = f"(({a}) % ({b}))"
        fix = f"({r} != 0 && (({r} < 0) != (({b}) < 0)) ? ({b}) : static_cast<{t}>(0))"
        return f"(({b}) == 0 || (({b}) < 0 && ({b}) == -1) ? static_cast<{t}>(0) : {r} + {fix})"
