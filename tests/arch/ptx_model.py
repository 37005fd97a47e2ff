"""Independent models of the PTX ISA fragment formulas and matrix-move semantics.

Written from the PTX ISA ("Matrix Fragments for mma.m16n8k*", "wgmma ... Register
Fragments", ldmatrix) and /work/shared/REFERENCE.md, without looking at any layout:
for each lane and register element index they give the tile coordinate it holds.
lane = 4*g + t (g = groupID = lane >> 2, t = threadID_in_group = lane % 4).
"""

from __future__ import annotations

import numpy as np

from hexlayout.layout import Layout


def tv_index_table(layout: Layout, nthreads: int) -> np.ndarray:
    """``table[t, v] = layout(t + nthreads * v)`` (colexicographic (thread, value) order)."""
    idx = layout.indices()
    nv = idx.size // nthreads
    return idx.reshape(nv, nthreads).T


# ---- mma.sync m16n8kX (per warp) -------------------------------------------------------------
def mma_a_coord(k_dim: int, a_bits: int, lane: int, i: int) -> tuple[int, int]:
    """(row m, col k) of element ``i`` of A held by ``lane``."""
    g, t = lane >> 2, lane % 4
    if a_bits == 16 and k_dim == 16:
        return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >= 4)
    if a_bits == 16 and k_dim == 8:
        return g + 8 * (i >= 2), 2 * t + (i & 1)
    if a_bits == 8 and k_dim == 32:
        return g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >= 8)
    if a_bits == 32 and k_dim == 8:  # tf32: a0,a2 rows g; a1,a3 rows g+8; a2,a3 cols +4
        return g + 8 * (i & 1), t + 4 * (i >= 2)
    raise NotImplementedError((k_dim, a_bits))


def mma_b_coord(k_dim: int, b_bits: int, lane: int, i: int) -> tuple[int, int]:
    """(row k, col n) of element ``i`` of B (K x N) held by ``lane``."""
    g, t = lane >> 2, lane % 4
    if b_bits == 16 and k_dim == 16:
        return 2 * t + (i & 1) + 8 * (i >= 2), g
    if b_bits == 16 and k_dim == 8:
        return 2 * t + i, g
    if b_bits == 8 and k_dim == 32:
        return 4 * t + (i & 3) + 16 * (i >= 4), g
    if b_bits == 32 and k_dim == 8:
        return t + 4 * i, g
    raise NotImplementedError((k_dim, b_bits))


def mma_c_coord(lane: int, i: int) -> tuple[int, int]:
    """(row m, col n) of accumulator element ``i`` (f32: c_i; f16: half i of the pairs)."""
    g, t = lane >> 2, lane % 4
    return g + 8 * (i >= 2), 2 * t + (i & 1)


# ---- wgmma (per warpgroup of 128 threads) ---------------------------------------------------
def wgmma_d_coord(thread: int, i: int) -> tuple[int, int]:
    w, lane = thread // 32, thread % 32
    g, t = lane >> 2, lane % 4
    return 16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)


def wgmma_a_reg_coord(a_bits: int, thread: int, i: int) -> tuple[int, int]:
    w, lane = thread // 32, thread % 32
    k_dim = 16 if a_bits == 16 else 32
    m, k = mma_a_coord(k_dim, a_bits, lane, i)
    return 16 * w + m, k


# ---- ldmatrix / stmatrix ---------------------------------------------------------------------
def ldmatrix_model(mem16: np.ndarray, row_addr: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """``regs[lane, j, e]``: the 16-bit element lane ``lane`` gets in element ``e`` of register ``j``.

    ``row_addr`` are byte addresses given by lanes; matrix ``j``'s row ``r`` is at
    ``row_addr[8j + r]``. Without .trans lane l gets (row l/4, col 2(l%4)+e); with .trans
    (row 2(l%4)+e, col l/4).
    """
    out = np.zeros((32, num, 2), dtype=mem16.dtype)
    for lane in range(32):
        for j in range(num):
            for e in range(2):
                if trans:
                    row, col = 2 * (lane % 4) + e, lane // 4
                else:
                    row, col = lane // 4, 2 * (lane % 4) + e
                out[lane, j, e] = mem16[row_addr[8 * j + row] // 2 + col]
    return out
