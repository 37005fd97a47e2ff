"""Division of a layout by a tiler: split each mode into (tile, rest).

- ``logical_divide(L, T) = L o (T, complement(T, size(L)))`` for a layout tiler ``T``;
  a tuple tiler divides mode by mode (``None`` keeps a mode whole, an int ``n`` is ``n:1``).
  The result's mode 0 enumerates the tile, mode 1 the tiles.
- ``zipped_divide``: ``((tile modes...), (rest modes...))``.
- ``tiled_divide``:  ``((tile modes...), rest0, rest1, ...)``.
- ``flat_divide``:   ``(tile0, tile1, ..., rest0, rest1, ...)``.

On a ``ComposedLayout`` each applies to its inner layout ``layout_b`` (CuTe C++).

Post-conditions: ``size(result[0]) == size(T)``, ``result[0] == L o T``, and the result
is a permutation of L's values when T's modes fit L's (coalesced) modes; as in C++, a
tile that does not divide a 1-D layout pads it (``6:1 / 4:1 = (4,2):(1,4)``, reading
past ``size(L)``), and a tile that straddles L's modes unevenly raises ValueError
(composition's divisibility check). ``tiled``/``flat`` unpack a mode with C++'s
``repeat<rank>(_)``: a rank-1 (tuple) mode is kept whole, e.g. ``((2),3,4)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .complement import complement
from .composition import Tiler, composition
from .inttuple import fmt, is_int, is_tuple
from .layout import Layout, coalesce, make_layout, require_layout

__all__ = [
    "logical_divide", "zipped_divide", "tiled_divide", "flat_divide", "zip2_by", "tuple_layout", "by_tiler",
]


def unpack_modes(mode: Layout) -> list[Layout]:
    """The modes a slice ``mode(repeat<rank(mode)>(_))`` keeps: a rank-1 mode stays whole
    (CuTe's ``repeat<1>(_)`` is a bare ``_``), a rank-r mode gives its r modes."""
    return [mode] if mode.rank == 1 else list(mode)


def tuple_layout(modes: list[Layout]) -> Layout:
    """The layout whose modes are ``modes`` (a rank-1 tuple layout when there is one)."""
    return Layout(tuple(m.shape for m in modes), tuple(m.stride for m in modes))


def by_tiler(layout: Any, tiler: Tiler, name: str, by_layout: Callable[[Layout, Layout], Layout],
             recurse: Callable[[Any, Tiler], Any]) -> Any:
    """The logical divide or product ``name`` of ``layout`` by ``tiler`` (``recurse``), as CuTe
    dispatches it: of a ``ComposedLayout``, the one of its inner layout; by ``None``, ``layout``;
    an int ``n`` is the layout ``n:1``; a ``Layout`` gives ``by_layout(layout, tiler)``; a tuple
    applies ``recurse`` mode by mode (the modes past the tiler's kept whole)."""
    c = on_inner(layout, tiler, recurse)
    if c is not None:
        return c
    require_layout(layout, name)
    if tiler is None:
        return layout
    if is_int(tiler):
        tiler = Layout(int(tiler))
    if isinstance(tiler, Layout):
        try:
            return by_layout(layout, tiler)
        except ValueError as e:
            raise ValueError(f"{name}({layout}, {tiler}): {e}") from None
    if is_tuple(tiler):
        if len(tiler) > layout.rank:
            raise ValueError(f"{name}({layout}, {fmt(tiler)}): too many modes in the tiler")
        modes = [recurse(layout[i], tiler[i]) for i in range(len(tiler))]
        modes += [layout[i] for i in range(len(tiler), layout.rank)]
        return tuple_layout(modes)
    raise ValueError(f"{name}({layout}, {tiler!r}): the tiler is not a Layout, int, None or tuple")


def logical_divide(layout: Any, tiler: Tiler) -> Any:
    return by_tiler(layout, tiler, "logical_divide", _divide_by_layout, logical_divide)


def _divide_by_layout(layout: Layout, tiler: Layout) -> Layout:
    """``L o (T, complement(T, size(L)))``."""
    return composition(layout, make_layout(tiler, complement(tiler, coalesce(layout).shape)))


def zip2_by(layout: Layout, guide: Tiler) -> Layout:
    """Gather the (tile, rest) pairs at the terminals of ``guide`` into ((tiles...), (rests...))."""
    if is_tuple(guide):
        if layout.rank < len(guide):
            raise ValueError(f"zip2_by({layout}, {fmt(guide)}): mismatched ranks")
        split = [zip2_by(layout[i], guide[i]) for i in range(len(guide))]
        first = tuple_layout([s[0] for s in split])
        second = tuple_layout([s[1] for s in split] + [layout[j] for j in range(len(guide), layout.rank)])
        return tuple_layout([first, second])
    if layout.rank != 2:
        raise ValueError(f"zip2_by({layout}, {fmt(guide)}): expected a rank-2 (tile, rest) mode")
    return layout


def on_inner(layout: Any, tiler: Any, f: Any) -> Any:
    """``f`` applied to the inner layout ``layout_b`` of a ``ComposedLayout`` (as CuTe C++ does
    for divides and products), or None for any other layout."""
    from .composed import ComposedLayout

    if isinstance(layout, ComposedLayout):
        return ComposedLayout(layout.layout_a, layout.offset, f(layout.layout_b, tiler))
    return None


def zipped_forms(logical: Any, kind: str) -> tuple[Any, Any, Any]:
    """The zipped, tiled and flat forms (``zipped_<kind>``, ...) of ``logical`` (the logical
    divide or product): ``((tile modes...), (rest modes...))``, ``((tile modes...), rest0,
    rest1, ...)`` and ``(tile0, tile1, ..., rest0, rest1, ...)``."""
    def zipped(layout: Any, tiler: Tiler) -> Any:
        c = on_inner(layout, tiler, zipped)
        if c is not None:
            return c
        return zip2_by(logical(layout, tiler), tiler)

    def tiled(layout: Any, tiler: Tiler) -> Any:
        c = on_inner(layout, tiler, tiled)
        if c is not None:
            return c
        z = zipped(layout, tiler)
        return tuple_layout([z[0]] + unpack_modes(z[1]))

    def flat(layout: Any, tiler: Tiler) -> Any:
        c = on_inner(layout, tiler, flat)
        if c is not None:
            return c
        z = zipped(layout, tiler)
        return tuple_layout(unpack_modes(z[0]) + unpack_modes(z[1]))

    for f, form in ((zipped, "zipped"), (tiled, "tiled"), (flat, "flat")):
        f.__name__ = f.__qualname__ = f"{form}_{kind}"
        f.__module__ = logical.__module__
    return zipped, tiled, flat


zipped_divide, tiled_divide, flat_divide = zipped_forms(logical_divide, "divide")
