"""The ALU functions: one registry of per-element functions, each defined once.

``alu_function(name)`` is the one ``AluFunction`` of a name; ``ALU_FUNCTIONS`` maps every
name to it. A function is a subclass of ``AluFunction`` (``base``) holding its typing rule,
numpy semantics, CUDA C++ printing, cost and accuracy; defining the class registers it.
The language (``hl.exp``, operators), the lowering, the emulator, the code generator and
the cost model all read these definitions. Families: ``arithmetic``, ``transcendental``,
``logic`` (comparisons, logical functions, select), ``bits`` (shifts and bitwise
functions of integers), ``index_math`` (floor division and modulo of integers), ``moves``
(mov, cvt) and ``convert`` (fast integer -> f16 / bf16 conversions).
"""

from __future__ import annotations

from . import arithmetic, bits, convert, index_math, logic, moves, transcendental
from .base import (
    ALU_FUNCTIONS,
    KIND_WORDS,
    NUMPY_DOMAIN,
    AluFunction,
    AluTypeError,
    CDomain,
    UnknownFunctionError,
    alu_function,
    alu_functions,
    compute_domain,
    kind_of,
    libm,
)

__all__ = [
    "ALU_FUNCTIONS", "AluFunction", "AluTypeError", "CDomain", "UnknownFunctionError", "alu_function",
    "alu_functions", "compute_domain", "NUMPY_DOMAIN", "kind_of", "libm", "KIND_WORDS", "arithmetic", "bits",
    "convert", "index_math", "logic", "moves", "transcendental",
]
