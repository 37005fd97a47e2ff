"""Views of tiles: ``Slice`` (modes fixed at indices), ``SubTile`` (a window), ``Permute``.

A view aliases its source (``Value.base``); writing through it writes the source.

- ``x[i, :, s]``: ints or ``Expr`` fix modes (``Slice``; the result drops them), ``:``
  keeps a mode, ``...`` stands for the remaining modes, ``a:b`` with a static width
  ``b - a`` keeps a window of a mode (``SubTile``). Static indices are bounds-checked;
  a runtime index is checked when its bounds prove it out of range.
- ``x.tile(shape, origin)``: the ``shape`` window at element offsets ``origin``.
- ``x.permute(*perm)`` / ``x.T``: result mode ``i`` is source mode ``perm[i]``.

The view's layout: derived from the source when that is a plain ``Layout`` (global /
shared), ``None`` for a global source without a static layout, else a fresh
``LayoutVar`` with hint ``view_of`` (the source's layout), for synthesis to relate.
"""

from __future__ import annotations

from typing import Any

from hexlayout.ir.expr import Expr, ExprLike, bounds
from hexlayout.ir.tile import Permute, Slice, SourceLoc, SubTile
from hexlayout.ir.types import LayoutLike, LayoutVar, Scope, TileType
from hexlayout.layout import Layout, select, slice_and_offset

from .checks import as_index, begin, origin_modes, static_int, static_shape
from .context import TraceContext
from .tensor import Tile, describe, method, shape_str

__all__ = ["getitem", "subtile", "permute"]


def _derived(src: TileType, make: Any) -> LayoutLike:
    lay = src.layout
    if isinstance(lay, Layout) and src.scope != Scope.REGISTER and lay.rank == len(src.shape):
        try:
            return make(lay)
        except (ValueError, TypeError, IndexError):
            pass
    if lay is None and src.scope == Scope.GLOBAL:
        return None
    return LayoutVar(hints={"view_of": lay})


def _check_index(ctx: TraceContext, op: str, loc: SourceLoc | None, t: Tile, mode: int, idx: ExprLike,
                 width: int = 1) -> None:
    ext = t.shape[mode]
    v = static_int(idx)
    if v is not None:
        if v < 0 or v + width > ext:
            what = f"index {v}" if width == 1 else f"window [{v}, {v + width})"
            raise ctx.error(op, loc, f"{what} out of range for mode {mode} of {describe(t.value)} "
                            f"(extent {ext})")
        return
    lo, hi = bounds(idx)
    if (lo is not None and lo + width > ext) or (hi is not None and hi <= 0):
        raise ctx.error(op, loc, f"index {idx} (in [{lo}, {hi})) is always out of range for mode {mode} of "
                        f"{describe(t.value)} (extent {ext})")


@method("getitem")
def getitem(t: Tile, index: Any) -> Tile:
    ctx, loc = begin("slice")
    idx = index if isinstance(index, tuple) else (index,)
    ells = [j for j, i in enumerate(idx) if i is Ellipsis]
    if len(ells) > 1:
        raise ctx.error("slice", loc, "only one ... allowed in an index")
    if ells:
        k = ells[0]
        fill = t.ndim - (len(idx) - 1)
        idx = idx[:k] + (slice(None),) * fill + idx[k + 1:]
    if len(idx) > t.ndim:
        raise ctx.error("slice", loc, f"{len(idx)} indices for {describe(t.value)} with {t.ndim} modes")
    idx = idx + (slice(None),) * (t.ndim - len(idx))
    fixed: list[ExprLike | None] = []
    window: list[tuple[ExprLike, int]] = []
    has_window = False
    for m, i in enumerate(idx):
        ext = t.shape[m]
        if isinstance(i, slice):
            if i.step not in (None, 1):
                raise ctx.error("slice", loc, f"mode {m} of {describe(t.value)}: slice steps are not "
                                "supported")
            start = 0 if i.start is None else as_index(ctx, "slice", loc, i.start, f"mode {m} start")
            stop = ext if i.stop is None else as_index(ctx, "slice", loc, i.stop, f"mode {m} stop")
            width = static_int(stop - start) if isinstance(stop, Expr) or isinstance(start, Expr) \
                else stop - start
            if width is None or width <= 0:
                raise ctx.error("slice", loc, f"mode {m} of {describe(t.value)}: the window "
                                f"{i.start}:{i.stop} "
                                "must have a static positive width (use x.tile(shape, origin))")
            _check_index(ctx, "slice", loc, t, m, start, width)
            if static_int(start) != 0 or width != ext:
                has_window = True
            window.append((start, width))
            fixed.append(None)
        else:
            e = as_index(ctx, "slice", loc, i, f"index of mode {m}")
            sv = static_int(e)
            if sv is not None and sv < 0:
                sv += ext
                e = sv
            _check_index(ctx, "slice", loc, t, m, e)
            window.append((e, 1))
            fixed.append(e)
    out = t
    if has_window:
        out = _subtile(ctx, loc, t, tuple(w for _, w in window), tuple(o for o, _ in window), None)
        if any(f is not None for f in fixed):
            fixed = [None if f is None else 0 for f in fixed]
    if all(f is None for f in fixed):
        return out
    return _slice(ctx, loc, out, tuple(fixed))


