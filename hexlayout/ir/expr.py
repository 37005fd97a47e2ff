"""Scalar integer / boolean expressions of the lowered program.

An ``Expr`` is a tree over ``Var`` (thread index, block index, loop variables, kernel
scalars) and ``Const``, closed under ``+ - * // % & | ^ << >>``, comparisons, ``min``,
``max`` and ``select``. Python operators build expressions, so a CuTe ``Layout`` or
``Swizzle`` evaluated at an ``Expr`` coordinate yields the symbolic address expression
(``crd2idx`` only uses ``+ * // %``; swizzles use ``& >> ^``).

Construction simplifies: constants fold; ``x+0``, ``x*1``, ``x*0``, ``x//1``, ``x%1``
vanish; with variable bounds ``0 <= x < n`` known, ``x % m == x`` and ``x // m == 0``
for ``n <= m``. Integer division and modulo are floor operations on non-negative
operands, matching C's ``/`` and ``%`` there.

``evaluate(e, env)`` computes an expression over numpy arrays (vectorized over
threads and values); ``to_c(e)`` prints it as a C expression.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, Union

import numpy as np

__all__ = [
    "Expr", "Var", "Const", "BinOp", "UnOp", "Select", "ExprLike", "as_expr", "evaluate", "to_c",
    "select", "emin", "emax", "bounds", "free_vars", "substitute", "is_const", "const_value", "RegRead",
    "reg_reads", "replace_leaves",
]

ExprLike = Union["Expr", int, bool, np.integer]


def _forward(op: str) -> Callable[[Expr, ExprLike], Expr]:
    """The method ``self <op> o``."""
    def method(self: Expr, o: ExprLike) -> Expr:
        return _binop(op, self, o)
    return method


def _reflected(op: str) -> Callable[[Expr, ExprLike], Expr]:
    """The method ``o <op> self`` (Python's reflected operand, or ``>`` as a reversed ``<``)."""
    def method(self: Expr, o: ExprLike) -> Expr:
        return _binop(op, o, self)
    return method


class Expr:
    """Base class; subclasses are immutable and hashable by structure."""

    __slots__ = ()

    # arithmetic and bits (``a <op> b``; reflected: ``b <op> a``) --------------------
    __add__, __radd__ = _forward("+"), _reflected("+")
    __sub__, __rsub__ = _forward("-"), _reflected("-")
    __mul__, __rmul__ = _forward("*"), _reflected("*")
    __floordiv__, __rfloordiv__ = _forward("//"), _reflected("//")
    __mod__, __rmod__ = _forward("%"), _reflected("%")
    __and__, __rand__ = _forward("&"), _reflected("&")
    __or__, __ror__ = _forward("|"), _reflected("|")
    __xor__, __rxor__ = _forward("^"), _reflected("^")
    __lshift__, __rlshift__ = _forward("<<"), _reflected("<<")
    __rshift__, __rrshift__ = _forward(">>"), _reflected(">>")

    def __neg__(self) -> Expr:
        return _binop("-", 0, self)

    # comparisons build expressions (use ``structurally_equal`` for identity); ``a > b`` is
    # ``b < a`` --------------------------------------------------------------------------
    __lt__, __gt__ = _forward("<"), _reflected("<")
    __le__, __ge__ = _forward("<="), _reflected("<=")
    eq, ne = _forward("=="), _forward("!=")
    logical_and, logical_or = _forward("&&"), _forward("||")

    def logical_not(self) -> Expr:
        return UnOp.make("!", self)

    def __bool__(self) -> bool:
        raise TypeError(
            f"the symbolic expression {to_c(self)} has no Python truth value; "
            "use hexlayout.lang conditionals (hl.if_) or select()"
        )

    def __index__(self) -> int:
        """Refuse use as a Python integer (``range(n)``, ``[0] * n``, ``seq[n]``): the value is
        known only when the kernel runs."""
        raise TypeError(
            f"the symbolic expression {to_c(self)} is not a Python integer (its value is known only "
            "when the kernel runs); use hl.range(...) for a runtime loop, or make the size a "
            "compile-time constant (a keyword-only kernel parameter) to unroll with a Python range"
        )

    def __str__(self) -> str:
        return to_c(self)

    def __repr__(self) -> str:
        return f"Expr({to_c(self)})"


def _no_number_equality(e: Expr, o: object) -> None:
    """``expr == 3`` has no Python truth value for a non-constant expression."""
    if isinstance(o, (int, float, np.integer)) and not isinstance(o, bool):
        raise TypeError(
            f"the symbolic expression {to_c(e)} == {o} has no Python truth value; use "
            "expr.eq(...) to build the comparison, or hexlayout.lang conditionals (hl.if_)"
        )


class Const(Expr):
    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        object.__setattr__(self, "value", int(value))

    def __eq__(self, o: object) -> bool:
        if isinstance(o, (int, np.integer)) and not isinstance(o, bool):
            return self.value == int(o)
        return isinstance(o, Const) and o.value == self.value

    def __hash__(self) -> int:
        return hash(("c", self.value))


class Var(Expr):
    """A named integer variable with optional bounds ``lo <= v < hi`` (``hi`` exclusive)."""

    __slots__ = ("name", "lo", "hi", "kind")

    def __init__(self, name: str, lo: int | None = 0, hi: int | None = None, kind: str = "var") -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "kind", kind)

    def __eq__(self, o: object) -> bool:
        _no_number_equality(self, o)
        return o is self

    def __hash__(self) -> int:
        return id(self)


