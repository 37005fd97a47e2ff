"""Argument checking shared by the operations: every failure is a ``KernelError``."""

from __future__ import annotations

from typing import Any

from hexlayout.arch.dtypes import PRED, DType
from hexlayout.ir.expr import Const, Expr, ExprLike
from hexlayout.ir.tile import SourceLoc
from hexlayout.ir.types import Scope

from .context import TraceContext, current
from .tensor import GlobalTensor, Tile, describe

__all__ = ["begin", "as_tile", "static_shape", "as_index", "static_int", "require_scope", "SCOPE_NAMES",
           "refuse_sub_byte", "origin_modes"]

SCOPE_NAMES = {Scope.GLOBAL: "global", Scope.SHARED: "shared", Scope.REGISTER: "register"}


def begin(op: str) -> tuple[TraceContext, SourceLoc | None]:
    """The trace context and the current kernel line, for an operation named ``op``."""
    ctx = current(op)
    loc = ctx.loc()
    ctx.check_open(op, loc)
    return ctx, loc


def as_tile(ctx: TraceContext, op: str, loc: SourceLoc | None, x: Any, role: str) -> Tile:
    if isinstance(x, Tile):
        if x._ctx is not ctx:
            raise ctx.error(op, loc, f"{role} %{x.name} belongs to another kernel trace")
        return x
    if isinstance(x, GlobalTensor):
        raise ctx.error(op, loc, f"{role} is the whole global tensor {x.name}; take a tile of it first "
                        f"(hl.view({x.name}, tile=..., origin=...))")
    raise ctx.error(op, loc, f"{role} must be a tile, got {type(x).__name__} {x!r}")


def require_scope(ctx: TraceContext, op: str, loc: SourceLoc | None, t: Tile, role: str,
                  scopes: tuple[Scope, ...]) -> None:
    if t.scope not in scopes:
        want = " or ".join(SCOPE_NAMES[s] for s in scopes)
        raise ctx.error(op, loc, f"{role} {describe(t.value)} must be a {want} tile")


def static_int(x: Any) -> int | None:
    """``x`` as an int when it is a static integer (int or constant Expr), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, Const):
        return x.value
    try:
        import numpy as np

        if isinstance(x, np.integer):
            return int(x)
    except ImportError:  # pragma: no cover
        pass
    return None


def static_shape(ctx: TraceContext, op: str, loc: SourceLoc | None, shape: Any, what: str) -> tuple[int, ...]:
    """A tile shape: a tuple (or one int) of static positive integers."""
    if not isinstance(shape, (tuple, list)):
        shape = (shape,)
    out = []
    for s in shape:
        v = static_int(s)
        if v is None:
            raise ctx.error(op, loc, f"{what} {tuple(shape)!r}: tile extents must be static integers "
                            f"(compile-time constants), got {s}")
        if v <= 0:
            raise ctx.error(op, loc, f"{what} {tuple(shape)!r}: extents must be positive")
        out.append(v)
    if not out:
        raise ctx.error(op, loc, f"{what}: a tile needs at least one mode")
    return tuple(out)


def origin_modes(ctx: TraceContext, op: str, loc: SourceLoc | None, origin: Any, ndim: int,
                 of: str) -> tuple[Any, ...] | list[Any]:
    """A window's ``origin``, one entry a mode: ``None`` is ``ndim`` zeros, a scalar one mode;
    a ``KernelError`` unless it has ``ndim`` entries (``of`` names the windowed tensor)."""
    if origin is None:
        origin = (0,) * ndim
    if not isinstance(origin, (tuple, list)):
        origin = (origin,)
    if len(origin) != ndim:
        raise ctx.error(op, loc, f"origin {tuple(origin)!r} has {len(origin)} entries, {of} has {ndim} modes")
    return origin


def as_index(ctx: TraceContext, op: str, loc: SourceLoc | None, x: Any, what: str) -> ExprLike:
    """An integer index / offset: an int or an ``Expr``."""
    v = static_int(x)
    if v is not None:
        return v
    if isinstance(x, Expr):
        return x
    if isinstance(x, Tile):
        raise ctx.error(op, loc, f"{what}: the tile %{x.name} is not a scalar index")
    raise ctx.error(op, loc, f"{what}: {x!r} is not an integer index (int or expression)")


def refuse_sub_byte(ctx: TraceContext, op: str, loc: SourceLoc | None, dt: DType, what: str) -> None:
    """``KernelError`` for a shared or register tile of a 4-bit type (``what``: "register
    tiles", "shared tiles"): they have no storage of their own yet; packed words do."""
    if dt != PRED and dt.bits < 8:
        raise ctx.error(op, loc, f"{what} of {dt} elements are not supported: 4-bit values live packed in "
                        f"wider words; load the words (as s32 / u32 / u8, e.g. AWQ's int32) and unpack them "
                        f"with shifts and masks, (w >> 4 * i) & 0xF; or declare the argument u4 / i4 and "
                        f"take w = hl.copy(hl.view(arg, ...)), a register tile of the values as u8 / s8")
