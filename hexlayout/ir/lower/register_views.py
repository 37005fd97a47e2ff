"""Views of register tiles that move no data: ``x.T`` / ``x.permute(...)``.

A register tile with TV layout ``f`` (``(thread, value) -> colex index of x``) seen with its
modes reordered, ``y[c'] = x[c]`` with ``c[perm[k]] = c'[k]``, is held by the same registers:
thread ``t``'s value ``v`` is element ``P(f(t, v))`` of ``y``, where ``P`` maps the colex
index of ``x`` to the colex index of ``y``. ``P`` is a layout of ``x``'s shape whose stride
along source mode ``perm[k]`` is ``y``'s colex stride of mode ``k``; ``P^-1`` is a layout of
``y``'s shape whose stride along mode ``k`` is ``x``'s colex stride of mode ``perm[k]``. So

    tv(y) = P o f,        tv(x) = P^-1 o tv(y)

(a bijective relation: synthesis propagates a layout either way) and the view is the same
register array under the composed layout; writing the view writes ``x``.
"""

from __future__ import annotations

from hexlayout.layout import Layout, composition

from .views import RegisterTile

__all__ = ["permute_maps", "permuted_tv", "permuted_tile"]


def _colex(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for e in shape:
        out.append(s)
        s *= e
    return out


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
