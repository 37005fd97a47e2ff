"""A register A operand of ``tcgen05.mma`` staged through shared memory (sm_100a).

tcgen05.mma reads A from shared memory (a descriptor) or tensor memory, never from registers.
When synthesis feeds a register A through shared memory (``umma_choice``'s A-source cost model),
the threads that run the op store the tile into a buffer the lowering allocates and the ``_SS``
atom reads it through its descriptor. ``smem_a_stage(m, k, bits, threads)`` chooses both sides
of those stores:

* the shared layout of one ``m x k`` buffer: K-major, the canonical tcgen05 / wgmma layout
  ``tile_to_shape(gmma_smem_atom(bits, "K", W), (m, k))`` with the widest swizzle ``W`` in
  {128, 64, 32} bytes that divides a row of ``k * bits / 8`` bytes (the descriptor's layout type);
* the register layout of A: ``e = min(128 / bits, ...)`` consecutive K elements per vector (the
  widest ``st.shared`` whose count ``m * k / e`` the threads share evenly), vector ``j = t + T r``
  of thread ``t`` (``T`` threads, repeat ``r``) at row ``j // (k / e)``, chunk ``j % (k / e)``:
  register ``(t, r * e + i)`` holds element ``(j // (k/e), (j % (k/e)) * e + i)``. Eight
  consecutive threads (one phase of 16-byte stores) write eight consecutive chunks of one or
  two W-byte atom rows, which the swizzle keeps in eight distinct 16-byte bank groups: the
  stores are conflict-free.

Example:
    >>> s = smem_a_stage(64, 64, 16, 128)
    >>> (s.swizzle, s.vector_elems, s.stores, s.nbytes)
    (128, 8, 4, 8192)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hexlayout.arch.gmma import gmma_smem_atom
from hexlayout.layout import ComposedLayout, Layout, coalesce, tile_to_shape
from hexlayout.layout.tv_maps import fit_tv

__all__ = ["SmemOperandStage", "smem_a_stage"]


@dataclass(frozen=True)
class SmemOperandStage:
    """How a register A of ``m x k`` ``bits``-bit elements reaches a ``_SS`` tcgen05.mma through
    shared memory: one buffer's ``layout`` (``swizzle`` bytes, K-major), A's ``register_tv`` over
    ``threads`` threads, ``stores`` ``st.shared`` of ``vector_elems`` elements per thread."""

    m: int
    k: int
    bits: int
    threads: int
    swizzle: int
    vector_elems: int
    layout: ComposedLayout
    register_tv: Layout

    @property
    def stores(self) -> int:
        """``st.shared`` per thread per execution of the op."""
        return self.m * self.k // (self.vector_elems * self.threads)

    @property
    def nbytes(self) -> int:
        """Bytes of one buffer (the ring holds several)."""
        return self.m * self.k * self.bits // 8

    def __str__(self) -> str:
        return (f"{self.m}x{self.k} K-major, {self.swizzle}-byte swizzle, {self.stores} "
                f"st.shared.b{self.vector_elems * self.bits} per thread")


def smem_a_stage(m: int, k: int, bits: int, threads: int) -> SmemOperandStage | None:
    """The staging of the module docstring (None: no canonical K-major layout holds the tile,
    or the threads cannot share its elements evenly)."""
    row = k * bits // 8
    swz = next((w for w in (128, 64, 32) if row % w == 0), None)
    if swz is None or bits not in (8, 16, 32) or m % 8:
        return None
    try:
        lay = tile_to_shape(gmma_smem_atom(bits, "K", swz), (m, k))
    except ValueError:
        return None
    e = 128 // bits
    while e >= 1 and (k % e or (m * k // e) % threads):
        e //= 2
    if e < 1:
        return None
    ck = k // e
    reps = m * k // (e * threads)
    t = np.arange(threads)[:, None, None]
    r = np.arange(reps)[None, :, None]
    i = np.arange(e)[None, None, :]
    j = t + threads * r
    table = (j // ck + m * ((j % ck) * e + i)).reshape(threads, reps * e)
    tv = fit_tv(table)
    if tv is None:
        return None
    return SmemOperandStage(m, k, bits, threads, swz, e, lay, coalesce(tv, (1, 1)))
