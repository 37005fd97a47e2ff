"""``CopyAtom``: one data-movement instruction as CuTe's ``Copy_Traits`` see it.

``src_layout`` and ``dst_layout`` map ``(thread, value) -> bit`` of a reference tile, in
BITS, as CuTe's traits do; ``ref_layout`` is the one the reference tile is defined by
(``dst`` for ldmatrix, ``src`` for stmatrix and the one-thread copies). A thread's
source value ``v`` lands at the destination position holding the same bit.

``access_bits`` is the width of one memory access a thread issues (a 128-bit row address
for ldmatrix, the vector width for ld/st and cp.async); ``bits_per_thread`` is the number
of bits one thread moves per instruction (its register fragment for ldmatrix/stmatrix).
``alignment`` is the byte alignment each per-thread address must have.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..layout import Layout
from .atom import InstructionAtom

__all__ = ["CopyAtom"]


@dataclass(frozen=True)
class CopyAtom(InstructionAtom):
    """A copy instruction: TV layouts in bits, widths, PTX, memory spaces, constraints."""

    name: str
    kind: str  # "universal", "cp.async", "ldmatrix", "stmatrix", "tma"
    thr_id: Layout
    src_layout: Layout
    dst_layout: Layout
    ref_layout: Layout
    access_bits: int
    src_space: str  # "gmem", "smem", "rmem"
    dst_space: str
    arch: str
    ptx: str
    ptx_operands: str
    alignment: int
    constraints: tuple[str, ...] = ()
    options: tuple[tuple[str, str], ...] = field(default=())

    FAMILY = "copy"

    @property
    def bits_per_thread(self) -> int:
        """Bits one thread moves per instruction: ``size(ref_layout) / num_threads``."""
        return self.per_thread(self.ref_layout)

    @property
    def src_bits_per_thread(self) -> int:
        return self.per_thread(self.src_layout)

    @property
    def dst_bits_per_thread(self) -> int:
        return self.per_thread(self.dst_layout)

    def __str__(self) -> str:
        return (f"{self.name}: {self.ptx} {self.src_space}->{self.dst_space} threads={self.num_threads} "
                f"access={self.access_bits}b\n  src {self.src_layout}\n  dst {self.dst_layout}")
