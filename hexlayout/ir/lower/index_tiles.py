"""Index tiles recomputed per thread: the value of an integer tile at a tile coordinate.

A gathered view (``hexlayout.ir.gather``) needs, in the thread that copies element ``c``,
the index ``idx[c]`` of every index tile it goes through. That element may live in another
thread's registers, so the lowering does not read it there: it recomputes it from the
index tile's definition, as an ``Expr`` over the tile coordinate, the loop variables and
the scalars in scope (``IndexTiles.value_at``). Supported definitions (the ways an index
tile is written naturally):

- ``hl.iota(shape, axis)``: ``c[axis]``;
- integer elementwise math (``+ - * / // % min max``, comparisons, ``where``, ``& | ^ ~ << >>``,
  casts between integer types) on index tiles, scalars and ``Expr``;
- ``hl.fill`` / ``hl.full``: the constant;
- a copy from a global view (plain or itself gathered) into the tile: the element is
  loaded (``LoadSlots.load``) at the address that view gives ``c``; a global view used
  directly as an index is the same load.

Each value carries a validity predicate: a load whose address is out of bounds reads 0
and makes every element computed from it invalid (an invalid element of a gathered view
reads as 0 and is never written). An index tile written by anything else (several
writes, a write through a view, a float computation, an mma) is refused with the op and
its source line.
"""

from __future__ import annotations

from typing import Any

from ..expr import Const, Expr, ExprLike, as_expr, emax, emin, select
from ..tile import Alloc, Cast, Copy, Elementwise, Fill, Iota, Op, Value
from ..types import Scope
from .views import GlobalTileView, LoadSlots

__all__ = ["IndexTiles"]

_TRUE = Const(1)


def _binary(name: str, a: Expr, b: Expr) -> Expr | None:
    table: dict[str, Any] = {
        "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "div": lambda: a // b,
        "floordiv": lambda: a // b, "mod": lambda: a % b,
        "min": lambda: emin(a, b), "max": lambda: emax(a, b), "lt": lambda: a < b, "le": lambda: a <= b,
        "gt": lambda: a > b, "ge": lambda: a >= b, "eq": lambda: a.eq(b), "ne": lambda: a.ne(b),
        "and": lambda: a.logical_and(b), "or": lambda: a.logical_or(b), "bitand": lambda: a & b,
        "bitor": lambda: a | b, "bitxor": lambda: a ^ b, "shl": lambda: a << b, "shr": lambda: a >> b,
    }
    f = table.get(name)
    return None if f is None else f()


def _unary(name: str, a: Expr) -> Expr | None:
    table: dict[str, Any] = {
        "neg": lambda: 0 - a, "mov": lambda: a, "cvt": lambda: a, "not": lambda: a.logical_not(),
        "bitnot": lambda: (0 - a) - 1, "abs": lambda: select(a < 0, 0 - a, a),
    }
    f = table.get(name)
    return None if f is None else f()


def _where(op: Op) -> str:
    if op.loc is None:
        return type(op).__name__
    return f"{type(op).__name__} at {op.loc.format()}"


