"""Pictures of layouts, TV layouts, shared-memory tiles and instruction atoms.

Each ``draw_*`` function builds a :class:`CellGrid` (pure data, see
:mod:`hexlayout.draw.grids`) and renders it with matplotlib (imported lazily) into a
``.png``, ``.svg`` or ``.pdf`` file chosen by the suffix; it returns the path.

- :func:`draw_layout`: a layout over its 2-D shape, cell ``(i, j)`` = ``L(i + M*j)``.
- :func:`draw_tv`: a TV layout ``(t, v) -> m + M*n`` over an ``M x N`` tile, cells
  ``T{t}/V{v}`` coloured by thread (CuTe's ``print_latex`` palette, ``t mod 8``).
- :func:`draw_smem`: a shared-memory tile, cells labelled by offset, chunk or bank and
  coloured by bank ``(byte // 4) mod 32``, with an optional access pattern whose bank
  groups and wavefronts are shown.
- :func:`draw_atom`: an operand of an mma atom (A: M x K, B: K x N as in CuTe's
  ``print_latex``, C: M x N) or of a copy atom (src/dst, bits converted to elements).
- :func:`draw`: dispatches on a layout string or object.

Pictures are limited to ``MAX_DRAW_CELLS`` cells, ``MAX_DRAW_SIDE`` per side (and TV
layouts to ``MAX_EVALUATED_POINTS`` points): larger ones raise :class:`DrawError` before
anything is evaluated. A file that cannot be written raises :class:`DrawOutputError`
naming its path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..layout.composed import ComposedLayout
from ..layout.layout import Layout
from .errors import DrawError, DrawOutputError
from .grids import (
    CUTE_TV_COLORS,
    MAX_DRAW_CELLS,
    MAX_DRAW_SIDE,
    MAX_EVALUATED_POINTS,
    CellGrid,
    atom_grid,
    bank_color,
    bank_of,
    check_drawable,
    check_elem_bits,
    check_evaluable,
    column_chunk_phases,
    layout_grid,
    layout_values,
    smem_grid,
    thread_color,
    tmem_grid,
    tv_grid,
    wavefronts,
)
from .render import render

__all__ = [
    "draw", "draw_layout", "draw_tv", "draw_smem", "draw_atom", "render",
    "CellGrid", "layout_grid", "tv_grid", "tmem_grid", "smem_grid", "atom_grid", "layout_values",
    "column_chunk_phases", "wavefronts", "bank_of", "thread_color", "bank_color", "CUTE_TV_COLORS",
    "DrawError", "DrawOutputError", "MAX_DRAW_CELLS", "MAX_DRAW_SIDE", "MAX_EVALUATED_POINTS",
    "check_drawable", "check_evaluable", "check_elem_bits",
]

PathLike = str | os.PathLike[str]


def draw_layout(layout: Layout | ComposedLayout, path: PathLike, *, title: str | None = None,
                labels: bool | None = None) -> Path:
    """Draw a layout as a grid over its 2-D shape, each cell labelled with its value."""
    return render(layout_grid(layout, title), path, labels=labels)


def draw_tv(layout_tv: Layout, tile_shape: Any, path: PathLike, *, title: str | None = None,
            labels: bool | None = None) -> Path:
    """Draw a TV layout ``(t, v) -> m + M*n`` over the ``(M, N)`` tile ``tile_shape``."""
    return render(tv_grid(layout_tv, tile_shape, title), path, labels=labels)


def draw_smem(layout: Layout | ComposedLayout, path: PathLike, *, elem_bits: int = 16,
              label: str = "offset", access: Any = None, title: str | None = None,
              labels: bool | None = None) -> Path:
    """Draw a (swizzled) shared-memory tile coloured by bank; see :func:`smem_grid`."""
    return render(smem_grid(layout, elem_bits, label, access, title), path, labels=labels)


def draw_atom(atom: Any, operand: str, path: PathLike, *, elem_bits: int = 16,
              row_elems: int | None = None, labels: bool | None = None) -> Path:
    """Draw operand ``a``/``b``/``c`` of an mma atom or ``src``/``dst`` of a copy atom;
    ``atom`` is an atom object or a name for ``hexlayout.arch.get_atom``."""
    if isinstance(atom, str):
        from .. import arch

        atom = arch.get_atom(atom)
    return render(atom_grid(atom, operand, elem_bits, row_elems), path, labels=labels)


def draw(obj: Any, path: PathLike, *, tile: Any = None, elem_bits: int | None = None,
         labels: bool | None = None) -> Path:
    """Draw ``obj`` (a layout or a CuTe string): with ``tile`` as a TV layout over that tile,
    with ``elem_bits`` (or a swizzle) as a shared-memory tile, else as a plain layout."""
    if isinstance(obj, str):
        from ..layout.parse import parse_layout

        obj = parse_layout(obj)
    if tile is not None:
        if not isinstance(obj, Layout):
            raise ValueError(f"a TV layout must be a plain Layout, not {obj}")
        return draw_tv(obj, tile, path, labels=labels)
    if elem_bits is not None or isinstance(obj, ComposedLayout):
        return draw_smem(obj, path, elem_bits=16 if elem_bits is None else elem_bits, labels=labels)
    return draw_layout(obj, path, labels=labels)
