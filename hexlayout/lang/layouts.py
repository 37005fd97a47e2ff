"""Layouts a kernel author may give: ``hl.auto`` (with hints) or an explicit layout.

- ``hl.auto``: synthesized. ``hl.auto(swizzle="128B")`` (one of ``"none"``, ``"32B"``,
  ``"64B"``, ``"128B"`` or a ``Swizzle``) and ``hl.auto(stride=(None, 1))`` (a known
  stride per mode, ``None`` = free) become ``LayoutVar.hints``.
- Shared tiles: a ``Layout`` or swizzled ``ComposedLayout`` mapping tile coordinates to
  element offsets; its size must equal the tile's element count (per mode when the ranks
  agree), and it must map distinct coordinates to distinct offsets.
- Register tiles: a TV layout ``(thread, value) -> m + M*n`` (a rank-2 ``Layout``, or the
  ``(tiler, layout_tv)`` pair ``make_layout_tv`` returns); its image must be exactly the
  tile (every element held by some thread) and its thread mode must fit in the block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexlayout.ir.tile import SourceLoc
from hexlayout.ir.types import LayoutLike, LayoutVar, Scope
from hexlayout.layout import ComposedLayout, Layout, Swizzle

from .context import TraceContext
from .tensor import shape_str

__all__ = ["Auto", "auto", "resolve_layout"]

_SWIZZLES = ("none", "32B", "64B", "128B")


class Auto:
    """``hl.auto``: a layout left to synthesis, optionally with hints.

    Where a layout is expected (``hl.shared``, ``hl.register``, ``hl.full``,
    ``hl.rearrange``, ...), ``hl.auto`` makes it a layout variable that synthesis solves
    from the tile's uses. Calling it adds hints that narrow the choice (they become
    ``LayoutVar.hints``); calls accumulate (``hl.auto(swizzle="128B")(stride=(None, 1))``).

    Args:
        **hints (Any): by keyword:
            ``swizzle`` (str | Swizzle), shared tiles only: ``"none"``, ``"32B"``,
            ``"64B"``, ``"128B"`` (Hopper's byte swizzles) or an explicit ``Swizzle``;
            ``stride`` (tuple[int | None, ...]): a known element stride per mode, ``None``
            = free (e.g. ``(None, 1)``: the last mode is contiguous).

    Returns:
        Auto: the hinted ``hl.auto``.

    Raises:
        KernelError: when the tile is created: an unknown hint; a swizzle hint on a
            non-shared tile or of another value; a stride hint of the wrong length.

    Example:
        >>> hl.auto, hl.auto(swizzle="128B")
        (auto, auto(swizzle='128B'))
        >>> @hl.kernel(threads=128)
        ... def k():
        ...     sa = hl.shared(hl.f16, (64, 64), hl.auto(swizzle="64B", stride=(None, 1)))
        ...     print(sa.layout.hints)
        >>> _ = k.trace()
        {'swizzle': '64B', 'stride': (None, 1)}
    """

    def __init__(self, **hints: Any) -> None:
        self.hints = dict(hints)

    def __call__(self, **hints: Any) -> Auto:
        """``hl.auto(**hints)``: a new ``Auto`` with ``hints`` added to this one's.

        Args:
            **hints (Any): ``swizzle=`` and / or ``stride=`` (see the class).

        Returns:
            Auto: the combined hints (later values win).

        Example:
            >>> hl.auto(swizzle="32B")(stride=(None, 1))
            auto(swizzle='32B', stride=(None, 1))
        """
        return Auto(**{**self.hints, **hints})

    def __repr__(self) -> str:
        if not self.hints:
            return "auto"
        return "auto(" + ", ".join(f"{k}={v!r}" for k, v in self.hints.items()) + ")"


auto = Auto()


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _mode_size(layout: Layout | ComposedLayout, i: int) -> int:
    return layout[i].size()


def resolve_layout(ctx: TraceContext, op: str, loc: SourceLoc | None, name: str, scope: Scope,
                   shape: tuple[int, ...], layout: Any) -> LayoutLike:
    """Check ``layout`` for a ``scope`` tile of ``shape`` and return the IR layout."""
    what = f"tensor {name} {shape_str(shape)}"
    if layout is None or isinstance(layout, Auto):
        hints = dict(layout.hints) if isinstance(layout, Auto) else {}
        _check_hints(ctx, op, loc, what, scope, shape, hints)
        return LayoutVar(hints=hints)
    if isinstance(layout, LayoutVar):
        return layout
    n = _size(shape)
    if scope == Scope.REGISTER:
        tiler = None
        if isinstance(layout, tuple) and len(layout) == 2 and isinstance(layout[1], Layout):
            tiler, layout = layout
        if not isinstance(layout, Layout):
            raise ctx.error(op, loc, f"{what}: a register tile's layout must be a TV Layout "
                            f"(thread, value) -> index, got {type(layout).__name__} {layout}")
        if tiler is not None:
            tl = tuple(tiler) if isinstance(tiler, tuple) else (tiler,)
            if tl != shape:
                raise ctx.error(op, loc, f"{what}: the TV layout's tile is {shape_str(tl)}, not the "
                                "tensor's shape")
        if layout.rank != 2:
            raise ctx.error(op, loc, f"{what}: TV layout {layout} must have rank 2 (thread, value)")
        if layout.cosize() != n:
            raise ctx.error(op, loc, f"{what}: TV layout {layout} covers a tile of {layout.cosize()} "
                            "elements, "
                            f"the tensor has {n}")
        if len(np.unique(layout.indices())) != n:
            raise ctx.error(op, loc, f"{what}: TV layout {layout} does not hold every element of the tile")
        nthr = layout[0].size()
        if nthr > ctx.threads:
            raise ctx.error(op, loc, f"{what}: TV layout {layout} uses {nthr} threads, the block has "
                            f"{ctx.threads}")
        return layout
    if not isinstance(layout, (Layout, ComposedLayout)):
        raise ctx.error(op, loc, f"{what}: layout must be hl.auto, a Layout or a swizzled ComposedLayout, "
                        f"got {type(layout).__name__} {layout!r}")
    if layout.size() != n:
        raise ctx.error(op, loc, f"{what}: layout {layout} has size {layout.size()}, the tensor has {n} "
                        "elements")
    if layout.rank == len(shape) and len(shape) > 1:
        for i, s in enumerate(shape):
            if _mode_size(layout, i) != s:
                raise ctx.error(op, loc, f"{what}: mode {i} of layout {layout} has size "
                                f"{_mode_size(layout, i)}, the tensor's extent is {s}")
    distinct = len(np.unique(layout.indices()))
    if distinct != n:
        raise ctx.error(op, loc, f"{what}: layout {layout} maps {n} elements to only {distinct} distinct "
                        "offsets (not injective)")
    return layout


def _check_hints(ctx: TraceContext, op: str, loc: SourceLoc | None, what: str, scope: Scope,
                 shape: tuple[int, ...], hints: dict[str, Any]) -> None:
    for key, val in hints.items():
        if key == "swizzle":
            if scope != Scope.SHARED:
                raise ctx.error(op, loc, f"{what}: the swizzle hint applies to shared tiles only")
            if not (isinstance(val, Swizzle) or val in _SWIZZLES):
                raise ctx.error(op, loc, f"{what}: swizzle hint {val!r} is not one of {', '.join(_SWIZZLES)} "
                                "or a Swizzle")
        elif key == "stride":
            if not isinstance(val, tuple) or len(val) != len(shape) or \
                    not all(v is None or (isinstance(v, int) and v >= 0) for v in val):
                raise ctx.error(op, loc, f"{what}: stride hint {val!r} must give one int or None per mode "
                                f"({len(shape)} modes)")
        else:
            raise ctx.error(op, loc, f"{what}: unknown layout hint {key!r} (known: swizzle, stride)")
