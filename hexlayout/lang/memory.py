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
row-index tile ``idx`` (integer, shape ``(tile[0],)`` or ``(tile[0], 1)``; a global view of
an index tensor or a register tile computed in registers): tile row ``i`` is tensor row
``idx[i]``. ``valid_rows`` (default ``tile[0]``) bounds mode 0's extent. Its layout is
``None`` (not affine). It is the gathered view ``a[idx, k0:k0+tile[1]]`` (``hexlayout.lang.indirect``,
gathers along any mode).

``hl.shared(dtype, shape, layout=hl.auto)`` / ``hl.register(...)``: a new buffer
(``Alloc``); ``layout`` is ``hl.auto`` (with hints), or explicit (see ``layouts``).
"""

from __future__ import annotations

from typing import Any

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import ExprLike, emin
from hexlayout.ir.gather import IndexMap, ModeIndex
from hexlayout.ir.tile import Alloc, GlobalView, Value
from hexlayout.ir.types import Scope, TileType
from hexlayout.layout import Layout

from .checks import as_index, as_tile, begin, origin_modes, refuse_sub_byte, static_int, static_shape
from .dtypes import canonical
from .layouts import auto, resolve_layout
from .tensor import METHODS, GlobalTensor, Tile, describe, method, shape_str

__all__ = ["view", "shared", "register"]


@method("view")
def view(a: GlobalTensor, tile: tuple[int, ...], origin: tuple[Any, ...] | None = None, *,
         rows: Tile | None = None, valid_rows: ExprLike | None = None, name: str | None = None) -> Tile:
    """A ``tile``-shaped window of a global tensor: ``y[c] = a[origin + c]``.

    The window's first element is at element coordinate ``origin`` (ints or ``Expr``;
    default 0). Its ``extent`` per mode is ``min(tile[i], a.shape[i] - origin[i])``: the
    number of in-bounds elements from the origin (<= 0: none), so ragged edges need no
    masks: copies from the view read out-of-bounds elements as 0 and copies into it skip
    them. Its layout (coordinate -> element offset from the origin) is ``a``'s strides
    restricted to the window: ``Layout(tile, a.stride)`` when every stride is static,
    else ``None`` (symbolic strides).

    Gathered rows: with ``rows=idx`` (an integer register tile of shape ``(tile[0],)`` or
    ``(tile[0], 1)``) mode 0 goes through the index tile: ``y[i, j] = a[idx[i], origin[1] + j]``
    and ``origin[0]`` must be ``None``. ``valid_rows`` bounds mode 0's extent (rows past it
    read as 0). ``a.tile(tile, origin)`` is the same view. Of a ``u4`` / ``i4`` argument the
    view is a ``PackedView`` (``hexlayout.lang.packed_global``) for ``hl.copy``; its last
    mode's tile extent and origin must be even.

    Args:
        a (GlobalTensor): a global tensor argument of the kernel.
        tile (tuple[int, ...]): static positive extents, one per mode of ``a``.
        origin (tuple[int | Expr | None, ...] | None): the element coordinate of the
            window's first element, one entry per mode; ``None`` means all zeros.
        rows (Tile | None): an integer register tile of row indices (gathered rows).
        valid_rows (int | Expr | None): with ``rows``, how many leading rows are valid.
        name (str | None): the value's name in the IR (default ``<a>_tile``).

    Returns:
        Tile: a global tile of shape ``tile`` and ``a``'s element type.

    Raises:
        KernelError: called outside a kernel trace; ``a`` is not a global tensor argument
            (a tile: use ``x.tile``); ``tile`` is not static and positive or has another
            rank than ``a``; ``origin`` has the wrong length or a non-index entry; ``None``
            in ``origin`` other than mode 0 with ``rows``; ``rows`` is not an integer tile
            of ``(tile[0],)`` or ``(tile[0], 1)``.

    Example:
        A ragged 64x32 tile at the bottom-right corner, and rows gathered by index::

            @hl.kernel(threads=128)
            def edges(a: hl.f16["M", "K"], ids: hl.i32["T"]):
                M, K = a.shape
                t = hl.view(a, (64, 32), (M - 10, K - 20))
                idx = hl.register(hl.i32, (64,))
                hl.copy(hl.view(ids, (64,), (0,)), idx)
                g = hl.view(a, (64, 32), (None, 0), rows=idx)
                assert t.shape == g.shape == (64, 32)

            edges.trace()
    """
    if isinstance(a, GlobalTensor) and a.view_op != "view":   # u4 / s4: a window of its bytes
        return METHODS[a.view_op](a, tile, origin, rows=rows, valid_rows=valid_rows, name=name)
    ctx, loc = begin("view")
    shape = _view_shape(ctx, loc, a, tile)
    origin, org = _view_origin(ctx, loc, a, origin, rows)
    gather = None if rows is None else _gather_rows(ctx, loc, rows, shape, origin)
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
    indices: tuple[Value, ...] = ()
    index_map = None
    if gather is not None:    # a gather through an index tile (hexlayout.ir.gather): x_0 = rows[c0]
        indices = (gather,)
        index_map = IndexMap((ModeIndex(None, 0, tuple(range(len(gather.type.shape)))),)
                             + tuple(ModeIndex(m) for m in range(1, len(shape))))
    ctx.emit(GlobalView(v, a.param, tuple(org), tuple(extent), gather, indices, index_map, loc=loc))
    return Tile(v, ctx)


def _view_shape(ctx: Any, loc: Any, a: Any, tile: Any) -> tuple[int, ...]:
    """The static tile shape of a view of ``a`` (a global tensor argument), one extent a mode."""
    if not isinstance(a, GlobalTensor):
        if isinstance(a, Tile):
            raise ctx.error("view", loc, f"hl.view takes a global tensor argument; for a sub-tile of "
                            f"{describe(a.value)} use .tile(shape, origin)")
        raise ctx.error("view", loc, f"{a!r} is not a global tensor argument")
    shape = static_shape(ctx, "view", loc, tile, f"tile of {a.name}")
    if len(shape) != a.ndim:
        raise ctx.error("view", loc, f"tile {shape_str(shape)} has {len(shape)} modes, tensor {a.name} has "
                        f"{a.ndim}")
    return shape


def _view_origin(ctx: Any, loc: Any, a: GlobalTensor, origin: Any,
                 rows: Any) -> tuple[tuple[Any, ...] | list[Any], list[ExprLike]]:
    """(the origin as given, one entry a mode; the origin as index expressions, ``None`` - mode 0
    with ``rows=`` - as 0)."""
    origin = origin_modes(ctx, "view", loc, origin, a.ndim, f"tensor {a.name}")
    org: list[ExprLike] = []
    for i, o in enumerate(origin):
        if o is None:
            if i != 0 or rows is None:
                raise ctx.error("view", loc, f"origin of {a.name}: None is only allowed in mode 0 with rows=")
            org.append(0)
        else:
            org.append(as_index(ctx, "view", loc, o, f"origin of {a.name} mode {i}"))
    return origin, org


def _gather_rows(ctx: Any, loc: Any, rows: Any, shape: tuple[int, ...], origin: Any) -> Value:
    """``rows=``: the value of an integer register tile of ``(tile[0],)`` or ``(tile[0], 1)``
    row indices (mode 0 of ``origin`` must be None)."""
    r = as_tile(ctx, "view", loc, rows, "rows")
    if r.dtype.kind not in ("int", "uint"):
        raise ctx.error("view", loc, f"rows {describe(r.value)} must hold integer row indices")
    if r.shape not in ((shape[0],), (shape[0], 1)):
        raise ctx.error("view", loc, f"rows {describe(r.value)} must have shape ({shape[0]},) or "
                        f"({shape[0]},1) for a tile of {shape[0]} rows")
    if origin[0] is not None and static_int(origin[0]) != 0:
        raise ctx.error("view", loc, "with rows=, mode 0 of origin must be None (rows are gathered)")
    return r.value


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
    refuse_sub_byte(ctx, op, loc, dt, f"{op} tiles")
    shp = static_shape(ctx, op, loc, shape, "shape")
    ty = TileType(dt, shp, scope, None)
    v = ctx.new_value(ty, loc, name=name)
    v.type.layout = resolve_layout(ctx, op, loc, f"%{v.name}", scope, shp, layout)
    if hasattr(v.type.layout, "hints") and not v.type.layout.name:  # LayoutVar
        v.type.layout.name = v.name
    ctx.emit(Alloc(v, loc=loc))
    return Tile(v, ctx)


def shared(dtype: DType, shape: tuple[int, ...], layout: Any = auto, *, name: str | None = None) -> Tile:
    """A new shared-memory tile: a block-wide buffer of ``shape`` elements of ``dtype``.

    Its layout maps tile coordinates to element offsets in the buffer: ``hl.auto`` lets
    synthesis choose it (including the swizzle that makes the copies into and out of it
    free of bank conflicts); hints narrow the choice (``hl.auto(swizzle="128B")``,
    ``hl.auto(stride=(None, 1))``). An explicit ``Layout`` or swizzled ``ComposedLayout``
    must have size ``prod(shape)`` (per mode when the ranks agree) and be injective.
    Give it an extra mode for the stages of a pipeline and index it (``s[:, :, i]``).

    Args:
        dtype (DType): the element type.
        shape (tuple[int, ...]): static positive extents.
        layout (Auto | Layout | ComposedLayout): ``hl.auto`` (default, with optional
            hints) or an explicit layout.
        name (str | None): the value's name in the IR (default: the assignment target).

    Returns:
        Tile: the shared tile (``Alloc``).

    Raises:
        KernelError: called outside a kernel trace; ``dtype`` is not an element type;
            ``shape`` is not static and positive; ``layout`` is neither ``hl.auto`` nor a
            layout of the right size, is not injective, or has an unknown / invalid hint.

    Example:
        A two-stage buffer with a 128-byte swizzle, and one with an explicit row-major layout::

            @hl.kernel(threads=128)
            def buffers():
                sa = hl.shared(hl.f16, (128, 64, 2), hl.auto(swizzle="128B"))
                sb = hl.shared(hl.f16, (64, 32), hl.Layout((64, 32), (32, 1)))
                assert sa[:, :, 1].shape == (128, 64) and sb.layout.size() == 2048

            buffers.trace()
    """
    return _alloc("shared", Scope.SHARED, dtype, shape, layout, name)


def register(dtype: DType, shape: tuple[int, ...], layout: Any = auto, *, name: str | None = None) -> Tile:
    """A new register tile, distributed over the block's threads by a TV layout.

    The layout is a thread-value layout ``(thread, value) -> m + M * n`` (column-major
    tile index, CuTe's convention): thread ``t``'s ``v``-th register holds that element.
    ``hl.auto`` (default) lets synthesis choose it from the tile's uses (mma operand and
    accumulator fragments, vectorized copies); an explicit ``Layout`` of rank 2 (or the
    ``(tiler, layout_tv)`` pair ``hl.make_layout_tv`` returns) must cover every element
    and use at most the block's threads. The contents are undefined until written.

    Args:
        dtype (DType): the element type.
        shape (tuple[int, ...]): static positive extents.
        layout (Auto | Layout | tuple): ``hl.auto`` (default) or an explicit TV layout.
        name (str | None): the value's name in the IR (default: the assignment target).

    Returns:
        Tile: the register tile (``Alloc``).

    Raises:
        KernelError: called outside a kernel trace; ``dtype`` is not an element type;
            ``shape`` is not static and positive; the TV layout has another rank, does
            not cover the tile exactly, uses more threads than the block, or a tiler
            other than ``shape``.

    Example:
        A synthesized tile and one whose 32 threads each hold 4 consecutive rows of a column::

            @hl.kernel(threads=32)
            def frags():
                ra = hl.register(hl.f16, (64, 32))
                rb = hl.register(hl.f32, (4, 32), hl.Layout((32, 4), (4, 1)))
                assert ra.shape == (64, 32) and rb.layout.size() == 128

            frags.trace()
    """
    return _alloc("register", Scope.REGISTER, dtype, shape, layout, name)
