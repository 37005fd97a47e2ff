"""Element types: the one ``DType`` every layer uses.

A ``DType`` names an element type several ways: hexlayout's short name (``"f16"``), the
PTX type suffix (``.f16``), the token CuTe uses inside atom names (``F16``) and the CUDA
C++ type (``half``). ``bits`` is the storage width (fp8: 8, tf32 occupies 32, int4: 4);
``kind`` is ``float``, ``int``, ``uint`` or ``bits``. ``numpy()`` is the numpy dtype the
emulator stores values in (bf16 and fp8 through ``ml_dtypes``; 4-bit types are unpacked
into one byte per element).

``e2m1`` is OCP microscaling's FP4 (MXFP4's element): 1 sign bit, 2 exponent bits (bias 1),
1 mantissa bit, no infinity or NaN: codes ``0 .. 7`` are ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` and
``8 .. 15`` their negatives (``-0`` for 8). In global memory two values share a byte (even
element in the low nibble); in registers one code is held per byte (its low nibble), as the
emulator stores it too (``numpy()`` is ``uint8``: the code, not the value), and the only
operation on such a tile is ``hl.cast`` to f16 / bf16 (``e2m1_f16`` / ``e2m1_bf16``).

``ue4m3`` is NVFP4's block scale factor: an unsigned E4M3 byte (4 exponent bits, bias 7, 3
mantissa bits; bit 7 is not part of the format): ``e = 0``: ``m / 8 * 2^-6``, else
``(1 + m / 8) * 2^(e - 7)``, ``0x7F`` NaN, largest 448 (``arch.block_scale.from_ue4m3``). Its
``kind`` is ``bits``: a tile of it holds the codes (``numpy()``: ``uint8``) and is only copied
(to shared memory, where ``tcgen05.cp`` moves it to tensor memory for a block-scaled MMA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "DType", "DTYPES", "get_dtype", "F16", "BF16", "F32", "F64", "TF32", "S4", "U4", "S8", "U8", "S32",
    "U32", "S64", "B16", "PRED", "E4M3", "E5M2", "E2M1", "UE4M3",
]


@dataclass(frozen=True)
class DType:
    """An element type: ``name`` (hexlayout), ``ptx`` (PTX suffix), ``cute`` (atom-name token)."""

    name: str
    bits: int
    ptx: str
    cute: str
    kind: str = "float"
    c_name: str = ""

    @property
    def bytes(self) -> int:
        """Whole bytes per element (0 for sub-byte types)."""
        return self.bits // 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    def numpy(self) -> Any:
        """The numpy dtype that holds values of this type in the emulator."""
        import numpy as np

        if self.name in ("bf16", "e4m3", "e5m2"):
            import ml_dtypes

            return np.dtype({"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
                             "e5m2": ml_dtypes.float8_e5m2}[self.name])
        table = {"f16": np.float16, "f32": np.float32, "tf32": np.float32, "f64": np.float64,
                 "s4": np.int8, "u4": np.uint8,
                 "e2m1": np.uint8, "ue4m3": np.uint8, "s8": np.int8, "u8": np.uint8, "s32": np.int32,
                 "u32": np.uint32, "s64": np.int64, "b16": np.uint16, "pred": np.bool_}
        return np.dtype(table[self.name])

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


F16 = DType("f16", 16, "f16", "F16", "float", "half")
BF16 = DType("bf16", 16, "bf16", "BF16", "float", "__nv_bfloat16")
F32 = DType("f32", 32, "f32", "F32", "float", "float")
F64 = DType("f64", 64, "f64", "F64", "float", "double")
TF32 = DType("tf32", 32, "tf32", "TF32", "float", "float")
E4M3 = DType("e4m3", 8, "e4m3", "E4M3", "float", "__nv_fp8_e4m3")
E5M2 = DType("e5m2", 8, "e5m2", "E5M2", "float", "__nv_fp8_e5m2")
E2M1 = DType("e2m1", 4, "e2m1", "E2M1", "float", "unsigned char")
UE4M3 = DType("ue4m3", 8, "ue4m3", "UE4M3", "bits", "unsigned char")
S4 = DType("s4", 4, "s4", "S4", "int", "int8_t")
U4 = DType("u4", 4, "u4", "U4", "uint", "uint8_t")
S8 = DType("s8", 8, "s8", "S8", "int", "int8_t")
U8 = DType("u8", 8, "u8", "U8", "uint", "uint8_t")
S32 = DType("s32", 32, "s32", "S32", "int", "int")
U32 = DType("u32", 32, "u32", "U32", "uint", "unsigned")
S64 = DType("s64", 64, "s64", "S64", "int", "long long")
B16 = DType("b16", 16, "b16", "B16", "bits", "uint16_t")
PRED = DType("pred", 1, "pred", "PRED", "bits", "bool")

DTYPES: dict[str, DType] = {
    d.name: d for d in (F16, BF16, F32, F64, TF32, E4M3, E5M2, E2M1, UE4M3, S4, U4, S8, U8, S32, U32, S64,
                        B16, PRED)
}
_BY_CUTE: dict[str, DType] = {d.cute: d for d in DTYPES.values()}
_ALIASES = {
    "float16": "f16", "half": "f16", "bfloat16": "bf16", "float32": "f32", "float": "f32",
    "float64": "f64", "double": "f64", "int8": "s8", "i8": "s8", "uint8": "u8", "int32": "s32",
    "i32": "s32", "uint32": "u32", "int64": "s64", "i64": "s64", "int4": "s4", "i4": "s4",
    "uint4": "u4", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float4_e2m1fn": "e2m1", "bool": "pred",
}


def get_dtype(name: Any) -> DType:
    """Look a dtype up by hexlayout name (``"bf16"``), CuTe token (``"BF16"``), an alias
    (``"bfloat16"``, ``"int8"``), a numpy / torch dtype, or return a ``DType`` unchanged."""
    if isinstance(name, DType):
        return name
    s = str(name).replace("torch.", "")
    s = _ALIASES.get(s, s)
    if s in DTYPES:
        return DTYPES[s]
    if s in _BY_CUTE:
        return _BY_CUTE[s]
    raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}")
