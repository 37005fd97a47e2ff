"""TV layouts of derived tiles: what a tile's thread-value layout becomes under a tile op.

A register tile with TV layout ``f`` (``(thread, value) -> colex index of x``) keeps its values
in their threads when it is reduced, seen with other modes, windowed, reshaped or joined; the
derived tile's TV layout is a composition with ``f``. Synthesis propagates layouts through
these maps (``hexlayout.synth.graph``) and the lowering builds the same views from them, so
both use these functions.

- reduction along ``axis`` (``reduced_tv``): ``P o f`` with ``P`` the projection of the tile
  onto ``axis = 0``; the stride-0 value modes are dropped (threads along the axis share the
  result).
- modes reordered, ``y[c'] = x[c]`` with ``c[perm[k]] = c'[k]`` (``permute_maps``):
  ``tv(y) = P o f`` and ``tv(x) = P^-1 o tv(y)``, ``P`` a layout of ``x``'s shape whose stride
  along source mode ``perm[k]`` is ``y``'s colex stride of mode ``k``.
- a static window (``window_tv``): thread ``t`` keeps, in value order, the window elements it
  holds; the ``(T, V')`` layout is fitted to that table (``fit_tv``).
- reshape (``reshape_maps``): ``tv(y) = R o tv(x)`` with ``R = Ly o Lx``: ``Lx`` maps ``x``'s
  coordinates to the row-major position, ``Ly`` a row-major position of ``y`` to ``y``'s colex
  index; ``R^-1`` the same with ``x`` and ``y`` swapped.
- join of ``k`` sources sharing the layout ``f`` (``join_tv``): ``E o f`` embeds a source in
  the result (``E``: the source shape with the result's colex strides, the joined axis's
  stride times ``k`` when interleaving) and one more value mode of extent ``k`` steps between
  sources: ``(T, (V, k))``, or ``(T, (k, V))`` interleaved; ``join_source_tv`` inverts it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .composition import composition
from .inverse import left_inverse
from .layout import Layout, coalesce, make_layout

__all__ = ["colex_strides", "same_function", "reduced_tv", "permute_maps", "permuted_tv", "window_tables",
           "fit_tv", "window_tv", "reshape_maps", "join_sources", "join_tv", "join_source_tv"]


def colex_strides(shape: tuple[int, ...]) -> list[int]:
    """The colexicographic strides of ``shape``: ``(1, s0, s0*s1, ...)``."""
    out, s = [], 1
    for x in shape:
        out.append(s)
        s *= x
    return out



def same_function(a: Layout, b: Layout) -> bool:
    """Equal as maps over ``[0, size)``."""
    return a.size() == b.size() and np.array_equal(a.indices(), b.indices())



def reduced_tv(tv: Layout, shape: tuple[int, ...], axis: int) -> Layout:
    """The TV layout of ``reduce(x, axis)`` for ``x`` with TV layout ``tv``: every thread keeps
    one value per distinct output coordinate it holds. ``P o tv`` with ``P`` the projection of
    the tile onto ``axis = 0`` maps the reduced values to stride-0 value modes, which are
    dropped (threads along the axis keep stride-0 thread modes: they share the result)."""
    out_shape = tuple(1 if k == axis else s for k, s in enumerate(shape))
    strides, scale = [], 1
    for k in range(len(shape)):
        strides.append(0 if k == axis else scale)
        scale *= out_shape[k]
    proj = Layout(tuple(shape), tuple(strides))
    try:
        h = composition(proj, tv)
    except ValueError as e:
        raise ValueError(f"cannot derive the layout of the reduction of {tv} along axis {axis}: "
                         f"{e}") from None
    thr, val = h[0], coalesce(h[1])
    vmodes = [val[i] for i in range(val.rank)] if isinstance(val.shape, tuple) else [val]
    kept = [m for m in vmodes if m.stride != 0 and m.shape != 1]
    vl = make_layout(*kept) if kept else Layout(1, 0)
    return Layout((thr.shape, vl.shape), (thr.stride, vl.stride))



def permute_maps(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[Layout, Layout]:
    """``(P, P^-1)`` of the module docstring for a tile of ``shape`` seen with modes ``perm``."""
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"{perm} is not a permutation of the {len(shape)} modes of a {shape} tile")
    out_shape = tuple(shape[p] for p in perm)
    ys, xs = colex_strides(out_shape), colex_strides(shape)
    fwd = [0] * len(shape)
    for k, p in enumerate(perm):
        fwd[p] = ys[k]
    bwd = [xs[p] for p in perm]
    return Layout(tuple(shape), tuple(fwd)), Layout(out_shape, tuple(bwd))


def permuted_tv(tv: Layout, mapping: Layout) -> Layout:
    """``mapping o tv``: the TV layout of the view (``mapping`` from ``permute_maps``)."""
    try:
        return composition(mapping, tv)
    except ValueError as e:
        raise ValueError(f"the register layout {tv} cannot be seen through {mapping}: {e}") from None


def window_tables(src_table: np.ndarray, shape: tuple[int, ...], origin: tuple[int, ...],
                  extent: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For a source ``[t, v] -> colex index`` table: ``(window colex index or -1, in-window mask)``."""
    crd = np.unravel_index(src_table, shape, order="F")
    inside = np.ones(src_table.shape, dtype=bool)
    widx = np.zeros(src_table.shape, dtype=np.int64)
    scale = 1
    for c, o, e in zip(crd, origin, extent):
        inside &= (c >= o) & (c < o + e)
        widx += (c - o) * scale
        scale *= e
    return np.where(inside, widx, -1), inside


