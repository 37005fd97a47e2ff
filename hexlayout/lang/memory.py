"""Tiles in the three scopes: global views, shared and register allocations.

``hl.view(a, tile, origin)`` is the ``tile``-shaped window of global tensor ``a`` whose
first element is at element coordinate ``origin`` (ints or ``Expr``; default 0). Its
``extent`` per mode is ``min(tile, a.shape - origin)``: the number of in-bounds elements
from the origin (<= 0: none), so ragged edges need no explicit masks. Copies from the
view read out-of-bounds elements as zero; copies into it skip them.

Its layout (coordinate -> element offset from the origin) is ``a``'s strides restricted
to the tile: a ``Layout(tile, stride)`` when every stride is static; otherwise ``None``
and the strides are the (symbolic) ``GlobalParam.stride``.

Gathered rows: ``hl.view(a, tile, origin=(None, k0), rows=idx)`` reads mode 0 through a
row-index tile ``idx`` (integer, shape ``(tile[0],)`` or ``(tile[0], 1)``): tile row ``i``
is tensor row ``idx[i]``. ``valid_rows`` (default ``tile[0]``) bounds mode 0's extent.
Its layout is ``None`` (not affine).

``hl.shared(dtype, shape, layout=hl.auto)`` / ``hl.register(...)``: a new buffer
(``Alloc``); ``layout`` is ``hl.auto`` (with hints), or explicit (see ``layouts``).
"""

from __future__ import annotations

from typing import Any

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import ExprLike, emin
from hexlayout.ir.tile import Alloc, GlobalView
from hexlayout.ir.types import Scope, TileType
from hexlayout.layout import Layout

from .checks import as_index, as_tile, begin, static_int, static_shape
from .dtypes import canonical
from .layouts import auto, resolve_layout
from .tensor import GlobalTensor, Tile, describe, shape_str

__all__ = ["view", "shared", "register"]


def view(a: GlobalTensor, tile: tuple[int, ...], origin: tuple[Any, ...] | None = None, *,
         rows: Tile | None = None, valid_rows: ExprLike | None = None, name: str | None = None) -> Tile:
    """The ``tile`` window of global tensor ``a`` at ``origin`` (see the module docstring)."""
    ctx, loc = begin("view")
    if not isinstance(a, GlobalTensor):
        if isinstance(a, Tile):
            raise ctx.error("view", loc, f"hl.view takes a global tensor argument; for a sub-tile of "
                            f"{describe(a.value)} use .tile(shape, origin)")
        raise ctx.error("view", loc, f"{a!r} is not a global tensor argument")
    shape = static_shape(ctx, "view", loc, tile, f"tile of {a.name}")
    if len(shape) != a.ndim:
        raise ctx.error("view", loc, f"tile {shape_str(shape)} has {len(shape)} modes, tensor {a.name} has "
                        f"{a.ndim}")
    if origin is None:
        origin = (0,) * a.ndim
    if not isinstance(origin, (tuple, list)):
        origin = (origin,)
    if len(origin) != a.ndim:
        raise ctx.error("view", loc, f"origin {tuple(origin)!r} has {len(origin)} entries, tensor {a.name} "
                        "has "
                        f"{a.ndim} modes")
    gather = None
    org: list[ExprLike] = []
    for i, o in enumerate(origin):
        if o is None:
            if i != 0 or rows is None:
                raise ctx.error("view", loc, f"origin of {a.name}: None is only allowed in mode 0 with rows=")
            org.append(0)
        else:
            org.append(as_index(ctx, "view", loc, o, f"origin of {a.name} mode {i}"))
    if rows is not None:
        r = as_tile(ctx, "view", loc, rows, "rows")
        if r.dtype.kind not in ("int", "uint"):
            raise ctx.error("view", loc, f"rows {describe(r.value)} must hold integer row indices")
        if r.shape not in ((shape[0],), (shape[0], 1)):
            raise ctx.error("view", loc, f"rows {describe(r.value)} must have shape ({shape[0]},) or "
                            f"({shape[0]},1) for a tile of {shape[0]} rows")
        if origin[0] is not None and static_int(origin[0]) != 0:
            raise ctx.error("view", loc, "with rows=, mode 0 of origin must be None (rows are gathered)")
        gather = r.value
    extent: list[ExprLike] = []
    for i, (t, o, s) in enumerate(zip(shape, org, a.shape)):
        if i == 0 and gather is not None:
            extent.append(t if valid_rows is None else
                          _emin(as_index(ctx, "view", loc, valid_rows, "valid_rows"), t))
        else:
            extent.append(_emin(s - o, t))
    strides = [static_int(s) for s in a.stride]
    layout = None
    if gather is None and all(s is not None for s in strides):
        layout = Layout(shape, tuple(strides))  # type: ignore[arg-type]
    ty = TileType(a.dtype, shape, Scope.GLOBAL, layout)
    v = ctx.new_value(ty, loc, (gather,) if gather is not None else (), name=name, default=f"{a.name}_tile")
    ctx.emit(GlobalView(v, a.param, tuple(org), tuple(extent), gather, loc=loc))
    return Tile(v, ctx)


def _emin(a: ExprLike, b: int) -> ExprLike:
    sa = static_int(a)
    if sa is not None:
        return min(sa, b)
    return emin(a, b)


def _alloc(op: str, scope: Scope, dtype: DType, shape: Any, layout: Any, name: str | None) -> Tile:
    ctx, loc = begin(op)
    try:
        dt = canonical(dtype)
    except (ValueError, KeyError, AttributeError):
        raise ctx.error(op, loc, f"{dtype!r} is not an element type") from None
    shp = static_shape(ctx, op, loc, shape, "shape")
    ty = TileType(dt, shp, scope, None)
    v = ctx.new_value(ty, loc, name=name)
    v.type.layout = resolve_layout(ctx, op, loc, f"%{v.name}", scope, shp, layout)
    if hasattr(v.type.layout, "hints") and not v.type.layout.name:  # LayoutVar
        v.type.layout.name = v.name
    ctx.emit(Alloc(v, loc=loc))
    return Tile(v, ctx)


def shared(dtype: DType, shape: tuple[int, ...], layout: Any = auto, *, name: str | None = None) -> Tile:
    """A new shared-memory tile (block-wide buffer)."""
    return _alloc("shared", Scope.SHARED, dtype, shape, layout, name)


def register(dtype: DType, shape: tuple[int, ...], layout: Any = auto, *, name: str | None = None) -> Tile:
    """A new register tile (distributed over the block's threads by its TV layout)."""
    return _alloc("register", Scope.REGISTER, dtype, shape, layout, name)
