"""Lowering of indirect addressing: scalar loads and gathered global views.

``ScalarLoad`` (its rule in ``LOWERING`` is ``lower_scalar_load``) becomes one
``LdGlobal`` of ``count`` elements per thread (the same address in every thread), its
register array joining the kernel's. A gathered ``GlobalView`` becomes a
``GlobalTileView`` whose ``IndexedGather`` maps tile coordinates to tensor coordinates
(``hexlayout.ir.gather`` gives the formula), recomputing index tiles per thread
(``index_tiles``); copies through it emit the index loads before their own instructions.
"""

from __future__ import annotations

import math
from typing import Any

from ..expr import Const, Expr, as_expr
from ..gather import IndexMap, ModeIndex, ScalarLoad
from ..lowered import GlobalRef, Instr, LdGlobal, RegRef
from ..tile import GlobalView
from .index_tiles import IndexTiles, valid_and
from .rules import LOWERING
from .views import GENERIC_STRIDE, GlobalTileView, IndexedGather, LoadSlots

__all__ = ["lower_scalar_load", "lower_gathered_view"]


@LOWERING.register(ScalarLoad)
def lower_scalar_load(lw: Any, op: ScalarLoad) -> list[Instr]:
    """``LdGlobal`` of ``op.count`` elements at ``op.index`` in every thread (0 out of range)."""
    p = op.param
    bits = op.count * p.dtype.bits
    if bits not in (8, 16, 32, 64, 128):
        raise ValueError(f"a load of {op.count} {p.dtype} element(s) from {p.name} moves {bits} bits; "
                         "a vector load moves 8, 16, 32, 64 or 128")
    if all(op.array is not a for a in lw.regs):
        lw.regs.append(op.array)
        lw.reg_names.add(op.array.name)
    off: Expr = Const(0)
    pred: Expr = Const(1)
    last = len(op.index) - 1
    for m, (i, s, d) in enumerate(zip(op.index, p.shape, p.stride)):
        off = off + as_expr(i) * d
        hi = as_expr(i) + (op.count - 1 if m == last else 0)
        pred = valid_and(pred, hi < s)
    always = isinstance(pred, Const) and pred.value
    return [LdGlobal(RegRef(op.array, 0, op.count), GlobalRef(p, off), bits, pred=None if always else pred)]


def _numeric(d: Any) -> int:
    if isinstance(d, int):
        return abs(d)
    if isinstance(d, Const):
        return abs(d.value)
    return GENERIC_STRIDE


def lower_gathered_view(lw: Any, op: GlobalView) -> list[Instr]:
    """The ``GlobalTileView`` of a gathered view (no instructions of its own)."""
    p = op.param
    imap = op.index_map
    if imap is None:    # rows gathered through op.gather only (built by hand): x_0 = gather[c0]
        imap = IndexMap((ModeIndex(None, 0, tuple(range(len(op.gather.type.shape)))),)
                        + tuple(ModeIndex(m) for m in range(1, len(p.shape))))
    shape = tuple(op.result.type.shape)
    if len(imap.modes) != len(p.shape):
        raise ValueError(f"the gather of {p.name} gives {len(imap.modes)} coordinates for "
                         f"{len(p.shape)} modes")
    tiles = getattr(lw, "_index_tiles", None)
    if tiles is None:
        tiles = lw._index_tiles = IndexTiles(lw)
    indices = tuple(op.indices) if op.index_map is not None else (op.gather,)
    axes: set[int] = set()
    strides: list[int] = []
    for m, mi in enumerate(imap.modes):
        if mi.index is not None:
            ishape = indices[mi.index].type.shape
            axes |= {a for a, s in zip(mi.axes, ishape) if s != 1}
            strides.append(_numeric(p.stride[m]))
    align = math.gcd(*strides) if strides else GENERIC_STRIDE
    origin = tuple(op.origin)

    def fn(coords: list[Any], slots: LoadSlots) -> tuple[list[Expr], Expr]:
        out: list[Expr] = []
        valid: Expr = Const(1)
        for m, mi in enumerate(imap.modes):
            x = as_expr(origin[m])
            if mi.tile_mode is not None:
                x = x + coords[mi.tile_mode]
            if mi.index is not None:
                v, ok = tiles.value_at(indices[mi.index], [coords[a] for a in mi.axes], slots)
                x = x + v
                valid = valid_and(valid, ok)
                valid = valid_and(valid, valid_and(0 <= x, x < p.shape[m]))
            out.append(x)
        return out, valid

    modes = []
    for k in range(len(shape)):
        direct = [m for m, mi in enumerate(imap.modes) if mi.tile_mode == k]
        via = [m for m, mi in enumerate(imap.modes) if mi.index is not None and k in mi.axes]
        modes.append((direct or via or [0])[0])
    slots = LoadSlots(lambda dt: lw.scratch(f"{op.result.name}_rows", dt, 0))
    lw.views[op.result.id] = GlobalTileView(p, p.dtype, shape, tuple(modes), origin, tuple(op.extent),
                                            IndexedGather(fn, slots, frozenset(axes), align))
    return []