class BinOp(Expr):
    __slots__ = ("op", "a", "b", "_h", "_bounds")

    def __init__(self, op: str, a: Expr, b: Expr) -> None:
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)
        object.__setattr__(self, "_h", hash((op, a, b)))
        object.__setattr__(self, "_bounds", None)

    def __eq__(self, o: object) -> bool:
        _no_number_equality(self, o)
        return (isinstance(o, BinOp) and o._h == self._h and o.op == self.op
                and o.a == self.a and o.b == self.b)

    def __hash__(self) -> int:
        return self._h


class UnOp(Expr):
    __slots__ = ("op", "a")

    def __init__(self, op: str, a: Expr) -> None:
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "a", a)

    @staticmethod
    def make(op: str, a: Expr) -> Expr:
        if isinstance(a, Const):
            return Const(int(not a.value))
        return UnOp(op, a)

    def __eq__(self, o: object) -> bool:
        _no_number_equality(self, o)
        return isinstance(o, UnOp) and o.op == self.op and o.a == self.a

    def __hash__(self) -> int:
        return hash(("u", self.op, self.a))


class Select(Expr):
    __slots__ = ("cond", "a", "b")

    def __init__(self, cond: Expr, a: Expr, b: Expr) -> None:
        object.__setattr__(self, "cond", cond)
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)

    def __eq__(self, o: object) -> bool:
        _no_number_equality(self, o)
        return isinstance(o, Select) and (o.cond, o.a, o.b) == (self.cond, self.a, self.b)

    def __hash__(self) -> int:
        return hash(("sel", self.cond, self.a, self.b))


class RegRead(Expr):
    """Element ``index`` of a per-thread register array (an integer loaded at run time, e.g. a
    gathered row index): a leaf whose value differs per thread. ``evaluate`` takes its
    values from ``env[array]`` (a ``[threads, count]`` array); ``to_c`` prints
    ``name[index]``. Non-negative when the array's type is unsigned; a signed value (a block-table
    entry, a slot) may be negative, so comparisons with 0 are not folded away."""

    __slots__ = ("array", "index")

    def __init__(self, array: Any, index: int) -> None:
        object.__setattr__(self, "array", array)
        object.__setattr__(self, "index", int(index))

    def __eq__(self, o: object) -> bool:
        _no_number_equality(self, o)
        return isinstance(o, RegRead) and o.array is self.array and o.index == self.index

    def __hash__(self) -> int:
        return hash(("reg", id(self.array), self.index))


def _leaves(e: ExprLike, kind: type) -> set[Any]:
    """The leaves of ``e`` of class ``kind``."""
    if isinstance(e, kind):
        return {e}
    if isinstance(e, BinOp):
        return _leaves(e.a, kind) | _leaves(e.b, kind)
    if isinstance(e, UnOp):
        return _leaves(e.a, kind)
    if isinstance(e, Select):
        return _leaves(e.cond, kind) | _leaves(e.a, kind) | _leaves(e.b, kind)
    return set()


def reg_reads(e: ExprLike) -> set[RegRead]:
    """The register leaves of ``e``."""
    return _leaves(e, RegRead)


