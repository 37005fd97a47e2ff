"""Lowered instructions of Blackwell's tensor cores (sm_100a): ``tcgen05`` and tensor memory.

A TMEM address is ``lane << 16 | column`` (``hexlayout.arch.tmem``); instructions take it as
an ``ExprLike`` (usually read from the shared word ``TmemAlloc`` wrote, plus an offset).

* ``TmemAlloc(dst, ncols)``: one warp allocates ``ncols`` columns (power of two, 32..512) and
  writes their address to the 32-bit shared word ``dst``; ``TmemDealloc(taddr, ncols)`` frees
  them; ``TmemRelinquish()`` gives up the right to allocate again (both by one warp).
* ``Tcgen05Mma(atom, d, a, b, accumulate)``: one thread issues ``D (+)= A @ B^T`` of a
  ``kind="tcgen05"`` atom with D at TMEM address ``d``, B a shared-memory descriptor and A a
  descriptor or a ``TmemRef``; ``accumulate`` 0 overwrites D (``enable_input_d``).
  A block-scaled atom (``scale_type`` "ue8m0") also takes ``sfa`` / ``sfb``, the TMEM addresses
  (lane 0, first column) of A's and B's scale factors, and ``sfa_id`` / ``sfb_id``, the byte
  (0..3) of those columns that holds this MMA's k-block (``hexlayout.arch.block_scale``).
* ``Tcgen05Cp(shape, taddr, src)``: one thread copies shared memory (descriptor ``src``) to TMEM
  at ``taddr`` (``hexlayout.arch.tcgen05_cp``), ordered before its later MMAs.
* ``Tcgen05Commit(bar, cta_group, multicast)``: one thread; ``bar`` gets one arrival once the
  thread's earlier MMAs and copies of the same ``cta_group`` completed; with ``multicast`` (a CTA
  mask of the cluster) the barrier at the same shared address of every CTA in the mask does.

``cta_group=2`` (alloc, dealloc, relinquish, commit; an MMA takes it from its atom): a pair of
CTAs of a cluster (ranks ``2p``, ``2p + 1``) works together. A warp of each CTA (the same warp)
allocates, and the columns are the same in both CTAs' TMEM; the even CTA's thread issues the MMA,
which reads each CTA's shared operands at the same offset in its own shared memory (A: its
``M/2`` rows; B: CTA ``c`` holds rows ``c N/2 ..``) and writes each CTA's ``M/2`` rows of D at the
same TMEM address in its own TMEM.
* ``Tcgen05Ld(shape, num, dst, taddr)`` / ``Tcgen05St(shape, num, taddr, src)``: a warp moves
  ``tcgen05.ld/st.{shape}.x{num}`` fragments (``hexlayout.arch.tmem.tmem_copy_layout``);
  ``half_split`` is ``immHalfSplitoff`` of ``16x32bx2`` (columns between the two halves).
* ``Tcgen05Wait(kind)``: ``wait::ld`` / ``wait::st`` of the warp; ``Tcgen05Fence(kind)``:
  ``fence::before_thread_sync`` / ``after_thread_sync``.

Shared-memory descriptors are the ``SmemDesc`` of wgmma (same fields; the sm_100a encoding
differs only in packing: ``hexlayout.arch.tcgen05.UmmaDescriptor``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .expr import ExprLike
from .lowered import Instr, MbarRef, RegRef, SharedRef, SmemDesc

__all__ = ["TmemRef", "TmemAlloc", "TmemDealloc", "TmemRelinquish", "Tcgen05Mma", "Tcgen05Cp",
           "Tcgen05Commit", "Tcgen05Ld", "Tcgen05St", "Tcgen05Wait", "Tcgen05Fence"]


@dataclass(eq=False)
class TmemRef:
    """An operand in tensor memory at address ``addr`` (``lane << 16 | column``)."""

    addr: ExprLike


@dataclass(eq=False)
class TmemAlloc(Instr):
    dst: SharedRef
    ncols: int
    cta_group: int = 1


@dataclass(eq=False)
class TmemDealloc(Instr):
    taddr: ExprLike
    ncols: int
    cta_group: int = 1


@dataclass(eq=False)
class TmemRelinquish(Instr):
    cta_group: int = 1


@dataclass(eq=False)
class Tcgen05Mma(Instr):
    atom: str
    d: ExprLike
    a: SmemDesc | TmemRef
    b: SmemDesc
    accumulate: ExprLike = 1
    sfa: ExprLike | None = None
    sfb: ExprLike | None = None
    sfa_id: int = 0
    sfb_id: int = 0


@dataclass(eq=False)
class Tcgen05Cp(Instr):
    shape: str
    taddr: ExprLike
    src: SmemDesc


@dataclass(eq=False)
class Tcgen05Commit(Instr):
    bar: MbarRef
    cta_group: int = 1
    multicast: ExprLike | None = None


@dataclass(eq=False)
class Tcgen05Ld(Instr):
    shape: str
    num: int
    dst: RegRef
    taddr: ExprLike
    half_split: int | None = None


@dataclass(eq=False)
class Tcgen05St(Instr):
    shape: str
    num: int
    taddr: ExprLike
    src: RegRef
    half_split: int | None = None


@dataclass(eq=False)
class Tcgen05Wait(Instr):
    kind: str  # "ld" or "st"


@dataclass(eq=False)
class Tcgen05Fence(Instr):
    kind: str  # "before_thread_sync" or "after_thread_sync"
