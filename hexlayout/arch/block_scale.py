"""Block scale factors of the block-scaled ``tcgen05.mma`` (sm_100a): their encodings (UE8M0,
UE4M3), which factors one MMA reads, their shared-memory layout and their layout in tensor memory.

**UE8M0**: an unsigned 8-bit exponent ``e``, the factor ``2^(e - 127)``; 255 is NaN. A float
is exactly representable iff it is a power of two in ``[2^-127, 2^127]``.

**UE4M3** (NVFP4's factors): the byte's bits 3..6 are an exponent ``e`` (bias 7), bits 0..2 a
mantissa ``m``: ``e = 0``: ``m / 8 * 2^-6`` (subnormal), else ``(1 + m / 8) * 2^(e - 7)``; ``0x7F``
is NaN, 448 the largest factor; bit 7 (a sign in E4M3) is not part of the format and is ignored.

**Scale vectors** (PTX ISA "tcgen05.mma block scaling"; CuTe ``SM100_MMA_MXF8F6F4_SS`` /
``SM100_MMA_MXF4_SS<..., VS>``): one factor per row and per ``VS`` K elements, ``VS`` 32 or 16.
An MMA of ``K`` elements reads ``K / VS`` factors per row (``SCALE_VECS``):

=====================  ========  ======  ============  =================  ===========
kind                   operands  MMA K   scale_vec     factors            per row/MMA
=====================  ========  ======  ============  =================  ===========
mxf8f6f4               e4m3/e5m2  32     1X (VS 32)    ue8m0              1
mxf4                   e2m1       64     2X (VS 32)    ue8m0              2
mxf4nvf4               e2m1       64     2X (VS 32)    ue8m0              2
mxf4nvf4               e2m1       64     4X (VS 16)    ue4m3 or ue8m0     4
=====================  ========  ======  ============  =================  ===========

**Scale factors of one operand** (A: ``M`` rows, B: ``N`` rows): ``SF[r, kb]``, one per row and
per ``VS`` K elements (k-block ``kb``). The MMA of k-step ``s`` (K elements ``[sK, sK + K)``) covers
k-blocks ``kb = s K / VS + j``, ``j < K / VS``, and multiplies ``A[r, k]`` by ``SFA[r, k // VS]`` and
``B[n, k]`` by ``SFB[n, k // VS]`` (UE8M0: ``2^(SF - 127)``; UE4M3: its value above).

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
the byte of its first k-block (``a_sf_id`` / ``b_sf_id``, ``tcgen05.InstrDescriptorBlockScaled``);
its ``K / VS`` factors are bytes ``sf_id .. sf_id + K / VS - 1`` of that column (CuTe's
``tmem_sf_frg``: the factor index within an MMA steps one byte), so the ID is a multiple of
``K / VS`` (1X: 0..3; 2X: 0 or 2; 4X: 0): ``mma_sf_id``.
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
           "from_ue8m0", "is_ue8m0", "from_ue4m3", "to_ue4m3", "decode_factors", "SCALE_VECS",
           "factors_per_mma", "mma_sf_id", "scale_smem_layout", "scale_tmem_layout", "scale_columns"]

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


#: (kind, VS) -> the factor types it accepts (module docstring's table)
SCALE_VECS: dict[tuple[str, int], tuple[str, ...]] = {
    ("mxf8f6f4", 32): ("ue8m0",), ("mxf4", 32): ("ue8m0",), ("mxf4nvf4", 32): ("ue8m0",),
    ("mxf4nvf4", 16): ("ue4m3", "ue8m0"),
}
#: scale_vec qualifier of (kind, VS)
SCALE_VEC_NAME = {("mxf8f6f4", 32): "1X", ("mxf4", 32): "2X", ("mxf4nvf4", 32): "2X", ("mxf4nvf4", 16): "4X"}


def from_ue4m3(b: np.ndarray) -> np.ndarray:
    """The UE4M3 factors of the bytes ``b`` as float64 (``0x7F``: NaN; bit 7 ignored)."""
    b = np.asarray(b).astype(np.int64) & 0x7F
    e, m = b >> 3, b & 7
    v = np.where(e == 0, np.ldexp(m / 8.0, -6), np.ldexp(1.0 + m / 8.0, e - 7))
    return np.where(b == 0x7F, np.nan, v)


def to_ue4m3(x: np.ndarray) -> np.ndarray:
    """The UE4M3 byte of each value (``ValueError`` unless it is exactly one: ``from_ue4m3`` of a
    byte ``0 .. 0x7E``)."""
    x = np.asarray(x, dtype=np.float64)
    table = from_ue4m3(np.arange(0x7F))
    idx = np.searchsorted(table, x)
    ok = (idx < len(table)) & (table[np.minimum(idx, len(table) - 1)] == x)
    if not ok.all():
        bad = x.reshape(-1)[np.flatnonzero(~ok.reshape(-1))[0]]
        raise ValueError(f"UE4M3: {float(bad)!r} is not a UE4M3 value (a non-negative E4M3 number up to 448)")
    return idx.astype(np.uint8)


def decode_factors(b: np.ndarray, scale_type: str) -> np.ndarray:
    """The factors (float64) of the bytes ``b`` of ``scale_type`` "ue8m0" or "ue4m3"."""
    if scale_type == "ue8m0":
        return from_ue8m0(b)
    if scale_type == "ue4m3":
        return from_ue4m3(b)
    raise ValueError(f"block scale factors: type {scale_type!r} is not ue8m0 or ue4m3")


def factors_per_mma(kind: str, vs: int) -> int:
    """Factors per row one MMA of ``kind`` with scale vector ``vs`` reads: ``K / VS``."""
    if (kind, vs) not in SCALE_VECS:
        raise ValueError(f"tcgen05.mma.kind::{kind}: a scale vector of {vs} K elements is not valid (valid: "
                         f"{', '.join(f'{k} {v}' for k, v in SCALE_VECS)})")
    return (32 if kind == "mxf8f6f4" else 64) // vs


def mma_sf_id(kind: str, vs: int, kstep: int) -> int:
    """The scale-factor ID (byte) of the MMA of k-step ``kstep``: its first k-block ``kstep K / VS``
    modulo 4 (its factors then fill bytes ``id .. id + K / VS - 1`` of one column)."""
    return kstep * factors_per_mma(kind, vs) % SF_ATOM_KBLOCKS


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
