"""Tensor memory and the ``tcgen05`` instructions (sm_100a, PTX ISA "TensorCore 5th Generation
Family Instructions"), executed from the printed PTX with the semantics of the IR emulator
(``hexlayout.emulator.tcgen05`` / ``tmem``).

**Tensor memory** (TMEM): per CTA 128 lanes x 512 columns of 32-bit cells, filled with the poison
``0xFFFFFFFF`` (NaN as f32); an address is ``lane << 16 | column`` (``arch.tmem``).

* ``tcgen05.alloc.cta_group::G.sync.aligned.shared::cta.b32 [a], n`` (a whole warp): the lowest
  ``n``-aligned block of ``n`` free columns (``n`` a power of two in [32, 512]); its address is
  written to the 4 shared bytes at ``a``. With ``cta_group::2`` the block is free in both CTAs of
  the pair (cluster ranks ``2p``, ``2p + 1``) and reserved in the other one until its warp
  allocates too. ``tcgen05.dealloc ... taddr, n`` frees an allocated block (not while an MMA
  writing it is in flight); ``tcgen05.relinquish_alloc_permit``: no later alloc. A CTA that ends
  with columns allocated, or that allocated and did not relinquish, is an error.
* ``tcgen05.mma.cta_group::G.kind::K [d], a, b, idesc, {[sfa], [sfb],} p`` (each executing
  thread issues one): ``a`` / ``b`` are 64-bit shared-memory descriptors (``arch.tcgen05.
  UmmaDescriptor``, read as wgmma's canonical layouts) or ``a`` is a TMEM address ``[a]``;
  ``idesc`` is decoded bit by bit (``InstrDescriptor`` for kind::f16 / kind::f8f6f4,
  ``InstrDescriptorBlockScaled`` for kind::mxf8f6f4 / mxf4 / mxf4nvf4 ``.block_scale``): types, M,
  N, majors, negation. ``K = 256 / bits(A)`` (e2m1: 64, packed two per byte, ``arch.fp4``). Then
  ``D (+)= A @ B^T`` (float64, rounded once to f32) into the cells of ``accumulator_layout(M, N,
  G)`` at ``d`` (``p``: accumulate). Block-scaled, ``VS`` K elements per factor (the qualifier:
  ``.scale_vec::1X`` / ``2X`` / ``.block32``: 32, ``.scale_vec::4X`` / ``.block16``: 16), ``K / VS``
  factors per row: ``D[m, n] (+)= sum_k A[m, k] SFA[m, k // VS] B[n, k] SFB[n, k // VS]`` with
  ``SFA[m, j]`` the byte ``a_sf_id + j`` of column ``sfa + m // 32`` in lane ``m`` and, for the rows
  of lane quarter ``q``, ``SFB[n, j]`` the byte ``b_sf_id + j`` of column ``sfb + n // 32`` in lane
  ``32 q + n % 32``, decoded as the descriptor's UE8M0 or UE4M3. ``cta_group::2`` (issued
  from the even CTA): CTA ``c`` of the pair reads its own ``M/2`` rows of A and ``N/2`` rows of
  B at the same shared offsets, and gets ``D_c (+)= A_c @ [B_0; B_1]^T`` in its own TMEM.
* Asynchrony: the result is computed at issue (the shared operands are read then; touching
  bytes a TMA copy has not landed is an error) but stays *in flight*: its D cells are pending,
  a ``tcgen05.ld`` / ``tcgen05.st`` / dealloc of them is an error, and a write into the shared
  bytes it read (a store, a TMA copy issued into them) is an error, until it completes. It
  completes through ``tcgen05.commit.cta_group::G.mbarrier::arrive::one{.shared::cluster}
  {.multicast::cluster}.b64 [mbar]{, ctaMask}``: the issuing thread's uncommitted MMAs and copies
  (and those of its earlier commits not landed yet: a commit tracks every earlier one) complete,
  and the barrier (of each CTA of ``ctaMask`` with ``.multicast``) gets one arrival,
  when that arrival lands: like a TMA copy, as late as the program allows (when a thread waits
  on the barrier, or nothing else can run). A later MMA of the same thread accumulating into
  pending cells chains onto the pending result (the hardware runs a thread's MMAs in order).
* ``tcgen05.cp.cta_group::G.{shape} [taddr], sdesc``: the shared rows of the descriptor (K-major,
  ``arch.tcgen05_cp.cp_smem_addresses``) to the TMEM cells of ``tmem_cp_layout(shape)``; in
  flight until a commit, ordered before the same thread's later MMAs (which read its result);
  another thread reading its cells earlier is an error.
* An A operand in TMEM (``[a]``, ``arch.tmem.operand_a_layout``: the accumulator's lanes, ``32 /
  bits`` elements per column): its cells are read at issue (pending only by the issuing thread's
  own earlier ops) and stay read until the MMA completes; a ``tcgen05.st`` into them before that
  is an error.
* ``tcgen05.ld`` / ``tcgen05.st .sync.aligned.{shape}.xN.b32`` (a whole warp): registers from /
  to ``tmem_copy_layout(shape, N)`` at the address, which must lie in the warp's lane quarter
  (``warp % 4``); loads and stores are performed at issue, ``tcgen05.wait::ld`` / ``wait::st``
  and ``tcgen05.fence::before_thread_sync`` order them (below); ``fence::after_thread_sync``: no
  effect on the CPU.
* Ordering, by the vector clocks of ``ptx.clocks`` (barriers, mbarrier arrivals and waits, cluster
  barriers, ``bar.warp.sync``) and the rules the IR emulator checks (``emulator.tmem_order``,
  shared with it), each a ``PtxRaceError`` at the instruction: an MMA writing cells that another
  thread (of either CTA of a pair) read with ``tcgen05.ld`` unless that read was waited for
  (``wait::ld``), fenced (``fence::before_thread_sync``) and released to the issuer (a barrier, an
  arrival the issuer waited on: the accumulator's empty barrier); a ``tcgen05.ld`` of cells whose
  MMA's commit arrived by a thread that has not observed the arrival (acquired the barrier's
  phase); an MMA reading A cells a ``tcgen05.st`` wrote before that store's ``wait::st``, or after
  it but unordered with the storing thread; a ``tcgen05.dealloc`` of columns a load not yet
  waited for reads. The clocks are cumulative per barrier (a waiter acquires every release so
  far), which can hide a missing release, never report a false one.

* The destination registers of a ``tcgen05.ld`` are in flight until its warp's ``wait::ld``: an
  instruction reading one before is a ``PtxRaceError`` naming the load (``Machine.pend_regs``).

Not modelled: sparse and ``.ws`` MMAs, f16 accumulators, kind::tf32 / i8, kind::mxf8f6f4 with
e2m1 / e2m3 / e3m2 operands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexlayout.arch.block_scale import decode_factors
from hexlayout.arch.fp4 import from_e2m1, unpack_fp4
from hexlayout.arch.tcgen05 import (
    InstrDescriptor,
    InstrDescriptorBlockScaled,
    UmmaDescriptor,
    umma_desc_addresses,
)
from hexlayout.arch.tcgen05_cp import CP_SHAPES, cp_smem_addresses, tmem_cp_layout
from hexlayout.arch.tmem import TMEM_COLUMNS, TMEM_LANES, TMEM_SHAPES, accumulator_layout, tmem_copy_layout
from hexlayout.emulator.tmem_order import TmemOrder

from . import clocks as hb
from .alu import _reg
from .errors import PtxError, PtxIllegalInstructionError, PtxOutOfBoundsError, PtxRaceError
from .machine import Machine
from .mbarrier import barrier_index, pend_commit
from .parse import Addr, Imm, Instruction, Vec
from .warp import _ELEM, warps_of

__all__ = ["TmemCta", "tmem_of", "check_exit", "check_mma_reads"]

POISON = np.uint32(0xFFFFFFFF)
_BITS = {"f16": 16, "bf16": 16, "e4m3": 8, "e5m2": 8, "e2m1": 4}
#: block-scaled MMA qualifiers -> K elements per factor (``block16`` / ``block32``: the newer spelling)
_SCALE_VEC = {"scale_vec::1X": 32, "scale_vec::2X": 32, "scale_vec::4X": 16, "block32": 32, "block16": 16}
_VEC_OF_KIND = {"mxf8f6f4": ("scale_vec::1X", "block32"), "mxf4": ("scale_vec::2X", "block32"),
                "mxf4nvf4": ("scale_vec::2X", "scale_vec::4X", "block32", "block16")}


def _scale_vec(m: Machine, t: int, kind: str, parts: Any) -> int:
    """K elements per scale factor of a block-scaled MMA, from its qualifier (checked against the
    kind: 1X mxf8f6f4, 2X mxf4 / mxf4nvf4, 4X mxf4nvf4)."""
    given = [p for p in parts if p in _SCALE_VEC]
    if len(given) != 1:
        raise _fail(m, t, f"tcgen05.mma.kind::{kind}.block_scale: give one scale-vector qualifier "
                    f"({' or '.join('.' + q for q in _VEC_OF_KIND[kind])})")
    if given[0] not in _VEC_OF_KIND[kind]:
        raise _fail(m, t, f"tcgen05.mma.kind::{kind}.block_scale.{given[0]}: kind::{kind} takes "
                    f"{' or '.join('.' + q for q in _VEC_OF_KIND[kind])}")
    return _SCALE_VEC[given[0]]


@dataclass
class TmemCta:
    """One CTA's tensor memory: ``cells`` (what a ``tcgen05.ld`` reads), ``future`` (with every
    issued MMA / copy applied), ``pending`` (id of the in-flight op writing a cell, 0 none)."""

    cells: np.ndarray = field(default_factory=lambda: np.full((TMEM_LANES, TMEM_COLUMNS), POISON, np.uint32))
    future: np.ndarray = field(default_factory=lambda: np.full((TMEM_LANES, TMEM_COLUMNS), POISON, np.uint32))
    pending: np.ndarray = field(default_factory=lambda: np.zeros((TMEM_LANES, TMEM_COLUMNS), np.int64))
    #: id of the in-flight MMA reading a cell as its A operand (0 none)
    a_reading: np.ndarray = field(default_factory=lambda: np.zeros((TMEM_LANES, TMEM_COLUMNS), np.int64))
    allocs: dict[int, tuple[int, Instruction]] = field(default_factory=dict)
    joining: dict[int, tuple[int, int, Instruction]] = field(default_factory=dict)
    allocated_by: Instruction | None = None
    relinquished: Instruction | None = None
    group: tuple[int, Instruction] | None = None
    #: the tcgen05.ld / st of each cell an MMA must be ordered with (shared with the IR emulator)
    order: TmemOrder = field(default_factory=TmemOrder)
    #: the completed op that last wrote each cell (0: none); ``writers[id]``: (issuer's clock column,
    #: its epoch at the commit, the instruction)
    writer: np.ndarray = field(default_factory=lambda: np.zeros((TMEM_LANES, TMEM_COLUMNS), np.int64))
    writers: dict[int, tuple[int, int, Instruction]] = field(default_factory=dict)
    #: per warp, the tcgen05.ld / st not yet waited for (``wait::ld`` / ``wait::st``)
    loads: dict[int, tuple[Instruction, int]] = field(default_factory=dict)
    stores: dict[int, tuple[Instruction, int]] = field(default_factory=dict)


@dataclass
class _Op:
    """An in-flight MMA or copy: the cells it writes in each CTA, the shared bytes it read."""

    ident: int
    kind: str
    thread: int
    ins: Instruction
    writes: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]  # (block, lanes, cols, values)
    reads: np.ndarray  # flat smem indices
    done: bool = False
    #: an A operand in TMEM: (block, lanes, cols) it reads
    a_reads: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)


def _state(m: Machine) -> dict[str, Any]:
    st = getattr(m, "tcgen05", None)
    if st is None:
        st = m.tcgen05 = {
            "tmem": {},
            "ops": {},
            "uncommitted": {},
            "committed": {},  # (thread, cta_group) -> the ops of its commits (landed ones are done)
            "next": 1,  # type: ignore[attr-defined]
            "reading": np.zeros(m.smem.size, dtype=np.int32),  # per shared byte: in-flight readers
            "in_flight": 0,
            "check_reads": check_mma_reads,  # machine.Machine.check_mma_reads calls it (no import back)
        }
    return st


def tmem_of(m: Machine, b: int) -> TmemCta:
    """The TMEM of block ``b`` of the batch."""
    return _state(m)["tmem"].setdefault(b, TmemCta())


def _fail(
    m: Machine, t: int, msg: str, cls: type[PtxError] = PtxIllegalInstructionError, **kw: Any
) -> PtxError:
    return cls(f"{m.ins.opcode}: {msg}", **m.where(t), **kw)


def _group(m: Machine, ins: Instruction, t: int) -> int:
    g = next((p for p in ins.parts if p.startswith("cta_group::")), "cta_group::1")
    group = int(g.split("::")[1])
    if group not in (1, 2):
        raise _fail(m, t, f"cta_group {group} is not 1 or 2")
    st = tmem_of(m, int(m.blk[t]))
    if st.group is None:
        st.group = (group, ins)
    elif st.group[0] != group:
        raise _fail(
            m,
            t,
            f"cta_group::{group} in a CTA whose tcgen05 instructions use cta_group::"
            f"{st.group[0]} (PTX line {st.group[1].line}): a kernel takes one cta_group",
        )
    return group


def _peer(m: Machine, t: int) -> int:
    """The batch block index of the other CTA of thread ``t``'s pair."""
    b = int(m.blk[t])
    rank = int(m.crank[b])
    if (rank ^ 1) >= m.csize:
        raise _fail(
            m,
            t,
            f"cta_group::2 runs on a pair of CTAs of one cluster (ranks 2p, 2p+1), but the "
            f"cluster has {m.csize} CTA(s) (launch with a cluster of 2 or a multiple)",
        )
    return int(m.cta_of_rank[b, rank ^ 1])


