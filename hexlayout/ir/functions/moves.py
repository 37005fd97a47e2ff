"""``mov`` (copy a value, ``hl.assign``, ``fill``), ``cvt`` (convert to the destination's
type, ``hl.cast``) and ``bitcast`` (reinterpret the bits, ``hl.bitcast``). ``mov`` and
``cvt`` are the identity in the compute domain: the conversion is the backend's rounding of
the operand into the domain and of the result into the destination (float -> float
nearest even, fp8 saturating; float -> integer nearest even, saturating, NaN -> 0; integer
-> integer wrapping). ``bitcast`` is the identity on bit patterns."""

from __future__ import annotations

from typing import Any

from .base import ANY, NUMBERS, AluFunction, CDomain

__all__ = ["Mov", "Cvt", "Bitcast"]


class _Identity(AluFunction):
    """The operand unchanged in the compute domain (what the destination makes of it is the
    backend's conversion, see the module docstring)."""

    def numpy(self, a: Any) -> Any:
        return a

    def cuda(self, c: CDomain, a: str) -> str:
        return a


class Mov(_Identity):
    """``a`` (the destination has the operand's type)."""

    name = "mov"
    accepts = ANY


class Cvt(_Identity):
    """``a`` converted to the destination's type."""

    name = "cvt"
    accepts = ANY
    result = "dst"


class Bitcast(_Identity):
    """The operand's bit pattern read as the destination's type (``hl.bitcast``; the
    language allows types of one width): ``numpy`` and ``cuda`` act on the pattern as an
    unsigned 64-bit integer (the source's bits, zero-extended); the destination takes its
    low bits."""

    name = "bitcast"
    accepts = NUMBERS
    result = "dst"
    on_bits = True

    def issue(self, count: int) -> float:
        return 0.25                         # a register rename at most
