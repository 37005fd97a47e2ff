"""Element types the atoms read and write.

A ``DType`` names an element type three ways: hexlayout's short name (``"f16"``), the
PTX type suffix (``.f16``) and the token CuTe uses inside atom names (``F16``).
``bits`` is the storage width; ``fp8`` types are 8 bits, ``tf32`` occupies 32.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DType", "DTYPES", "get_dtype", "F16", "BF16", "F32", "TF32", "S8", "U8", "S32", "E4M3", "E5M2"]


@dataclass(frozen=True)
class DType:
    """An element type: ``name`` (hexlayout), ``ptx`` (PTX suffix), ``cute`` (atom-name token)."""

    name: str
    bits: int
    ptx: str
    cute: str

    @property
    def bytes(self) -> int:
        return self.bits // 8

    def __str__(self) -> str:
        return self.name


F16 = DType("f16", 16, "f16", "F16")
BF16 = DType("bf16", 16, "bf16", "BF16")
F32 = DType("f32", 32, "f32", "F32")
TF32 = DType("tf32", 32, "tf32", "TF32")
S8 = DType("s8", 8, "s8", "S8")
U8 = DType("u8", 8, "u8", "U8")
S32 = DType("s32", 32, "s32", "S32")
E4M3 = DType("e4m3", 8, "e4m3", "E4M3")
E5M2 = DType("e5m2", 8, "e5m2", "E5M2")

DTYPES: dict[str, DType] = {d.name: d for d in (F16, BF16, F32, TF32, S8, U8, S32, E4M3, E5M2)}
_BY_CUTE: dict[str, DType] = {d.cute: d for d in DTYPES.values()}


def get_dtype(name: str) -> DType:
    """Look a dtype up by hexlayout name (``"bf16"``) or CuTe token (``"BF16"``)."""
    if name in DTYPES:
        return DTYPES[name]
    if name in _BY_CUTE:
        return _BY_CUTE[name]
    raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}")
