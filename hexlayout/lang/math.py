"""Elementwise math on register tiles, with numpy broadcasting.

Operands are register tiles, Python numbers or integer ``Expr`` (scalars broadcast).
Shapes broadcast as in numpy (aligned on the right; extents equal or 1); the result has
the broadcast shape and the type the function's typing rule gives (the operands' element
type, which tile operands must agree on (use ``hl.cast``), or a predicate for comparisons).
Each call emits one ``Elementwise(result, fn, args)`` op; ``out=`` writes into an existing
tile of the broadcast shape instead of a new one (how loop-carried state is updated).

The functions and their rules are the ALU functions of ``hexlayout.ir.functions``; every
one with a ``lang_name`` (``exp exp2 log log2 rsqrt sqrt silu gelu tanh softplus``) gets a
unary ``hl.<lang_name>(x, *, out=None)`` generated here (``FUNCTIONS``), whose docstring is
the function's. Operators, ``abs``, ``maximum``/``minimum``, ``where``, comparisons and
logical functions are written out below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import Expr, emax, emin
from hexlayout.ir.functions import (
    KIND_WORDS,
    AluFunction,
    AluTypeError,
    UnknownFunctionError,
    alu_function,
    alu_functions,
)
from hexlayout.ir.tile import Elementwise, SourceLoc, Value
from hexlayout.ir.types import LayoutVar, Scope, TileType

from .checks import begin
from .context import TraceContext
from .tensor import GlobalTensor, Tile, describe, shape_str

__all__ = [
    "elementwise", "broadcast_shapes", "unary_function", "function", "FUNCTIONS", "abs_", "maximum",
    "minimum", "where", "equal", "not_equal", "logical_and", "logical_or", "logical_not",
]


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


def elementwise(fn: str | AluFunction, args: tuple[Any, ...], *, out: Tile | None = None,
                opname: str | None = None) -> Tile:
    """Emit ``Elementwise(result, fn, args)`` (see the module docstring); ``fn`` is an ALU
    function or its name, ``opname`` how messages name the operation."""
    try:
        f = alu_function(fn)
    except UnknownFunctionError as e:
        ctx, loc = begin(opname or str(fn))
        raise ctx.error(opname or str(fn), loc, str(e)) from None
    op = opname or f.operator or str(f)
    ctx, loc = begin(op)
    ops = [_operand(ctx, op, loc, a) for a in args]
    tiles = [o for o in ops if isinstance(o, Value)]
    if not tiles:
        raise ctx.error(op, loc, "needs at least one register tile operand")
    shape = broadcast_shapes([tuple(t.type.shape) for t in tiles])
    if shape is None:
        desc = ", ".join(describe(t) for t in tiles)
        raise ctx.error(op, loc, f"shapes do not broadcast: {desc}")
    dtype = _result_dtype(ctx, op, loc, f, ops)
    if out is not None:
        if not isinstance(out, Tile) or out.scope != Scope.REGISTER:
            raise ctx.error(op, loc, f"out= must be a register tile, got {out!r}")
        if broadcast_shapes([shape, tuple(out.shape)]) != tuple(out.shape):
            raise ctx.error(op, loc, f"the result shape {shape_str(shape)} does not broadcast to out= "
                            f"{describe(out.value)}")
        if out.dtype != dtype:
            raise ctx.error(op, loc, f"the result is {dtype} but out= {describe(out.value)}; use hl.cast")
        ctx.emit(Elementwise(out.value, f, tuple(ops), loc=loc))
        return out
    ty = TileType(dtype, shape, Scope.REGISTER, LayoutVar())
    v = ctx.new_value(ty, loc, tuple(tiles))
    ctx.emit(Elementwise(v, f, tuple(ops), loc=loc))
    return Tile(v, ctx)


def _result_dtype(ctx: TraceContext, op: str, loc: SourceLoc | None, fn: AluFunction,
                  ops: list[Any]) -> DType:
    """``fn``'s typing rule on the operands, its refusal as a message naming the tiles."""
    try:
        return fn.result_dtype([o.type.dtype if isinstance(o, Value) else None for o in ops])
    except AluTypeError as e:
        named = [ops[i] for i in e.operands]
        what = [describe(o) if isinstance(o, Value) else repr(o) for o in named]
        if e.requirement == "condition":
            msg = f"the condition {what[0]} must be a predicate tile (a comparison)"
        elif e.requirement == "tile":
            msg = "needs a tile among the two choices" if fn.condition else "needs a tile operand"
        elif e.requirement == "same":
            msg = f"element types differ: {' and '.join(what)}; convert one with hl.cast"
        elif e.requirement == "kind":
            want = " or ".join(KIND_WORDS[k] for k in sorted(fn.accepts))
            msg = f"{fn} needs a {want} tile, {what[0]} is {named[0].type.dtype}"
        else:
            msg = str(e)
        raise ctx.error(op, loc, msg) from None


