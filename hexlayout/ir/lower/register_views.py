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

from hexlayout.layout.tv_maps import permute_maps, permuted_tv, window_tables

from ..windows import window_of
from .views import RegisterTile

__all__ = ["permuted_tile", "lower_register_window"]


def permuted_tile(tile: RegisterTile, perm: tuple[int, ...]) -> RegisterTile:
    """The view of ``tile`` with its modes reordered by ``perm`` (same registers)."""
    fwd, _ = permute_maps(tile.shape, perm)
    view = RegisterTile(tile.array, tile.dtype, tuple(tile.shape[p] for p in perm), permuted_tv(tile.tv, fwd),
                        tile.threads)
    view.extra.update(tile.extra)
    return view


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
