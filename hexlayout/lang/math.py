"""Elementwise math on register tiles, with numpy broadcasting.

Operands are register tiles, Python numbers or integer ``Expr`` (scalars broadcast).
Shapes broadcast as in numpy (aligned on the right; extents equal or 1); the result has
the broadcast shape and the operands' element type (tile operands must agree; use
``hl.cast``), except comparisons, which give predicate (``pred``) tiles. Each call emits
one ``Elementwise(result, fn, args)`` op; ``out=`` writes into an existing tile of the
broadcast shape instead of a new one (how loop-carried state is updated).

``fn`` names: add sub mul div neg abs exp exp2 log log2 rsqrt sqrt silu gelu max min
select (``hl.where``) mov (``hl.assign``) lt le gt ge eq ne and or not.
"""

from __future__ import annotations

from typing import Any

from hexlayout.arch.dtypes import PRED, DType
from hexlayout.ir.expr import Expr, emax, emin
from hexlayout.ir.tile import Elementwise, SourceLoc, Value
from hexlayout.ir.types import LayoutVar, Scope, TileType

from .checks import begin
from .context import TraceContext
from .tensor import GlobalTensor, Tile, describe, shape_str

__all__ = [
    "elementwise", "broadcast_shapes", "exp", "exp2", "log", "log2", "rsqrt", "sqrt", "abs_", "silu", "gelu",
    "maximum", "minimum", "where", "equal", "not_equal", "logical_and", "logical_or", "logical_not",
]

_COMPARE = {"lt", "le", "gt", "ge", "eq", "ne"}
_LOGIC = {"and", "or", "not"}
_UNARY_FLOAT = {"exp", "exp2", "log", "log2", "rsqrt", "sqrt", "silu", "gelu"}
_OPNAME = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
           "and": "&", "or": "|", "neg": "unary -", "not": "~"}


