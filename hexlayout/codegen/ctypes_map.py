"""C++ spellings of element types, vector types and literals used by the generated code.

The generated source includes only ``cuda_fp16.h``, ``cuda_bf16.h`` and ``cuda_fp8.h``
(no ``<stdint.h>``, which NVRTC lacks), so integer types are spelled with built-in
C++ types.
"""

from __future__ import annotations

import math

from hexlayout.arch.dtypes import DType

__all__ = ["c_type", "vector_type", "float_literal", "to_float", "from_float", "is_fp8", "VECTOR_TYPES"]

_C_TYPES = {
    "f16": "half", "bf16": "__nv_bfloat16", "f32": "float", "f64": "double", "tf32": "float",
    "e4m3": "__nv_fp8_e4m3", "e5m2": "__nv_fp8_e5m2", "e2m1": "unsigned char", "ue4m3": "unsigned char",
    "s8": "signed char", "u8": "unsigned char",
    "s32": "int", "u32": "unsigned", "s64": "long long", "b16": "unsigned short", "pred": "bool",
}

#: bits -> the C++ type a vector access of that width moves.
VECTOR_TYPES = {8: "unsigned char", 16: "unsigned short", 32: "unsigned", 64: "uint2", 128: "uint4"}


def c_type(dt: DType) -> str:
    """The C++ type of one element of ``dt`` (sub-byte types have none, but ``e2m1``, whose
    code a register holds in a byte)."""
    try:
        return _C_TYPES[dt.name]
    except KeyError:
        raise ValueError(f"element type {dt} has no C++ register type (sub-byte types are not supported "
                         "in registers yet)") from None


def vector_type(bits: int) -> str:
    try:
        return VECTOR_TYPES[bits]
    except KeyError:
        raise ValueError(f"a {bits}-bit vector access is not 8, 16, 32, 64 or 128 bits") from None


def is_fp8(dt: DType) -> bool:
    return dt.name in ("e4m3", "e5m2")


def float_literal(x: float, double: bool = False) -> str:
    """A C++ literal for ``x`` (``float`` unless ``double``); inf / nan through bit patterns."""
    x = float(x)
    if math.isnan(x):
        return "__longlong_as_double(0x7ff8000000000000ll)" if double else "__int_as_float(0x7fc00000)"
    if math.isinf(x):
        if double:
            return f"__longlong_as_double({'0xfff0000000000000ll' if x < 0 else '0x7ff0000000000000ll'})"
        return f"__int_as_float({'0xff800000' if x < 0 else '0x7f800000'})"
    s = repr(x)
    if "e" not in s and "." not in s:
        s += ".0"
    return s if double else s + "f"


def to_float(dt: DType, x: str, double: bool = False) -> str:
    """``x`` (an element of ``dt``) converted to ``float`` (or ``double``)."""
    target = "double" if double else "float"
    if dt.name in ("f32", "tf32"):
        return f"static_cast<double>({x})" if double else x
    if dt.name == "f64":
        return x if double else f"static_cast<float>({x})"
    if dt.name == "f16":
        f = f"__half2float({x})"
    elif dt.name == "bf16":
        f = f"__bfloat162float({x})"
    else:
        return f"static_cast<{target}>({x})"
    return f"static_cast<double>({f})" if double else f


#: ``from_float`` per element type: the C conversion of the float value ``{x}``
_FROM_FLOAT = {
    "f32": "{x}", "tf32": "{x}", "f64": "static_cast<double>({x})", "f16": "__float2half_rn({x})",
    "bf16": "__float2bfloat16_rn({x})", "e4m3": "__nv_fp8_e4m3({x})", "e5m2": "__nv_fp8_e5m2({x})",
    "s32": "__float2int_rn({x})", "u32": "__float2uint_rn({x})", "s64": "__float2ll_rn({x})",
    "s8": "static_cast<signed char>(max(-128, min(127, __float2int_rn({x}))))",
    "u8": "static_cast<unsigned char>(max(0, min(255, __float2int_rn({x}))))",
    "pred": "(({x}) != 0.0f)",
}


def from_float(dt: DType, x: str) -> str:
    """A ``float`` (or ``double``) value ``x`` rounded to ``dt`` (nearest even; fp8 saturates;
    integers round to nearest even and saturate)."""
    form = _FROM_FLOAT.get(dt.name)
    if form is None:
        raise ValueError(f"no conversion from float to {dt}")
    return form.replace("{x}", x)
