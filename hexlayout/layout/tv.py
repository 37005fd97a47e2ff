"""Thread-value (TV) layouts: ``(thread, value) -> colexicographic index of a tile coordinate``.

For an M x N tile the index is ``m + M * n`` (CuTe's convention). ``make_layout_tv``
builds one from a thread arrangement and a per-thread value arrangement over the tile,
as CuTe's ``make_layout_tv`` / ``make_tiled_copy`` do:

    layout_mn = raked_product(thr_layout, val_layout)   # (m, n) -> (thr, val) index
    layout_tv = with_shape(right_inverse(layout_mn), (size(thr), size(val)))

``tv_inverse`` is the other direction, ``(m, n) -> (thread, value)``, and
``tv_coords`` tabulates a TV layout as arrays of tile coordinates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .composition import with_shape
from .divide import tuple_layout
from .inttuple import IntTuple, is_tuple, product, product_each
from .inverse import left_inverse, right_inverse
from .layout import Layout
from .product import raked_product

if TYPE_CHECKING:
    import numpy as np

__all__ = ["make_layout_tv", "tv_inverse", "tv_coords", "tv_table", "make_tv"]


def make_layout_tv(thr_layout: Layout, val_layout: Layout | None = None) -> tuple[IntTuple, Layout]:
    """Return ``(tiler_mn, layout_tv)`` for threads arranged as ``thr_layout`` ((m,n) -> thr)
    each owning a block of values arranged as ``val_layout`` ((m,n) -> val)."""
    if val_layout is None:
        val_layout = Layout(tuple(1 for _ in range(thr_layout.rank)) if thr_layout.rank > 1 else 1)
    layout_mn = raked_product(thr_layout, val_layout)
    layout_tv = with_shape(right_inverse(layout_mn), (thr_layout.size(), val_layout.size()))
    tiler = product_each(layout_mn.shape)
    return tiler, layout_tv


def make_tv(thr: Layout, val: Layout) -> Layout:
    """The TV layout ``(thr, val)`` as a rank-2 layout (mode 0 threads, mode 1 values)."""
    return tuple_layout([thr, val])


def tv_inverse(layout_tv: Layout, tile_size: int | None = None) -> Layout:
    """``(tile index) -> thread + nthreads * value``: left inverse of an injective TV layout."""
    inv = left_inverse(layout_tv)
    if tile_size is not None:
        inv = with_shape(inv, tile_size)
    return inv


def tv_coords(layout_tv: Layout, tile_shape: IntTuple) -> np.ndarray:
    """Array ``[thread, value, mode]`` of the tile coordinates each (thread, value) holds."""
    import numpy as np
    nt = product(layout_tv.shape[0]) if is_tuple(layout_tv.shape) else layout_tv.size()
    nv = layout_tv.size() // nt
    idx = layout_tv.indices().reshape(nv, nt).T
    dims = tile_shape if is_tuple(tile_shape) else (tile_shape,)
    out = np.empty((nt, nv, len(dims)), dtype=np.int64)
    rest = idx
    for k, d in enumerate(dims):
        out[:, :, k] = rest % d
        rest = rest // d
    return out


def tv_table(layout_tv: Layout, tile_shape: IntTuple) -> tuple[np.ndarray, np.ndarray]:
    """Arrays over the tile (shape ``tile_shape``) giving the thread and value that hold
    each element (-1 where none does; the lowest thread wins where several do)."""
    import numpy as np
    dims = tile_shape if is_tuple(tile_shape) else (tile_shape,)
    total = int(np.prod(dims))
    nt = product(layout_tv.shape[0]) if is_tuple(layout_tv.shape) else layout_tv.size()
    idx = layout_tv.indices()
    t = np.arange(layout_tv.size()) % nt
    v = np.arange(layout_tv.size()) // nt
    thr = np.full(total, -1, dtype=np.int64)
    val = np.full(total, -1, dtype=np.int64)
    order = np.lexsort((v, -t))  # later assignments win: highest thread first, lowest last
    for k in order:
        i = idx[k]
        if 0 <= i < total:
            thr[i], val[i] = t[k], v[k]
    return thr.reshape(dims, order="F"), val.reshape(dims, order="F")