def _fit_1d(a: np.ndarray) -> tuple[list[int], list[int]] | None:
    """Shapes and strides of a layout ``L`` with ``L(i) = a[i]`` (``a[0] == 0``), or None."""
    n = len(a)
    shapes: list[int] = []
    strides: list[int] = []
    block = 1                       # size of the modes found so far
    while block < n:
        stride = int(a[block])
        ext = 1
        while block * (ext + 1) <= n and n % (block * (ext + 1)) == 0 and all(
                int(a[block * ext + i]) == int(a[i]) + ext * stride for i in range(block)):
            ext += 1
        while n % (block * ext):
            ext -= 1
        if ext <= 1:
            return None
        shapes.append(ext)
        strides.append(stride)
        block *= ext
    if not shapes:
        return [1], [0]
    return shapes, strides


def fit_tv(table: np.ndarray) -> Layout | None:
    """A TV layout ``(T, V)`` whose value at ``(t, v)`` is ``table[t, v]``, or None."""
    if table[0, 0] != 0:
        return None
    th = _fit_1d(table[:, 0])
    va = _fit_1d(table[0, :])
    if th is None or va is None:
        return None
    lay = Layout((_tup(th[0]), _tup(va[0])), (_tup(th[1]), _tup(va[1])))
    t, v = np.meshgrid(np.arange(table.shape[0]), np.arange(table.shape[1]), indexing="ij")
    got = np.asarray(lay((t + table.shape[0] * v).ravel()), dtype=np.int64)   # vectorized
    return lay if np.array_equal(got.reshape(table.shape), table) else None


def _tup(xs: list[int]) -> Any:
    return xs[0] if len(xs) == 1 else tuple(xs)


def window_tv(tv: Layout, threads: int, shape: tuple[int, ...], origin: tuple[int, ...],
              extent: tuple[int, ...]) -> Layout:
    """The TV layout of a window of a register tile whose values stay in their threads: thread
    ``t`` keeps, in value order, the window elements it holds (``ValueError`` when the threads
    hold different numbers of them or no layout describes them)."""
    values = tv.size() // threads
    src = tv.indices().reshape(values, threads).T
    widx, inside = window_tables(src, shape, origin, extent)
    counts = inside.sum(axis=1)
    if counts.min() != counts.max() or counts.min() == 0:
        raise ValueError(f"the threads hold {int(counts.min())} to {int(counts.max())} elements of the "
                         f"window {extent} at {origin}: a window of a register tile must give every thread "
                         "as many (hl.rearrange the tile first, or take the window of the shared or global "
                         "tile it came from)")
    table = np.stack([widx[t][inside[t]] for t in range(threads)])
    lay = fit_tv(table)
    if lay is None:
        raise ValueError(f"no TV layout describes the elements of the window {extent} at {origin} each "
                         f"thread holds under {tv}")
    return lay



