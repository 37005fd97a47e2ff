"""Products of a layout with a tiler: reproduce a block over the tiler's layout.

- ``logical_product(A, B) = (A, complement(A, size(A) * cosize(B)) o B)``: mode 0 is
  the block A, mode 1 the layout of the copies of A arranged as B.
- ``zipped_product`` / ``tiled_product`` / ``flat_product``: as the divides, regrouped.
- ``blocked_product(A, B)``: rank-wise ``(A_i, B_i)`` pairs with A's modes innermost
  (each element of B is a block A).
- ``raked_product(A, B)``: rank-wise ``(B_i, A_i)`` pairs (the copies interleaved).
- ``tile_to_shape(A, shape)``: ``blocked_product`` of A to fill ``shape``.
"""

from __future__ import annotations

from typing import Any

from .complement import complement
from .composition import Tiler, composition
from .divide import by_tiler, on_inner, zipped_forms
from .inttuple import IntTuple, ceil_div, fmt, is_int, is_tuple, product, product_each
from .layout import Layout, append, cosize, make_layout, make_ordered_layout

__all__ = [
    "logical_product",
    "zipped_product",
    "tiled_product",
    "flat_product",
    "blocked_product",
    "raked_product",
    "tile_to_shape",
]


def logical_product(block: Any, tiler: Tiler) -> Any:
    return by_tiler(block, tiler, "logical_product", _product_by_layout, logical_product)


def _product_by_layout(block: Layout, tiler: Layout) -> Layout:
    """``(A, complement(A, size(A) * cosize(B)) o B)``."""
    return make_layout(block, composition(complement(block, block.size() * cosize(tiler)), tiler))


zipped_product, tiled_product, flat_product = zipped_forms(logical_product, "product")


def _zip(a: IntTuple, b: IntTuple) -> IntTuple:
    """CuTe's ``zip(a, b)``: ``((a0,b0),(a1,b1),...)`` for a tuple ``a``, ``((a,b))`` for an int ``a``."""
    if is_tuple(a):
        bs = b if is_tuple(b) else (b,)
        if len(bs) != len(a):
            raise ValueError(f"zip: mismatched ranks of {fmt(a)} and {fmt(b)}")
        return tuple((x, y) for x, y in zip(a, bs))
    return ((a, b),)


def _rank_product(block: Any, tiler: Any, raked: bool) -> Layout:
    op = "raked_product" if raked else "blocked_product"
    if not isinstance(block, Layout):
        raise ValueError(f"{op}: block {block!r} must be a Layout")
    if is_int(tiler):
        tiler = Layout(int(tiler))
    if not isinstance(tiler, Layout):
        raise ValueError(f"{op}({block}, {tiler!r}): the tiler must be a Layout")
    r = max(block.rank, tiler.rank)
    try:
        result = logical_product(append(block, n=r), append(tiler, n=r))
    except ValueError as e:
        raise ValueError(f"{op}({block}, {tiler}): {e}") from None
    a, b = result[0], result[1]
    first, second = (b, a) if raked else (a, b)
    return Layout(_zip(first.shape, second.shape), _zip(first.stride, second.stride))


def blocked_product(block: Any, tiler: Layout) -> Any:
    """``zip(A*, B*)`` of ``logical_product(A*, B*)`` with both padded to the same rank:
    mode ``i`` is ``(A_i, B_i)``, each copy of the block contiguous in the result."""
    c = on_inner(block, tiler, blocked_product)
    if c is not None:
        return c
    return _rank_product(block, tiler, raked=False)


def raked_product(block: Any, tiler: Layout) -> Any:
    """``zip(B*, A*)``: mode ``i`` is ``(B_i, A_i)``, the copies of the block interleaved."""
    c = on_inner(block, tiler, raked_product)
    if c is not None:
        return c
    return _rank_product(block, tiler, raked=True)


def tile_to_shape(block: Any, trg_shape: IntTuple, order: IntTuple | None = None) -> Any:
    """Repeat ``block`` (blocked) until it has shape ``trg_shape``; ``order`` orders the repeats."""
    c = on_inner(block, trg_shape, lambda b, s: tile_to_shape(b, s, order))
    if c is not None:
        return c
    r = len(trg_shape) if is_tuple(trg_shape) else 1
    if block.rank > r:
        raise ValueError(f"tile_to_shape({block}, {fmt(trg_shape)}): the block has more modes than the shape")
    padded = append(block, n=r)
    block_shape = product_each(padded.shape) if r > 1 else (product(padded.shape),)
    target = product_each(trg_shape) if is_tuple(trg_shape) else (trg_shape,)
    for t, b in zip(target, block_shape):
        if t % b != 0:
            raise ValueError(
                f"tile_to_shape({block}, {fmt(trg_shape)}): block extent {b} does not divide {t}"
            )
    rep = tuple(ceil_div(t, b) for t, b in zip(target, block_shape))
    if order is None:
        order = tuple(range(r))
    if r == 1:
        rep_layout = make_ordered_layout(rep[0], order[0] if is_tuple(order) else order)
    else:
        rep_layout = make_ordered_layout(rep, order)
    return blocked_product(padded, rep_layout)
