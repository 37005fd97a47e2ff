"""``tcgen05.cp`` (sm_100a): shared memory -> tensor memory, issued by one thread, asynchronous.

One thread copies a block of shared memory, described by a shared-memory descriptor (the
sm_100a encoding of ``tcgen05.py``; rows of 16 bytes in the canonical K-major layout: row ``r``
at ``(r // 8) * SBO + (r % 8) * 16`` bytes before the swizzle, the second 16 bytes of a 256-bit
row ``LBO`` further), to TMEM. It is ordered before the same thread's later ``tcgen05.mma``
and completes through ``tcgen05.commit`` (the shared bytes it reads must not be overwritten
before). Shapes (PTX ISA "tcgen05.cp": ``.shape`` and ``.multicast``; CuTe ``SM100_UTCCP_*``),
``rows x bits`` per row, and the TMEM lanes row ``r`` lands in (relative to the address's lane):

* ``128x256b``, ``128x128b``: lane ``r``;
* ``4x256b``: lane ``32 r`` (one row per lane quarter);
* ``64x128b.warpx2::02_13``: lanes ``r`` and ``r + 64``;
* ``64x128b.warpx2::01_23``: lanes ``64 (r // 32) + r % 32`` and ``+ 32``;
* ``32x128b.warpx4``: lanes ``r + 32 q`` for the four quarters ``q`` (CuTe
  ``SM100_UTCCP_4x32dp128bit``: block scale factors, which every subpartition reads).

The 32-bit word ``w`` of a row goes to column ``w`` after the address's column.
``tmem_cp_layout(shape)`` is that map as a layout ``(row, word, replica) -> lane << 16 | column``
(``TMEM_DP`` = ``1 << 16``), so its image lists every cell the copy writes.

Example:
    >>> str(tmem_cp_layout("32x128b.warpx4"))
    '(32,4,4):(65536,1,2097152)'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import Layout
from .tcgen05 import UmmaDescriptor, umma_desc_addresses
from .tmem import TMEM_DP

__all__ = ["CpShape", "CP_SHAPES", "tmem_cp_layout", "tcgen05_cp_ptx", "cp_smem_addresses"]


@dataclass(frozen=True)
class CpShape:
    """A ``tcgen05.cp`` shape: ``rows`` of ``bits`` each, and its TMEM placement (``layout``)."""

    name: str
    rows: int
    bits: int
    layout: Layout  # (row, word, replica) -> lane << 16 | column

    @property
    def words(self) -> int:
        """32-bit TMEM columns per row."""
        return self.bits // 32

    @property
    def bytes(self) -> int:
        """Shared-memory bytes one copy reads."""
        return self.rows * self.bits // 8


def _shape(name: str, rows: int, bits: int, row_mode: tuple, replicas: tuple[int, int]) -> CpShape:
    shape, stride = row_mode
    words = bits // 32
    return CpShape(name, rows, bits, Layout((shape, words, replicas[0]), (stride, 1, replicas[1] * TMEM_DP)))


CP_SHAPES: dict[str, CpShape] = {s.name: s for s in (
    _shape("128x256b", 128, 256, (128, TMEM_DP), (1, 0)),
    _shape("128x128b", 128, 128, (128, TMEM_DP), (1, 0)),
    _shape("4x256b", 4, 256, (4, 32 * TMEM_DP), (1, 0)),
    _shape("64x128b.warpx2::02_13", 64, 128, (64, TMEM_DP), (2, 64)),
    _shape("64x128b.warpx2::01_23", 64, 128, ((32, 2), (TMEM_DP, 64 * TMEM_DP)), (2, 32)),
    _shape("32x128b.warpx4", 32, 128, (32, TMEM_DP), (4, 32)),
)}


def _get(shape: str) -> CpShape:
    if shape not in CP_SHAPES:
        raise ValueError(f"tcgen05.cp: shape {shape!r} is not one of {', '.join(CP_SHAPES)}")
    return CP_SHAPES[shape]


def tmem_cp_layout(shape: str) -> Layout:
    """``(row, word, replica) -> lane << 16 | column`` of ``tcgen05.cp.{shape}`` (module docstring)."""
    return _get(shape).layout


def tcgen05_cp_ptx(shape: str, cta_group: int = 1) -> str:
    """The PTX of ``tcgen05.cp`` (without operands ``[taddr], s_desc``)."""
    _get(shape)
    if cta_group not in (1, 2):
        raise ValueError(f"tcgen05.cp: cta_group {cta_group} is not 1 or 2")
    return f"tcgen05.cp.cta_group::{cta_group}.{shape}"


def cp_smem_addresses(desc: UmmaDescriptor, shape: str) -> np.ndarray:
    """Byte addresses ``[rows, bits / 8]`` that ``tcgen05.cp.{shape}`` reads through ``desc``: the
    canonical K-major layout of ``rows x (bits / 8)`` bytes (``tcgen05.umma_desc_addresses`` with
    8-bit elements)."""
    s = _get(shape)
    return umma_desc_addresses(desc, "K", 8, s.rows, s.bits // 8)