def _blocks_text(st: TmemCta) -> str:
    return ", ".join(f"columns [{s}, {s + n})" for s, (n, _) in sorted(st.allocs.items())) or "none"


def _check_cells(m: Machine, t: int, b: int, lanes: np.ndarray, cols: np.ndarray, what: str) -> None:
    """Every cell exists and lies in a block allocated (and joined) by CTA ``b``."""
    st = tmem_of(m, b)
    lanes, cols = lanes.reshape(-1), cols.reshape(-1)
    bad = (lanes < 0) | (lanes >= TMEM_LANES) | (cols < 0) | (cols >= TMEM_COLUMNS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(
            m,
            t,
            f"{what}: TMEM cell (lane {int(lanes[i])}, column {int(cols[i])}) is outside the "
            f"{TMEM_LANES} lanes x {TMEM_COLUMNS} columns of tensor memory",
            PtxOutOfBoundsError,
            buffer="tmem",
            address=int(lanes[i]) << 16 | int(cols[i]),
        )
    for start, (n, _w, _i) in st.joining.items():
        if ((cols >= start) & (cols < start + n)).any():
            raise _fail(
                m,
                t,
                f"{what}: TMEM columns [{start}, {start + n}) are reserved by the pair's "
                "tcgen05.alloc.cta_group::2, but this CTA's warp has not allocated them yet",
            )
    owned = np.zeros(TMEM_COLUMNS, dtype=bool)
    for start, (n, _) in st.allocs.items():
        owned[start : start + n] = True
    if not owned[cols].all():
        c = int(cols[np.flatnonzero(~owned[cols])[0]])
        raise _fail(
            m, t, f"{what}: TMEM column {c} is not allocated (tcgen05.alloc); allocated: {_blocks_text(st)}"
        )


# --- allocation ----------------------------------------------------------------------------------


def _free_start(n: int, *states: TmemCta) -> int | None:
    def free(st: TmemCta, s: int) -> bool:
        taken = [(a, k) for a, (k, _) in st.allocs.items()] + [
            (a, k) for a, (k, _w, _i) in st.joining.items()
        ]
        return all(s + n <= a or a + k <= s for a, k in taken)

    return next((s for s in range(0, TMEM_COLUMNS, n) if all(free(st, s) for st in states)), None)


def _alloc(m: Machine, ins: Instruction, warps: np.ndarray) -> None:
    for warp in warps:
        t = int(warp[0])
        b = int(m.blk[t])
        st = tmem_of(m, b)
        group = _group(m, ins, t)
        n = m.uniform(ins.operands[1], warp, "tcgen05.alloc column count")
        if st.relinquished is not None:
            raise _fail(
                m, t, f"alloc after tcgen05.relinquish_alloc_permit (PTX line {st.relinquished.line})"
            )
        if n < 32 or n > TMEM_COLUMNS or n & (n - 1):
            raise _fail(m, t, f"{n} columns: not a power of two in [32, {TMEM_COLUMNS}]")
        w = int(m.tid[t]) // 32
        if group == 2 and st.joining:  # the pair's CTA allocated first: join its block
            start = min(st.joining)
            k, pw, _first = st.joining.pop(start)
            if (k, pw) != (n, w):
                raise _fail(
                    m,
                    t,
                    f"{n} columns by warp {w}, but the pair's CTA allocated {k} columns by warp "
                    f"{pw} (the pair's warps allocate together: same columns, same warp)",
                )
            st.allocs[start] = (n, ins)
        else:
            states = [st] if group == 1 else [st, tmem_of(m, _peer(m, t))]
            got = _free_start(n, *states)
            if got is None:
                used = sum(k for k, _ in st.allocs.values())
                raise _fail(
                    m,
                    t,
                    f"{n} columns with {used} of {TMEM_COLUMNS} in use ({_blocks_text(st)}): "
                    "no free block, the warp would wait forever",
                )
            start = got
            st.allocs[start] = (n, ins)
            if group == 2:
                states[1].joining[start] = (n, w, ins)
        st.allocated_by = st.allocated_by or ins
        addr = m.address(ins.operands[0], warp[:1])
        m.store(
            "shared",
            addr,
            np.array([start], dtype=np.uint32).view(np.uint8)[None, :],
            warp[:1],
            "tcgen05.alloc",
        )


def _dealloc(m: Machine, ins: Instruction, warps: np.ndarray) -> None:
    for warp in warps:
        t = int(warp[0])
        st = tmem_of(m, int(m.blk[t]))
        _group(m, ins, t)
        taddr = m.uniform(ins.operands[0], warp, "tcgen05.dealloc address")
        n = m.uniform(ins.operands[1], warp, "tcgen05.dealloc column count")
        start = taddr & 0xFFFF
        if st.allocs.get(start, (None,))[0] != n or taddr >> 16:
            raise _fail(
                m, t, f"{n} columns at {taddr:#x}: not an allocated block (allocated: {_blocks_text(st)})"
            )
        if st.pending[:, start : start + n].any():
            raise _fail(
                m,
                t,
                f"columns [{start}, {start + n}) while a tcgen05.mma / cp into them is in "
                "flight (commit it and wait on its mbarrier first)",
                PtxRaceError,
            )
        w = st.order.load_in_flight(np.arange(start, start + n))
        if w is not None:
            ld, lw = st.loads[w]
            raise _fail(m, t, f"columns [{start}, {start + n}) before the tcgen05.ld of warp {lw} (PTX line "
                        f"{ld.line}) that reads them completed (tcgen05.wait::ld first)", PtxRaceError,
                        buffer="tmem")
        del st.allocs[start]


def check_exit(m: Machine) -> None:
    """The blocks of the batch ended: their TMEM must be deallocated and the permit relinquished."""
    for b, st in sorted(_state(m)["tmem"].items()) if getattr(m, "tcgen05", None) is not None else []:
        blk = m.blocks[b]
        for what, ins in (
            (
                f"block {blk} exits with TMEM {_blocks_text(st)} still allocated "
                "(tcgen05.dealloc them before the end)",
                next(iter(st.allocs.values()), (0, None))[1],
            ),
            (
                f"block {blk} exits without joining the tcgen05.alloc.cta_group::2 its pair's CTA made",
                next(iter(st.joining.values()), (0, 0, None))[2],
            ),
            (
                f"block {blk} allocated tensor memory but exits without tcgen05.relinquish_alloc_permit",
                st.allocated_by if st.relinquished is None else None,
            ),
        ):
            if ins is not None:
                raise PtxIllegalInstructionError(what, kernel=m.kernel, site=m.site(ins))


# --- MMA and copy ------------------------------------------------------------------------------------


def _desc(m: Machine, op: Any, t: int, what: str) -> UmmaDescriptor:
    v = int(np.asarray(m.read(op, "u64", np.array([t]))).astype(np.uint64)[0])
    try:
        d = UmmaDescriptor.decode(v)
    except ValueError as e:
        raise _fail(m, t, f"{what} descriptor: {e}") from None
    if d.base_offset:
        raise m.unsupported(f"{what} descriptors with a base offset ({d.base_offset})")
    if isinstance(d.swizzle, str):
        raise m.unsupported(f"{what} descriptors with layout type {d.swizzle}")
    return d


def _smem_flat(m: Machine, b: int, addr: np.ndarray, nbytes: int, t: int, what: str) -> np.ndarray:
    """Flat ``smem`` indices ``[n, nbytes]`` of shared offsets ``addr`` in block ``b``, checked."""
    addr = addr.astype(np.int64).reshape(-1)
    if (addr < 0).any() or (addr + nbytes > m.smem_size).any():
        a = int(addr[(addr < 0) | (addr + nbytes > m.smem_size)][0])
        raise _fail(
            m,
            t,
            f"{what} at shared address {a}: the block has {m.smem_size} bytes of shared memory",
            PtxOutOfBoundsError,
            buffer="shared",
            address=a,
        )
    at = (b * m.smem_size + addr)[:, None] + np.arange(nbytes)
    m.check_tma_pending(at, np.full(len(at), t), f"{m.ins.opcode} {what}")
    return at


def _operand(
    m: Machine, b: int, d: UmmaDescriptor, major: str, dt: str, rows: int, k: int, t: int, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """``([rows, k]`` float64 values, flat byte indices) of a descriptor operand in block ``b``; e2m1
    is packed two per byte (``arch.fp4``): ``k / 2`` bytes a row, read as an 8-bit operand."""
    if dt == "e2m1":
        at = _smem_flat(m, b, umma_desc_addresses(d, major, 8, rows, k // 2), 1, t, what)
        return from_e2m1(unpack_fp4(m.smem[at].reshape(rows, k // 2))), at.reshape(-1)
    bits = _BITS[dt]
    at = _smem_flat(m, b, umma_desc_addresses(d, major, bits, rows, k), bits // 8, t, what)
    raw = m.smem[at].reshape(-1).view(np.uint8 if bits == 8 else np.uint16)
    return raw.view(_ELEM[dt]).astype(np.float64).reshape(rows, k), at.reshape(-1)


def _acc_cells(
    m: Machine, t: int, b: int, base: int, M: int, N: int, G: int, what: str
) -> tuple[np.ndarray, ...]:
    try:
        lay = accumulator_layout(M, N, G)
    except ValueError as e:
        raise _fail(m, t, str(e)) from None
    rows = M // G
    addr = lay.indices().reshape(N, rows).T
    lanes, cols = (base >> 16) + (addr >> 16), (base & 0xFFFF) + (addr & 0xFFFF)
    _check_cells(m, t, b, lanes, cols, what)
    return lanes, cols


def _readable(m: Machine, t: int, b: int, lanes: np.ndarray, cols: np.ndarray, what: str) -> np.ndarray:
    """The ``future`` words of cells an MMA issued by thread ``t`` reads (TMEM A, scale factors):
    pending only by thread ``t``'s own earlier ops (ordered before it)."""
    _check_cells(m, t, b, lanes, cols, what)
    st = tmem_of(m, b)
    pend = st.pending[lanes, cols]
    ops = _state(m)["ops"]
    for ident in np.unique(pend[pend > 0]):
        op = ops[int(ident)]
        if op.thread != t:
            raise _fail(
                m,
                t,
                f"{what}: reads TMEM cells that thread {op.thread}'s {op.kind} (PTX line "
                f"{op.ins.line}) writes before it completed (commit it and wait on its mbarrier)",
                PtxRaceError,
                buffer="tmem",
            )
    _check_observed(m, np.array([t]), st, lanes.reshape(1, -1), cols.reshape(1, -1), f"{what}: ")
    return st.future[lanes, cols]


def _scales(m: Machine, t: int, b: int, op: Any, byte: int, nsf: int, scale_type: str, M: int, N: int,
            role: str) -> np.ndarray:
    """The factors (bytes ``byte .. byte + nsf - 1`` of each cell, decoded as ``scale_type``): ``[M,
    nsf]`` for A, ``[M // 32, N, nsf]`` (one per lane quarter) for B."""
    base = int(np.asarray(m.address(op, np.array([t])))[0])
    if base >> 16:
        raise _fail(m, t, f"{role} scale factors at TMEM address {base:#x}: not at lane 0")
    if role == "A":
        r = np.arange(M)
        lanes, cols = r, base + r // 32
    else:
        q = np.arange(M // 32)[:, None]
        n = np.arange(N)[None, :]
        lanes, cols = (
            np.broadcast_to(32 * q + n % 32, (M // 32, N)),
            np.broadcast_to(base + n // 32, (M // 32, N)),
        )
    words = _readable(m, t, b, lanes, cols, f"{role} scale factors")[..., None]
    e = (words >> (np.uint32(8) * (byte + np.arange(nsf, dtype=np.uint32)))) & np.uint32(0xFF)
    return decode_factors(e, scale_type)


def _new_op(m: Machine, kind: str, t: int, group: int) -> _Op:
    s = _state(m)
    op = _Op(s["next"], kind, t, m.ins, [], np.zeros(0, dtype=np.int64))
    s["next"] += 1
    s["ops"][op.ident] = op
    s["uncommitted"].setdefault((t, group), []).append(op)
    return op


def _pend(m: Machine, op: _Op, b: int, lanes: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
    st = tmem_of(m, b)
    st.future[lanes, cols] = vals
    st.pending[lanes, cols] = op.ident
    op.writes.append((b, lanes, cols, vals))


def _mma_one(m: Machine, ins: Instruction, t: int) -> None:
    parts = ins.parts
    group = _group(m, ins, t)
    kind = next((p.split("::")[1] for p in parts if p.startswith("kind::")), "")
    scaled = "block_scale" in parts
    if (
        kind not in ("f16", "f8f6f4", "mxf8f6f4", "mxf4", "mxf4nvf4")
        or kind.startswith("mx") != scaled
        or "ws" in parts
        or "sp" in parts
    ):
        raise m.unsupported()
    vs = _scale_vec(m, t, kind, parts) if scaled else 0
    ops = ins.operands
    idesc = int(np.asarray(m.read(ops[3], "u32", np.array([t]))).astype(np.uint32)[0])
    try:
        if scaled:
            dd: Any = InstrDescriptorBlockScaled.decode(idesc, kind, vs)
        else:
            if idesc & 0b111:
                raise ValueError("sparse MMAs are not modelled (bits 0..2 are not 0)")
            dd = InstrDescriptor.decode(idesc, kind)
    except (ValueError, KeyError) as e:
        raise _fail(m, t, f"instruction descriptor {idesc:#010x}: {e}") from None
    if not scaled and dd.d_dtype.name != "f32":
        raise m.unsupported("f16 accumulators")
    at, bt = dd.a_dtype.name, dd.b_dtype.name
    M, N, K = dd.m, dd.n, 256 // _BITS[at]
    blocks = [int(m.blk[t])]
    if group == 2:
        if int(m.crank[blocks[0]]) % 2:
            raise _fail(
                m,
                t,
                f"cta_group::2 issued from the odd CTA of its pair (cluster rank "
                f"{int(m.crank[blocks[0]])}); the even CTA issues the pair's MMA",
            )
        blocks.append(_peer(m, t))
    rows_a, rows_b = M // group, N // group
    a_tmem = isinstance(ops[1], Addr)
    bdesc = _desc(m, ops[2], t, "B")
    adesc = None if a_tmem else _desc(m, ops[1], t, "A")
    a_base = int(m.address(ops[1], np.array([t]))[0]) if a_tmem else 0
    d_base = int(m.address(ops[0], np.array([t]))[0])
    acc = (
        bool(np.asarray(m.read(ops[-1], "pred", np.array([t])), dtype=bool).reshape(-1)[0])
        if not isinstance(ops[-1], Imm)
        else bool(ops[-1].value)
    )
    As, Bs, reads, a_reads = [], [], [], []
    for b in blocks:
        if a_tmem:
            lanes, cols = _acc_cells(m, t, b, a_base, rows_a, K * _BITS[at] // 32, 1, "A")
            words = _readable(m, t, b, lanes, cols, "A")
            a_reads.append((b, lanes, cols))
            A = np.ascontiguousarray(words).view(_ELEM[at]).astype(np.float64).reshape(rows_a, K)
        else:
            A, ra = _operand(m, b, adesc, dd.a_major, at, rows_a, K, t, "A")  # type: ignore[arg-type]
            reads.append(ra)
        B, rb = _operand(m, b, bdesc, dd.b_major, bt, rows_b, K, t, "B")
        reads.append(rb)
        As.append(-A if dd.negate_a else A)
        Bs.append(-B if dd.negate_b else B)
    B = np.concatenate(Bs, axis=0)
    if scaled:
        if group == 2:
            raise m.unsupported("block-scaled cta_group::2 MMAs")
        nsf = K // vs
        sa = _scales(m, t, blocks[0], ops[4], dd.a_sf_id, nsf, dd.scale_type, M, N, "A")
        sb = _scales(m, t, blocks[0], ops[5], dd.b_sf_id, nsf, dd.scale_type, M, N, "B")
        sa, sb = np.repeat(sa, vs, axis=-1), np.repeat(sb, vs, axis=-1)
    op = _new_op(m, "tcgen05.mma", t, group)
    op.a_reads = a_reads
    for b, lanes, cols in a_reads:          # A's cells stay read until the MMA completes
        tmem_of(m, b).a_reading[lanes, cols] = op.ident
    for b, lanes, cols in a_reads:
        _check_a_stores(m, t, b, lanes, cols)
    for b, A in zip(blocks, As):
        lanes, cols = _acc_cells(m, t, b, d_base, M, N, group, "D")
        _check_loads_done(m, t, b, lanes, cols)
        pend = tmem_of(m, b).pending[lanes, cols]
        others = [o for o in np.unique(pend[pend > 0]) if _state(m)["ops"][int(o)].thread != t]
        if others:
            raise _fail(m, t, "D: TMEM cells another thread's in-flight tcgen05 op writes", PtxRaceError)
        if scaled:                          # factors per K element: sa [M, K], sb [M // 32, N, K]
            As_ = A * sa
            D = np.concatenate([As_[32 * q : 32 * q + 32] @ (B * sb[q]).T for q in range(M // 32)])
        else:
            D = A @ B.T
        if acc:
            D = D + tmem_of(m, b).future[lanes, cols].view(np.float32)
        _pend(m, op, b, lanes, cols, D.astype(np.float32).view(np.uint32))
    op.reads = np.concatenate(reads) if reads else op.reads
    _state(m)["reading"][op.reads] += 1
    _state(m)["in_flight"] += 1


def _cp_one(m: Machine, ins: Instruction, t: int) -> None:
    group = _group(m, ins, t)
    shape = next((s for s in CP_SHAPES if ins.opcode.endswith("." + s) or f".{s}." in ins.opcode + "."), None)
    if (
        shape is None
        or group != 1
        or any(p.startswith("multicast") or p in ("b6x16_p32", "b4x16_p64") for p in ins.parts)
    ):
        raise m.unsupported()
    b = int(m.blk[t])
    taddr = int(m.address(ins.operands[0], np.array([t]))[0])
    d = _desc(m, ins.operands[1], t, "source")
    at = _smem_flat(m, b, cp_smem_addresses(d, shape).reshape(-1), 1, t, "source")
    s = CP_SHAPES[shape]
    words = m.smem[at.reshape(-1)].reshape(s.rows, s.words * 4).view(np.uint32)  # [rows, words]
    lay = tmem_cp_layout(shape)
    reps = lay.shape[2]
    off = np.array(
        [[[lay(r, w, q) for q in range(reps)] for w in range(s.words)] for r in range(s.rows)], dtype=np.int64
    )
    lanes, cols = (taddr >> 16) + (off >> 16), (taddr & 0xFFFF) + (off & 0xFFFF)
    _check_cells(m, t, b, lanes, cols, "destination")
    op = _new_op(m, "tcgen05.cp", t, group)
    _pend(
        m, op, b, lanes.reshape(-1), cols.reshape(-1), np.repeat(words[:, :, None], reps, axis=2).reshape(-1)
    )
    op.reads = at.reshape(-1)
    _state(m)["reading"][op.reads] += 1
    _state(m)["in_flight"] += 1


def check_mma_reads(m: Machine, at: np.ndarray, threads: np.ndarray, what: str) -> None:
    """Writing shared bytes (flat ``at``) that an in-flight tcgen05.mma / cp reads is an error."""
    s = getattr(m, "tcgen05", None)
    if s is None or not s["in_flight"]:
        return
    bad = s["reading"][at] > 0
    if bad.any():
        i, j = np.argwhere(np.atleast_2d(bad))[0]
        flat = int(np.atleast_2d(at)[i, j])
        op = next(o for o in s["ops"].values() if not o.done and (o.reads == flat).any())
        t = int(np.broadcast_to(np.asarray(threads).reshape(-1, 1), np.atleast_2d(at).shape)[i, j])
        raise PtxRaceError(
            f"{what} writes shared byte {flat % m.smem_size}, which the {op.kind} issued at PTX "
            f"line {op.ins.line} by thread {op.thread} still reads (it completes when its "
            "tcgen05.commit arrives: wait on that mbarrier first)",
            buffer="shared",
            address=flat % m.smem_size,
            **m.where(t),
        )


def _complete(m: Machine, ops: list[_Op], by: tuple[int, int] | None = None) -> None:
    """The ``ops`` complete (a commit landed): their results become the cells; ``by``: the
    committing thread's clock column and its epoch at the commit, which a reader of the cells
    must have observed (``_check_observed``)."""
    s = _state(m)
    for op in ops:
        if op.done:
            continue
        op.done = True
        for b, lanes, cols, vals in op.writes:
            st = tmem_of(m, b)
            mine = st.pending[lanes, cols] == op.ident
            st.cells[lanes[mine], cols[mine]] = vals[mine]
            st.pending[lanes[mine], cols[mine]] = 0
            if by is not None:
                st.writer[lanes[mine], cols[mine]] = op.ident
                st.writers[op.ident] = (by[0], by[1], op.ins)
        for b, lanes, cols in op.a_reads:
            st = tmem_of(m, b)
            mine = st.a_reading[lanes, cols] == op.ident
            st.a_reading[lanes[mine], cols[mine]] = 0
        s["reading"][op.reads] -= 1
        s["in_flight"] -= 1
        s["ops"].pop(op.ident, None)


def _commit(m: Machine, ins: Instruction, t: int) -> None:
    group = _group(m, ins, t)
    if "mbarrier::arrive::one" not in ins.parts:
        raise m.unsupported()
    s = _state(m)
    # a commit tracks every earlier MMA and copy of the thread (PTX ISA): those of its earlier
    # commits that have not landed complete with it too (first: issue order)
    prior = [op for op in s["committed"].get((t, group), []) if not op.done]
    ops = prior + s["uncommitted"].pop((t, group), [])
    s["committed"][(t, group)] = ops
    key = int(barrier_index(m, ins, ins.operands[0], np.array([t]))[0])
    keys = [key]
    if "multicast::cluster" in ins.parts:
        mask = m.uniform(ins.operands[1], np.array([t]), "tcgen05.commit ctaMask")
        b = key // m.smem_size  # the block whose barrier the address names
        off = key % m.smem_size
        keys = []
        for r in range(m.csize):
            if mask >> r & 1:
                tb = int(m.cta_of_rank[b, r])
                if tb < 0:
                    raise _fail(m, t, f"ctaMask {mask:#x} names CTA rank {r}, not in the cluster")
                keys.append(tb * m.smem_size + off)
        if not keys:
            raise _fail(m, t, "ctaMask 0 arrives on no barrier")
    rel = hb.release(m, np.array([t]), None)   # the commit's arrival publishes the issuer's clock
    by = None if rel is None else (int(m.clocks.col[t]), int(rel[m.clocks.col[t]]))  # type: ignore[attr-defined]
    for k in keys:
        pend_commit(m, k, lambda ops=ops: _complete(m, ops, by), t, rel)


# --- loads and stores ----------------------------------------------------------------------------


def _fragment(m: Machine, ins: Instruction, warp: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """``(lanes [32, R], cols [32, R], registers)`` of a ``tcgen05.ld`` / ``st`` of one warp."""
    t = int(warp[0])
    shape = next((p for p in ins.parts if p in TMEM_SHAPES), None)
    num = next((int(p[1:]) for p in ins.parts if p.startswith("x") and p[1:].isdigit()), 1)
    if shape is None or "b32" not in ins.parts or "pack::16b" in ins.parts or "unpack::16b" in ins.parts:
        raise m.unsupported()
    try:
        lay = tmem_copy_layout(shape, num)
    except ValueError as e:
        raise _fail(m, t, str(e)) from None
    is_ld = ins.parts[1] == "ld"
    regs_op, addr_op = (ins.operands[0], ins.operands[1]) if is_ld else (ins.operands[1], ins.operands[0])
    regs = list(regs_op.items) if isinstance(regs_op, Vec) else [regs_op]
    if shape == "16x32bx2":
        raise m.unsupported("tcgen05.ld/st.16x32bx2")
    s = TMEM_SHAPES[shape]
    if len(regs) != s.regs * num:
        raise _fail(m, t, f"{len(regs)} registers, .{shape}.x{num} moves {s.regs * num} per thread")
    a = m.address(addr_op, warp)
    if (a != a[0]).any():
        raise _fail(m, t, "the TMEM address differs between the lanes of the warp")
    taddr = int(a[0])
    idx = lay.indices().reshape(-1, 32).T
    lanes, cols = (taddr >> 16) + idx % s.lanes, (taddr & 0xFFFF) + idx // s.lanes
    q = int(m.tid[t]) // 32 % 4
    out = (lanes < 32 * q) | (lanes >= 32 * q + 32)
    if out.any():
        raise _fail(
            m,
            t,
            f"warp {int(m.tid[t]) // 32} accesses TMEM lane {int(lanes[out][0])}, outside its lane "
            f"quarter [{32 * q}, {32 * q + 32}) (warp % 4 = {q})",
            buffer="tmem",
            address=taddr,
        )
    _check_cells(m, t, int(m.blk[t]), lanes, cols, "tcgen05." + ins.parts[1])
    return lanes, cols, regs


def _in_flight(m: Machine, warp: np.ndarray, lanes: np.ndarray, cols: np.ndarray, marks: np.ndarray,
               why: str) -> None:
    """A ``PtxRaceError`` at the first cell of ``(lanes, cols)`` an in-flight op marks in ``marks``
    (``why``: the message after the cell, with ``{op}`` and ``{line}``)."""
    hit = marks[lanes, cols]
    if hit.any():
        r, c = np.argwhere(hit)[0]
        op = _state(m)["ops"][int(hit[r, c])]
        raise _fail(m, int(warp[r]), f"TMEM cell (lane {int(lanes[r, c])}, column {int(cols[r, c])}) "
                    + why.format(op=op.kind, line=op.ins.line), PtxRaceError, buffer="tmem")


def _ld_st(m: Machine, ins: Instruction, warps: np.ndarray) -> None:
    for warp in warps:
        t = int(warp[0])
        st = tmem_of(m, int(m.blk[t]))
        lanes, cols, regs = _fragment(m, ins, warp)
        _in_flight(m, warp, lanes, cols, st.pending, "is written by the {op} at PTX line {line}, whose "
                   "tcgen05.commit has not arrived (commit, wait on the mbarrier, "
                   "tcgen05.fence::after_thread_sync)")
        if ins.parts[1] == "st":
            _in_flight(m, warp, lanes, cols, st.a_reading, "is still read as its A operand by the {op} "
                       "at PTX line {line} (its tcgen05.commit has not arrived: wait on that mbarrier "
                       "before rewriting A)")
        key, w = int(m.warp[t]), int(m.tid[t]) // 32
        clk = getattr(m, "clocks", None)
        if ins.parts[1] == "ld":
            _check_observed(m, warp, st, lanes, cols)
            for j, r in enumerate(regs):
                m.write(r, "b32", warp, st.cells[lanes[:, j], cols[:, j]])
            m.pend_regs([r.name for r in regs], warp, ins)
            if clk is not None:
                st.order.load(key, lanes, cols, warp, clk.col[warp])
                st.loads[key] = (ins, w)
        else:
            vals = np.stack([np.asarray(m.read(r, "b32", warp)).astype(np.uint32) for r in regs], axis=1)
            st.cells[lanes, cols] = vals
            st.future[lanes, cols] = vals
            st.writer[lanes, cols] = 0
            if clk is not None:
                st.order.store(key, lanes, cols, warp, clk.col[warp])
                st.stores[key] = (ins, w)


def _wait(m: Machine, ins: Instruction, warps: np.ndarray) -> None:
    """``wait::ld`` / ``wait::st`` of whole warps: their loads (stores) completed; the cells of a
    load become ordered for other threads at its threads' ``fence::before_thread_sync``, those of a
    store take the storing threads' epochs now (``emulator.tmem_order``)."""
    kind = ins.parts[1]
    if kind not in ("wait::ld", "wait::st"):
        raise m.unsupported()
    clk = getattr(m, "clocks", None)
    for warp in warps:
        t = int(warp[0])
        st, key = tmem_of(m, int(m.blk[t])), int(m.warp[t])
        if kind == "wait::ld":
            m.clear_pending(warp)
            st.order.wait_ld(key)
            st.loads.pop(key, None)
        elif clk is not None:
            st.order.wait_st(key, dict(zip(warp.tolist(), clk.epoch(warp).tolist())))
            st.stores.pop(key, None)


def _fence(m: Machine, threads: np.ndarray) -> None:
    """``fence::before_thread_sync`` by ``threads``: their waited loads take their epochs now, so a
    later release (barrier, arrive) orders the loads before its observers."""
    clk = getattr(m, "clocks", None)
    if clk is None:
        return
    for key in np.unique(m.warp[threads]):
        mine = threads[m.warp[threads] == key]
        tmem_of(m, int(m.blk[mine[0]])).order.fence(int(key), mine, clk.epoch(mine))


def _who(m: Machine, b: int, g: int) -> str:
    """Clock column ``g`` of block ``b``'s cluster, in words."""
    rank, tid = divmod(g, m.ntid)
    peer = int(m.cta_of_rank[b, rank])
    return f"thread {tid}" + ("" if peer == b else f" of block {m.blocks[peer]} (cluster rank {rank})")


def _check_observed(m: Machine, warp: np.ndarray, st: TmemCta, lanes: np.ndarray, cols: np.ndarray,
                    what: str = "") -> None:
    """The threads ``warp`` (row ``i`` reads the cells ``lanes[i], cols[i]``: a ``tcgen05.ld``, or
    the issuer of an MMA reading A / scale factors in TMEM) read cells a completed MMA / copy wrote:
    each observed its commit's arrival (acquired a clock holding the committing thread's epoch
    there)."""
    clk = getattr(m, "clocks", None)
    if clk is None or m.races is None:
        return
    wr = st.writer[lanes, cols]
    for ident in np.unique(wr[wr > 0]):
        g, epoch, mma = st.writers[int(ident)]
        rows = np.flatnonzero((wr == ident).any(axis=1) & (clk.c[warp, g] < epoch))
        if len(rows):
            r = int(warp[rows[0]])
            kind = mma.opcode.split(".")[1]
            raise _fail(m, r, f"{what}reads TMEM cells that the tcgen05.{kind} at PTX line {mma.line} wrote, "
                        f"whose tcgen05.commit arrived, but thread {int(m.tid[r])} has not observed that "
                        "arrival (wait on the commit's mbarrier first)", PtxRaceError, buffer="tmem")


def _check_loads_done(m: Machine, t: int, b: int, lanes: np.ndarray, cols: np.ndarray) -> None:
    """An MMA issued by thread ``t`` writes the cells ``(lanes, cols)`` of block ``b``'s TMEM: every
    ``tcgen05.ld`` of them by another thread was waited for, fenced (``fence::before_thread_sync``)
    and that fence happened before the issue (a release the issuer acquired: the accumulator's
    empty barrier) - else the MMA overwrites an accumulator still being read."""
    clk = getattr(m, "clocks", None)
    if clk is None or m.races is None:
        return
    st = tmem_of(m, b)
    u = st.order.unordered_load(lanes, cols, int(clk.col[t]), clk.c[t])
    if u is None:
        return
    where = "" if b == int(m.blk[t]) else f" of block {m.blocks[b]} (the pair's other CTA)"
    raise _fail(m, t, f"D: writes TMEM cell (lane {u.lane}, column {u.col}){where} that "
                f"{_who(m, int(m.blk[t]), u.gid)} reads with tcgen05.ld, without the issuing thread "
                f"{int(m.tid[t])} being ordered after that read{u.why()} (the reader's tcgen05.wait::ld, "
                "tcgen05.fence::before_thread_sync, then an arrive the issuer waits on, e.g. the "
                "accumulator's empty barrier - the even CTA's, for a pair's MMA)", PtxRaceError,
                buffer="tmem")


def _check_a_stores(m: Machine, t: int, b: int, lanes: np.ndarray, cols: np.ndarray) -> None:
    """An MMA issued by thread ``t`` reads the cells as its A operand: no ``tcgen05.st`` into them
    is still in flight (before its warp's ``wait::st``), and ``t`` is ordered after every other
    storing thread's ``wait::st`` (fence::before_thread_sync, a barrier, fence::after_thread_sync)."""
    clk = getattr(m, "clocks", None)
    if clk is None or m.races is None:
        return
    st = tmem_of(m, b)
    u = st.order.store_in_flight(lanes, cols)
    if u is not None:           # in flight: not even the storing thread itself may read it yet
        raise _fail(m, t, f"A: reads TMEM cell (lane {u.lane}, column {u.col}) written by a tcgen05.st of "
                    f"{_who(m, b, u.gid)} whose warp has not run tcgen05.wait::st", PtxRaceError,
                    buffer="tmem")
    u = st.order.unordered_store(lanes, cols, int(clk.col[t]), clk.c[t])
    if u is not None:
        raise _fail(m, t, f"A: reads TMEM cells {_who(m, b, u.gid)} stored (tcgen05.st) without the issuing "
                    f"thread {int(m.tid[t])} synchronizing with it after its tcgen05.wait::st "
                    "(tcgen05.fence::before_thread_sync, a barrier, tcgen05.fence::after_thread_sync before "
                    "the issue)", PtxRaceError, buffer="tmem")


@_reg("tcgen05")
def _tcgen05(m: Machine, ins: Instruction, idx: Any) -> None:
    op = ins.parts[1].split("::")[0]
    threads = np.arange(m.T)[idx]
    if op == "fence":
        if ins.parts[1] not in ("fence::before_thread_sync", "fence::after_thread_sync"):
            raise m.unsupported()
        if ins.parts[1] == "fence::before_thread_sync":
            _fence(m, threads)
        return
    if op in ("mma", "cp", "commit"):
        fn = {"mma": _mma_one, "cp": _cp_one, "commit": _commit}[op]
        for t in threads:
            fn(m, ins, int(t))
        return
    warps, _ = warps_of(m, idx, ins.opcode)
    if op == "alloc":
        _alloc(m, ins, warps)
    elif op == "dealloc":
        _dealloc(m, ins, warps)
    elif op == "relinquish_alloc_permit":
        for w in warps:
            _group(m, ins, int(w[0]))
            tmem_of(m, int(m.blk[int(w[0])])).relinquished = ins
    elif op in ("ld", "st"):
        _ld_st(m, ins, warps)
    elif op == "wait":  # loads and stores are performed at issue; the waits order them
        _wait(m, ins, warps)
    else:
        raise m.unsupported()
