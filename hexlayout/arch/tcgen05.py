"""Blackwell (sm_100a) tcgen05.mma descriptors: the 32-bit instruction descriptor and the
64-bit shared-memory descriptor.

**Instruction descriptor** (PTX ISA "Instruction descriptor format for .kind::f16,
.kind::tf32, .kind::f8f6f4"; CuTe ``UMMA::InstrDescriptor``), bit ranges ``[lo, hi)``:
``[0,2)`` sparsity selector, ``[2,3)`` sparsity, ``[3,4)`` saturate, ``[4,6)`` D format
(0 F16, 1 F32), ``[7,10)`` A format, ``[10,13)`` B format (kind::f16: 0 F16, 1 BF16;
kind::f8f6f4: 0 E4M3, 1 E5M2), ``[13,14)`` negate A, ``[14,15)`` negate B, ``[15,16)``
A major (0 K, 1 MN), ``[16,17)`` B major, ``[17,23)`` N >> 3, ``[24,29)`` M >> 4,
``[30,32)`` max shift (``.ws`` only). So ``M=128, N=256``, bf16 -> f32, both K-major is
``1<<4 | 1<<7 | 1<<10 | 32<<17 | 8<<24``.

**Block-scaled instruction descriptor** (PTX ISA "Instruction descriptor format for
.kind::mxf8f6f4 / .kind::mxf4 / .kind::mxf4nvf4"; CuTe ``UMMA::InstrDescriptorBlockScaled``):
``[0,2)`` sparsity selector, ``[2,3)`` sparsity, ``[4,6)`` B scale-factor ID, ``[7,10)`` A format,
``[10,13)`` B format (kind::mxf8f6f4: 0 E4M3, 1 E5M2 (3 E2M3, 4 E3M2, 5 E2M1 not modelled);
kind::mxf4 / mxf4nvf4: 1 E2M1), ``[13,14)`` / ``[14,15)`` negate A / B, ``[15,16)`` /
``[16,17)`` A / B major (MN-major only for 8-bit formats), ``[17,23)`` N >> 3, ``[23,24)`` scale
type (0 UE4M3, 1 UE8M0), ``[24,29)`` M >> 4, ``[29,31)`` A scale-factor ID, ``[31,32)`` K size
(0: K = 32 for mxf8f6f4, 64 for mxf4 / mxf4nvf4; 1: K = 96, not modelled). There is no D format
field (D is f32). A scale-factor ID is the byte, 0..3, of the 32-bit TMEM column where the
instruction's factors start (CuTe takes it from bits 30..31 of the factors' TMEM address); an
MMA reading ``K / VS`` factors per row (2X: 2, 4X: 4) reads bytes ``id .. id + K/VS - 1``.

**Shared-memory descriptor** (PTX ISA "Shared memory descriptor", CuTe
``UMMA::SmemDescriptor``): ``[0,14)`` start address >> 4, ``[16,30)`` leading byte
offset >> 4, ``[32,46)`` stride byte offset >> 4, ``[46,48)`` version = 1 (the fixed
``0b001`` of bits 46..48), ``[49,52)`` base offset, ``[52,53)`` LBO mode, ``[61,64)``
layout type: 0 no swizzle, 1 128-byte swizzle with 32-byte atomic base, 2 128-byte,
4 64-byte, 6 32-byte. The canonical K-/MN-major layouts are those of wgmma (``gmma.py``),
so the bytes an sm_100a descriptor reads are ``gmma_desc_addresses`` of the equivalent
wgmma descriptor; only the field packing differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import ComposedLayout, Layout
from .block_scale import SCALE_VECS, factors_per_mma
from .dtypes import BF16, E2M1, E4M3, E5M2, F16, F32, DType
from .gmma import GmmaDescriptor, gmma_desc_addresses, make_gmma_desc
from .sm100 import MMA_KINDS, kind_of

__all__ = ["InstrDescriptor", "InstrDescriptorBlockScaled",
           "UmmaDescriptor", "make_umma_desc", "umma_desc_addresses", "UMMA_LAYOUT_TYPE"]

#: Layout-type field (bits 61..63) per swizzle mode; "128B_BASE32B" is 128-byte swizzle whose
#: 16-byte chunks are permuted within 32-byte atoms.
UMMA_LAYOUT_TYPE: dict[int | str, int] = {0: 0, "128B_BASE32B": 1, 128: 2, 64: 4, 32: 6}

_D_FORMAT = {"f16": 0, "f32": 1}
_DTYPES = {d.name: d for d in (F16, BF16, F32, E4M3, E5M2, E2M1)}


def _bits(value: int, lo: int, hi: int) -> int:
    return (value >> lo) & ((1 << (hi - lo)) - 1)


@dataclass(frozen=True)
class InstrDescriptor:
    """The instruction descriptor of a dense ``tcgen05.mma`` (``m`` is the whole MMA's M:
    128 or 256 for ``cta_group::2``)."""

    a_dtype: DType
    b_dtype: DType
    d_dtype: DType
    m: int
    n: int
    a_major: str = "K"
    b_major: str = "K"
    negate_a: bool = False
    negate_b: bool = False
    saturate: bool = False

    @property
    def kind(self) -> str:
        return kind_of(self.a_dtype)

    def encode(self) -> int:
        """The 32-bit value passed as ``idesc``.

        Example:
            >>> hex(InstrDescriptor(BF16, BF16, F32, 128, 256).encode())
            '0x8400490'
        """
        kind = self.kind
        if kind_of(self.b_dtype) != kind:
            raise ValueError(f"tcgen05.mma: A {self.a_dtype.name} and B {self.b_dtype.name} are not one kind")
        if self.d_dtype.name not in _D_FORMAT:
            raise ValueError(f"tcgen05.mma: accumulator {self.d_dtype.name} is not f16 or f32")
        if self.m % 16 or not 0 < self.m >> 4 < 32 or self.n % 8 or not 0 < self.n >> 3 < 64:
            raise ValueError(f"tcgen05.mma: M={self.m} / N={self.n} do not fit the descriptor")
        fmt = MMA_KINDS[kind]
        return (int(self.saturate) << 3 | _D_FORMAT[self.d_dtype.name] << 4 | fmt[self.a_dtype.name] << 7
                | fmt[self.b_dtype.name] << 10 | int(self.negate_a) << 13 | int(self.negate_b) << 14
                | int(self.a_major == "MN") << 15 | int(self.b_major == "MN") << 16 | (self.n >> 3) << 17
                | (self.m >> 4) << 24)

    @staticmethod
    def decode(value: int, kind: str) -> InstrDescriptor:
        """The fields of ``value`` for an MMA of ``kind`` ("f16" or "f8f6f4")."""
        names = {v: k for k, v in MMA_KINDS[kind].items()}
        d = {v: k for k, v in _D_FORMAT.items()}[_bits(value, 4, 6)]
        return InstrDescriptor(
            a_dtype=_DTYPES[names[_bits(value, 7, 10)]], b_dtype=_DTYPES[names[_bits(value, 10, 13)]],
            d_dtype=_DTYPES[d], m=_bits(value, 24, 29) << 4, n=_bits(value, 17, 23) << 3,
            a_major="MN" if _bits(value, 15, 16) else "K", b_major="MN" if _bits(value, 16, 17) else "K",
            negate_a=bool(_bits(value, 13, 14)), negate_b=bool(_bits(value, 14, 15)),
            saturate=bool(_bits(value, 3, 4)))


_SCALE_FORMAT = {"ue4m3": 0, "ue8m0": 1}
#: operand formats (bits 7..9 / 10..12) per block-scaled kind (CuTe ``MXF8F6F4Format``, ``MXF4Format``)
_SCALED_FORMATS: dict[str, dict[str, int]] = {
    "mxf8f6f4": MMA_KINDS["f8f6f4"], "mxf4": {"e2m1": 1}, "mxf4nvf4": {"e2m1": 1},
}
#: K elements per scale factor of each (kind, scale type) a descriptor can name; mxf4nvf4 with ue8m0
#: may be 2X or 4X (the PTX qualifier says which, the descriptor does not)
_MMA_K = {"mxf8f6f4": 32, "mxf4": 64, "mxf4nvf4": 64}


@dataclass(frozen=True)
class InstrDescriptorBlockScaled:
    """The instruction descriptor of a block-scaled ``tcgen05.mma`` (``kind`` mxf8f6f4, mxf4 or
    mxf4nvf4; ``m`` the whole MMA's M); ``a_sf_id`` / ``b_sf_id``: the byte (0..3) of the scale
    factors' TMEM columns where the MMA's first factor is (``vs``: K elements per factor, 16 or 32;
    the ID must leave room for the MMA's ``K / vs`` factors in the column: a multiple of it)."""

    a_dtype: DType
    b_dtype: DType
    m: int
    n: int
    a_major: str = "K"
    b_major: str = "K"
    a_sf_id: int = 0
    b_sf_id: int = 0
    scale_type: str = "ue8m0"
    negate_a: bool = False
    negate_b: bool = False
    kind: str = "mxf8f6f4"
    vs: int = 32

    def encode(self) -> int:
        """The 32-bit value passed as ``idesc``.

        Example:
            >>> hex(InstrDescriptorBlockScaled(E4M3, E4M3, 128, 64).encode())
            '0x8900000'
            >>> hex(InstrDescriptorBlockScaled(E2M1, E2M1, 128, 64, scale_type="ue4m3", kind="mxf4nvf4",
            ...                                vs=16).encode())
            '0x8100480'
        """
        if self.kind not in _SCALED_FORMATS:
            raise ValueError(f"tcgen05.mma block_scale: kind {self.kind!r} is not one of "
                             f"{', '.join(_SCALED_FORMATS)}")
        fmt = _SCALED_FORMATS[self.kind]
        for role, d in (("A", self.a_dtype), ("B", self.b_dtype)):
            if d.name not in fmt:
                raise ValueError(f"tcgen05.mma.kind::{self.kind}: {role} {d.name} is not {' or '.join(fmt)}")
        if self.scale_type not in _SCALE_FORMAT:
            raise ValueError(f"tcgen05.mma block_scale: scale type {self.scale_type!r} is not ue4m3 or ue8m0")
        per = factors_per_mma(self.kind, self.vs)
        if self.scale_type not in SCALE_VECS[(self.kind, self.vs)]:
            valid = " or ".join(SCALE_VECS[(self.kind, self.vs)])
            raise ValueError(f"tcgen05.mma.kind::{self.kind} with one factor per {self.vs} K elements takes "
                             f"{valid} factors, not {self.scale_type}")
        for role, sf in (("A", self.a_sf_id), ("B", self.b_sf_id)):
            if not 0 <= sf < 4 or sf % per:
                raise ValueError(f"tcgen05.mma.kind::{self.kind} block_scale: {role} scale-factor ID {sf} is "
                                 f"not a byte 0..3 that is a multiple of {per} (the MMA reads {per} factors "
                                 "per row)")
        if self.kind != "mxf8f6f4" and (self.a_major, self.b_major) != ("K", "K"):
            raise ValueError(f"tcgen05.mma.kind::{self.kind}: e2m1 operands are K-major only")
        if self.m % 16 or not 0 < self.m >> 4 < 32 or self.n % 8 or not 0 < self.n >> 3 < 64:
            raise ValueError(f"tcgen05.mma: M={self.m} / N={self.n} do not fit the descriptor")
        return (self.b_sf_id << 4 | fmt[self.a_dtype.name] << 7 | fmt[self.b_dtype.name] << 10
                | int(self.negate_a) << 13 | int(self.negate_b) << 14 | int(self.a_major == "MN") << 15
                | int(self.b_major == "MN") << 16 | (self.n >> 3) << 17 | _SCALE_FORMAT[self.scale_type] << 23
                | (self.m >> 4) << 24 | self.a_sf_id << 29)

    @staticmethod
    def decode(value: int, kind: str = "mxf8f6f4", vs: int | None = None) -> InstrDescriptorBlockScaled:
        """The fields of a block-scaled ``value`` of an MMA of ``kind`` (dense, bit 31 = 0: K = 32 for
        mxf8f6f4, 64 for mxf4 / mxf4nvf4). ``vs`` (the PTX's scale_vec) defaults to 32 but for an
        mxf4nvf4 descriptor with UE4M3 factors (16)."""
        if _bits(value, 0, 3) or _bits(value, 31, 32):
            raise ValueError(f"tcgen05.mma block_scale descriptor {value:#x}: sparse or K=96 forms are not "
                             "modelled")
        if kind not in _SCALED_FORMATS:
            raise ValueError(f"tcgen05.mma block_scale: kind {kind!r} is not one of "
                             f"{', '.join(_SCALED_FORMATS)}")
        names = {v: k for k, v in _SCALED_FORMATS[kind].items()}
        scale = {v: k for k, v in _SCALE_FORMAT.items()}[_bits(value, 23, 24)]
        for f in (_bits(value, 7, 10), _bits(value, 10, 13)):
            if f not in names:
                raise ValueError(f"tcgen05.mma.kind::{kind} descriptor {value:#x}: operand format {f} is not "
                                 f"one of {', '.join(f'{v} ({k})' for k, v in names.items())}")
        if vs is None:
            vs = 16 if scale == "ue4m3" else 32
        out = InstrDescriptorBlockScaled(
            a_dtype=_DTYPES[names[_bits(value, 7, 10)]], b_dtype=_DTYPES[names[_bits(value, 10, 13)]],
            m=_bits(value, 24, 29) << 4, n=_bits(value, 17, 23) << 3,
            a_major="MN" if _bits(value, 15, 16) else "K", b_major="MN" if _bits(value, 16, 17) else "K",
            a_sf_id=_bits(value, 29, 31), b_sf_id=_bits(value, 4, 6), scale_type=scale,
            negate_a=bool(_bits(value, 13, 14)), negate_b=bool(_bits(value, 14, 15)), kind=kind, vs=vs)
        out.encode()            # the same checks as encoding (ID alignment, factor type per kind)
        return out


@dataclass(frozen=True)
class UmmaDescriptor:
    """The fields of an sm_100a shared-memory descriptor (byte values; encoded >> 4).
    ``swizzle`` is 0, 32, 64, 128 or "128B_BASE32B"."""

    start_address: int
    leading_byte_offset: int
    stride_byte_offset: int
    swizzle: int | str = 0
    base_offset: int = 0
    lbo_mode: int = 0

    def encode(self) -> int:
        """The 64-bit descriptor value (version field 1 at bit 46)."""
        for what, v in (("start address", self.start_address), ("LBO", self.leading_byte_offset),
                        ("SBO", self.stride_byte_offset)):
            if v % 16 or not 0 <= v >> 4 < 1 << 14:
                raise ValueError(f"tcgen05 smem descriptor: {what} {v} is not a multiple of 16 below 2^18")
        if self.swizzle not in UMMA_LAYOUT_TYPE:
            raise ValueError(f"tcgen05 smem descriptor: swizzle {self.swizzle!r} is not one of "
                             f"{', '.join(map(str, UMMA_LAYOUT_TYPE))}")
        return ((self.start_address >> 4) | (self.leading_byte_offset >> 4) << 16
                | (self.stride_byte_offset >> 4) << 32 | 1 << 46 | (self.base_offset & 7) << 49
                | (self.lbo_mode & 1) << 52 | UMMA_LAYOUT_TYPE[self.swizzle] << 61)

    @staticmethod
    def decode(value: int) -> UmmaDescriptor:
        if _bits(value, 46, 48) != 1:
            raise ValueError(f"tcgen05 smem descriptor {value:#x}: version bits 46..47 are not 1")
        swz = {v: k for k, v in UMMA_LAYOUT_TYPE.items()}[_bits(value, 61, 64)]
        return UmmaDescriptor(start_address=_bits(value, 0, 14) << 4,
                              leading_byte_offset=_bits(value, 16, 30) << 4,
                              stride_byte_offset=_bits(value, 32, 46) << 4, swizzle=swz,
                              base_offset=_bits(value, 49, 52), lbo_mode=_bits(value, 52, 53))

    def as_gmma(self) -> GmmaDescriptor:
        """The wgmma descriptor that reads the same bytes (not for "128B_BASE32B")."""
        if isinstance(self.swizzle, str):
            raise ValueError(f"tcgen05 smem descriptor: {self.swizzle} has no wgmma equivalent")
        return GmmaDescriptor(self.start_address, self.leading_byte_offset, self.stride_byte_offset,
                              self.swizzle, self.base_offset)


def umma_desc_addresses(desc: UmmaDescriptor, major: str, elem_bits: int, mn: int, k: int) -> np.ndarray:
    """Byte addresses ``[mn, k]`` that ``tcgen05.mma`` reads for an ``mn x k`` operand through ``desc``."""
    return gmma_desc_addresses(desc.as_gmma(), major, elem_bits, mn, k)


def make_umma_desc(layout: ComposedLayout | Layout, major: str, elem_bits: int, mn: int, k: int,
                   base_address: int = 0) -> UmmaDescriptor:
    """The sm_100a descriptor of the ``mn x k`` tile whose element offsets are ``layout(mn, k)``
    (a canonical K- or MN-major layout, see ``gmma.make_gmma_desc``; ``ValueError`` otherwise).

    Example:
        >>> from hexlayout.arch.gmma import gmma_smem_atom
        >>> make_umma_desc(gmma_smem_atom(16, "K", 128), "K", 16, 8, 64).swizzle
        128
    """
    g = make_gmma_desc(layout, major, elem_bits, mn, k, base_address)
    return UmmaDescriptor(g.start_address, g.leading_byte_offset, g.stride_byte_offset, g.swizzle,
                          g.base_offset)
