"""Exact integer rewrites that expose loop-invariant parts of address expressions.

Two identities hold for all integers (Python's unbounded two's complement, and C's 32-bit
``int`` modulo 2^32), for a term ``t`` that is a multiple of ``2^q``:

- ``(r + t) & m == r & m`` when ``m`` is a non-negative mask below ``2^q``
  (``m < 2^q``): adding a multiple of ``2^q`` leaves the low ``q`` bits unchanged;
- ``(r + t) ^ y == (r ^ y) + t`` when ``0 <= y < 2^q``: the XOR changes only the low ``q``
  bits, which ``t`` does not touch, and ``t`` adds to the bits above them without a carry
  out of the low part.

A swizzle ``Swizzle<B,M,S>(x) = x ^ ((x & mask) >> S)`` of ``x = r + stage * size`` (a
pipeline stage offset, a multiple of the swizzle period) is therefore
``Swizzle(r) + stage * size``: the per-thread part ``Swizzle(r)`` is loop-invariant and
only the stage offset moves. ``fold`` applies both identities bottom-up.

``linear_terms`` writes an expression as a list of terms whose sum is the expression,
distributing products over sums (``(a + 32) * K -> a*K + 32*K``), so that a loop-invariant
part can be separated from the part that depends on the loop variable.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from hexlayout.ir.expr import BinOp, Const, Expr, ExprLike, Select, UnOp, as_expr, bounds, emax, emin, select

__all__ = ["fold", "linear_terms", "sum_terms", "is_multiple", "apply", "nonnegative", "xor_constant_out"]

#: products of sums with more terms than this are kept whole
MAX_DISTRIBUTED_TERMS = 16


def is_multiple(e: ExprLike, p: int) -> bool:
    """Whether ``e`` is provably a multiple of ``p`` (> 0) for every value of its variables."""
    e = as_expr(e)
    if isinstance(e, Const):
        return e.value % p == 0
    if isinstance(e, BinOp):
        if e.op == "*":
            return is_multiple(e.a, p) or is_multiple(e.b, p)
        if e.op in ("+", "-"):
            return is_multiple(e.a, p) and is_multiple(e.b, p)
        if e.op == "<<" and isinstance(e.b, Const) and e.b.value >= 0:
            return (1 << e.b.value) % p == 0 or is_multiple(e.a, p)
    return False


def nonnegative(e: ExprLike) -> bool:
    """Whether ``e >= 0`` for all values of its variables (as integers, without overflow):
    ``bounds`` where it knows, else by structure (sums, products, quotients, remainders,
    bitwise operations and shifts of non-negative operands, comparisons)."""
    e = as_expr(e)
    lo, _ = bounds(e)
    if lo is not None:
        return lo >= 0
    if isinstance(e, BinOp):
        if e.op in ("+", "*", "//", "%", "|", "^", ">>", "<<", "max", "min"):
            return nonnegative(e.a) and nonnegative(e.b)
        if e.op == "&":
            return nonnegative(e.a) or nonnegative(e.b)
        if e.op in ("<", "<=", "==", "!=", "&&", "||"):
            return True
    if isinstance(e, Select):
        return nonnegative(e.a) and nonnegative(e.b)
    return isinstance(e, UnOp)


def _plus_terms(e: Expr) -> list[Expr]:
    if isinstance(e, BinOp) and e.op == "+":
        return _plus_terms(e.a) + _plus_terms(e.b)
    return [e]


def sum_terms(terms: list[Expr]) -> Expr:
    """``terms[0] + terms[1] + ...`` (0 for none), constants last."""
    out: Expr = Const(0)
    consts = 0
    for t in terms:
        if isinstance(t, Const):
            consts += t.value
        else:
            out = out + t
    return out + consts


def _split_multiples(e: Expr, p: int) -> tuple[Expr, Expr] | None:
    """``e = rest + mult`` with ``mult`` a multiple of ``p`` (None when no term is one)."""
    terms = linear_terms(e)
    mult = [t for t in terms if is_multiple(t, p)]
    if not mult or len(mult) == len(terms) and len(terms) == 1:
        return None
    rest = [t for t in terms if not is_multiple(t, p)]
    return sum_terms(rest), sum_terms(mult)


def _pow2_above(hi_exclusive: int) -> int:
    """The smallest ``2^q`` with ``hi_exclusive <= 2^q``."""
    return 1 << max(hi_exclusive - 1, 0).bit_length()


def _fold_node(op: str, a: Expr, b: Expr) -> Expr:
    if op == "&":
        for x, m in ((a, b), (b, a)):
            if isinstance(m, Const) and m.value > 0:
                p = _pow2_above(m.value + 1)
                sp = _split_multiples(x, p)
                if sp is not None:
                    return _fold_node("&", sp[0], m)
                # (A + c) & m == A & m when A is a multiple of 2^z (m's lowest bit) and 0 <= c < 2^z
                low = m.value & -m.value
                terms = linear_terms(x)
                small = [t for t in terms if not is_multiple(t, low)]
                if small and len(small) < len(terms):
                    c = sum_terms(small)
                    lo, hi = bounds(c)
                    if lo is not None and hi is not None and lo >= 0 and hi <= low:
                        return sum_terms([t for t in terms if is_multiple(t, low)]) & m
    if op == "^":
        for x, y in ((a, b), (b, a)):
            lo, hi = bounds(y)
            if lo is not None and hi is not None and lo >= 0:
                p = _pow2_above(hi)
                sp = _split_multiples(x, p)
                if sp is not None:
                    return (sp[0] ^ y) + sp[1]
    if op in ("//", "%") and isinstance(b, Const) and b.value > 0:
        # (r + c) // m == (r + c % m) // m + c // m and (r + c) % m == (r + c % m) % m (r >= 0)
        terms = linear_terms(a)
        c = sum(t.value for t in terms if isinstance(t, Const))
        rest = sum_terms([t for t in terms if not isinstance(t, Const)])
        if c >= b.value and nonnegative(rest):
            if op == "%":
                return apply("%", rest + c % b.value, b)
            return apply("//", rest + c % b.value, b) + c // b.value
    if op in ("<", "<=") and isinstance(b, BinOp) and b.op == "min":
        # a < min(p, q) == a < p && a < q; drop a comparison that bounds decide
        parts = [apply(op, a, b.a), apply(op, a, b.b)]
        if any(isinstance(x, Const) for x in parts):
            return parts[0].logical_and(parts[1])
    return apply(op, a, b)


_OPS: dict[str, Callable[[Expr, Expr], Expr]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
    "%": operator.mod, "&": operator.and_, "|": operator.or_, "^": operator.xor,
    "<<": operator.lshift, ">>": operator.rshift, "<": operator.lt, "<=": operator.le,
    "==": Expr.eq, "!=": Expr.ne, "&&": Expr.logical_and, "||": Expr.logical_or,
    "min": emin, "max": emax,
}


def apply(op: str, a: Expr, b: Expr) -> Expr:
    """``a op b`` built with the simplifying constructors of ``hexlayout.ir.expr``."""
    return _OPS[op](a, b)


def fold(e: ExprLike) -> Expr:
    """``e`` with the swizzle identities of the module docstring applied bottom-up (exact)."""
    e = as_expr(e)
    if isinstance(e, BinOp):
        return _fold_node(e.op, fold(e.a), fold(e.b))
    if isinstance(e, UnOp):
        return UnOp.make(e.op, fold(e.a))
    if isinstance(e, Select):
        return select(fold(e.cond), fold(e.a), fold(e.b))
    return e


def xor_constant_out(e: Expr) -> tuple[Expr, int] | None:
    """``(y + X, c)`` when ``e = (c ^ y) + X`` with ``0 <= c, y < 2^q`` and ``X >= 0`` a multiple
    of ``2^q``: then ``e == (y + X) ^ c`` (the parts occupy disjoint bits), so that addresses
    differing in a constant XOR share the register ``y + X``."""
    terms = linear_terms(e)
    for i, t in enumerate(terms):
        if not (isinstance(t, BinOp) and t.op == "^"):
            continue
        for c, y in ((t.a, t.b), (t.b, t.a)):
            if not isinstance(c, Const) or c.value < 0:
                continue
            lo, hi = bounds(y)
            if lo is None or hi is None or lo < 0:
                continue
            q = _pow2_above(max(hi, c.value + 1))
            rest = terms[:i] + terms[i + 1:]
            if rest and all(is_multiple(r, q) for r in rest) and nonnegative(sum_terms(rest)):
                return sum_terms([y] + rest), c.value
    return None


def linear_terms(e: ExprLike) -> list[Expr]:
    """Terms whose sum is ``e``: sums and differences flattened, products of sums distributed
    (up to ``MAX_DISTRIBUTED_TERMS`` terms), shifts by constants written as products."""
    e = as_expr(e)
    if isinstance(e, BinOp):
        if e.op == "+":
            return linear_terms(e.a) + linear_terms(e.b)
        if e.op == "-":
            return linear_terms(e.a) + [t * -1 for t in linear_terms(e.b)]
        if e.op == "*":
            ta, tb = linear_terms(e.a), linear_terms(e.b)
            if len(ta) * len(tb) <= MAX_DISTRIBUTED_TERMS:
                return [x * y for x in ta for y in tb]
        if e.op == "<<" and isinstance(e.b, Const) and 0 <= e.b.value < 31:
            return [t * (1 << e.b.value) for t in linear_terms(e.a)]
    return [e]
