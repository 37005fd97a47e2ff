"""Block scale factors of ``tcgen05.mma.kind::mxf8f6f4.block_scale.scale_vec::1X`` (sm_100a):
their encoding (UE8M0), their shared-memory layout and their layout in tensor memory.

**UE8M0**: an unsigned 8-bit exponent ``e``, the factor ``2^(e - 127)``; 255 is NaN. A float
is exactly representable iff it is a power of two in ``[2^-127, 2^127]``.

**Scale factors of one operand** (A: ``M`` rows, B: ``N`` rows): ``SF[r, kb]``, one per row and
per 32 K elements (k-block ``kb``). The MMA (K = 32) of k-block ``kb`` multiplies row ``r`` of A
by ``2^(SFA[r, kb] - 127)`` and row ``n`` of B by ``2^(SFB[n, kb] - 127)``.

**Shared memory** (CUTLASS ``Sm1xxBlkScaledConfig::SfKMajorAtom``): an atom of 128 rows x 4
k-blocks is 512 bytes, ``SF[r, kb]`` at byte ``16 (r % 32) + 4 (r // 32) + kb``: 32 rows of 16
bytes, exactly one ``tcgen05.cp.32x128b.warpx4`` (row ``r % 32`` of the copy, word ``r // 32``,
byte ``kb``). Atoms tile k-blocks first (``+512`` per 4 k-blocks), then rows (``+512 * kblocks / 4``
per 128 rows): ``scale_smem_layout``.

**Tensor memory** (CuTe ``UMMA::tmem_sf_frg``, ``ScaleFactorDuplicated4by1``): the copy above
replicates the atom into the four lane quarters; ``SF[r, kb]`` is in lane ``32 q + r % 32`` (every
``q``), 32-bit column ``r // 32`` (plus ``rows / 32`` columns per further 4 k-blocks, rows
rounded up to 128), byte ``kb % 4``. As a layout of byte offsets (CuTe's ``tmem_ptr<uint8_t>``:
lane stride ``1 << 18``, column ``c`` byte ``b`` at ``4 c + b``): ``scale_tmem_layout``. The MMA
takes the factors' TMEM address (lane 0, the first column) and, in the instruction descriptor,
the byte of k-block ``kb`` (``a_sf_id`` / ``b_sf_id``, ``tcgen05.InstrDescriptorBlockScaled``).
Which replica a datapath reads is not documented; the emulator reads row ``m`` of A from lane
``m`` and B for the D rows of quarter ``q`` from lanes ``32 q ..`` (each subpartition its own copy),
so a copy that does not replicate the factors gives wrong rows there, as it would on the GPU.

Example:
    >>> str(scale_smem_layout(128, 4))
    '((32,4),4):((16,4),1)'
"""

from __future__ import annotations

import numpy as np

from ..layout import Layout

__all__ = ["UE8M0_BIAS", "SF_ATOM_ROWS", "SF_ATOM_KBLOCKS", "SF_ATOM_BYTES", "TMEM_SF_DP", "to_ue8m0",
           "from_ue8m0", "is_ue8m0", "scale_smem_layout", "scale_tmem_layout", "scale_columns"]

UE8M0_BIAS = 127
SF_ATOM_ROWS = 128
SF_ATOM_KBLOCKS = 4
SF_ATOM_BYTES = 512
#: lane stride of a TMEM byte offset (CuTe ``TMEM::DP<uint8_t>``: ``1 << 16`` columns of 4 bytes)
TMEM_SF_DP = 1 << 18


def is_ue8m0(x: np.ndarray) -> np.ndarray:
    """Whether each value is exactly a UE8M0 factor: a power of two in ``[2^-127, 2^127]``."""
    x = np.asarray(x, dtype=np.float64)
    m, e = np.frexp(x)
    return (m == 0.5) & (e - 1 >= -127) & (e - 1 <= 127)


def to_ue8m0(x: np.ndarray) -> np.ndarray:
    """The UE8M0 byte ``log2(x) + 127`` of powers of two (``ValueError`` for any other value)."""
    x = np.asarray(x, dtype=np.float64)
    ok = is_ue8m0(x)
    if not ok.all():
        bad = x.reshape(-1)[np.flatnonzero(~ok.reshape(-1))[0]]
        raise ValueError(f"UE8M0: {float(bad)!r} is not a power of two in [2^-127, 2^127]")
    return (np.frexp(x)[1] - 1 + UE8M0_BIAS).astype(np.uint8)


def from_ue8m0(e: np.ndarray) -> np.ndarray:
    """``2^(e - 127)`` as float64 (255: NaN)."""
    e = np.asarray(e).astype(np.int64)
    return np.where(e == 255, np.nan, np.ldexp(1.0, e - UE8M0_BIAS))


def _check(rows: int, kblocks: int) -> None:
    if rows <= 0 or kblocks <= 0 or kblocks % SF_ATOM_KBLOCKS and kblocks > SF_ATOM_KBLOCKS:
        raise ValueError(f"block scale factors: {rows} rows x {kblocks} k-blocks (k-blocks: 1..4 or a "
                         "multiple of 4)")


def _rows(rows: int) -> int:
    """Rows rounded up to whole 128-row atoms."""
    return -(-rows // SF_ATOM_ROWS) * SF_ATOM_ROWS


def scale_smem_layout(rows: int, kblocks: int) -> Layout:
    """``(row, k-block) -> byte offset`` of the factors in shared memory (module docstring); rows
    are rounded up to 128 (a partial atom still occupies 512 bytes)."""
    _check(rows, kblocks)
    r = _rows(rows)
    kg = -(-kblocks // SF_ATOM_KBLOCKS)
    row_mode = ((32, 4), (16, 4)) if r == SF_ATOM_ROWS else ((32, 4, r // 128), (16, 4, SF_ATOM_BYTES * kg))
    kb_mode = (kblocks, 1) if kblocks <= SF_ATOM_KBLOCKS else ((4, kg), (1, SF_ATOM_BYTES))
    return Layout((row_mode[0], kb_mode[0]), (row_mode[1], kb_mode[1]))


def scale_columns(rows: int, kblocks: int) -> int:
    """32-bit TMEM columns the factors occupy (rows rounded up to 128: ``rows / 32`` per 4 k-blocks)."""
    _check(rows, kblocks)
    return _rows(rows) // 32 * -(-kblocks // SF_ATOM_KBLOCKS)


def scale_tmem_layout(rows: int, kblocks: int) -> Layout:
    """``(row, k-block, replica) -> lane * 2^18 + 4 * column + byte`` of the factors in TMEM
    (module docstring; replica ``q``: lane quarter ``q``)."""
    _check(rows, kblocks)
    r = _rows(rows)
    kg = -(-kblocks // SF_ATOM_KBLOCKS)
    row_mode = ((32, r // 32), (TMEM_SF_DP, 4))
    kb_mode = (kblocks, 1) if kblocks <= SF_ATOM_KBLOCKS else ((4, kg), (1, r // 8))
    return Layout((row_mode[0], kb_mode[0], 4), (row_mode[1], kb_mode[1], 32 * TMEM_SF_DP))
