"""wgmma shared-memory operands: canonical layout atoms and 64-bit matrix descriptors.

A wgmma operand in shared memory is described by a descriptor (PTX ISA "Matrix
Descriptor Format"): bits ``[0,14)`` start address >> 4, ``[16,30)`` leading byte offset
(LBO) >> 4, ``[32,46)`` stride byte offset (SBO) >> 4, ``[49,52)`` base offset, ``[62,64)``
layout type (0 none/interleave, 1 128-byte, 2 64-byte, 3 32-byte swizzle).

The descriptor selects a *canonical layout*. With ``eb`` bytes per element, ``T = 16/eb``
elements per 16-byte chunk and ``W`` = 1, 2, 4, 8 chunks per swizzle row (none, 32, 64,
128 B), the byte offset of operand element ``(mn, k)`` before swizzling is (CuTe's
``make_gmma_desc`` conventions):

* K-major:  ``(mn%8)*16W + (mn//8)*SBO + (k%T)*eb + (k//T)*(LBO if W == 1 else 16)``
* MN-major, none: ``(mn%T)*eb + (mn//T)*SBO + (k%8)*16 + (k//8)*LBO``
* MN-major, swizzled: ``(mn%T)*eb + ((mn//T)%W)*16 + (mn//(T*W))*LBO + (k%8)*16W + (k//8)*SBO``

and the hardware reads byte ``Swizzle<B,4,3>(start + offset)`` (B = log2 W), the swizzle
acting on absolute shared-memory addresses, so a swizzled tile must be aligned to its
period (``2^(B+7)`` bytes: 1024 for 128-byte mode) and the start address may move inside it
(advancing K by one wgmma adds 32 bytes to the start of a K-major swizzled tile).

``gmma_smem_atom`` gives CuTe's ``Layout_{K|MN}_{INTER|SW32|SW64|SW128}_Atom<T>`` in element
units: ``Swizzle<B, 4 - log2(eb), 3> o 0 o (8, W*T) : (W*T, 1)`` (K-major) or
``(W*T, 8) : (1, W*T)`` (MN-major); e.g. ``Sw<3,3,3> o 0 o (8,64):(64,1)`` for 16-bit K-major
128-byte swizzle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import ComposedLayout, Layout, Swizzle

__all__ = ["GmmaDescriptor", "gmma_smem_atom", "make_gmma_desc", "gmma_desc_addresses", "LAYOUT_TYPE",
           "SWIZZLE_CHUNKS"]

#: Descriptor layout-type field per swizzle mode in bytes.
LAYOUT_TYPE: dict[int, int] = {0: 0, 128: 1, 64: 2, 32: 3}
#: 16-byte chunks per swizzle row (``W``) per swizzle mode in bytes.
SWIZZLE_CHUNKS: dict[int, int] = {0: 1, 32: 2, 64: 4, 128: 8}
_B = {0: 0, 32: 1, 64: 2, 128: 3}


def _elem_bytes(elem_bits: int) -> int:
    if elem_bits not in (8, 16, 32):
        raise ValueError(f"wgmma operand: {elem_bits}-bit elements are not 8, 16 or 32 bits")
    return elem_bits // 8


def _check(major: str, swizzle: int) -> None:
    if major not in ("K", "MN"):
        raise ValueError(f"wgmma operand: major {major!r} is not 'K' or 'MN'")
    if swizzle not in SWIZZLE_CHUNKS:
        raise ValueError(f"wgmma operand: swizzle {swizzle} B is not one of 0, 32, 64, 128")


def byte_swizzle(swizzle: int) -> Swizzle:
    """``Swizzle<B,4,3>`` on byte addresses for a mode of ``swizzle`` bytes."""
    return Swizzle(_B[swizzle], 4, 3)


def gmma_smem_atom(elem_bits: int, major: str, swizzle: int) -> ComposedLayout:
    """CuTe's canonical wgmma smem layout atom, in elements: ``(mn, k) -> offset``."""
    _check(major, swizzle)
    eb = _elem_bytes(elem_bits)
    w_elems = SWIZZLE_CHUNKS[swizzle] * 16 // eb
    sw = Swizzle(_B[swizzle], 4 - (eb.bit_length() - 1), 3)
    inner = Layout((8, w_elems), (w_elems, 1)) if major == "K" else Layout((w_elems, 8), (1, w_elems))
    return ComposedLayout(sw, 0, inner)


