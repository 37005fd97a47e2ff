"""Packed data: ``hl.bitcast``, reading a register tile's bits as another type of one width.

The bit operators of integer tiles (``<< >> & | ^ ~``) are ``Tile`` operators
(``hexlayout.lang.tensor``); this module holds what reinterprets values.
"""

from __future__ import annotations

from hexlayout.arch.dtypes import PRED, DType
from hexlayout.ir.functions import alu_function
from hexlayout.ir.tile import Elementwise, SourceLoc
from hexlayout.ir.types import LayoutVar, Scope, TileType

from .checks import as_tile, begin, require_scope
from .context import TraceContext
from .dtypes import canonical
from .tensor import Tile, describe

__all__ = ["bitcast", "refuse_sub_byte"]


def refuse_sub_byte(ctx: TraceContext, op: str, loc: SourceLoc | None, dt: DType, what: str) -> None:
    """``KernelError`` for a shared or register tile of a 4-bit type (``what``: "register
    tiles", "shared tiles"): they have no storage of their own yet; packed words do."""
    if dt != PRED and dt.bits < 8:
        raise ctx.error(op, loc, f"{what} of {dt} elements are not supported: 4-bit values live packed in "
                        f"wider words; load the words (as s32 / u32 / u8, e.g. AWQ's int32) and unpack them "
                        f"with shifts and masks, (w >> 4 * i) & 0xF")


def bitcast(x: Tile, dtype: DType) -> Tile:
    """Read the bits of a register tile as another element type of the same width:
    ``y[c]`` has the bit pattern of ``x[c]`` (no conversion, no rounding).

    ``f32 <-> s32 / u32``, ``f16 <-> bf16 <-> b16``, ``s8 <-> u8 <-> e4m3 <-> e5m2``, ``s32 <->
    u32``. Predicates and 4-bit types have no register bit pattern of their own and are
    refused. The ALU function ``bitcast``; the result's layout is ``x``'s.

    Args:
        x (Tile): a register tile.
        dtype (DType): the result's element type, as wide as ``x``'s.

    Returns:
        Tile: a new register tile of ``x``'s shape and element type ``dtype``.

    Raises:
        KernelError: called outside a kernel trace; ``x`` is not a register tile;
            ``dtype`` is not an element type, or not as wide as ``x``'s; either is a
            predicate or a 4-bit type.

    Example:
        The sign bit of every f32 element, as an integer::

            @hl.kernel(threads=128)
            def signs(x: hl.f32["N"], y: hl.u32["N"]):
                t = hl.register(hl.f32, (128,))
                hl.copy(x.tile((128,), (0,)), t)
                bits = hl.bitcast(t, hl.u32)
                hl.copy(bits >> 31, y.tile((128,), (0,)))

            signs.trace()
    """
    ctx, loc = begin("bitcast")
    t = as_tile(ctx, "bitcast", loc, x, "x")
    require_scope(ctx, "bitcast", loc, t, "x", (Scope.REGISTER,))
    try:
        dt = canonical(dtype)
    except (ValueError, KeyError, AttributeError):
        raise ctx.error("bitcast", loc, f"{dtype!r} is not an element type") from None
    for d in (t.dtype, dt):
        if d == PRED or d.bits < 8:       # (4-bit register tiles are refused where they are made)
            raise ctx.error("bitcast", loc, f"{d} has no bit pattern of its own in registers "
                            f"(bitcast {describe(t.value)} to {dt})")
    if dt.bits != t.dtype.bits:
        raise ctx.error("bitcast", loc, f"{describe(t.value)} has {t.dtype.bits}-bit elements, {dt} "
                        f"{dt.bits}-bit ones; bitcast keeps the width (hl.cast converts values)")
    v = ctx.new_value(TileType(dt, t.shape, Scope.REGISTER, LayoutVar()), loc, (t.value,))
    ctx.emit(Elementwise(v, alu_function("bitcast"), (t.value,), loc=loc))
    return Tile(v, ctx)
