"""What synthesis chose for a tile program: an immutable ``Assignment``.

An assignment gives

- ``layouts``: a layout per tile value, by ``Value.id`` (register tiles: their TV layout;
  shared root buffers: their layout in elements, swizzle included);
- ``mma``: the ``TiledMma`` (atom, warp arrangement, k order) of each ``mma`` op, by ``op.uid``;
- ``copies``: the instruction of each copy op, by ``op.uid``, as ``(rule family, name)``
  (``hexlayout.ir.lower.copy_rules``).

Both keys are stable identities that copies of the program keep: ``Value.id`` and ``Op.uid``
are fields given at trace time, carried by ``copy.deepcopy`` (``annotate``) and by the
persisted build's plain-data round trip, so an assignment resolves the values and ops of the
program it was made for, of its annotated copy and of a build read back from the cache.

The lowering takes ``(tile kernel, assignment, arch)`` and decides nothing that the
assignment gives: where it gives a value's layout, an mma's TiledMma or a copy's instruction,
the lowering uses exactly that; where it gives none (an explicit program), the program's own
``layout=`` / ``atom=`` / ``warps=`` / ``instruction=`` stand. Assignments never change:
``with_layouts`` and friends return new ones, so the solver can try a candidate without
touching the program or the assignment it started from.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .tiled_mma import TiledMma

__all__ = ["Assignment", "EMPTY"]


@dataclass(frozen=True)
class Assignment:
    """Layouts per value id, TiledMma and copy instruction per op uid (see the module docstring).

    The mappings are private copies made at construction and never changed afterwards (read
    them, never write them); every ``with_*`` method returns a new assignment."""

    layouts: Mapping[int, Any] = field(default_factory=dict)
    mma: Mapping[int, TiledMma] = field(default_factory=dict)
    copies: Mapping[int, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("layouts", "mma", "copies"):
            object.__setattr__(self, name, dict(getattr(self, name)))

    def layout_of(self, v: Any) -> Any:
        """The layout of value ``v``: the assigned one, else the program's own."""
        return self.layouts.get(v.id, v.type.layout)

    def with_layouts(self, layouts: Mapping[int, Any]) -> Assignment:
        """This assignment with ``layouts`` (value id -> layout) added or replaced."""
        return Assignment({**self.layouts, **layouts}, self.mma, self.copies)

    def with_mma(self, mma: Mapping[int, TiledMma]) -> Assignment:
        """This assignment with ``mma`` (op uid -> TiledMma) added or replaced."""
        return Assignment(self.layouts, {**self.mma, **mma}, self.copies)

    def with_copies(self, copies: Mapping[int, tuple[str, str]]) -> Assignment:
        """This assignment with ``copies`` (op uid -> (rule family, name)) added or replaced."""
        return Assignment(self.layouts, self.mma, {**self.copies, **copies})

    def annotate(self, tk: Any) -> tuple[Any, dict[int, Any]]:
        """A copy of tile kernel ``tk`` whose types and mma ops carry this assignment (what a
        printer or a reader of ``Synthesis.kernel`` sees), and the map ``id(op of tk) -> op of
        the copy``. ``tk`` itself is not changed."""
        from .walk import walk

        out = copy.deepcopy(tk)
        ops = dict(zip((id(op) for op in walk(tk)), walk(out)))
        for op in ops.values():
            for v in op.values():
                lay = self.layouts.get(v.id)
                if lay is not None and v.type.layout is not lay:
                    v.type = v.type.with_layout(lay)
        from hexlayout.arch import atom_spec

        for op in ops.values():
            tm = self.mma.get(op.uid)
            if tm is not None:
                op.atom, op.warps, op.k_inner = atom_spec(tm.atom), tm.warps, tm.k_inner
        return out, ops


EMPTY = Assignment()
