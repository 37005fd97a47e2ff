"""PTX fundamental types as numpy dtypes, and the bit-level conversions between a register
(stored as raw unsigned bits of its declared width) and a typed value.

PTX ISA "Operand Size Exceeding Instruction-Type Size": a source register wider than the
instruction type is truncated to its low bits; a destination register wider than the type
receives the value sign-extended for signed integer types and zero-extended otherwise.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["NP", "BITS", "UINT", "SINT", "is_float", "is_signed", "type_of", "from_bits", "to_bits", "TYPES"]

NP: dict[str, Any] = {
    "pred": np.bool_,
    "b8": np.uint8,
    "u8": np.uint8,
    "s8": np.int8,
    "b16": np.uint16,
    "u16": np.uint16,
    "s16": np.int16,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "b32": np.uint32,
    "u32": np.uint32,
    "s32": np.int32,
    "f32": np.float32,
    "tf32": np.float32,
    "f16x2": np.uint32,
    "bf16x2": np.uint32,
    "b64": np.uint64,
    "u64": np.uint64,
    "s64": np.int64,
    "f64": np.float64,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3x2": np.uint16,
    "e5m2x2": np.uint16,
}
BITS: dict[str, int] = {
    "pred": 1,
    "b8": 8,
    "u8": 8,
    "s8": 8,
    "b16": 16,
    "u16": 16,
    "s16": 16,
    "f16": 16,
    "bf16": 16,
    "b32": 32,
    "u32": 32,
    "s32": 32,
    "f32": 32,
    "tf32": 32,
    "f16x2": 32,
    "bf16x2": 32,
    "b64": 64,
    "u64": 64,
    "s64": 64,
    "f64": 64,
    "e4m3": 8,
    "e5m2": 8,
    "e4m3x2": 16,
    "e5m2x2": 16,
    "b128": 128,
}
TYPES = frozenset(NP)
UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
SINT = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}


def is_float(t: str) -> bool:
    return t[0] in "fe" or t.startswith("bf") or t == "tf32"


def is_signed(t: str) -> bool:
    return t[0] == "s"


def type_of(parts: list[str]) -> str:
    """The last PTX type among an opcode's parts (``add.rn.f32`` -> ``f32``)."""
    for p in reversed(parts):
        if p in TYPES:
            return p
    raise KeyError(f"no type in {'.'.join(parts)}")


def from_bits(raw: np.ndarray, width: int, t: str) -> np.ndarray:
    """Raw unsigned bits of ``width`` -> a value array of PTX type ``t``."""
    if t == "pred":
        return raw.astype(np.bool_)
    tb = BITS[t]
    if width != tb:
        raw = raw.astype(UINT[tb])  # truncate (wider register) or zero-extend (narrower)
        if width < tb and is_signed(t):
            sh = tb - width
            raw = (raw.view(SINT[tb]) << sh) >> sh
            return raw.view(NP[t])
    return raw.view(NP[t])


def to_bits(val: np.ndarray, t: str, width: int) -> np.ndarray:
    """A value array of PTX type ``t`` -> raw unsigned bits of ``width`` (sign-extended for
    signed types when the register is wider)."""
    if width == 1:
        return np.asarray(val).astype(np.bool_)
    tb = BITS[t]
    v = np.ascontiguousarray(np.asarray(val, dtype=NP[t]))
    raw = v.view(UINT[tb]) if tb in UINT else v
    if width == tb:
        return raw
    if width > tb and is_signed(t):
        return v.astype(SINT[width]).view(UINT[width])
    return raw.astype(UINT[width])
