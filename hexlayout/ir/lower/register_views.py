"""Views of register tiles: ``x.T`` / ``x.permute(...)`` (no data moves) and static windows
``x.tile(shape, origin)`` / ``x[..., i, ...]`` (the values stay in their threads).

A register tile with TV layout ``f`` (``(thread, value) -> colex index of x``) seen with its
modes reordered, ``y[c'] = x[c]`` with ``c[perm[k]] = c'[k]``, is held by the same registers:
thread ``t``'s value ``v`` is element ``P(f(t, v))`` of ``y``, where ``P`` maps the colex
index of ``x`` to the colex index of ``y``. ``P`` is a layout of ``x``'s shape whose stride
along source mode ``perm[k]`` is ``y``'s colex stride of mode ``k``; ``P^-1`` is a layout of
``y``'s shape whose stride along mode ``k`` is ``x``'s colex stride of mode ``perm[k]``. So

    tv(y) = P o f,        tv(x) = P^-1 o tv(y)

(a bijective relation: synthesis propagates a layout either way) and the view is the same
register array under the composed layout; writing the view writes ``x``.

A window with static origin ``o`` and extent ``e`` (a ``Slice`` fixes modes at static
indices: extent 1, mode dropped) keeps in each thread the window elements the thread holds,
in value order: its TV layout ``(T, V')`` is fitted to that table (``window_tv``; every
thread must hold equally many, e.g. a column block of an mma accumulator), and it lowers to
register moves (a new tile; writes to it do not reach ``x``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexlayout.layout import Layout, composition

from .copy import _colex_strides as _colex
from .views import RegisterTile

__all__ = ["permute_maps", "permuted_tv", "permuted_tile", "window_of", "window_tv", "window_tables",
           "fit_tv"]


def permute_maps(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[Layout, Layout]:
    """``(P, P^-1)`` of the module docstring for a tile of ``shape`` seen with modes ``perm``."""
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"{perm} is not a permutation of the {len(shape)} modes of a {shape} tile")
    out_shape = tuple(shape[p] for p in perm)
    ys, xs = _colex(out_shape), _colex(shape)
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


def permuted_tile(tile: RegisterTile, perm: tuple[int, ...]) -> RegisterTile:
    """The view of ``tile`` with its modes reordered by ``perm`` (same registers)."""
    fwd, _ = permute_maps(tile.shape, perm)
    view = RegisterTile(tile.array, tile.dtype, tuple(tile.shape[p] for p in perm), permuted_tv(tile.tv, fwd),
                        tile.threads)
    view.extra.update(tile.extra)
    return view


# --- windows: x.tile(shape, origin) and x[..., i, ...] of a register tile ---------------------
def window_of(op: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """``(origin, extent, kept modes)`` of a static ``SubTile`` / ``Slice`` of a register tile
    (``ValueError`` for a run-time index: which registers hold the window would depend on it)."""
    from ..tile import Slice

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


def lower_register_window(lw: Any, op: Any, base: RegisterTile) -> list[Any]:
    """A window of register tile ``base`` (``op``: ``SubTile`` / ``Slice``): moves of the values
    each thread holds into the result's registers (``lw``: the lowering)."""
    from .regroup import lower_moves

    try:
        origin, extent, _ = window_of(op)
    except ValueError as e:
        raise lw.fail(op, str(e)) from None
    dst = lw.register_of(op.result, op)
    if dst.threads != base.threads:
        raise lw.fail(op, "the window is held by another number of threads than its tile")
    widx, _ = window_tables(base.index_table(), base.shape, origin, extent)
    res = lower_moves(dst, dst.index_table(), [(base, widx)])
    if isinstance(res, str):
        raise lw.fail(op, f"window {extent} at {origin} of %{op.src.name}: {res}")
    return res