def _rowmajor(shape: tuple[int, ...]) -> list[int]:
    return list(reversed(colex_strides(tuple(reversed(shape)))))


def _one_way(x: tuple[int, ...], y: tuple[int, ...]) -> Layout:
    lx = Layout(tuple(x), tuple(_rowmajor(x)))
    ly = Layout(tuple(reversed(y)), tuple(reversed(colex_strides(y))))
    return composition(ly, lx)


def reshape_maps(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[Layout, Layout]:
    """``(R, R^-1)``: colex index of ``x`` -> colex index of ``y`` under a row-major reshape, and back."""
    if int(np.prod(x)) != int(np.prod(y)):
        raise ValueError(f"cannot reshape a {x} tile ({int(np.prod(x))} elements) to {y} "
                         f"({int(np.prod(y))} elements)")
    return _one_way(x, y), _one_way(y, x)


def join_sources(shape: tuple[int, ...], k: int, axis: int, interleave: bool) -> tuple[Layout, int]:
    """``(E, step)`` of the module docstring for ``k`` sources of ``shape`` joined along ``axis``."""
    out = list(shape)
    out[axis] *= k
    s = colex_strides(tuple(out))
    strides = list(s)
    if interleave:
        strides[axis] *= k
    step = s[axis] if interleave else shape[axis] * s[axis]
    return Layout(tuple(shape), tuple(strides)), step


def join_tv(f: Layout, shape: tuple[int, ...], k: int, axis: int, interleave: bool) -> Layout:
    """The result layout of a join whose sources all have the TV layout ``f``."""
    emb, step = join_sources(shape, k, axis, interleave)
    g = composition(emb, f)
    t, v = g[0], g[1]
    if interleave:      # the sources' values alternate: runs along the axis stay contiguous
        return Layout((t.shape, (k, v.shape)), (t.stride, (step, v.stride)))
    return Layout((t.shape, (v.shape, k)), (t.stride, (v.stride, step)))


def join_source_tv(r: Layout, shape: tuple[int, ...], k: int, axis: int, interleave: bool) -> Layout | None:
    """The inverse of ``join_tv``: the layout ``f`` the sources must share so that the join's
    result has the TV layout ``r`` (``join_tv(f) == r`` as functions), or None when none does.

    ``r``'s value ``v_r`` (colex position ``t + T v_r`` of its ``(T, V)`` domain) is value ``v``
    of source ``j`` with ``v_r = j + k v`` (interleave) or ``v_r = v + (V / k) j``
    (concatenation); source 0's values are ``r o P`` with ``P = (T, V / k) : (1, T k)`` or
    ``(1, T)``, and they are ``E o f`` (``join_sources``), so ``f = E^-1 o r o P`` with
    ``E^-1`` the left inverse of the injective ``E``. The result is checked forward: ``r``
    must hold source ``j``'s values where ``join_tv`` puts them (else None: the required
    layout splits a source's element runs, e.g. keeps two nibbles of one word in two threads)."""
    nt, nv = r[0].size(), r[1].size()
    if nv % k:
        return None
    emb, _ = join_sources(shape, k, axis, interleave)
    pick = Layout((nt, nv // k), (1, nt * k if interleave else nt))
    try:
        f = composition(left_inverse(emb), composition(r, pick))
        f = Layout((f[0].shape, f[1].shape), (f[0].stride, f[1].stride))
        back = join_tv(f, shape, k, axis, interleave)
    except (ValueError, IndexError, TypeError):
        return None
    if back.size() != r.size() or not np.array_equal(r.indices(), back.indices()):
        return None
    src = f.indices()
    if src.min() < 0 or src.max() >= int(np.prod(shape)):
        return None
    return f