def _slice(ctx: TraceContext, loc: SourceLoc | None, t: Tile, index: tuple[ExprLike | None, ...]) -> Tile:
    shape = tuple(s for s, i in zip(t.shape, index) if i is None)
    if not shape:
        shape = (1,)
    crd = tuple(None if i is None else 0 for i in index)

    def make(lay: Layout) -> Layout:
        if all(i is not None for i in index):
            return Layout(1, 0)
        return slice_and_offset(crd, lay)[0]

    ty = TileType(t.dtype, shape, t.scope, _derived(t.value.type, make))
    v = ctx.new_value(ty, loc, (t.value,), base=t.value)
    ctx.emit(Slice(v, t.value, index, loc=loc))
    return Tile(v, ctx)


def _subtile(ctx: TraceContext, loc: SourceLoc | None, t: Tile, shape: tuple[int, ...],
             offset: tuple[ExprLike, ...], name: str | None) -> Tile:
    def make(lay: Layout) -> Layout:
        strides = tuple(lay[i].stride for i in range(lay.rank))
        if any(isinstance(s, tuple) for s in strides):
            raise ValueError("hierarchical mode")
        return Layout(shape, strides)

    ty = TileType(t.dtype, shape, t.scope, _derived(t.value.type, make))
    v = ctx.new_value(ty, loc, (t.value,), base=t.value, name=name)
    ctx.emit(SubTile(v, t.value, offset, loc=loc))
    return Tile(v, ctx)


@method("subtile")
def subtile(t: Tile, shape: tuple[int, ...], origin: tuple[ExprLike, ...] | None = None, *,
            name: str | None = None) -> Tile:
    """The ``shape`` window of ``t`` at element offsets ``origin`` (default 0)."""
    ctx, loc = begin("tile")
    shp = static_shape(ctx, "tile", loc, shape, f"sub-tile of %{t.name}")
    if len(shp) != t.ndim:
        raise ctx.error("tile", loc, f"sub-tile {shape_str(shp)} has {len(shp)} modes, "
                        f"{describe(t.value)} has "
                        f"{t.ndim}")
    origin = origin_modes(ctx, "tile", loc, origin, t.ndim, describe(t.value))
    off = tuple(as_index(ctx, "tile", loc, o, f"origin mode {m}") for m, o in enumerate(origin))
    for m, (o, w) in enumerate(zip(off, shp)):
        _check_index(ctx, "tile", loc, t, m, o, w)
    return _subtile(ctx, loc, t, shp, off, name)


@method("permute")
def permute(t: Tile, perm: tuple[int, ...]) -> Tile:
    ctx, loc = begin("permute")
    perm = tuple(perm)
    if sorted(perm) != list(range(t.ndim)):
        raise ctx.error("permute", loc, f"{perm} is not a permutation of the {t.ndim} modes of "
                        f"{describe(t.value)}")
    shape = tuple(t.shape[p] for p in perm)
    ty = TileType(t.dtype, shape, t.scope, _derived(t.value.type, lambda lay: select(lay, *perm)))
    v = ctx.new_value(ty, loc, (t.value,), base=t.value)
    ctx.emit(Permute(v, t.value, perm, loc=loc))
    return Tile(v, ctx)
