"""Where the elements of a tile live: per-scope views used by the lowering.

Every view answers, for a tile element given by its colexicographic tile index ``i``
(``i = c0 + S0*c1 + ...`` over the tile shape ``S``):

- ``GlobalTileView.offset(i)``: element offset into the global tensor,
  ``base + sum_k c_k * stride_k`` (strides may be symbolic); ``inbounds(i)`` is the
  predicate ``c_k < extent_k`` for every mode (ragged edges).
- ``SharedTileView.offset(i)``: element offset into the shared buffer,
  ``swizzle(base + L(i))`` where ``L`` is the tile's (unswizzled) layout and ``base`` the
  offset of a slice (e.g. a pipeline stage); the swizzle acts on element offsets.
- ``RegisterTile``: per-thread array of ``V`` values; the TV layout maps
  ``(t, v) -> i``.

``offsets(i_array)`` evaluates a view numerically (symbolic strides replaced by a large
generic multiple of 128 and the base by 0) for the legality analysis of copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexlayout.layout import ComposedLayout, Layout, Swizzle, flatten, make_layout
from hexlayout.layout.inttuple import crd2idx
from hexlayout.memo import memoized

from ..expr import Const, Expr, ExprLike, RegRead, as_expr, evaluate, free_vars, reg_reads, replace_leaves
from ..lowered import RegArray, SmemBuffer
from ..tile import GlobalParam
from ..types import DType

__all__ = ["GlobalTileView", "SharedTileView", "RegisterTile", "tile_coords", "GENERIC_STRIDE", "LoadSlots",
           "IndexedGather", "crd2idx_colex"]

#: Value standing in for a symbolic stride in numeric analyses: a large multiple of 128
#: (so any vector alignment holds) that is unlikely to create accidental coincidences.
GENERIC_STRIDE = 128 * 1_000_003


def crd2idx_colex(coords: list[Any], shape: tuple[int, ...]) -> Any:
    """The colexicographic tile index of ``coords`` (inverse of ``tile_coords``)."""
    idx: Any = 0
    scale = 1
    for c, s in zip(coords, shape):
        idx = idx + c * scale
        scale *= s
    return idx


def tile_coords(idx: Any, shape: tuple[int, ...]) -> list[Any]:
    """Colexicographic coordinates of tile index ``idx`` (int, numpy array or Expr)."""
    out = []
    scale = 1
    for k, s in enumerate(shape):
        c = idx // scale if scale != 1 else idx
        if k != len(shape) - 1:
            c = c % s
        out.append(c)
        scale *= s
    return out


def _numeric_stride(d: ExprLike) -> int:
    """A static stride, or ``GENERIC_STRIDE`` for a symbolic one."""
    if isinstance(d, Expr) and not isinstance(d, Const):
        return GENERIC_STRIDE
    return int(d.value if isinstance(d, Const) else d)


def _numeric_base(e: ExprLike) -> int:
    """A slice base with every variable (loop index, stage) and every value loaded into
    registers (``RegRead``) at 0 (at 1 where 0 would divide by zero: a base such as
    ``(j - n // g) % 2``)."""
    if not isinstance(e, Expr):
        return int(e)
    if reg_reads(e):
        e = replace_leaves(e, lambda x: 0 if isinstance(x, RegRead) else x)
    try:
        return int(evaluate(e, {v: 0 for v in free_vars(e)}))
    except ZeroDivisionError:
        return int(evaluate(e, {v: 1 for v in free_vars(e)}))


@dataclass(eq=False)
class LoadSlots:
    """Register slots of the index values one copy needs: ``load`` gives the value of an
    element of a global tensor as a ``RegRead`` and queues the ``LdGlobal`` that fills it
    (one per distinct address and predicate; threads where ``pred`` fails read 0); the copy
    emits the queued loads before its own instructions (``take_loads``). Arrays, one per
    index element type, come from ``new_array(dtype)``."""

    new_array: Any
    arrays: dict[str, RegArray] = field(default_factory=dict)
    loads: list[Any] = field(default_factory=list)
    slots: dict[tuple[str, str, str], RegRead] = field(default_factory=dict)

    def load(self, param: GlobalParam, dtype: DType, offset: ExprLike, pred: ExprLike) -> RegRead:
        from ..expr import to_c
        from ..lowered import GlobalRef, LdGlobal, RegRef

        if dtype.kind not in ("int", "uint") or dtype.bits not in (8, 16, 32, 64):
            raise ValueError(f"index values of {param.name} must be 8- to 64-bit integers, not {dtype}")
        key = (param.name, to_c(as_expr(offset)), to_c(as_expr(pred)))
        got = self.slots.get(key)
        if got is not None:
            return got
        arr = self.arrays.get(dtype.name)
        if arr is None:
            arr = self.arrays[dtype.name] = self.new_array(dtype)
        slot = sum(1 for r in self.slots.values() if r.array is arr)
        arr.count = max(arr.count, slot + 1)
        p = as_expr(pred)
        always = isinstance(p, Const) and p.value
        self.loads.append(LdGlobal(RegRef(arr, slot, 1), GlobalRef(param, offset), dtype.bits,
                                   pred=None if always else p))
        got = self.slots[key] = RegRead(arr, slot)
        return got

    def take_loads(self) -> list[Any]:
        out, self.loads = self.loads, []
        self.slots.clear()
        return out


@dataclass(eq=False)
class IndexedGather:
    """The tensor coordinates of a gathered view: ``fn(coords, slots)`` maps tile
    coordinates to ``(one Expr per tensor mode, validity Expr)``, loading index values
    through ``slots`` (``hexlayout.ir.lower.index_tiles``). ``axes``: the tile modes some
    index depends on; ``align``: gcd of the element strides of the indexed tensor modes
    (numeric analyses place gathered positions far apart at that alignment)."""

    fn: Any
    slots: LoadSlots
    axes: frozenset[int]
    align: int

    def take_loads(self) -> list[Any]:
        return self.slots.take_loads()

    def remap(self, f: Any, axes: frozenset[int]) -> IndexedGather:
        """The same gather seen through the coordinate map ``old = f(new)``."""
        fn = self.fn
        return IndexedGather(lambda c, slots: fn(f(c), slots), self.slots, axes, self.align)


@dataclass(eq=False)
class GlobalTileView:
    """A window of global tensor ``param``: tile mode ``k`` runs along tensor mode ``modes[k]``
    from element coordinate ``origin`` (one entry per tensor mode); ``extent[k]`` elements of
    tile mode ``k`` are inside the tensor. With ``gather`` (a gathered view), ``gather.fn``
    gives the tensor coordinates of every element instead (``hexlayout.ir.gather``)."""

    param: GlobalParam
    dtype: DType
    shape: tuple[int, ...]
    modes: tuple[int, ...]
    origin: tuple[ExprLike, ...]
    extent: tuple[ExprLike, ...]
    gather: IndexedGather | None = None

    @property
    def strides(self) -> tuple[ExprLike, ...]:
        return tuple(self.param.stride[m] for m in self.modes)

    @property
    def base(self) -> Expr:
        off: Expr = Const(0)
        for o, d in zip(self.origin, self.param.stride):
            off = off + as_expr(o) * d
        return off

    def element(self, coords: list[Any], slots: LoadSlots | None = None) -> tuple[Expr, Expr]:
        """``(element offset, in-bounds predicate)`` of the element at tile ``coords``
        (index values of a gathered view are loaded through ``slots``, default its own)."""
        g = self.gather
        if g is None:
            c = as_expr(crd2idx_colex(coords, self.shape))
            return self.offset(c), self.inbounds(c)
        tc, valid = g.fn(list(coords), slots if slots is not None else g.slots)
        off: Expr = Const(0)
        for x, d in zip(tc, self.param.stride):
            off = off + as_expr(x) * d
        for c, s, e in zip(coords, self.shape, self.extent):
            if isinstance(e, int) and e >= s:
                continue
            valid = as_expr(valid).logical_and(as_expr(c) < e)
        return off, as_expr(valid)

    def offset(self, idx: ExprLike) -> Expr:
        if isinstance(self.gather, IndexedGather):
            return self.element(tile_coords(idx, self.shape))[0]
        off = self.base
        for c, d in zip(tile_coords(idx, self.shape), self.strides):
            off = off + c * d
        return off

    def inbounds(self, idx: ExprLike) -> Expr:
        if isinstance(self.gather, IndexedGather):
            return self.element(tile_coords(idx, self.shape))[1]
        pred: Expr = Const(1)
        for c, s, e in zip(tile_coords(idx, self.shape), self.shape, self.extent):
            if isinstance(e, int) and e >= s:
                continue
            pred = pred.logical_and(as_expr(c) < e)
        return pred

    def offsets(self, idx: np.ndarray) -> np.ndarray:
        coords = tile_coords(idx, self.shape)
        off = np.zeros_like(idx)
        g = self.gather
        for k, (c, d) in enumerate(zip(coords, self.strides)):
            if isinstance(g, IndexedGather) and k in g.axes:
                # gathered positions: far apart, aligned as the indexed modes' strides allow
                off = off + c * (GENERIC_STRIDE + g.align)
            else:
                off = off + c * _numeric_stride(d)
        return off

    def static_stride(self, k: int) -> int | None:
        if isinstance(self.gather, IndexedGather) and k in self.gather.axes:
            return None
        d = self.strides[k]
        if isinstance(d, int):
            return d
        if isinstance(d, Const):
            return d.value
        return None

    def slice(self, index: tuple[ExprLike | None, ...]) -> GlobalTileView:
        """Fix the tile modes where ``index`` is not ``None`` (tile-relative coordinates)."""
        if len(index) != len(self.shape):
            raise ValueError(f"slice {index} does not match the rank of tile {self.shape}")
        if isinstance(self.gather, IndexedGather):
            kept = [k for k, i in enumerate(index) if i is None]

            def f(c: list[Any]) -> list[Any]:
                it = iter(c)
                return [next(it) if i is None else as_expr(i) for i in index]

            return self._remapped(f, tuple(kept), tuple(self.shape[k] for k in kept))
        origin = list(self.origin)
        shape, modes, extent = [], [], []
        for i, s, m, e in zip(index, self.shape, self.modes, self.extent):
            if i is None:
                shape.append(s)
                modes.append(m)
                extent.append(e)
            else:
                origin[m] = as_expr(origin[m]) + i
        return GlobalTileView(self.param, self.dtype, tuple(shape), tuple(modes), tuple(origin),
                              tuple(extent))

    def subtile(self, shape: tuple[int, ...], offset: tuple[ExprLike, ...]) -> GlobalTileView:
        if isinstance(self.gather, IndexedGather):
            view = self._remapped(lambda c: [as_expr(x) + o for x, o in zip(c, offset)],
                                  tuple(range(len(shape))), tuple(shape))
            view.extent = tuple(e - o if isinstance(e, int) and isinstance(o, int) else as_expr(e) - o
                                for e, o in zip(self.extent, offset))
            return view
        origin = list(self.origin)
        extent = []
        for k, (o, m) in enumerate(zip(offset, self.modes)):
            origin[m] = as_expr(origin[m]) + o
            extent.append(as_expr(self.extent[k]) - o)
        return GlobalTileView(self.param, self.dtype, tuple(shape), self.modes, tuple(origin), tuple(extent))

    def _remapped(self, f: Any, kept: tuple[int, ...], shape: tuple[int, ...]) -> GlobalTileView:
        """A gathered view whose tile mode ``i`` is this view's mode ``kept[i]``; ``f`` maps
        the new tile coordinates to this view's."""
        g = self.gather
        assert isinstance(g, IndexedGather)
        axes = frozenset(i for i, k in enumerate(kept) if k in g.axes)
        return GlobalTileView(self.param, self.dtype, shape, tuple(self.modes[k] for k in kept), self.origin,
                              tuple(self.extent[k] for k in kept), g.remap(f, axes))

    def permute(self, perm: tuple[int, ...]) -> GlobalTileView:
        if isinstance(self.gather, IndexedGather):
            def f(c: list[Any]) -> list[Any]:
                old: list[Any] = [0] * len(perm)
                for i, p in enumerate(perm):
                    old[p] = c[i]
                return old

            return self._remapped(f, tuple(perm), tuple(self.shape[p] for p in perm))
        return GlobalTileView(self.param, self.dtype, tuple(self.shape[p] for p in perm),
                              tuple(self.modes[p] for p in perm), self.origin,
                              tuple(self.extent[p] for p in perm))


@memoized(1 << 16)
def _smem_offset(base: ExprLike, layout: Layout, swizzle: Any, idx: ExprLike) -> Expr:
    """``swizzle(base + layout(idx))`` as an expression (memoized: a synthesis lowers the same
    copy under many candidate layouts)."""
    o = as_expr(base) + crd2idx(as_expr(idx), layout.shape, layout.stride)
    return swizzle(o) if swizzle is not None else o


@dataclass(eq=False)
class SharedTileView:
    buffer: SmemBuffer
    dtype: DType
    shape: tuple[int, ...]
    layout: Layout
    swizzle: Swizzle | None = None
    base: ExprLike = 0

    @staticmethod
    def of(buffer: SmemBuffer, dtype: DType, shape: tuple[int, ...],
           layout: Layout | ComposedLayout) -> SharedTileView:
        if isinstance(layout, ComposedLayout):
            if not isinstance(layout.layout_a, Swizzle):
                raise ValueError(f"shared layout {layout}: only swizzle functions compose with a layout")
            return SharedTileView(buffer, dtype, shape, layout.layout_b, layout.layout_a, layout.offset)
        return SharedTileView(buffer, dtype, shape, layout)

    @property
    def full_layout(self) -> Layout | ComposedLayout:
        if self.swizzle is None:
            return self.layout
        return ComposedLayout(self.swizzle, 0, self.layout)

    def offset(self, idx: ExprLike) -> Expr:
        return _smem_offset(self.base, self.layout, self.swizzle, idx)

    def offsets(self, idx: np.ndarray) -> np.ndarray:
        o = crd2idx(idx, self.layout.shape, self.layout.stride) + _numeric_base(self.base)
        return self.swizzle(o) if self.swizzle is not None else o

    def slice(self, index: tuple[ExprLike | None, ...]) -> SharedTileView:
        if len(index) != len(self.shape):
            raise ValueError(f"slice {index} does not match the rank of tile {self.shape}")
        modes = [self.layout[k] for k in range(len(self.shape))] if len(self.shape) > 1 else [self.layout]
        base: Expr = as_expr(self.base)
        kept = []
        shape = []
        for i, m, s in zip(index, modes, self.shape):
            if i is None:
                kept.append(m)
                shape.append(s)
            else:
                base = base + crd2idx(as_expr(i), m.shape, m.stride)
        lay = make_layout(*kept) if kept else Layout(1, 0)
        return SharedTileView(self.buffer, self.dtype, tuple(shape), lay, self.swizzle, base)


    def _modes(self) -> list[Layout]:
        return [self.layout[k] for k in range(len(self.shape))] if len(self.shape) > 1 else [self.layout]

    def subtile(self, shape: tuple[int, ...], offset: tuple[ExprLike, ...]) -> SharedTileView:
        """The ``shape`` window at per-mode ``offset``: the base moves, the modes are cut."""
        modes = self._modes()
        base: Expr = as_expr(self.base)
        for o, m in zip(offset, modes):
            base = base + crd2idx(as_expr(o), m.shape, m.stride)
        cut = []
        for s, o, m in zip(shape, offset, modes):
            if isinstance(m.shape, tuple):
                w = _window(m, s, o)
                if w is None:
                    raise ValueError(f"a window of {s} at {o} of the hierarchical mode {m} of shared layout "
                                     f"{self.layout}")
                cut.append(w)
            else:
                cut.append(Layout(s, m.stride))
        lay = cut[0] if len(cut) == 1 else Layout(tuple(c.shape for c in cut), tuple(c.stride for c in cut))
        return SharedTileView(self.buffer, self.dtype, tuple(shape), lay, self.swizzle, base)

    def permute(self, perm: tuple[int, ...]) -> SharedTileView:
        modes = self._modes()
        lay = Layout(tuple(modes[p].shape for p in perm), tuple(modes[p].stride for p in perm))
        return SharedTileView(self.buffer, self.dtype, tuple(self.shape[p] for p in perm), lay, self.swizzle,
                              self.base)


def _window(m: Layout, size: int, offset: ExprLike) -> Layout | None:
    """The layout of elements ``offset .. offset + size`` of the hierarchical mode ``m`` (relative
    to element ``offset``), when it is one: ``size`` a product of ``m``'s leading sub-extents
    times a divisor of the next one, and ``offset`` a static multiple of ``size`` (so the
    window's coordinates are the leading digits alone); else ``None``."""
    o = evaluate(as_expr(offset), {}) if not free_vars(as_expr(offset)) else None
    if o is None or int(o) % size:
        return None
    flat = flatten(m)
    shapes, strides = [], []
    left = size
    for sh, st in zip(flat.shape if isinstance(flat.shape, tuple) else (flat.shape,),
                      flat.stride if isinstance(flat.stride, tuple) else (flat.stride,)):
        if left == 1:
            break
        if left % sh == 0:
            shapes.append(sh)
            strides.append(st)
            left //= sh
        elif sh % left == 0:
            shapes.append(left)
            strides.append(st)
            left = 1
        else:
            return None
    if left != 1:
        return None
    return Layout(shapes[0], strides[0]) if len(shapes) == 1 else Layout(tuple(shapes), tuple(strides))


@dataclass(eq=False)
class RegisterTile:
    array: RegArray
    dtype: DType
    shape: tuple[int, ...]
    tv: Layout
    threads: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def values(self) -> int:
        return self.tv.size() // self.threads

    def index_table(self) -> np.ndarray:
        """``[t, v] -> tile index`` for every thread and value."""
        return self.tv.indices().reshape(self.values, self.threads).T
