"""Conflict-free shared-memory row layouts: XOR swizzles and padded row strides.

A shared tile with rows of ``row_bytes`` bytes is accessed in 16-byte chunks. Chunk ``c``
of row ``r`` starts at byte ``a(r, c)`` and falls in bank group ``(a >> 4) mod 8`` (8
groups of 16 bytes per 128-byte line). A layout is conflict-free for the two access
patterns of tiled copies when

- an ldmatrix phase (8 consecutive rows of one chunk column, rows aligned to 8) and
- a coalesced vector phase (8 consecutive chunks in row-major order)

each touch 8 distinct bank groups.

- ``conflict_free_swizzles``: every ``Swizzle<B, M, S>`` on element offsets with
  ``M = log2(16 / elem_bytes)`` (whole chunks move), ``S >= B``, whose period
  ``2^(B+M+S)`` divides the tile's element count (so the swizzle permutes the tile's own
  offsets ``[0, rows*row_elems)``; a 48 x 80 f16 tile, 3840 elements, admits periods up to
  256), that makes both patterns conflict-free (checked exhaustively over the 32 ``(B, S)``).
- ``chunk_swizzles``: every ``Swizzle<B, M, S>`` that moves whole 16-byte chunks
  (``B >= 1``, ``M`` as above, ``S >= B``) and permutes the tile's own offsets, whatever
  the access patterns: the candidates for accesses neither pattern above describes (a
  transpose writes rows and reads columns: rows ``8a + v`` of one chunk column must land in
  distinct bank groups, which ``Swizzle<3, M, log2(8 * row_elems)>`` does). Which of them
  is conflict-free is decided by counting the conflicts of the actual accesses (the cost
  model), not here.
- ``conflict_free_padding``: the smallest row padding ``P`` (elements) with 16-byte
  aligned rows of ``row_bytes + P * elem_bytes`` bytes that makes the ldmatrix phase
  conflict-free, solved with z3 (an ``Optimize`` over the integer padding with the bank
  groups of the 8 rows ``Distinct``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from hexlayout.layout import Swizzle

__all__ = ["conflict_free_swizzles", "chunk_swizzles", "conflict_free_padding", "phase_groups"]


def phase_groups(byte_addr: np.ndarray) -> np.ndarray:
    """16-byte bank group of each chunk start."""
    return (byte_addr >> 4) & 7


def _conflict_free(addr_of: object, rows: int, chunks: int) -> bool:
    r = np.arange(rows)[:, None]
    c = np.arange(chunks)[None, :]
    a = addr_of(r, c)                                  # type: ignore[operator]
    g = phase_groups(a)
    for r0 in range(0, rows - rows % 8 if rows >= 8 else 0, 8):
        block = g[r0:r0 + 8]                           # [8 rows, chunks]
        if any(len(set(block[:, j].tolist())) != 8 for j in range(chunks)):
            return False
    flat = g.reshape(-1)
    for j0 in range(0, flat.size - flat.size % 8, 8):
        if len(set(flat[j0:j0 + 8].tolist())) != 8:
            return False
    return True


@lru_cache(maxsize=128)
def conflict_free_swizzles(row_bytes: int, rows: int, elem_bits: int) -> tuple[Swizzle, ...]:
    eb = elem_bits // 8
    if eb < 1 or 16 % eb or row_bytes % 16 or rows < 1:
        return ()
    m_bits = (16 // eb).bit_length() - 1
    chunks = row_bytes // 16
    tile_elems = row_bytes * rows // eb
    out = []
    for b in range(4):
        for s in range(b, 8):
            if b and tile_elems % (1 << (b + m_bits + s)):
                continue                                # the period must tile the buffer exactly
            sw = Swizzle(b, m_bits, s)

            def addr(r: np.ndarray, c: np.ndarray, sw: Swizzle = sw) -> np.ndarray:
                return sw((r * row_bytes + 16 * c) // eb) * eb

            if _conflict_free(addr, min(rows, 64), chunks):
                out.append(sw)
            if b == 0:
                break                                   # without bits the shift is irrelevant
    return tuple(out)


@lru_cache(maxsize=128)
def chunk_swizzles(row_bytes: int, rows: int, elem_bits: int) -> tuple[Swizzle, ...]:
    """Every chunk-moving swizzle of a ``rows x row_bytes`` tile (see the module docstring),
    most bits first, then by shift."""
    eb = elem_bits // 8
    if eb < 1 or 16 % eb or row_bytes % 16 or rows < 1:
        return ()
    m_bits = (16 // eb).bit_length() - 1
    tile_elems = row_bytes * rows // eb
    return tuple(Swizzle(b, m_bits, s) for b in (3, 2, 1) for s in range(b, 16)
                 if tile_elems % (1 << (b + m_bits + s)) == 0)


@lru_cache(maxsize=128)
def conflict_free_padding(row_bytes: int, elem_bits: int, max_pad_bytes: int = 128) -> int | None:
    """Smallest padding (elements) per row making 8 consecutive rows' chunks hit 8 groups."""
    import z3

    eb = elem_bits // 8
    if eb < 1:
        return None
    p = z3.Int("pad")
    opt = z3.Optimize()
    opt.add(p >= 0, p * eb <= max_pad_bytes, (row_bytes + p * eb) % 16 == 0)
    stride = row_bytes + p * eb
    opt.add(z3.Distinct(*[((r * stride) / 16) % 8 for r in range(8)]))
    opt.minimize(p)
    if opt.check() != z3.sat:
        return None
    return opt.model()[p].as_long()
