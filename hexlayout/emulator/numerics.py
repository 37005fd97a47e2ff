"""Element types of atoms as numpy dtypes, and exact conversions used by the mma units.

``atom_numpy(dtype)`` maps an ``hexlayout.arch`` dtype (``f16``, ``bf16``, ``tf32``, ``s8``,
``u8``, ``s32``, ``e4m3``, ``e5m2``, ``f32``) to the numpy dtype that stores it (tf32 is stored
in 32 bits). ``to_compute`` converts inputs exactly to float32 (float types; tf32 keeps its
top 19 bits, as the tensor cores read it) or int64 (integers).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["atom_numpy", "to_compute", "is_int_type"]

_TABLE: dict[str, Any] = {
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "f32": np.float32,
    "tf32": np.float32,
    "s8": np.int8,
    "u8": np.uint8,
    "s32": np.int32,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
}


def atom_numpy(dtype: Any) -> np.dtype:
    return np.dtype(_TABLE[dtype.name])


def is_int_type(dtype: Any) -> bool:
    return dtype.name in ("s8", "u8", "s32")


def to_compute(values: np.ndarray, dtype: Any) -> np.ndarray:
    if is_int_type(dtype):
        return values.astype(np.int64)
    if dtype.name == "tf32":
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return bits.view(np.float32)
    return values.astype(np.float32)
