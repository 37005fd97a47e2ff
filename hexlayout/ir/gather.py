"""Indirect addressing in the tile IR: scalar loads and gathered global views.

``ScalarLoad``: ``count`` consecutive elements of a global tensor, at element coordinate
``index`` (the last mode runs over the ``count`` elements), loaded into the per-thread
register array ``array`` by every thread (the same address in every thread, so the value
is thread-uniform). The loaded values are the expressions ``RegRead(array, i)``: they
can be used wherever an integer ``Expr`` can (a loop bound, a view origin, a condition,
an index). They need no layout: synthesis ignores the op. Out-of-range coordinates read 0.

Gathered views are ``GlobalView`` ops with ``indices`` (integer index tiles, register
tiles or global views) and an ``IndexMap``: per tensor mode ``m`` a ``ModeIndex`` saying
that the element at tile coordinate ``c`` has tensor coordinate

    x_m(c) = origin[m] + (c[tile_mode] if tile_mode is not None)
                       + (indices[index][c[axes[0]], c[axes[1]], ...] if index is not None)

(an index-tile mode of extent 1 reads coordinate 0: broadcasting). An element is in bounds
when every gathered coordinate is in ``[0, shape_m)``, every plain tile mode is inside the
view's ``extent`` and every load its index needs was in bounds; out-of-bounds elements read
as 0 and are never written. The lowering recomputes index tiles per thread from their
definitions (``hexlayout.ir.lower.index_tiles``), so an index tile needs no layout of its
own for the gather.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .expr import ExprLike, RegRead, to_c
from .lowered import RegArray
from .printer import PRINTING, Printer
from .tile import GlobalParam, Op

__all__ = ["ModeIndex", "IndexMap", "ScalarLoad"]


@dataclass(frozen=True)
class ModeIndex:
    """How one tensor mode's coordinate is formed (see the module docstring)."""

    tile_mode: int | None
    index: int | None = None
    axes: tuple[int, ...] = ()


@dataclass(frozen=True)
class IndexMap:
    """One ``ModeIndex`` per tensor mode of a gathered view."""

    modes: tuple[ModeIndex, ...]

    def text(self, names: list[str]) -> str:
        out = []
        for m in self.modes:
            parts = []
            if m.tile_mode is not None:
                parts.append(f"c{m.tile_mode}")
            if m.index is not None:
                parts.append(f"%{names[m.index]}[{', '.join(f'c{a}' for a in m.axes)}]")
            out.append(" + ".join(parts) if parts else "0")
        return "(" + ", ".join(out) + ")"


@dataclass(eq=False)
class ScalarLoad(Op):
    """``array[0:count] = param[index[0], ..., index[-1] + 0:count]`` in every thread."""

    array: RegArray
    param: GlobalParam
    index: tuple[ExprLike, ...]
    count: int = 1

    def loaded(self) -> list[Any]:
        """The loaded values as expressions (``RegRead``), one per element."""
        return [RegRead(self.array, i) for i in range(self.count)]


@PRINTING.register(ScalarLoad)
def _scalar_load(p: Printer, op: ScalarLoad) -> str:
    idx = ", ".join(to_c(i) if not isinstance(i, int) else str(i) for i in op.index)
    n = f" x{op.count}" if op.count != 1 else ""
    return f"{op.array.name} = load %{op.param.name}[{idx}]{n}"