def replace_leaves(e: ExprLike, fn: Callable[[Expr], ExprLike]) -> Expr:
    """``e`` rebuilt with every ``Var`` / ``RegRead`` leaf ``x`` replaced by ``fn(x)``."""
    e = as_expr(e)
    if isinstance(e, (Var, RegRead)):
        return as_expr(fn(e))
    if isinstance(e, BinOp):
        return _binop(e.op, replace_leaves(e.a, fn), replace_leaves(e.b, fn))
    if isinstance(e, UnOp):
        return UnOp.make(e.op, replace_leaves(e.a, fn))
    if isinstance(e, Select):
        return select(replace_leaves(e.cond, fn), replace_leaves(e.a, fn), replace_leaves(e.b, fn))
    return e


def as_expr(x: ExprLike) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, int, np.integer)):
        return Const(int(x))
    raise TypeError(f"{x!r} is not an integer expression")


def is_const(x: ExprLike) -> bool:
    return not isinstance(x, Expr) or isinstance(x, Const)


def const_value(x: ExprLike) -> int:
    if isinstance(x, Const):
        return x.value
    if isinstance(x, Expr):
        raise ValueError(f"{to_c(x)} is not a constant")
    return int(x)


_PY: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
    "%": operator.mod, "&": operator.and_, "|": operator.or_, "^": operator.xor,
    "<<": operator.lshift, ">>": operator.rshift,
    "<": lambda a, b: int(a < b), "<=": lambda a, b: int(a <= b),
    "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
    "&&": lambda a, b: int(bool(a) and bool(b)), "||": lambda a, b: int(bool(a) or bool(b)),
    "min": min, "max": max,
}

_NP: dict[str, Callable[[Any, Any], Any]] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide, "%": np.mod,
    "&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor, "<<": np.left_shift,
    ">>": np.right_shift, "<": np.less, "<=": np.less_equal, "==": np.equal, "!=": np.not_equal,
    "&&": np.logical_and, "||": np.logical_or, "min": np.minimum, "max": np.maximum,
}


def bounds(e: ExprLike) -> tuple[int | None, int | None]:
    """Conservative ``[lo, hi)`` of ``e`` (``None`` = unbounded)."""
    if not isinstance(e, Expr):
        return int(e), int(e) + 1
    if isinstance(e, Const):
        return e.value, e.value + 1
    if isinstance(e, Var):
        return e.lo, e.hi
    if isinstance(e, RegRead):
        dt = getattr(e.array, "dtype", None)
        return (0, None) if dt is not None and getattr(dt, "kind", "") == "uint" else (None, None)
    if isinstance(e, BinOp):
        if e._bounds is None:
            object.__setattr__(e, "_bounds", _binop_bounds(e))
        return e._bounds
    if isinstance(e, Select):
        (al, ah), (bl, bh) = bounds(e.a), bounds(e.b)
        lo = None if al is None or bl is None else min(al, bl)
        hi = None if ah is None or bh is None else max(ah, bh)
        return lo, hi
    if isinstance(e, UnOp):
        return 0, 2
    return None, None


def _binop_bounds(e: BinOp) -> tuple[int | None, int | None]:
    (al, ah), (bl, bh) = bounds(e.a), bounds(e.b)
    if e.op == "+":
        return (None if al is None or bl is None else al + bl,
                None if ah is None or bh is None else ah + bh - 1)
    if e.op == "*" and None not in (al, ah, bl, bh) and al >= 0 and bl >= 0:
        return al * bl, (ah - 1) * (bh - 1) + 1
    if e.op == "*" and None not in (al, bl) and al >= 0 and bl >= 0:
        return al * bl, None
    if e.op == "//" and isinstance(e.b, Const) and e.b.value > 0 and al is not None and al >= 0:
        return al // e.b.value, None if ah is None else (ah - 1) // e.b.value + 1
    if e.op == "%" and isinstance(e.b, Const) and e.b.value > 0 and al is not None and al >= 0:
        hi = e.b.value if ah is None else min(e.b.value, ah)
        return 0, hi
    if e.op == "&" and isinstance(e.b, Const) and e.b.value >= 0:
        return 0, e.b.value + 1
    if e.op in ("<", "<=", "==", "!=", "&&", "||"):
        return 0, 2
    if e.op == "min" and None not in (ah, bh):
        lo = None if al is None or bl is None else min(al, bl)
        return lo, min(ah, bh)
    if e.op == "max" and (al is not None or bl is not None):
        hi = None if ah is None or bh is None else max(ah, bh)
        return max(x for x in (al, bl) if x is not None), hi
    if e.op == ">>" and isinstance(e.b, Const) and al is not None and al >= 0:
        return al >> e.b.value, None if ah is None else ((ah - 1) >> e.b.value) + 1
    return None, None