class IndexTiles:
    """Recomputes index tiles of the program ``lw.tk`` (``lw``: the lowering, for the
    global views built so far)."""

    def __init__(self, lw: Any) -> None:
        self.lw = lw
        self._defs: dict[int, list[Op]] | None = None

    def defs(self, v: Value) -> list[Op]:
        if self._defs is None:
            d: dict[int, list[Op]] = {}
            for op in self.lw.tk.body.walk():
                if isinstance(op, Alloc):
                    continue
                for out in op.outputs():
                    d.setdefault(out.id, []).append(op)
                    if out.base is not None:          # a write through a view of a buffer
                        d.setdefault(out.root.id, []).append(op)
            self._defs = d
        return self._defs.get(v.id, [])

    def value_at(self, v: Value, coords: list[Any], slots: LoadSlots) -> tuple[Expr, Expr]:
        """``(idx[coords], valid)`` of the integer tile ``v`` (``coords``: one per mode)."""
        if v.type.dtype.kind == "float":
            raise ValueError(f"index tile %{v.name} holds {v.type.dtype} values, not integers")
        coords = [as_expr(c) if s != 1 else Const(0) for c, s in zip(coords, v.type.shape)]
        if v.scope == Scope.GLOBAL:
            return self._load(v, coords, slots)
        ops = self.defs(v)
        if len(ops) != 1:
            lines = ", ".join(_where(o) for o in ops) or "nothing"
            raise ValueError(f"index tile %{v.name} must be computed by exactly one op to serve as an index "
                             f"(it is written by {lines})")
        return self._op(ops[0], v, coords, slots)

    def _arg(self, x: Any, shape: tuple[int, ...], coords: list[Expr], slots: LoadSlots,
             op: Op) -> tuple[Expr, Expr]:
        if isinstance(x, Value):
            n = len(x.type.shape)
            sub = coords[len(coords) - n:] if n <= len(coords) else [Const(0)] * (n - len(coords)) + coords
            return self.value_at(x, sub, slots)
        if isinstance(x, Expr):
            return x, _TRUE
        if isinstance(x, (bool, int)):
            return Const(int(x)), _TRUE
        if isinstance(x, float) and x == int(x):
            return Const(int(x)), _TRUE
        raise ValueError(f"{_where(op)}: operand {x!r} of an index computation is not an integer")

    def _op(self, op: Op, v: Value, coords: list[Expr], slots: LoadSlots) -> tuple[Expr, Expr]:
        shape = tuple(v.type.shape)
        if isinstance(op, Iota):
            return coords[op.axis], _TRUE
        if isinstance(op, Fill):
            if float(op.value) != int(op.value):
                raise ValueError(f"{_where(op)}: index tile %{v.name} is filled with {op.value}")
            return Const(int(op.value)), _TRUE
        if isinstance(op, Cast):
            return self._arg(op.src, shape, coords, slots, op)
        if isinstance(op, Elementwise):
            vals = [self._arg(a, shape, coords, slots, op) for a in op.args]
            xs = [x for x, _ in vals]
            valid: Expr = _TRUE
            for _, ok in vals:
                valid = valid_and(valid, ok)
            name = op.fn.name
            out = None
            if len(xs) == 1:
                out = _unary(name, xs[0])
            elif len(xs) == 2:
                out = _binary(name, xs[0], xs[1])
            elif name == "select":
                out = select(xs[0], xs[1], xs[2])
            elif name == "fma":
                out = xs[0] * xs[1] + xs[2]
            if out is None:
                raise ValueError(f"{_where(op)}: {name} cannot compute an index (integer arithmetic, "
                                 "comparisons, where and bit operations can)")
            return as_expr(out), valid
        if isinstance(op, Copy) and op.dst is v and op.src.scope == Scope.GLOBAL:
            val, ok = self._load(op.src, coords, slots)
            if op.mask is not None and not isinstance(op.mask, Value):
                m = as_expr(op.mask)
                return select(m, val, 0), valid_and(ok, m)
            if op.mask is None:
                return val, ok
        raise ValueError(f"index tile %{v.name} is computed by {_where(op)}, which cannot be recomputed "
                         "per thread (an index tile is built from iota, integer math, where, fills and loads "
                         "from global memory)")

    def _load(self, v: Value, coords: list[Expr], slots: LoadSlots) -> tuple[Expr, Expr]:
        view = self.lw.views.get(v.id)
        if not isinstance(view, GlobalTileView):
            raise ValueError(f"index tile %{v.name}: its global view is not defined before the gather")
        off, ok = view.element(coords, slots)
        return slots.load(view.param, view.dtype, off, ok), ok


def valid_and(a: ExprLike, b: ExprLike) -> Expr:
    """``a && b``, folding a constant true."""
    a, b = as_expr(a), as_expr(b)
    if isinstance(a, Const) and a.value:
        return b
    if isinstance(b, Const) and b.value:
        return a
    return a.logical_and(b)
