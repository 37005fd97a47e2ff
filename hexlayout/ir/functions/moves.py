"""``mov`` (copy a value, ``hl.assign``, ``fill``) and ``cvt`` (convert to the destination's
type, ``hl.cast``). Both are the identity in the compute domain: the conversion is the
backend's rounding of the operand into the domain and of the result into the destination
(float -> float nearest even, fp8 saturating; float -> integer nearest even, saturating,
NaN -> 0; integer -> integer wrapping)."""

from __future__ import annotations

from typing import Any

from .base import ANY, AluFunction, CDomain

__all__ = ["Mov", "Cvt"]


class Mov(AluFunction):
    """``a`` (the destination has the operand's type)."""

    name = "mov"
    accepts = ANY

    def numpy(self, a: Any) -> Any:
        return a

    def cuda(self, c: CDomain, a: str) -> str:
        return a


class Cvt(AluFunction):
    """``a`` converted to the destination's type."""

    name = "cvt"
    accepts = ANY
    result = "dst"

    def numpy(self, a: Any) -> Any:
        return a

    def cuda(self, c: CDomain, a: str) -> str:
        return a
