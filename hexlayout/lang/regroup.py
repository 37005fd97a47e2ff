"""Register tiles regrouped in registers: ``hl.reshape``, ``hl.concat``, ``hl.interleave``.

All three take register tiles and return a new register tile whose values stay in the
threads that hold them (synthesis derives its layout; the moves it lowers to cost nothing
once compiled). ``x.T`` / ``x.permute(...)`` of a register tile is a view of the same
registers (``Tile.permute``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hexlayout.ir.regroup import Join, Reshape
from hexlayout.ir.types import LayoutVar, Scope, TileType

from .checks import as_tile, begin, static_shape
from .tensor import Tile, describe, shape_str

__all__ = ["reshape", "concat", "interleave"]


def reshape(x: Tile, shape: tuple[int, ...]) -> Tile:
    """The register tile ``x`` with another shape, elements in row-major order (as numpy's
    ``x.reshape(shape)``): ``y.flat[i] = x.flat[i]``.

    Args:
        x (Tile): a register tile.
        shape (tuple[int, ...]): static positive extents whose product is ``x``'s size.

    Returns:
        Tile: a new register tile of ``shape`` and ``x``'s element type (its layout is
        ``x``'s seen through the reshape: no value leaves its thread).

    Raises:
        KernelError: called outside a kernel trace; ``x`` is not a register tile; ``shape``
            is not static and positive or has another number of elements.

    Example:
        Eight columns of a word seen as a mode of their own::

            @hl.kernel(threads=128)
            def split():
                r = hl.zeros((64, 64), hl.f32)
                assert hl.reshape(r, (64, 8, 8)).shape == (64, 8, 8)

            split.trace()
    """
    ctx, loc = begin("reshape")
    t = as_tile(ctx, "reshape", loc, x, "x")
    if t.scope != Scope.REGISTER:
        raise ctx.error("reshape", loc, f"hl.reshape takes a register tile, not {describe(t.value)} "
                        "(a view of a shared or global tile is hl.view / .tile / .permute)")
    new = static_shape(ctx, "reshape", loc, shape, "shape")
    n = 1
    for e in new:
        n *= e
    if n != t.size:
        raise ctx.error("reshape", loc, f"cannot reshape {describe(t.value)} ({t.size} elements) to "
                        f"{shape_str(new)} ({n} elements)")
    v = ctx.new_value(TileType(t.dtype, new, Scope.REGISTER, LayoutVar()), loc, (t.value,))
    ctx.emit(Reshape(v, t.value, loc=loc))
    return Tile(v, ctx)


def _join(op: str, tiles: Sequence[Tile], axis: int, inter: bool) -> Tile:
    ctx, loc = begin(op)
    if not isinstance(tiles, (list, tuple)) or len(tiles) < 2:
        raise ctx.error(op, loc, f"hl.{op} takes a list of at least two register tiles, got {tiles!r}")
    ts = [as_tile(ctx, op, loc, x, f"tiles[{i}]") for i, x in enumerate(tiles)]
    first = ts[0]
    for i, t in enumerate(ts):
        if t.scope != Scope.REGISTER:
            raise ctx.error(op, loc, f"tiles[{i}] {describe(t.value)} is not a register tile")
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ctx.error(op, loc, f"tiles[{i}] {describe(t.value)} differs from tiles[0] "
                            f"{describe(first.value)} in shape or element type")
    if not isinstance(axis, int) or not -first.ndim <= axis < first.ndim:
        raise ctx.error(op, loc, f"axis {axis!r} is not a mode of {describe(first.value)}")
    axis %= first.ndim
    shape = list(first.shape)
    shape[axis] *= len(ts)
    v = ctx.new_value(TileType(first.dtype, tuple(shape), Scope.REGISTER, LayoutVar()), loc,
                      tuple(t.value for t in ts))
    ctx.emit(Join(v, tuple(t.value for t in ts), axis, inter, loc=loc))
    return Tile(v, ctx)


def concat(tiles: Sequence[Tile], axis: int = 0) -> Tile:
    """Register tiles of one shape and type concatenated along ``axis`` (``np.concatenate``).

    Args:
        tiles (Sequence[Tile]): two or more register tiles of one shape and element type.
        axis (int): the mode to join along.

    Returns:
        Tile: a new register tile, ``len(tiles)`` times longer along ``axis``; each thread
        keeps the values it held (synthesis gives the sources one layout).

    Raises:
        KernelError: fewer than two tiles; a tile is not a register tile; shapes or element
            types differ; ``axis`` is not a mode.

    Example:
        Two halves of an accumulator as one tile::

            @hl.kernel(threads=128)
            def halves():
                lo, hi = hl.zeros((32, 64), hl.f32), hl.zeros((32, 64), hl.f32)
                assert hl.concat([lo, hi], axis=0).shape == (64, 64)

            halves.trace()
    """
    return _join("concat", tiles, axis, False)


def interleave(tiles: Sequence[Tile], axis: int = -1) -> Tile:
    """Register tiles of one shape interleaved along ``axis``: element ``c`` of ``tiles[j]`` is
    element ``c'`` of the result with ``c'[axis] = len(tiles) * c[axis] + j``
    (``np.stack(tiles, axis + 1).reshape(...)``).

    Args:
        tiles (Sequence[Tile]): two or more register tiles of one shape and element type.
        axis (int): the mode to interleave along (default the last).

    Returns:
        Tile: a new register tile, ``len(tiles)`` times longer along ``axis``.

    Raises:
        KernelError: as ``hl.concat``.

    Example:
        Even and odd columns woven together::

            @hl.kernel(threads=128)
            def weave():
                even, odd = hl.zeros((64, 32), hl.f16), hl.zeros((64, 32), hl.f16)
                assert hl.interleave([even, odd]).shape == (64, 64)

            weave.trace()
    """
    return _join("interleave", tiles, axis, True)