@dataclass(frozen=True)
class GmmaDescriptor:
    """The fields of a wgmma matrix descriptor (byte values; encoded >> 4)."""

    start_address: int
    leading_byte_offset: int
    stride_byte_offset: int
    swizzle: int = 0
    base_offset: int = 0

    def encode(self) -> int:
        """The 64-bit descriptor value."""
        for what, v in (("start address", self.start_address), ("LBO", self.leading_byte_offset),
                        ("SBO", self.stride_byte_offset)):
            if v % 16 or not 0 <= v >> 4 < 1 << 14:
                raise ValueError(f"wgmma descriptor: {what} {v} is not a multiple of 16 below 2^18")
        _check("K", self.swizzle)
        return ((self.start_address >> 4) | (self.leading_byte_offset >> 4) << 16
                | (self.stride_byte_offset >> 4) << 32 | (self.base_offset & 7) << 49
                | LAYOUT_TYPE[self.swizzle] << 62)

    @staticmethod
    def decode(value: int) -> GmmaDescriptor:
        mask = (1 << 14) - 1
        lt = (value >> 62) & 3
        swz = {v: k for k, v in LAYOUT_TYPE.items()}[lt]
        return GmmaDescriptor(start_address=(value & mask) << 4,
                              leading_byte_offset=((value >> 16) & mask) << 4,
                              stride_byte_offset=((value >> 32) & mask) << 4, swizzle=swz,
                              base_offset=(value >> 49) & 7)


def gmma_desc_addresses(desc: GmmaDescriptor, major: str, elem_bits: int, mn: int, k: int) -> np.ndarray:
    """Byte addresses ``[mn, k]`` the hardware reads for an ``mn x k`` operand through ``desc``."""
    _check(major, desc.swizzle)
    eb = _elem_bytes(elem_bits)
    t = 16 // eb
    w = SWIZZLE_CHUNKS[desc.swizzle]
    lbo, sbo = desc.leading_byte_offset, desc.stride_byte_offset
    m_i = np.arange(mn, dtype=np.int64)[:, None]
    k_i = np.arange(k, dtype=np.int64)[None, :]
    if major == "K":
        off = (m_i % 8) * 16 * w + (m_i // 8) * sbo + (k_i % t) * eb + (k_i // t) * (lbo if w == 1 else 16)
    elif w == 1:
        off = (m_i % t) * eb + (m_i // t) * sbo + (k_i % 8) * 16 + (k_i // 8) * lbo
    else:
        off = ((m_i % t) * eb + ((m_i // t) % w) * 16 + (m_i // (t * w)) * lbo
               + (k_i % 8) * 16 * w + (k_i // 8) * sbo)
    return np.asarray(byte_swizzle(desc.swizzle)(desc.start_address + off), dtype=np.int64)


def make_gmma_desc(layout: ComposedLayout | Layout, major: str, elem_bits: int, mn: int, k: int,
                   base_address: int = 0) -> GmmaDescriptor:
    """The descriptor of the ``mn x k`` operand tile whose element offsets are ``layout(mn, k)``.

    ``layout`` is in elements (``Swizzle<B, 4-log2(eb), 3> o off o inner`` or a plain Layout
    for no swizzle) and lives at byte ``base_address`` (aligned to the swizzle period).
    Raises ``ValueError`` when the tile is not a canonical wgmma layout.
    """
    eb = _elem_bytes(elem_bits)
    t = 16 // eb
    if isinstance(layout, ComposedLayout):
        sw, off, inner = layout.layout_a, layout.offset, layout.layout_b
        if not isinstance(sw, Swizzle) or (sw.bits and (sw.base, sw.shift) != (4 - (eb.bit_length() - 1), 3)):
            raise ValueError(f"{layout}: swizzle {sw} is not a wgmma byte swizzle Swizzle<B,4,3> in elements")
        swizzle = {0: 0, 1: 32, 2: 64, 3: 128}[sw.bits]
    else:
        off, inner, swizzle = 0, layout, 0
    w = SWIZZLE_CHUNKS[swizzle]
    if base_address % (128 << _B[swizzle]) and swizzle:
        raise ValueError(f"wgmma operand at {base_address:#x} is not aligned to the {swizzle}-byte "
                         "swizzle period")

    def at(i: int, j: int) -> int:
        return int(inner((i, j))) * eb if i < mn and j < k else 0

    if major == "K":
        sbo = at(8, 0)
        lbo = at(0, t) if w == 1 else 16
    elif w == 1:
        sbo, lbo = at(t, 0), at(0, 8)
    else:
        lbo, sbo = at(t * w, 0), at(0, 8)
    desc = GmmaDescriptor(start_address=base_address + off * eb, leading_byte_offset=lbo,
                          stride_byte_offset=sbo,
                          swizzle=swizzle)
    want = base_address + np.asarray(layout.indices(), dtype=np.int64).reshape(k, mn).T * eb
    got = gmma_desc_addresses(desc, major, elem_bits, mn, k)
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)[0]
        raise ValueError(f"{layout}: not a canonical {major}-major wgmma layout for a {mn}x{k} tile of "
                         f"{elem_bits}-bit elements (element {tuple(int(x) for x in bad)} is at byte "
                         f"{int(want[tuple(bad)])}, the descriptor would read {int(got[tuple(bad)])})")
    return desc
