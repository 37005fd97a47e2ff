"""Static windows of a tile: the ``(origin, extent, kept modes)`` of a ``SubTile`` or ``Slice``.

``x.tile(shape, origin)`` is the window ``origin + [0, shape)``; ``x[..., i, ...]`` fixes the
indexed modes at ``i`` (extent 1, mode dropped) and keeps the others whole. Synthesis derives
a windowed register tile's TV layout from it (``hexlayout.layout.tv_maps.window_tv``) and the
lowering moves the same registers.
"""

from __future__ import annotations

from typing import Any

from .tile import Slice

__all__ = ["window_of"]


# --- windows: x.tile(shape, origin) and x[..., i, ...] of a register tile ---------------------
def window_of(op: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """``(origin, extent, kept modes)`` of a static ``SubTile`` / ``Slice`` of a register tile
    (``ValueError`` for a run-time index: which registers hold the window would depend on it)."""
    shape = tuple(op.src.type.shape)
    if isinstance(op, Slice):
        origin, extent, kept = [], [], []
        for k, i in enumerate(op.index):
            if i is None:
                origin.append(0)
                extent.append(shape[k])
                kept.append(k)
            else:
                origin.append(_static(i, "index"))
                extent.append(1)
        return tuple(origin), tuple(extent), tuple(kept)
    origin = tuple(_static(o, "offset") for o in op.offset)
    return origin, tuple(op.result.type.shape), tuple(range(len(shape)))


def _static(x: Any, what: str) -> int:
    if isinstance(x, int):
        return x
    v = getattr(x, "value", None)
    if isinstance(v, int):
        return v
    raise ValueError(f"a window of a register tile needs a static {what}, not {x} (the registers that "
                     "hold it would depend on a run-time value)")
