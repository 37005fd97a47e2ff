"""``InstructionAtom``: what every instruction atom (``MmaAtom``, ``CopyAtom``) has.

An atom is executed cooperatively by the threads of ``thr_id`` (a warp, a warp group, one
thread); it was introduced by architecture ``arch`` and is offered by every later target
(``archs``). Its TV layouts map ``(thread, value)`` to an index of a reference tile, so a
layout of ``size`` entries gives each thread ``size / num_threads`` values.
"""

from __future__ import annotations

from typing import ClassVar

from ..layout import Layout
from .targets import archs_offering

__all__ = ["InstructionAtom"]


class InstructionAtom:
    """Properties shared by the atom dataclasses, from their ``thr_id`` and ``arch`` fields;
    ``FAMILY`` names the kind of atom (``"mma"``, ``"copy"``)."""

    FAMILY: ClassVar[str] = ""
    thr_id: Layout
    arch: str

    @property
    def kind_family(self) -> str:
        return self.FAMILY

    @property
    def num_threads(self) -> int:
        return self.thr_id.size()

    @property
    def archs(self) -> tuple[str, ...]:
        """The supported targets that offer this instruction."""
        return archs_offering(self.arch)

    def per_thread(self, layout: Layout) -> int:
        """The values one thread holds of a TV layout of this atom: ``size(layout) / num_threads``."""
        return layout.size() // self.num_threads
