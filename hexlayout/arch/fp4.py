"""FP4 (OCP ``e2m1``) operands of the block-scaled ``tcgen05.mma`` (kind::mxf4 / mxf4nvf4):
the element values and the packed shared-memory format.

**E2M1**: 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; code ``c``: magnitude
``E2M1_VALUES[c & 7]`` = ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` (``e = (c >> 1) & 3``, ``m = c & 1``:
``e = 0``: ``m / 2``, else ``(1 + m / 2) 2^(e - 1)``), negated when bit 3 is set.

**Packed** (shared and global memory, CuTe ``float_e2m1_t`` arrays, PTX "Packing format of
.e2m1"): two elements per byte, element ``2j`` in the low nibble of byte ``j`` and ``2j + 1`` in the
high nibble. A K-major operand row of ``K`` elements is ``K / 2`` bytes, so the MMA's K = 64 is the
32 bytes a K = 32 fp8 MMA reads: the descriptor, its LBO / SBO and the swizzle are those of an 8-bit
operand 32 elements wide, and element ``k`` of a row is nibble ``k % 2`` of its byte ``k // 2``.

Example:
    >>> unpack_fp4(np.array([[0x2F]], np.uint8)).tolist()
    [[15, 2]]
"""

from __future__ import annotations

import numpy as np

__all__ = ["E2M1_VALUES", "from_e2m1", "unpack_fp4"]

#: magnitude of the e2m1 codes 0..7
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def from_e2m1(codes: np.ndarray) -> np.ndarray:
    """The values (float64) of e2m1 ``codes`` (low 4 bits of each integer)."""
    c = np.asarray(codes).astype(np.int64) & 15
    return np.where(c & 8, -1.0, 1.0) * E2M1_VALUES[c & 7]


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """The codes ``[..., 2 n]`` of packed bytes ``[..., n]`` (element ``2j`` from the low nibble)."""
    b = np.asarray(packed).astype(np.uint8)
    return np.stack([b & 15, b >> 4], axis=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])