def _binop(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """``a op b``, simplified: two constants folded, else the rule of ``op`` in ``_SIMPLIFY``
    (identities, constants folded to the right, divisions of known multiples or bounds)."""
    a, b = as_expr(a), as_expr(b)
    if isinstance(a, Const) and isinstance(b, Const):
        if op in ("//", "%") and b.value == 0:
            raise ZeroDivisionError(f"constant expression {a.value} {op} 0")
        return Const(_PY[op](a.value, b.value))
    ca = a.value if isinstance(a, Const) else None
    cb = b.value if isinstance(b, Const) else None
    rule = _SIMPLIFY.get(op)
    out = rule(op, a, b, ca, cb) if rule is not None else None
    return out if out is not None else BinOp(op, a, b)


def _simplify_add(op: str, a: Expr, b: Expr, ca: Any, cb: Any) -> Expr | None:
    """``a + b``: drop a 0; fold constants to the right: (x + c1) + c2 -> x + (c1 + c2)."""
    if ca == 0:
        return b
    if cb == 0:
        return a
    if cb is not None and isinstance(a, BinOp) and a.op == "+" and isinstance(a.b, Const):
        return _binop("+", a.a, a.b.value + cb)
    if ca is not None:
        return _binop("+", b, a)
    return None


def _simplify_sub(op: str, a: Expr, b: Expr, ca: Any, cb: Any) -> Expr | None:
    """``a - c``: ``a + (-c)``."""
    if cb == 0:
        return a
    if cb is not None:
        return _binop("+", a, -cb)
    return None


def _simplify_mul(op: str, a: Expr, b: Expr, ca: Any, cb: Any) -> Expr | None:
    """``a * b``: 0 and 1 folded, constants to the right: (x * c1) * c2 -> x * (c1 * c2)."""
    if ca == 0 or cb == 0:
        return Const(0)
    if ca == 1:
        return b
    if cb == 1:
        return a
    if ca is not None:
        return _binop("*", b, a)
    if cb is not None and isinstance(a, BinOp) and a.op == "*" and isinstance(a.b, Const):
        return _binop("*", a.a, a.b.value * cb)
    return None


def _simplify_div(op: str, a: Expr, b: Expr, ca: Any, cb: Any) -> Expr | None:
    """``a // c`` (c > 0): multiples of c split off, 0 when ``a`` is within [0, c), scaled
    products and nested divisions merged."""
    if cb == 1:
        return a
    if cb is None or cb <= 0:
        return None
    rest, mult = _split_multiple(a, cb)
    if mult is not None:
        out = _binop("//", rest, cb)
        for t in _terms(mult):
            out = _binop("+", out, _binop("//", t, cb))
        return out
    lo, hi = bounds(a)
    if lo is not None and hi is not None and lo >= 0 and hi <= cb:
        return Const(0)
    # (x * c1) // c2 with c2 | c1, or c1 | c2 (x >= 0)
    if isinstance(a, BinOp) and a.op == "*" and isinstance(a.b, Const) and a.b.value > 0:
        if a.b.value % cb == 0:
            return _binop("*", a.a, a.b.value // cb)
        if cb % a.b.value == 0 and _nonneg(a.a):
            return _binop("//", a.a, cb // a.b.value)
    # (x // c1) // c2 -> x // (c1*c2) for non-negative x
    if isinstance(a, BinOp) and a.op == "//" and isinstance(a.b, Const) and a.b.value > 0:
        alo, _ = bounds(a.a)
        if alo is not None and alo >= 0:
            return _binop("//", a.a, a.b.value * cb)
    return None


def _simplify_mod(op: str, a: Expr, b: Expr, ca: Any, cb: Any) -> Expr | None:
    """``a % c`` (c > 0): multiples of c dropped, ``a`` itself when within [0, c), scaled
    products and nested remainders reduced."""
    if cb == 1:
        return Const(0)
    if cb is None or cb <= 0:
        return None
    rest, mult = _split_multiple(a, cb)
    if mult is not None:
        return _binop("%", rest, cb)
    lo, hi = bounds(a)
    if lo is not None and hi is not None and lo >= 0 and hi <= cb:
        return a
    if isinstance(a, BinOp) and a.op == "*" and isinstance(a.b, Const) and a.b.value % cb == 0:
        return Const(0)
    # (x * c1) % c2 with c1 | c2 -> (x % (c2 / c1)) * c1 (x >= 0)
    if isinstance(a, BinOp) and a.op == "*" and isinstance(a.b, Const) and a.b.value > 0 \
            and cb % a.b.value == 0 and _nonneg(a.a):
        return _binop("*", _binop("%", a.a, cb // a.b.value), a.b.value)
    # (x % c1) % c2 with c2 | c1
    if isinstance(a, BinOp) and a.op == "%" and isinstance(a.b, Const) and a.b.value % cb == 0:
        return _binop("%", a.a, cb)
    return None


def _simplify_bits(op: str, a: Expr, b: Expr, ca: Any, cb: Any) -> Expr | None:
    """``&``, ``|``, ``^``, ``<<``, ``>>``: identities and zeros, shifts and masks that keep
    or clear every bit of a value within known bounds."""
    if op == "&" and (ca == 0 or cb == 0):
        return Const(0)
    if op in ("|", "^") and cb == 0:
        return a
    if op in ("|", "^") and ca == 0:
        return b
    if op in ("<<", ">>") and cb == 0:
        return a
    if op == ">>" and cb is not None:
        lo, hi = bounds(a)
        if lo is not None and hi is not None and lo >= 0 and hi <= (1 << cb):
            return Const(0)
    if op == "&" and cb is not None:
        lo, hi = bounds(a)
        if lo is not None and hi is not None and lo >= 0 and hi <= 1 << (cb.bit_length()) and \
                cb == (1 << cb.bit_length()) - 1:
            return a
    return None


def _simplify_logic(op: str, a: Expr, b: Expr, ca: Any, cb: Any) -> Expr | None:
    """``&&`` / ``||`` with a constant side."""
    if op == "&&":
        if ca is not None:
            return b if ca else Const(0)
        if cb is not None:
            return a if cb else Const(0)
        return None
    if ca is not None:
        return Const(1) if ca else b
    if cb is not None:
        return Const(1) if cb else a
    return None


def _simplify_less(op: str, a: Expr, b: Expr, ca: Any, cb: Any) -> Expr | None:
    """``<`` / ``<=`` decided by the operands' bounds."""
    (al, ah), (bl, bh) = bounds(a), bounds(b)
    if op == "<" and ah is not None and bl is not None and ah - 1 < bl:
        return Const(1)
    if op == "<" and al is not None and bh is not None and al >= bh - 1:
        return Const(0)
    if op == "<=" and ah is not None and bl is not None and ah - 1 <= bl:
        return Const(1)
    return None


_SIMPLIFY = {"+": _simplify_add, "-": _simplify_sub, "*": _simplify_mul, "//": _simplify_div,
             "%": _simplify_mod, **dict.fromkeys(("&", "|", "^", "<<", ">>"), _simplify_bits),
             "&&": _simplify_logic, "||": _simplify_logic, "<": _simplify_less, "<=": _simplify_less}


def _nonneg(e: Expr) -> bool:
    lo, _ = bounds(e)
    return lo is not None and lo >= 0


def _terms(e: Expr) -> list[Expr]:
    if isinstance(e, BinOp) and e.op == "+":
        return _terms(e.a) + _terms(e.b)
    return [e]


def _is_multiple(e: Expr, c: int) -> bool:
    if isinstance(e, Const):
        return e.value % c == 0
    if isinstance(e, BinOp) and e.op == "*":
        return (isinstance(e.b, Const) and e.b.value % c == 0) or _is_multiple(e.a, c)
    return False


def _split_multiple(a: Expr, c: int) -> tuple[Expr, Expr | None]:
    """Split a sum ``a`` into (rest, multiple of c) when some terms are multiples of ``c``
    and the rest is non-negative (so that floor division and modulo distribute)."""
    terms = _terms(a)
    if len(terms) < 2:
        return a, None
    mult = [t for t in terms if _is_multiple(t, c)]
    if not mult:
        return a, None
    rest_terms = [t for t in terms if not _is_multiple(t, c)]
    rest: Expr = Const(0)
    for t in rest_terms:
        rest = _binop("+", rest, t)
    lo, _ = bounds(rest)
    if lo is None or lo < 0:
        return a, None
    m: Expr = Const(0)
    for t in mult:
        m = _binop("+", m, t)
    return rest, m


def select(cond: ExprLike, a: ExprLike, b: ExprLike) -> Expr:
    cond, a, b = as_expr(cond), as_expr(a), as_expr(b)
    if isinstance(cond, Const):
        return a if cond.value else b
    if a == b:
        return a
    return Select(cond, a, b)


def emin(a: ExprLike, b: ExprLike) -> Expr:
    return _binop("min", a, b)


def emax(a: ExprLike, b: ExprLike) -> Expr:
    return _binop("max", a, b)


def evaluate(e: ExprLike, env: Mapping[Var, Any]) -> Any:
    """Value of ``e`` with each ``Var`` replaced by ``env[var]`` (ints or numpy arrays)."""
    if not isinstance(e, Expr):
        return e
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        try:
            return env[e]
        except KeyError:
            raise KeyError(f"no value for variable {e.name!r}") from None
    if isinstance(e, RegRead):
        try:
            values = env[e.array]  # type: ignore[index]
        except KeyError:
            raise KeyError(f"no values for register array {getattr(e.array, 'name', e.array)!r}") from None
        return np.asarray(values)[..., e.index].astype(np.int64)
    if isinstance(e, BinOp):
        a, b = evaluate(e.a, env), evaluate(e.b, env)
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            r = _NP[e.op](a, b)
            return r.astype(np.int64) if r.dtype == bool else r
        return _PY[e.op](a, b)
    if isinstance(e, UnOp):
        a = evaluate(e.a, env)
        return np.logical_not(a).astype(np.int64) if isinstance(a, np.ndarray) else int(not a)
    if isinstance(e, Select):
        c, a, b = evaluate(e.cond, env), evaluate(e.a, env), evaluate(e.b, env)
        if any(isinstance(x, np.ndarray) for x in (c, a, b)):
            return np.where(np.asarray(c) != 0, a, b)
        return a if c else b
    raise TypeError(f"cannot evaluate {e!r}")


_PREC = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, "<=": 7, "<<": 8, ">>": 8,
         "+": 9, "-": 9, "*": 10, "//": 10, "%": 10}
_C_OP = {"//": "/"}


def to_c(e: ExprLike, parent_prec: int = 0) -> str:
    """C source for ``e`` (fully parenthesized where precedence requires)."""
    if not isinstance(e, Expr):
        return str(int(e))
    if isinstance(e, Const):
        return str(e.value) if e.value >= 0 else f"({e.value})"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, RegRead):
        return f"{getattr(e.array, 'name', 'r')}[{e.index}]"
    if isinstance(e, UnOp):
        return f"!({to_c(e.a)})"
    if isinstance(e, Select):
        return f"(({to_c(e.cond)}) ? ({to_c(e.a)}) : ({to_c(e.b)}))"
    if isinstance(e, BinOp):
        if e.op in ("min", "max"):
            return f"{e.op}({to_c(e.a)}, {to_c(e.b)})"
        if e.op in ("//", "%") and not (_nonneg(e.a) and _nonneg(e.b)):
            return _floor_c(e)
        p = _PREC[e.op]
        s = f"{to_c(e.a, p)} {_C_OP.get(e.op, e.op)} {to_c(e.b, p + 1)}"
        return f"({s})" if p < parent_prec else s
    raise TypeError(f"cannot print {e!r}")


def _floor_c(e: BinOp) -> str:
    """C for ``a // b`` / ``a % b`` with Python's floor semantics (what ``evaluate`` and the
    emulator compute) where an operand may be negative: C's ``/`` and ``%`` truncate, so
    ``a // b = a / b - r`` and ``a % b = a % b + r * b`` with
    ``r = (a % b != 0) && ((a % b < 0) != (b < 0))``."""
    a, b = to_c(e.a, 11), to_c(e.b, 11)
    if isinstance(e.b, Const) and e.b.value > 0:
        r = f"({a} % {b} < 0)"
    else:
        r = f"({a} % {b} != 0 && (({a} % {b} < 0) != ({b} < 0)))"
    if e.op == "//":
        return f"({a} / {b} - {r})"
    return f"({a} % {b} + {r} * {b})"


def free_vars(e: ExprLike) -> set[Var]:
    """The variables of ``e``."""
    return _leaves(e, Var)


def substitute(e: ExprLike, mapping: Mapping[Var, ExprLike]) -> Expr:
    """``e`` with variables replaced (re-simplified)."""
    return replace_leaves(e, lambda x: mapping.get(x, x) if isinstance(x, Var) else x)
