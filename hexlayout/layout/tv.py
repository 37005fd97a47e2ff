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

import math
from typing import TYPE_CHECKING

from .composition import with_shape
from .divide import tuple_layout
from .inttuple import IntTuple, is_tuple, product, product_each
from .inverse import left_inverse, right_inverse
from .layout import Layout
from .product import raked_product

if TYPE_CHECKING:
    import numpy as np

__all__ = ["make_layout_tv", "tv_inverse", "tv_coords", "tv_table", "make_tv", "copy_thread_layout"]


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


def copy_thread_layout(shape: tuple[int, ...], order: list[int], w: int, threads: int,
                       run: int | None = None) -> Layout | str:
    """TV layout ``(t, (j, n)) -> tile index`` of ``w``-element vectors taken in ``order``
    (``order[0]`` fastest, vectorized by ``w``), vector ``u = t + threads*n``.

    ``run``: take only ``run`` vectors along ``order[0]`` before moving along the other modes
    (the rest of ``order[0]`` comes last): consecutive threads cover a ``run * w``-element
    segment of each of several rows instead of one whole row (the vectors stay coalesced in
    ``run * w``-element segments; what a transposed access of shared memory needs to spread
    over the banks)."""
    inner = order[0]
    if shape[inner] % w:
        return f"the contiguous extent {shape[inner]} is not a multiple of the vector width {w}"
    if run is not None and (run < 1 or (shape[inner] // w) % run):
        return (f"a run of {run} vectors does not divide the {shape[inner] // w} vectors of the "
                "contiguous mode")
    colex = [1]
    for s in shape[:-1]:
        colex.append(colex[-1] * s)
    total_vecs = 1
    for s in shape:
        total_vecs *= s
    total_vecs //= w
    if total_vecs % threads:
        return f"{total_vecs} vectors do not divide evenly among {threads} threads"
    # the vector index u walks modes in 'order' with the inner mode in units of w
    u_shape = [shape[inner] // w] + [shape[k] for k in order[1:]]
    u_stride = [colex[inner] * w] + [colex[k] for k in order[1:]]
    if run is not None and run < u_shape[0]:
        u_shape = [run] + u_shape[1:] + [u_shape[0] // run]
        u_stride = [u_stride[0]] + u_stride[1:] + [u_stride[0] * run]
    u = Layout(tuple(u_shape), tuple(u_stride))
    split = (threads, total_vecs // threads) if total_vecs > threads else threads
    try:
        t_part = with_shape(u, split)
    except ValueError:   # e.g. rows of 12 vectors over 128 threads: no layout takes vectors in order
        return _spread_thread_layout(u_shape, u_stride, Layout(w, colex[inner]), threads)
    if total_vecs > threads:
        thr, rest = t_part[0], t_part[1]
    else:
        thr, rest = t_part, Layout(1, 0)
    vec = Layout(w, colex[inner])
    return Layout((thr.shape, (vec.shape, rest.shape)), (thr.stride, (vec.stride, rest.stride)))


def _spread_thread_layout(u_shape: list[int], u_stride: list[int], vec: Layout, threads: int) -> Layout | str:
    """``copy_thread_layout`` when vectors ``u = t + threads*n`` are no layout (a mode's extent
    neither divides nor is divided by the threads left): ``f_k = gcd(e_k, T_k)`` threads go
    along vector mode ``k`` (extent ``e_k``, fastest first; ``T_k`` threads still unplaced) with
    the mode's stride ``s_k``, and its ``e_k / f_k`` remaining vectors, stride ``f_k*s_k``, are
    values. A 64 x 96 f16 tile (12 vectors a row) over 128 threads: 4 threads a row, 32 rows."""
    thr: list[tuple[int, int]] = []
    rest: list[tuple[int, int]] = []
    left = threads
    for e, st in zip(u_shape, u_stride):
        f = math.gcd(e, left)
        if f > 1:
            thr.append((f, st))
        if e // f > 1:
            rest.append((e // f, st * f))
        left //= f
    if left > 1:
        return f"{threads} threads cannot be spread evenly over {tuple(u_shape)} vectors"

    def mode(parts: list[tuple[int, int]]) -> Layout:
        if not parts:
            return Layout(1, 0)
        if len(parts) == 1:
            return Layout(parts[0][0], parts[0][1])
        return Layout(tuple(p[0] for p in parts), tuple(p[1] for p in parts))

    t, r = mode(thr), mode(rest)
    return Layout((t.shape, (vec.shape, r.shape)), (t.stride, (vec.stride, r.stride)))
