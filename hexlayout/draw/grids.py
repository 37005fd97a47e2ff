"""The data every picture is drawn from: a grid of cell labels, colour keys and colours.

Nothing here imports matplotlib. Each builder returns a :class:`CellGrid`; the renderer in
:mod:`hexlayout.draw.render` only paints it, so the content of a picture is testable
without rendering it.

Conventions (CuTe's):

- A layout ``L`` is drawn over its 2-D shape ``(M, N)`` with ``M = size(mode 0)`` and
  ``N = size(L) / M`` (a rank-1 layout is one row, ``M = 1``): cell ``(i, j)`` holds
  ``L(i + M*j)``, i.e. the colexicographic 1-D index, which equals ``L(i, j)`` for rank 2.
- A TV layout maps ``(t, v) -> m + M*n`` over an ``M x N`` tile; the cell ``(m, n)``
  shows the thread ``t`` and value ``v`` that hold it (the lowest thread if several do),
  coloured by ``t mod 8`` with CuTe's ``print_latex`` palette.
- A shared-memory tile is a layout whose values are element offsets; with elements of
  ``elem_bits`` bits an offset ``x`` starts at byte ``b = x*elem_bits/8``, lies in bank
  ``(b // 4) mod 32`` and in 16-byte chunk ``b // 16`` (bank group ``(b // 16) mod 8``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..layout.composed import ComposedLayout
from ..layout.inttuple import is_tuple, product
from ..layout.layout import Layout
from ..layout.recast import upcast
from ..layout.tv import tv_table
from .errors import DrawError

__all__ = [
    "CellGrid",
    "CUTE_TV_COLORS",
    "BANKS",
    "thread_color",
    "bank_color",
    "layout_values",
    "layout_grid",
    "tv_grid",
    "smem_grid",
    "atom_grid",
    "column_chunk_phases",
    "bank_of",
    "wavefronts",
    "MAX_DRAW_CELLS",
    "MAX_DRAW_SIDE",
    "MAX_EVALUATED_POINTS",
    "check_drawable",
    "check_evaluable",
    "check_elem_bits",
]

BANKS = 32
BANK_BYTES = 4

# Drawable sizes. A cell is at least 0.16 in at 120 dpi (render.py), about 19 x 19 pixels, so
# 65,536 cells are at most ~25 megapixels (~2 s, ~250 MB to render 256 x 256); a side of at
# most 1,024 cells keeps a one-row picture under 20,000 pixels wide. TV layouts and copy atoms
# are evaluated point by point: at most MAX_EVALUATED_POINTS of them (~1 s).
MAX_DRAW_CELLS = 256 * 256
MAX_DRAW_SIDE = 1024
MAX_EVALUATED_POINTS = 1 << 20

# CuTe's print_latex TV palette (cute/util/print_latex.hpp, TikzColor_TV): thread t -> t % 8.
CUTE_TV_COLORS: tuple[tuple[int, int, int], ...] = (
    (175, 175, 255),
    (175, 255, 175),
    (255, 255, 175),
    (255, 175, 175),
    (210, 210, 255),
    (210, 255, 210),
    (255, 255, 210),
    (255, 210, 210),
)
# CuTe's black-and-white palette for plain layouts (TikzColor_BWx8): percent black of value % 8,
# lightened here so that black labels stay readable.
_BW_PERCENT = (0, 40, 20, 60, 10, 50, 30, 70)
EMPTY_COLOR = (1.0, 1.0, 1.0)


def thread_color(t: int) -> tuple[float, float, float]:
    """RGB in [0, 1] of thread ``t``: CuTe's 8-colour TV cycle, ``CUTE_TV_COLORS[t % 8]``."""
    r, g, b = CUTE_TV_COLORS[t % len(CUTE_TV_COLORS)]
    return (r / 255, g / 255, b / 255)


def _gray(v: int) -> tuple[float, float, float]:
    level = 1.0 - 0.6 * _BW_PERCENT[v % 8] / 100
    return (level, level, level)


