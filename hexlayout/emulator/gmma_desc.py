"""The wgmma shared-memory matrix descriptor, encoded and decoded as the hardware does.

64-bit layout (PTX ISA "Matrix Descriptor Format"): bits [0,14) start address >> 4,
[16,30) leading dimension byte offset (LBO) >> 4, [32,46) stride dimension byte offset
(SBO) >> 4, [49,52) base offset, [62,64) layout type (0 interleave / no swizzle, 1 128-byte,
2 64-byte, 3 32-byte swizzle).

Canonical layouts (CuTe ``make_gmma_desc``; units: T = 16 bytes / element size elements
per 16-byte chunk, W = 1, 2, 4, 8 chunks per swizzle row for none / 32 / 64 / 128 B), giving
the byte offset of element (mn, k) of an MN x K operand tile from the start address:

* K-major, no swizzle: ``((8,m),(T,2k)):((1T,SBO),(1,LBO))`` - 8x16-byte core matrices; rows
  16 B apart, 8-row groups SBO apart, 16-byte K chunks LBO apart.
* K-major, swizzled: ``((8,m),(T,2k)):((W*T,SBO),(1,T))`` - rows W*16 B apart, K chunks
  adjacent, 8-row groups SBO apart.
* MN-major, no swizzle: ``((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))`` - 16-byte MN chunks SBO apart,
  K rows 16 B apart, 8-row K groups LBO apart.
* MN-major, swizzled: ``((T,W,m),(8,k)):((1,T,LBO),(W*T,SBO))`` - W chunks contiguous along MN,
  further MN groups LBO apart, K rows W*16 B apart, 8-row K groups SBO apart.

The swizzle ``Swizzle<B,4,3>`` (B = log2 W) is then applied to the *absolute* shared byte
address, so a swizzled tile must sit at an address aligned to its period (256 / 512 /
1024 B); advancing the start address by the K offset of a sub-tile is how kernels iterate.
The base-offset field is decoded but must be 0 here (tiles aligned to the period).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GmmaDescriptor", "encode", "decode", "operand_addresses", "SWIZZLE_ROW_CHUNKS"]

#: layout type -> 16-byte chunks per swizzle row (W); 0 = no swizzle (interleave).
SWIZZLE_ROW_CHUNKS = {0: 1, 1: 8, 2: 4, 3: 2}
_SWIZZLE_BITS = {0: 0, 1: 3, 2: 2, 3: 1}
_NAMES = {0: "none", 1: "128B", 2: "64B", 3: "32B"}


@dataclass(frozen=True)
class GmmaDescriptor:
    start: int  # bytes
    lbo: int  # bytes
    sbo: int  # bytes
    base_offset: int
    layout_type: int

    @property
    def swizzle_name(self) -> str:
        return _NAMES[self.layout_type]


def encode(start: int, lbo: int, sbo: int, layout_type: int, base_offset: int = 0) -> int:
    """The 64-bit descriptor (the low 4 bits of addresses and offsets are dropped, as in hardware)."""
    return (
        ((start >> 4) & 0x3FFF)
        | (((lbo >> 4) & 0x3FFF) << 16)
        | (((sbo >> 4) & 0x3FFF) << 32)
        | ((base_offset & 0x7) << 49)
        | ((layout_type & 0x3) << 62)
    )


def decode(desc: int) -> GmmaDescriptor:
    return GmmaDescriptor(
        start=(desc & 0x3FFF) << 4,
        lbo=((desc >> 16) & 0x3FFF) << 4,
        sbo=((desc >> 32) & 0x3FFF) << 4,
        base_offset=(desc >> 49) & 0x7,
        layout_type=(desc >> 62) & 0x3,
    )


def operand_addresses(d: GmmaDescriptor, mn: int, k: int, esize: int, major: str) -> np.ndarray:
    """Absolute shared byte addresses ``[mn, k]`` of the elements of an MN x K operand tile."""
    t = 16 // esize
    w = SWIZZLE_ROW_CHUNKS[d.layout_type]
    r = np.arange(mn, dtype=np.int64)[:, None]
    c = np.arange(k, dtype=np.int64)[None, :]
    if major == "K":
        kc, ki = c // t, c % t
        if d.layout_type == 0:
            off = (r % 8) * 16 + (r // 8) * d.sbo + kc * d.lbo + ki * esize
        else:
            off = (r % 8) * (16 * w) + (r // 8) * d.sbo + kc * 16 + ki * esize
    else:
        mc, mi = r // t, r % t
        if d.layout_type == 0:
            off = mc * d.sbo + (c % 8) * 16 + (c // 8) * d.lbo + mi * esize
        else:
            off = (mc % w) * 16 + (mc // w) * d.lbo + (c % 8) * (16 * w) + (c // 8) * d.sbo + mi * esize
    addr = d.start + off
    b = _SWIZZLE_BITS[d.layout_type]
    if b:
        addr = addr ^ ((addr >> 3) & (((1 << b) - 1) << 4))
    return addr