def broadcast_shapes(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """numpy's broadcast of ``shapes`` (None when they do not broadcast)."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        ext = 1
        for s in shapes:
            k = d - (rank - len(s))
            if k < 0:
                continue
            e = s[k]
            if e == 1:
                continue
            if ext not in (1, e):
                return None
            ext = e
        out.append(ext)
    return tuple(out)


def _operand(ctx: TraceContext, op: str, loc: SourceLoc | None, x: Any) -> Value | float | int | Expr:
    if isinstance(x, Tile):
        if x._ctx is not ctx:
            raise ctx.error(op, loc, f"%{x.name} belongs to another kernel trace")
        if x.scope != Scope.REGISTER:
            raise ctx.error(op, loc, f"elementwise math needs register tiles, {describe(x.value)} is "
                            f"{x.scope}; copy it to registers first (hl.copy)")
        return x.value
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, (int, float, Expr)):
        return x
    try:
        import numpy as np

        if isinstance(x, (np.integer, np.floating)):
            return x.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(x, GlobalTensor):
        raise ctx.error(op, loc, f"the global tensor {x.name} is not a register tile; view and copy it first")
    raise ctx.error(op, loc, f"{x!r} ({type(x).__name__}) is not a tile or a scalar")


def elementwise(fn: str, args: tuple[Any, ...], *, out: Tile | None = None,
                opname: str | None = None) -> Tile:
    """Emit ``Elementwise(result, fn, args)`` (see the module docstring)."""
    op = opname or _OPNAME.get(fn, fn)
    ctx, loc = begin(op)
    ops = [_operand(ctx, op, loc, a) for a in args]
    tiles = [o for o in ops if isinstance(o, Value)]
    if not tiles:
        raise ctx.error(op, loc, "needs at least one register tile operand")
    shape = broadcast_shapes([tuple(t.type.shape) for t in tiles])
    if shape is None:
        desc = ", ".join(describe(t) for t in tiles)
        raise ctx.error(op, loc, f"shapes do not broadcast: {desc}")
    dtype = _result_dtype(ctx, op, loc, fn, ops, tiles)
    if out is not None:
        if not isinstance(out, Tile) or out.scope != Scope.REGISTER:
            raise ctx.error(op, loc, f"out= must be a register tile, got {out!r}")
        if broadcast_shapes([shape, tuple(out.shape)]) != tuple(out.shape):
            raise ctx.error(op, loc, f"the result shape {shape_str(shape)} does not broadcast to out= "
                            f"{describe(out.value)}")
        if out.dtype != dtype:
            raise ctx.error(op, loc, f"the result is {dtype} but out= {describe(out.value)}; use hl.cast")
        ctx.emit(Elementwise(out.value, fn, tuple(ops), loc=loc))
        return out
    ty = TileType(dtype, shape, Scope.REGISTER, LayoutVar())
    v = ctx.new_value(ty, loc, tuple(tiles))
    ctx.emit(Elementwise(v, fn, tuple(ops), loc=loc))
    return Tile(v, ctx)


def _result_dtype(ctx: TraceContext, op: str, loc: SourceLoc | None, fn: str, ops: list[Any],
                  tiles: list[Value]) -> DType:
    if fn == "select":
        cond = ops[0]
        if not isinstance(cond, Value) or cond.type.dtype != PRED:
            what = describe(cond) if isinstance(cond, Value) else repr(cond)
            raise ctx.error(op, loc, f"the condition {what} must be a predicate tile (a comparison)")
        tiles = [t for t in ops[1:] if isinstance(t, Value)]
        if not tiles:
            raise ctx.error(op, loc, "needs a tile among the two choices")
    elif fn in _LOGIC:
        for t in tiles:
            if t.type.dtype != PRED:
                raise ctx.error(op, loc, f"{describe(t)} is not a predicate tile")
        return PRED
    dts = {t.type.dtype for t in tiles}
    if len(dts) > 1:
        desc = " and ".join(describe(t) for t in tiles)
        raise ctx.error(op, loc, f"element types differ: {desc}; convert one with hl.cast")
    dt = next(iter(dts))
    if fn in _UNARY_FLOAT and not dt.is_float:
        raise ctx.error(op, loc, f"{fn} needs a floating-point tile, {describe(tiles[0])} is {dt}")
    if fn in _COMPARE:
        return PRED
    return dt


def _unary(fn: str, x: Any, out: Tile | None) -> Tile:
    return elementwise(fn, (x,), out=out, opname=fn)


def exp(x: Tile, *, out: Tile | None = None) -> Tile:
    """``e**x``."""
    return _unary("exp", x, out)


def exp2(x: Tile, *, out: Tile | None = None) -> Tile:
    """``2**x`` (one ``ex2.approx``; prefer it with a log2(e)-scaled argument)."""
    return _unary("exp2", x, out)


def log(x: Tile, *, out: Tile | None = None) -> Tile:
    return _unary("log", x, out)


def log2(x: Tile, *, out: Tile | None = None) -> Tile:
    return _unary("log2", x, out)


def rsqrt(x: Tile, *, out: Tile | None = None) -> Tile:
    return _unary("rsqrt", x, out)


def sqrt(x: Tile, *, out: Tile | None = None) -> Tile:
    return _unary("sqrt", x, out)


def abs_(x: Tile, *, out: Tile | None = None) -> Tile:
    return _unary("abs", x, out)


def silu(x: Tile, *, out: Tile | None = None) -> Tile:
    """``x * sigmoid(x)``."""
    return _unary("silu", x, out)


def gelu(x: Tile, *, out: Tile | None = None) -> Tile:
    """GELU (tanh approximation)."""
    return _unary("gelu", x, out)


def _scalars(a: Any, b: Any) -> bool:
    return all(isinstance(x, (int, Expr)) and not isinstance(x, bool) for x in (a, b))


def maximum(a: Any, b: Any, *, out: Tile | None = None) -> Any:
    """Elementwise maximum (``hl.max`` for two tiles); of two integer scalars / ``Expr``, their max."""
    if out is None and _scalars(a, b):
        return emax(a, b) if isinstance(a, Expr) or isinstance(b, Expr) else max(a, b)
    return elementwise("max", (a, b), out=out, opname="maximum")


def minimum(a: Any, b: Any, *, out: Tile | None = None) -> Any:
    """Elementwise minimum (``hl.min``); of two integer scalars / ``Expr``, their min."""
    if out is None and _scalars(a, b):
        return emin(a, b) if isinstance(a, Expr) or isinstance(b, Expr) else min(a, b)
    return elementwise("min", (a, b), out=out, opname="minimum")


def where(cond: Tile, a: Any, b: Any, *, out: Tile | None = None) -> Tile:
    """``a`` where the predicate tile ``cond`` holds, else ``b`` (broadcasting)."""
    return elementwise("select", (cond, a, b), out=out, opname="where")


def equal(a: Any, b: Any) -> Tile:
    return elementwise("eq", (a, b), opname="equal")


def not_equal(a: Any, b: Any) -> Tile:
    return elementwise("ne", (a, b), opname="not_equal")


def logical_and(a: Any, b: Any) -> Tile:
    return elementwise("and", (a, b), opname="logical_and")


def logical_or(a: Any, b: Any) -> Tile:
    return elementwise("or", (a, b), opname="logical_or")


def logical_not(a: Any) -> Tile:
    return elementwise("not", (a,), opname="logical_not")