def bank_color(bank: int) -> tuple[float, float, float]:
    """RGB of shared-memory bank ``bank`` (0..31): 8 hues for the bank group ``bank // 4``
    (CuTe's TV palette, saturated), 4 lightness steps for ``bank % 4`` within the group."""
    r, g, b = CUTE_TV_COLORS[(bank // 4) % 8]
    base = np.array([r, g, b], dtype=float) / 255
    # Saturate the pastel hue, then lighten by the position inside the 16-byte group.
    sat = np.clip((base - 0.68) / 0.32, 0, 1) * 0.6 + 0.4
    light = (bank % 4) / 4 * 0.6
    rgb = sat + (1 - sat) * light
    return (float(rgb[0]), float(rgb[1]), float(rgb[2]))


@dataclass
class CellGrid:
    """A picture's content: ``rows x cols`` cells.

    ``labels[i, j]`` is the text of cell (i, j) ("" for none); ``keys[i, j]`` the integer the
    colour is chosen by (thread, bank, value; -1 for an empty cell); ``colors[i, j]`` its RGB
    in [0, 1]; ``highlight[i, j]`` marks cells outlined (an access pattern); ``row_notes`` are
    printed right of each row, ``footer`` under the grid. ``row_name``/``col_name`` name
    the axes (``m``, ``n``, ``k``, ``row``, ``col``). With ``merge_runs`` a run of equal
    labels in a row is written once, centred over the run (e.g. a 16-byte chunk).
    """

    title: str
    labels: np.ndarray
    keys: np.ndarray
    colors: np.ndarray
    row_name: str = "row"
    col_name: str = "col"
    highlight: np.ndarray | None = None
    row_notes: list[str] | None = None
    footer: str = ""
    merge_runs: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.labels.shape[0]), int(self.labels.shape[1]))


def _colors_from(keys: np.ndarray, color_of: Any) -> np.ndarray:
    out = np.empty((*keys.shape, 3), dtype=float)
    cache: dict[int, tuple[float, float, float]] = {}
    for idx, k in np.ndenumerate(keys):
        k = int(k)
        if k not in cache:
            cache[k] = EMPTY_COLOR if k < 0 else color_of(k)
        out[idx] = cache[k]
    return out


def _label_array(shape: tuple[int, int], fn: Any) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for i in range(shape[0]):
        for j in range(shape[1]):
            out[i, j] = fn(i, j)
    return out


def grid_shape(layout: Layout | ComposedLayout) -> tuple[int, int]:
    """``(M, N)``: ``M = size(mode 0)`` (1 for a rank-1 layout), ``N = size / M``."""
    shape = layout.shape
    if is_tuple(shape) and len(shape) >= 2:
        m = product(shape[0])
        return m, layout.size() // m
    return 1, layout.size()


def check_drawable(rows: int, cols: int, what: str) -> None:
    """Raise :class:`DrawError` naming ``what`` unless a ``rows x cols`` grid is drawable:
    ``rows*cols <= MAX_DRAW_CELLS`` and each side ``<= MAX_DRAW_SIDE``."""
    if rows * cols > MAX_DRAW_CELLS or max(rows, cols) > MAX_DRAW_SIDE:
        raise DrawError(f"{what} is {rows}x{cols} cells, too large to draw: at most "
                        f"{MAX_DRAW_CELLS} cells and {MAX_DRAW_SIDE} per side; draw a tile of it")


def check_evaluable(layout: Layout | ComposedLayout, what: str) -> None:
    """Raise :class:`DrawError` unless ``size(layout) <= MAX_EVALUATED_POINTS``."""
    n = layout.size()
    if n > MAX_EVALUATED_POINTS:
        raise DrawError(f"{what} {layout} has {n} points, too many to draw: at most {MAX_EVALUATED_POINTS}")


def check_elem_bits(elem_bits: Any, what: str = "elem_bits") -> int:
    """``elem_bits`` if it is an element width a picture can use: a power of two from 1 to
    128 bits; else :class:`DrawError` naming ``what``."""
    ok = isinstance(elem_bits, (int, np.integer)) and not isinstance(elem_bits, bool)
    if not ok or not (1 <= elem_bits <= 128) or elem_bits & (elem_bits - 1):
        raise DrawError(f"{what} {elem_bits!r} is not an element width: expected a power of two "
                        "from 1 to 128 bits (8 or more for a shared-memory tile)")
    return int(elem_bits)


def layout_values(layout: Layout | ComposedLayout) -> np.ndarray:
    """``(M, N)`` array with ``[i, j] = L(i + M*j)`` (see :func:`grid_shape`); a layout of
    more than ``MAX_DRAW_CELLS`` cells raises :class:`DrawError` before it is evaluated."""
    m, n = grid_shape(layout)
    check_drawable(m, n, f"layout {layout}")
    return np.asarray(layout.indices(), dtype=np.int64).reshape((m, n), order="F")


