"""``AluFunction``: one per-element function of the ALU, defined once with every rule.

A function is a subclass of ``AluFunction`` whose class body holds all that the layers
above need to know about it, so a new function is one class (plus its test):

- typing: ``arity``; ``accepts`` (the element kinds its operands may have: ``"float"``,
  ``"int"`` (signed), ``"uint"``, ``"pred"``); ``result`` (``"same"``: the operands'
  type, ``"pred"``: a predicate, ``"dst"``: whatever the destination is, as ``cvt``, or
  the name of one type, as ``"f16"``: always that type);
  ``condition`` (the first operand is a predicate, the rest are typed, as ``select``).
  ``result_dtype(dtypes)`` applies the rule (``None`` stands for a scalar operand).
- semantics: ``numpy(*xs)``, evaluated in the C compute domain of the printed code (see
  below) on numpy arrays of that domain's type; ``floating``: the function always
  computes in floating point (an integer destination receives the rounded result).
- CUDA C++: ``cuda(c, *xs)``, the expression over the operand expressions ``xs`` in the
  compute domain described by ``c`` (a ``CDomain``).
- ``integer_domain``: the function computes on the integer operands themselves (the
  ``int`` domain) whatever its result type; ``cuda`` then gives a value of the result's C
  type and ``numpy`` the result's values (the fast integer -> float conversions).
- ``on_bits``: the function acts on bit patterns (``bitcast``): its operands are register
  slices, ``numpy`` and ``cuda`` see each element's bits as an unsigned 64-bit integer
  (zero-extended) and the destination takes the low bits of the result.
- cost: ``issue(count)``, issue slots of one instruction over ``count`` elements.
- accuracy: ``ulp``, the largest difference, in units in the last place of the
  destination type, between the printed code and ``numpy`` (0: bit for bit), and
  ``device_ulp``, the bound CUDA documents for the device math function it calls.
- language: ``lang_name`` (an ``hl.<lang_name>(x, out=None)`` unary function is generated
  for it), ``operator`` (how error messages spell it, e.g. ``+``).
- device helper: ``helper``, the name of a device function of ``hexlayout.codegen.helpers``
  its printing calls (inline PTX such as ``ex2.approx.ftz.f32``); the code generator emits it
  where used, and the registry test's host harness has a stand-in for it.

The compute domain: a floating destination computes in ``float`` (``double`` for f64);
an integer or predicate destination computes in ``float`` when the function is
``floating`` or an operand is floating, otherwise in ``int`` (``long long`` for 64-bit
destinations). Operands are converted into the domain (as C converts them), every step
of the expression is rounded to the domain (as C does), and the result is converted to
the destination type by the backend (floats round to nearest even, fp8 saturates,
integers round to nearest even and saturate from floats and wrap from integers).

The instances are strings (their name), so the text form of a kernel, equality with a
name and dictionary lookups by name keep working; ``alu_function(name)`` returns the one
instance of a name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from hexlayout.arch.dtypes import DTYPES, PRED, DType
from hexlayout.errors import HexlayoutError

__all__ = [
    "AluFunction", "CDomain", "AluTypeError", "UnknownFunctionError", "alu_function", "alu_functions",
    "ALU_FUNCTIONS", "kind_of", "KIND_WORDS", "compute_domain", "NUMPY_DOMAIN", "libm", "function_class",
]

#: every function, by name (the registry)
ALU_FUNCTIONS: dict[str, AluFunction] = {}

#: how a message names operands of each kind
KIND_WORDS = {"float": "floating-point", "int": "signed integer", "uint": "unsigned integer",
              "pred": "predicate"}

FLOAT = frozenset({"float"})
NUMBERS = frozenset({"float", "int", "uint"})
ANY = frozenset({"float", "int", "uint", "pred"})


def kind_of(dt: DType) -> str:
    """The kind of ``dt`` as ``accepts`` spells it (``float``, ``int``, ``uint``, ``pred``,
    ``bits``)."""
    return "pred" if dt == PRED else dt.kind


class UnknownFunctionError(HexlayoutError, ValueError):
    """A name that is not an ALU function."""


class AluTypeError(HexlayoutError, TypeError):
    """An operand list a function does not accept: ``requirement`` is ``"condition"`` (the
    first operand must be a predicate), ``"tile"`` (a typed operand is needed), ``"same"``
    (the typed operands differ), or ``"kind"`` (an operand's kind is not accepted);
    ``operands`` are the indices involved."""

    def __init__(self, fn: AluFunction, requirement: str, operands: tuple[int, ...], message: str) -> None:
        super().__init__(f"{fn}: {message}")
        self.fn = fn
        self.requirement = requirement
        self.operands = operands


@dataclass(frozen=True)
class CDomain:
    """The C type an ALU expression is computed in, for ``AluFunction.cuda``.

    ``ctype``: ``float``, ``double``, ``int`` or ``long long``; ``literal(x)`` spells a
    floating constant of this domain (given by the code generator)."""

    ctype: str
    literal: Callable[[float], str]

    @property
    def floating(self) -> bool:
        return self.ctype in ("float", "double")

    def math(self, name: str) -> str:
        """The C math function ``name`` of this domain (``expf`` for float, ``exp`` for double)."""
        return f"{name}f" if self.ctype == "float" else name

    def lit(self, x: float) -> str:
        return self.literal(x)

    def one(self) -> str:
        return self.literal(1.0)

    def from_bool(self, x: str) -> str:
        """A C boolean expression as a value of the domain (0 or 1)."""
        return f"static_cast<{self.ctype}>({x})" if self.floating else f"int({x})"


class AluFunction(str):
    """One ALU function (see the module docstring). Subclasses define the rules; the one
    instance of each is registered under ``name`` when the class is defined."""

    name: ClassVar[str] = ""
    arity: ClassVar[int] = 1
    accepts: ClassVar[frozenset[str]] = NUMBERS
    result: ClassVar[str] = "same"
    condition: ClassVar[bool] = False
    floating: ClassVar[bool] = False
    integer_domain: ClassVar[bool] = False
    on_bits: ClassVar[bool] = False
    ulp: ClassVar[int] = 0
    device_ulp: ClassVar[int] = 0
    lang_name: ClassVar[str | None] = None
    #: the device helper (``hexlayout.codegen.helpers``) its printing calls, emitted where used
    helper: ClassVar[str | None] = None
    operator: ClassVar[str | None] = None

    def __new__(cls, name: str) -> AluFunction:
        return super().__new__(cls, name)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if not cls.__dict__.get("name"):
            return                          # an abstract family (no name of its own)
        if cls.name in ALU_FUNCTIONS:
            raise ValueError(f"ALU function {cls.name!r} is defined twice "
                             f"({type(ALU_FUNCTIONS[cls.name]).__qualname__} and {cls.__qualname__})")
        if cls.result not in ("same", "pred", "dst") and cls.result not in DTYPES:
            raise ValueError(f"{cls.__qualname__}.result is {cls.result!r}, not 'same', 'pred', 'dst' "
                             f"or a type name")
        ALU_FUNCTIONS[cls.name] = cls(cls.name)

    def __reduce__(self) -> tuple[Any, ...]:
        if ALU_FUNCTIONS.get(str(self)) is self:
            return alu_function, (str(self),)          # unpickles to the registered instance
        return type(self), (str(self),)

    def __copy__(self) -> AluFunction:
        return self                                     # immutable

    def __deepcopy__(self, memo: dict[int, Any]) -> AluFunction:
        return self

    def __repr__(self) -> str:
        return f"AluFunction({str(self)!r})"

    @property
    def doc(self) -> str:
        """The math, from the class docstring."""
        return (type(self).__doc__ or "").strip()

    # --- typing ---------------------------------------------------------------------
    def result_dtype(self, dtypes: Sequence[DType | None], dst: DType | None = None) -> DType:
        """The result's element type for operands of ``dtypes`` (``None``: a scalar), or
        ``AluTypeError``. ``dst`` is the destination type (needed when ``result`` is ``"dst"``)."""
        if len(dtypes) != self.arity:
            raise AluTypeError(self, "arity", tuple(range(len(dtypes))),
                               f"takes {self.arity} operand(s), got {len(dtypes)}")
        first = 0
        if self.condition:
            if dtypes[0] != PRED:
                raise AluTypeError(self, "condition", (0,), "the condition must be a predicate tile")
            first = 1
        typed = [(i, d) for i, d in enumerate(dtypes) if i >= first and d is not None]
        if not typed and self.condition:
            raise AluTypeError(self, "tile", (), "needs a tile among the choices")
        if len({d for _, d in typed}) > 1:
            raise AluTypeError(self, "same", tuple(i for i, _ in typed), "element types differ")
        for i, d in typed:
            if kind_of(d) not in self.accepts:
                want = " or ".join(KIND_WORDS[k] for k in sorted(self.accepts))
                raise AluTypeError(self, "kind", (i,), f"needs {want} operands, operand {i} is {d}")
        if self.result == "pred":
            return PRED
        if self.result in DTYPES:
            return DTYPES[self.result]
        if self.result == "dst":
            if dst is None:
                raise AluTypeError(self, "dst", (), "the result type is the destination's, none given")
            return dst
        if not typed:
            raise AluTypeError(self, "tile", (), "needs a typed operand")
        return typed[0][1]

    # --- semantics, printing, cost ----------------------------------------------------
    def numpy(self, *xs: Any) -> Any:
        """The function on numpy arrays of the compute domain (float32, float64 or int64)."""
        raise NotImplementedError(f"{type(self).__qualname__} defines no numpy semantics")

    def cuda(self, c: CDomain, *xs: str) -> str:
        """The C++ expression over the operand expressions ``xs`` in the domain ``c``."""
        raise NotImplementedError(f"{type(self).__qualname__} defines no CUDA printing")

    def issue(self, count: int) -> float:
        """Issue slots of one instruction over ``count`` elements (one per four elements)."""
        return max(1.0, count / 4)

    def ulp_bound(self, dst: DType) -> int:
        """The largest difference in ``dst`` ulps allowed between the printed code and
        ``numpy``: ``ulp`` for f32 / f64 results; a function that is not bit exact in f32
        may differ by one ulp after rounding to a narrower type."""
        if self.ulp == 0:
            return 0
        return self.ulp if dst.bits >= 32 else 1


def function_class(cls: str, base: type[AluFunction], doc: str, module: str, **rules: Any) -> Any:
    """Define (and so register) the function class ``cls`` of module ``module``, a subclass of
    the family ``base`` with the math ``doc`` and the class attributes ``rules``; its name is
    ``cls.lower()`` unless ``rules`` gives one. For the families whose members differ only in
    their attributes (one operator, one library function), defined as a table."""
    return type(cls, (base,), {"__doc__": doc, "__module__": module, "__qualname__": cls, "name": cls.lower(),
                               **rules})


def alu_function(fn: str) -> AluFunction:
    """The function named ``fn`` (an ``AluFunction`` is returned unchanged)."""
    if isinstance(fn, AluFunction):
        return fn
    try:
        return ALU_FUNCTIONS[fn]
    except (KeyError, TypeError):
        raise UnknownFunctionError(f"unknown ALU function {fn!r}; known: {', '.join(sorted(ALU_FUNCTIONS))}"
                                   ) from None


def alu_functions() -> Iterator[AluFunction]:
    """Every registered function, in definition order."""
    return iter(list(ALU_FUNCTIONS.values()))


def compute_domain(fn: AluFunction, dst: DType, float_operand: bool) -> str:
    """The C type ``fn`` computes in for a ``dst`` destination (see the module docstring):
    ``float``, ``double``, ``int`` or ``long long``."""
    if fn.integer_domain:
        return "int"
    if dst.is_float:
        return "double" if dst.bits == 64 else "float"
    if fn.floating or float_operand:
        return "float"
    return "long long" if dst.bits == 64 else "int"


#: numpy type of each compute domain
NUMPY_DOMAIN = {"float": np.float32, "double": np.float64, "int": np.int64, "long long": np.int64}


_WIDE = np.longdouble if np.finfo(np.longdouble).nmant > 52 else np.float64   # x87: 64-bit mantissa


def libm(f: Callable[[Any], Any], x: Any) -> Any:
    """The math-library function ``f`` (a numpy ufunc) of ``x`` as a correctly rounding C
    library computes it in ``x``'s precision: evaluated in a wider type (float32 in float64,
    float64 in long double where that is wider) and rounded once (numpy's own float32 and
    float64 kernels are less accurate than glibc's or CUDA's)."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return f(x.astype(np.float64)).astype(np.float32)
    if x.dtype == np.float64:
        return f(x.astype(_WIDE)).astype(np.float64)
    return f(x)


def is_integer_array(x: Any) -> bool:
    return np.asarray(x).dtype.kind in "iub"
