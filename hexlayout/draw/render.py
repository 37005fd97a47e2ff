"""Paint a :class:`~hexlayout.draw.grids.CellGrid` with matplotlib and save it.

matplotlib is imported inside the functions (``import hexlayout`` stays light) and used
through ``matplotlib.figure.Figure`` with the Agg canvas, never through pyplot, so no
global backend is switched. The format follows the file suffix: ``.png``, ``.svg``, ``.pdf``.
In SVG the labels stay ``<text>`` elements (``svg.fonttype = none``).

Sizing: a cell is ``clamp(14 in / max(rows, cols), 0.16 in, 0.6 in)`` wide; the label font
scales with the cell, and labels are left out (said in the title) when they would be
smaller than ``MIN_LABEL_PT`` points or the grid has more than ``MAX_LABELLED_CELLS``
cells (e.g. a 64 x 64 tile), unless ``labels=True`` (refused beyond ``MAX_FORCED_LABELS``
cells: matplotlib draws about 500 labels a second).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np

from .errors import DrawError, DrawOutputError
from .grids import CellGrid

__all__ = ["render", "FORMATS", "MIN_LABEL_PT", "MAX_LABELLED_CELLS", "MAX_FORCED_LABELS"]

FORMATS = (".png", ".svg", ".pdf")
MIN_LABEL_PT = 4.0
MAX_LABELLED_CELLS = 2048  # matplotlib draws ~1000 labels a second; more would be slow to draw and read
MAX_FORCED_LABELS = 128 * 128  # labels=True on more cells is refused (128 x 128 takes ~30 s)
DPI = 120


def _cannot_write(p: Path, err: OSError) -> DrawOutputError:
    reason = err.strerror or str(err)
    if err.filename is not None and str(err.filename) != str(p):
        reason += f" ({err.filename})"
    return DrawOutputError(f"cannot write the picture to {str(p)!r}: {reason}")


def _check_path(path: str | os.PathLike[str]) -> Path:
    """The output path: its suffix must be a known format; a missing parent directory is
    created; a path that is a directory, or whose directory cannot be made, raises
    :class:`DrawOutputError` naming it (before anything is drawn)."""
    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        raise ValueError(f"cannot draw to {str(p)!r}: the file suffix must be one of {', '.join(FORMATS)}")
    if p.is_dir():
        raise DrawOutputError(f"cannot write the picture to {str(p)!r}: it is a directory")
    existing = next((d for d in p.parents if d.exists()), None)
    if existing is not None and not existing.is_dir():
        raise DrawOutputError(f"cannot write the picture to {str(p)!r}: {str(existing)!r} is not a directory")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DrawOutputError(f"cannot write the picture to {str(p)!r}: cannot create its directory "
                              f"{str(p.parent)!r}: {e.strerror or e}") from None
    return p


def _label_fontsize(grid: CellGrid, cell_in: float) -> float:
    lines = max((str(s).count("\n") + 1 for s in grid.labels.flat), default=1)
    chars = max((max(len(x) for x in str(s).split("\n")) for s in grid.labels.flat), default=1)
    cell_pt = cell_in * 72
    # Glyphs are about 0.6 em wide and 1.2 em tall; leave a margin of 15 %.
    return min(0.85 * cell_pt / (0.62 * max(chars, 1)), 0.85 * cell_pt / (1.25 * lines), 11.0)


def _ticks(n: int) -> list[int]:
    step = 1 if n <= 32 else (2 if n <= 64 else (4 if n <= 128 else 8))
    return list(range(0, n, step))


def _label_runs(row: np.ndarray, merge: bool) -> list[tuple[int, int, str]]:
    """``(first, end, label)`` per label of a row: one per cell, or per run of equal labels."""
    out: list[tuple[int, int, str]] = []
    j = 0
    while j < len(row):
        end = j + 1
        if merge:
            while end < len(row) and row[end] == row[j]:
                end += 1
        if row[j]:
            out.append((j, end, str(row[j])))
        j = end
    return out


def render(grid: CellGrid, path: str | os.PathLike[str], *, labels: bool | None = None) -> Path:
    """Draw ``grid`` into ``path`` (format by suffix) and return the path.

    ``labels``: ``None`` labels the cells when the font would be readable; ``True`` always,
    ``False`` never.
    """
    import matplotlib
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure

    out = _check_path(path)
    rows, cols = grid.shape
    if labels and rows * cols > MAX_FORCED_LABELS:
        raise DrawError(f"cell labels on {rows}x{cols} cells would take minutes to draw: at most "
                        f"{MAX_FORCED_LABELS} labelled cells; draw without labels (colours only)")
    cell_in = min(0.6, max(0.16, 14.0 / max(rows, cols, 1)))
    fs = _label_fontsize(grid, cell_in)
    show = (fs >= MIN_LABEL_PT and rows * cols <= MAX_LABELLED_CELLS) if labels is None else labels
    note_in = 0.0
    if grid.row_notes:
        note_chars = max((len(s) for s in grid.row_notes), default=0)
        note_in = 0.25 + note_chars * min(fs, 8.0) * 0.62 / 72
    title = grid.title if show else grid.title + "\n(cell labels omitted: tile too large; see colours)"
    grid_w, grid_h = cols * cell_in, rows * cell_in
    margin_l, margin_r, margin_b = 0.6, 0.3 + note_in, 0.35 + (0.3 if grid.footer else 0.0)
    fig_w = max(grid_w + margin_l + margin_r, 4.0)
    # A 9-pt DejaVu Sans glyph is about 5.5 pt wide on average.
    width_chars = max(30, int((fig_w - 0.2) * 72 / 5.6))
    wrapped = "\n".join(textwrap.fill(line, width_chars, break_on_hyphens=False)
                         for line in title.split("\n"))
    title_lines = wrapped.count("\n") + 1
    margin_t = 0.5 + 0.2 * title_lines
    fig_h = grid_h + margin_t + margin_b

    with matplotlib.rc_context({"svg.fonttype": "none", "font.family": "DejaVu Sans"}):
        fig = Figure(figsize=(fig_w, fig_h), dpi=DPI)
        ax = fig.add_axes((margin_l / fig_w, margin_b / fig_h, grid_w / fig_w, grid_h / fig_h))
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)  # row 0 at the top, as in CuTe's pictures
        verts = []
        faces = []
        for i in range(rows):
            for j in range(cols):
                verts.append([(j, i), (j + 1, i), (j + 1, i + 1), (j, i + 1)])
                faces.append(tuple(grid.colors[i, j]))
        lw = 0.5 if max(rows, cols) <= 64 else 0.25
        ax.add_collection(PolyCollection(verts, facecolors=faces, edgecolors="black", linewidths=lw))
        if grid.highlight is not None and grid.highlight.any():
            hv = [verts[i * cols + j] for i, j in zip(*np.nonzero(grid.highlight))]
            ax.add_collection(PolyCollection(hv, facecolors="none", edgecolors="#d62728",
                                             linewidths=max(1.0, 3 * lw)))
        if show:
            for i in range(rows):
                for j0, j1, s in _label_runs(grid.labels[i], grid.merge_runs):
                    # A label over several cells covers a grid line: give it a light backing.
                    box = None
                    if j1 - j0 > 1:
                        box = dict(boxstyle="square,pad=0.1", fc=(1, 1, 1, 0.75), ec="none")
                    ax.text((j0 + j1) / 2, i + 0.5, s, ha="center", va="center", fontsize=fs,
                            linespacing=1.0, bbox=box)
        tick_fs = max(4.0, min(9.0, cell_in * 72 * 0.6))
        ax.set_xticks([j + 0.5 for j in _ticks(cols)], [str(j) for j in _ticks(cols)], fontsize=tick_fs)
        ax.set_yticks([i + 0.5 for i in _ticks(rows)], [str(i) for i in _ticks(rows)], fontsize=tick_fs)
        ax.xaxis.tick_top()
        ax.tick_params(length=0, pad=2)
        ax.set_xlabel(grid.col_name, fontsize=tick_fs + 1)
        ax.xaxis.set_label_position("top")
        ax.set_ylabel(grid.row_name, fontsize=tick_fs + 1)
        for spine in ax.spines.values():
            spine.set_visible(False)
        if grid.row_notes:
            for i, note in enumerate(grid.row_notes):
                if note:
                    ax.text(cols + 0.2, i + 0.5, note, ha="left", va="center", fontsize=min(fs, 8.0),
                            color="#d62728", clip_on=False)
        if grid.footer:
            fig.text(margin_l / fig_w, 0.1 / fig_h, textwrap.shorten(grid.footer, 200), fontsize=8,
                     ha="left", va="bottom")
        fig.text(0.5, 1 - 0.12 / fig_h, wrapped, ha="center", va="top", fontsize=9)
        try:
            fig.savefig(out, dpi=DPI, facecolor="white")
        except OSError as e:
            raise _cannot_write(out, e) from None
    return out