def layout_grid(layout: Layout | ComposedLayout, title: str | None = None) -> CellGrid:
    """A plain layout: each cell ``(i, j)`` labelled with ``L(i + M*j)``, shaded by value mod 8
    (CuTe's black-and-white cycle)."""
    vals = layout_values(layout)
    labels = _label_array(vals.shape, lambda i, j: str(vals[i, j]))
    return CellGrid(
        title=title or f"Layout {layout}",
        labels=labels,
        keys=vals.copy(),
        colors=_colors_from(vals % 8, _gray),
        row_name="i",
        col_name="j",
        meta={"values": vals},
    )


def _tile2(tile_shape: Any) -> tuple[int, int]:
    if is_tuple(tile_shape):
        dims = [product(d) for d in tile_shape]
        if len(dims) == 1:
            return 1, dims[0]
        return dims[0], int(np.prod(dims[1:]))
    return 1, int(tile_shape)


def tv_arrays(layout_tv: Layout, tile_shape: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(thread, value)`` arrays of shape ``(M, N)`` over the tile (``-1`` where nobody)."""
    m, n = _tile2(tile_shape)
    check_drawable(m, n, f"the {m}x{n} tile of TV layout {layout_tv}")
    check_evaluable(layout_tv, "TV layout")
    thr, val = tv_table(layout_tv, (m, n))
    return np.asarray(thr).reshape(m, n), np.asarray(val).reshape(m, n)


def _tv_cells(thr: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    labels = _label_array(thr.shape, lambda i, j: "" if thr[i, j] < 0 else f"T{thr[i, j]}\nV{val[i, j]}")
    return labels, _colors_from(thr, thread_color)


def tv_grid(layout_tv: Layout, tile_shape: Any, title: str | None = None,
            row_name: str = "m", col_name: str = "n") -> CellGrid:
    """A TV layout ``(t, v) -> m + M*n`` over an ``M x N`` tile: cell ``(m, n)`` labelled
    ``T{t}\\nV{v}`` and coloured by ``t mod 8``."""
    thr, val = tv_arrays(layout_tv, tile_shape)
    labels, colors = _tv_cells(thr, val)
    m, n = thr.shape
    return CellGrid(
        title=title or f"TV layout {layout_tv} over a {m}x{n} tile, (T,V) -> {row_name} + {m}*{col_name}",
        labels=labels, keys=thr, colors=colors, row_name=row_name, col_name=col_name,
        meta={"threads": thr, "values": val},
    )


def tmem_grid(accumulator: Layout, register_tv: Layout, tile_shape: Any, columns: int,
              title: str | None = None) -> CellGrid:
    """Tensor memory (sm_100a) holding an ``M x N`` accumulator: a ``128 lanes x columns`` grid
    where the cell at lane ``accumulator(m, n) >> 16``, column ``accumulator(m, n) & 0xFFFF``
    (``arch.tmem.accumulator_layout``) is labelled ``T{t}\nV{v}``, the thread and register
    that ``tcgen05.ld`` brings it to (``register_tv``: ``(t, v) -> m + M*n``), coloured by ``t``;
    cells the accumulator does not use are empty."""
    m, n = _tile2(tile_shape)
    check_drawable(128, columns, f"tensor memory of the {m}x{n} accumulator")
    thr, val = tv_arrays(register_tv, (m, n))
    addr = np.asarray(accumulator.indices(), dtype=np.int64).reshape((m, n), order="F")
    lanes, cols = addr >> 16, addr & 0xFFFF
    t_at = np.full((128, columns), -1, dtype=np.int64)
    v_at = np.full((128, columns), -1, dtype=np.int64)
    t_at[lanes, cols], v_at[lanes, cols] = thr, val
    labels, colors = _tv_cells(t_at, v_at)
    return CellGrid(
        title=title or f"TMEM: {m}x{n} accumulator in 128 lanes x {columns} columns, loaded by (T, V)",
        labels=labels, keys=t_at, colors=colors, row_name="lane", col_name="column",
        meta={"threads": t_at, "values": v_at},
    )


# --- shared memory -------------------------------------------------------------------------

def bank_of(byte_address: Any) -> Any:
    """Bank of a byte address: ``(b // 4) mod 32``."""
    return (np.asarray(byte_address) // BANK_BYTES) % BANKS


def wavefronts(byte_addresses: Sequence[int] | np.ndarray, access_bytes: int = 1) -> int:
    """Wavefronts to serve one shared-memory request touching ``[b, b + access_bytes)`` for
    each ``b``: the largest number of distinct 4-byte words that fall into one bank (the same
    word read twice is free). 0 for an empty request."""
    b = np.asarray(byte_addresses, dtype=np.int64).reshape(-1)
    if b.size == 0:
        return 0
    first = b // BANK_BYTES
    last = (b + max(access_bytes, 1) - 1) // BANK_BYTES
    words = np.unique(np.concatenate([np.arange(f, lst + 1) for f, lst in zip(first, last)]))
    counts = np.bincount(words % BANKS, minlength=BANKS)
    return int(counts.max())


def column_chunk_phases(rows: int, chunk_elems: int, chunk: int = 0,
                        rows_per_phase: int = 8) -> list[list[tuple[int, int]]]:
    """The access of ``ldmatrix`` (or any 16-byte-per-thread load) down one chunk column:
    phase ``p`` reads, in rows ``rows_per_phase*p ... rows_per_phase*(p+1) - 1``, the
    ``chunk_elems`` elements of logical chunk ``chunk`` (columns ``chunk*chunk_elems + e``)."""
    phases = []
    for p0 in range(0, rows, rows_per_phase):
        phases.append([(r, chunk * chunk_elems + e)
                       for r in range(p0, min(rows, p0 + rows_per_phase)) for e in range(chunk_elems)])
    return phases


def smem_grid(layout: Layout | ComposedLayout, elem_bits: int = 16, label: str = "offset",
              access: Sequence[Sequence[tuple[int, int]]] | None = None,
              title: str | None = None) -> CellGrid:
    """A shared-memory tile: cell ``(i, j)`` holds the element offset ``x = L(i + M*j)``,
    labelled by ``x`` (``label="offset"``), its 16-byte chunk ``x*elem_bits // 128``
    (``"chunk"``) or its bank (``"bank"``), and coloured by bank ``(x*elem_bits/8 // 4) mod 32``.

    ``access`` is a list of phases, each a list of cells ``(i, j)`` read together; the cells
    are outlined, each row is annotated with the bank groups (16-byte groups of 4 banks,
    ``bank // 4``) its accessed cells hit, and the footer gives the wavefronts per phase
    (:func:`wavefronts`).
    """
    check_elem_bits(elem_bits, "smem_grid: elem_bits")
    if elem_bits % 8:
        raise DrawError(f"smem_grid: elem_bits {elem_bits} is not a positive multiple of 8")
    ebytes = elem_bits // 8
    offs = layout_values(layout)
    byte = offs * ebytes
    banks = bank_of(byte)
    chunks = byte // 16
    if label == "offset":
        labels = _label_array(offs.shape, lambda i, j: str(offs[i, j]))
    elif label == "chunk":
        labels = _label_array(offs.shape, lambda i, j: str(chunks[i, j]))
    elif label == "bank":
        labels = _label_array(offs.shape, lambda i, j: str(banks[i, j]))
    else:
        raise ValueError(f"smem_grid: label must be 'offset', 'chunk' or 'bank', not {label!r}")
    grid = CellGrid(
        title=title or f"Shared-memory tile {layout}, {elem_bits}-bit elements, "
                       f"cells: {label}, colour: bank",
        labels=labels, keys=banks, colors=_colors_from(banks, bank_color),
        row_name="row", col_name="col", merge_runs=(label == "chunk"),
        meta={"offsets": offs, "banks": banks, "chunks": chunks, "elem_bits": elem_bits},
    )
    if access:
        m, n = offs.shape
        hl = np.zeros((m, n), dtype=bool)
        groups: list[set[int]] = [set() for _ in range(m)]
        waves = []
        for phase in access:
            addrs = []
            for (i, j) in phase:
                if not (0 <= i < m and 0 <= j < n):
                    raise ValueError(f"smem_grid: access cell ({i},{j}) is outside the {m}x{n} tile")
                hl[i, j] = True
                groups[i].add(int(banks[i, j]) // 4)
                addrs.append(int(byte[i, j]))
            waves.append(wavefronts(addrs, ebytes))
        grid.highlight = hl
        grid.row_notes = [("groups " + ",".join(str(g) for g in sorted(gs))) if gs else "" for gs in groups]
        grid.footer = ("access: " + ", ".join(f"phase {p}: {w} wavefront{'s' if w != 1 else ''}"
                                               for p, w in enumerate(waves)))
        grid.meta["wavefronts"] = waves
        grid.meta["row_groups"] = groups
    return grid


# --- instruction atoms ---------------------------------------------------------------------

MMA_OPERANDS = ("a", "b", "c")
COPY_OPERANDS = ("src", "dst")


def atom_kind(atom: Any) -> str:
    """``"mma"`` for an atom with ``a_layout``, ``"copy"`` for one with ``src_layout``."""
    if hasattr(atom, "a_layout") and hasattr(atom, "shape_mnk"):
        return "mma"
    if hasattr(atom, "src_layout") and hasattr(atom, "dst_layout"):
        return "copy"
    raise ValueError(f"{_atom_name(atom)} is neither an mma atom (a_layout, shape_mnk) "
                     f"nor a copy atom (src_layout, dst_layout)")


def _atom_name(atom: Any) -> str:
    return str(getattr(atom, "name", type(atom).__name__))


def atom_grid(atom: Any, operand: str, elem_bits: int = 16,
              row_elems: int | None = None) -> CellGrid:
    """One operand of an instruction atom as a TV picture.

    mma atoms (``shape_mnk = (M, N, K)``, layouts in elements, CuTe convention):
    ``a``: ``(T,V) -> m + M*k`` drawn ``M x K`` (rows m, columns k);
    ``b``: ``(T,V) -> n + N*k`` drawn ``K x N`` (rows k, columns n), as CuTe's
    ``print_latex`` draws B above C; ``c``: ``(T,V) -> m + M*n`` drawn ``M x N``.

    copy atoms (``src_layout``/``dst_layout``: ``(T,V) -> bit``): the layout is upcast to
    ``elem_bits``-bit elements, ``(T,V) -> element e``, and drawn as rows of ``row_elems``
    elements (default: one 16-byte row, ``128 // elem_bits``), cell ``(r, c)`` = element
    ``r*row_elems + c``.
    """
    name = _atom_name(atom)
    kind = atom_kind(atom)
    op = operand.lower()
    if kind == "mma":
        if op not in MMA_OPERANDS:
            raise ValueError(f"mma atom {name}: operand must be one of a, b, c, not {operand!r}")
        m, n, k = (int(x) for x in atom.shape_mnk[:3])
        layout = getattr(atom, f"{op}_layout")
        if op == "a":
            thr, val = tv_arrays(layout, (m, k))
            rn, cn, desc = "m", "k", f"A ({m}x{k}, M x K), (T,V) -> m + {m}*k"
        elif op == "b":
            thr, val = tv_arrays(layout, (n, k))
            thr, val = thr.T.copy(), val.T.copy()
            rn, cn, desc = "k", "n", f"B drawn K x N ({k}x{n}, as CuTe print_latex), (T,V) -> n + {n}*k"
        else:
            thr, val = tv_arrays(layout, (m, n))
            rn, cn, desc = "m", "n", f"C ({m}x{n}, M x N), (T,V) -> m + {m}*n"
        title = f"{name}: {desc}\n{layout}"
    else:
        if op not in COPY_OPERANDS:
            raise ValueError(f"copy atom {name}: operand must be src or dst, not {operand!r}")
        check_elem_bits(elem_bits, f"copy atom {name}: elem_bits")
        bits_layout = getattr(atom, f"{op}_layout")
        check_evaluable(bits_layout, f"copy atom {name}: {op} layout")
        layout = upcast(bits_layout, elem_bits) if elem_bits > 1 else bits_layout
        # Element codomain: cosize of the upcast layout.
        total = int(np.asarray(layout.indices()).max()) + 1
        w = row_elems or max(1, 128 // elem_bits)
        w = min(w, total)
        rows = -(-total // w)
        thr_cm, val_cm = tv_arrays(layout, (w, rows))  # index e = c + w*r
        thr, val = thr_cm.T.copy(), val_cm.T.copy()
        rn, cn = "row", "col"
        title = (f"{name}: {op} (T,V) -> element, {elem_bits}-bit elements, rows of {w} "
                 f"(element = row*{w} + col)\n{bits_layout} (bits) = {layout} (elements)")
    labels, colors = _tv_cells(thr, val)
    return CellGrid(title=title, labels=labels, keys=thr, colors=colors, row_name=rn, col_name=cn,
                    meta={"threads": thr, "values": val, "layout": layout})