_UNARY_DOC = """{math}

Elementwise over a register tile: element ``i`` of the result is the function of ``x[i]``,
computed in f32 (f64 for f64 tiles) and rounded once to ``x``'s element type. Shapes of
``x`` and ``out`` broadcast as in numpy. (Generated from the ALU function ``{fn}`` of
``hexlayout.ir.functions``{accuracy}.)

Args:
    x: a register tile of {kinds} elements.
    out: a register tile to write the result into (its shape the broadcast of ``x``'s, its
        type ``x``'s); ``None`` for a new tile.

Returns:
    The result tile (``out`` when given), of ``x``'s element type.

Raises:
    KernelError: ``x`` is not a register tile or not of {kinds} type, or ``out`` does not
        fit the result.

Example:
    ``hl.{name}`` of a tile loaded from global memory::

        @hl.kernel(threads=128)
        def f(a: hl.f32["M", "N"], c: hl.f32["M", "N"]):
            x = hl.register(hl.f32, (64, 64))
            hl.copy(a.tile((64, 64), (0, 0)), x)
            hl.copy(hl.{name}(x), c.tile((64, 64), (0, 0)))

        f.trace()
"""


def unary_function(fn: AluFunction) -> Callable[..., Tile]:
    """``hl.<fn.lang_name>(x, *, out=None)``: ``fn`` of a register tile, elementwise (its
    docstring generated from ``fn``'s)."""
    name = fn.lang_name or str(fn)

    def f(x: Tile, *, out: Tile | None = None) -> Tile:
        return elementwise(fn, (x,), out=out, opname=name)

    f.__name__ = f.__qualname__ = name
    f.__module__ = __name__
    accuracy = f"; the device's math library is within {fn.device_ulp} ulp in f32" if fn.device_ulp else ""
    kinds = " or ".join(KIND_WORDS[k] for k in sorted(fn.accepts))
    f.__doc__ = _UNARY_DOC.format(math=fn.doc, fn=fn, name=name, kinds=kinds, accuracy=accuracy)
    return f


#: the generated unary functions, ``lang_name -> function`` (exported as ``hl.<lang_name>``)
FUNCTIONS: dict[str, Callable[..., Tile]] = {fn.lang_name: unary_function(fn) for fn in alu_functions()
                                             if fn.lang_name}
globals().update(FUNCTIONS)
__all__ += list(FUNCTIONS)


def function(lang_name: str) -> Callable[..., Tile]:
    """The unary function ``hl.<lang_name>`` (generated on first use for an ALU function defined
    after this module was imported); ``LookupError`` when no ALU function has that name."""
    if lang_name not in FUNCTIONS:
        for fn in alu_functions():
            if fn.lang_name == lang_name:
                FUNCTIONS[lang_name] = unary_function(fn)
                break
        else:
            raise LookupError(f"no ALU function has the language name {lang_name!r}")
    return FUNCTIONS[lang_name]


def abs_(x: Tile, *, out: Tile | None = None) -> Tile:
    """``|x|`` elementwise (``hl.abs``; also ``abs(tile)``)."""
    return elementwise("abs", (x,), out=out, opname="abs")


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
