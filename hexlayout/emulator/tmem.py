"""Tensor memory (sm_100a) in the emulator: allocation, ``tcgen05.ld`` / ``st`` / ``wait``.

TMEM is its own memory per CTA: 128 lanes x 512 columns of 32-bit cells (``TmemState.cells``),
addressed ``lane << 16 | column``. The rules checked (each error names the instruction and its
source line):

* ``tcgen05.alloc`` of ``ncols`` columns: a power of two in [32, 512] that still fits (the
  hardware would block forever otherwise), by a whole warp, not after
  ``relinquish_alloc_permit``; the columns are the lowest free block aligned to ``ncols`` and
  their address is written to the shared word ``dst``;
* every cell a tcgen05 instruction touches lies in an allocated block;
* ``tcgen05.dealloc`` frees exactly an allocated block, only when no MMA into it is in
  flight and every ``tcgen05.ld`` that read it was waited for (``tcgen05.wait::ld``);
* at exit every block was deallocated and a CTA that allocated relinquished its permit;
* ``cta_group::2`` (a pair of CTAs of a cluster, ranks ``2p`` and ``2p + 1``): the same warp of
  each CTA allocates; the first of the two reserves the lowest block free in both CTAs' TMEM, the
  second joins it (same number of columns, same warp) and both get the same address. Until the
  second joins, its CTA's reserved columns are not usable (an MMA of the pair into them is an
  error); a CTA that exits with a reservation it never joined is an error. Each CTA deallocates
  its own columns. Every tcgen05 instruction of a CTA uses one ``cta_group``;
* ``tcgen05.ld`` / ``st`` by whole warps; warp ``w`` may access lanes ``32*(w%4)`` .. ``+31`` only;
  the destination registers of an ``ld`` are in flight until ``wait::ld`` (using them earlier is
  an ``AsyncHazardError``); a cell an MMA writes may be read only after the MMA's commit
  arrived on its mbarrier and the reading thread observed that (``emulator/tcgen05.py``);
* an MMA writing cells another thread read with ``tcgen05.ld`` must be ordered after that read:
  the reader's ``wait::ld``, its ``fence::before_thread_sync`` (the read's epoch is taken there),
  then a release the issuer acquired (a barrier; an mbarrier arrival the issuer waited on - for a
  pair's MMA, which writes both CTAs' TMEM, the odd CTA's readers' remote arrivals on the even
  CTA's barrier); else ``AsyncHazardError`` naming the reader (``check_loads_done``);
* a ``tcgen05.st`` is in flight until its warp's ``tcgen05.wait::st``: an MMA reading the cells
  as its A operand before that is an ``AsyncHazardError``, and so is one whose issuing thread has
  not observed the storing thread's progress at its ``wait::st`` (happens-before through a
  barrier or mbarrier, the race detector's vector clocks: ``wait::st``, ``fence::before_thread_sync``,
  barrier, ``fence::after_thread_sync``, then the issue; for a pair's MMA each CTA's stores, the odd
  CTA's through a cluster barrier), and so is one reading A cells no ``tcgen05.st`` wrote; a
  ``tcgen05.st`` into cells an in-flight MMA reads as its A operand (its commit has not landed) is
  an ``AsyncHazardError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexlayout.arch.tmem import TMEM_COLUMNS, TMEM_LANES, TMEM_SHAPES, tmem_copy_layout
from hexlayout.ir.lowered import Instr
from hexlayout.ir.lowered_tcgen05 import (
    Tcgen05Fence,
    Tcgen05Ld,
    Tcgen05St,
    Tcgen05Wait,
    TmemAlloc,
    TmemDealloc,
    TmemRelinquish,
)

from .errors import AsyncHazardError, IllegalInstructionError, OutOfBoundsError
from .machine import Active, Machine
from .tmem_order import TmemOrder
from .warps import whole_units

__all__ = ["HANDLERS", "TmemState", "tmem_state", "check_cells", "check_exit", "check_group", "pair_of",
           "check_a_stores", "check_loads_done"]


def _grid(dtype: type) -> np.ndarray:
    return np.zeros((TMEM_LANES, TMEM_COLUMNS), dtype=dtype)


@dataclass
class TmemState:
    cells: np.ndarray = field(default_factory=lambda: _grid(np.uint32))
    #: the cells once every issued MMA completed (what the next MMA accumulates onto)
    future: np.ndarray = field(default_factory=lambda: _grid(np.uint32))
    #: start column -> (ncols, the TmemAlloc)
    allocs: dict[int, tuple[int, Instr]] = field(default_factory=dict)
    relinquished: Instr | None = None
    allocated_by: Instr | None = None
    #: id of the in-flight MMA group that writes each cell (0: none)
    mma_pending: np.ndarray = field(default_factory=lambda: _grid(np.int64))
    #: the completed MMA that last wrote each cell (0: none); ``writers[id]``: (issuer's cluster-wide
    #: thread id, its epoch at the commit, instr)
    writer: np.ndarray = field(default_factory=lambda: _grid(np.int64))
    writers: dict[int, tuple[int, int, Instr]] = field(default_factory=dict)
    #: warp -> [(async op id, columns read, the Tcgen05Ld, register slice)] not yet waited for
    loads: dict[int, list[tuple[int, np.ndarray, Instr, Any]]] = field(default_factory=dict)
    #: cta_group::2 blocks the pair's CTA reserved here, not yet joined: start -> (ncols, warp, its alloc)
    joining: dict[int, tuple[int, int, Instr]] = field(default_factory=dict)
    #: the cta_group of this CTA's tcgen05 instructions and the first one that fixed it
    group: tuple[int, Instr] | None = None
    #: the tcgen05.st not yet waited for (wait::st) that wrote each cell (0: none), and per warp
    #: its stores ``(id, lanes [32, R], cols [32, R], threads [32], instr)``
    st_pending: np.ndarray = field(default_factory=lambda: _grid(np.int64))
    stores: dict[int, list[tuple[int, np.ndarray, np.ndarray, np.ndarray, Instr]]] = field(
        default_factory=dict)
    next_store: int = 1
    #: the instruction of each tcgen05.st
    st_instr: dict[int, Instr] = field(default_factory=dict)
    #: the in-flight MMA that reads each cell as its A operand (0: none)
    a_reading: np.ndarray = field(default_factory=lambda: _grid(np.int64))
    #: the last tcgen05.ld / tcgen05.st of each cell by cluster-wide thread id and the epoch an MMA
    #: must be ordered after (``tmem_order``: shared with the PTX executor)
    order: TmemOrder = field(default_factory=TmemOrder)


def tmem_state(m: Machine) -> TmemState:
    """The block's TMEM; fresh cells hold the poison byte pattern (0xFF: NaN), as fresh registers
    and shared memory do, so an MMA that accumulates onto never-written cells gives NaN."""

    def fresh() -> TmemState:
        st = TmemState()
        word = np.frombuffer(bytes([m.options.poison & 0xFF]) * 4, dtype=np.uint32)[0]
        st.cells.fill(word)
        st.future.fill(word)
        return st

    return m.family_state("tmem", fresh)


def check_cells(m: Machine, ins: Instr, lanes: np.ndarray, cols: np.ndarray, what: str) -> None:
    """Every cell ``(lanes[i], cols[i])`` exists and lies in an allocated block."""
    st = tmem_state(m)
    bad = (lanes < 0) | (lanes >= TMEM_LANES) | (cols < 0) | (cols >= TMEM_COLUMNS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        m.fail(OutOfBoundsError, ins, f"{what}: TMEM cell (lane {int(lanes[i])}, column {int(cols[i])}) is "
               f"outside the {TMEM_LANES} lanes x {TMEM_COLUMNS} columns of tensor memory",
               buffer="tmem", address=int(lanes[i]) << 16 | int(cols[i]))
    for start, (n, _warp, alloc) in st.joining.items():
        hit = (cols >= start) & (cols < start + n)
        if hit.any():
            m.fail(IllegalInstructionError, ins, f"{what}: TMEM columns [{start}, {start + n}) of block "
                   f"{m.block} are reserved by its pair's tcgen05.alloc.cta_group::2, but this CTA's warp "
                   "has not executed its own tcgen05.alloc.cta_group::2 yet (synchronize the pair after both "
                   "allocate, e.g. hl.cluster_sync())", buffer="tmem", address=start, other_instr=alloc)
    owned = np.zeros(TMEM_COLUMNS, dtype=bool)
    for start, (n, _) in st.allocs.items():
        owned[start:start + n] = True
    if not owned[cols].all():
        c = int(cols[np.flatnonzero(~owned[cols])[0]])
        m.fail(IllegalInstructionError, ins, f"{what}: TMEM column {c} is not allocated (tcgen05.alloc); "
               f"allocated: {_blocks(st) or 'none'}", buffer="tmem", address=c)


def _blocks(st: TmemState) -> str:
    return ", ".join(f"columns [{s}, {s + n})" for s, (n, _) in sorted(st.allocs.items()))


def check_group(m: Machine, ins: Instr, group: int, what: str) -> None:
    """``group`` (1 or 2) is the ``cta_group`` of every tcgen05 instruction this CTA ran so far."""
    if group not in (1, 2):
        m.fail(IllegalInstructionError, ins, f"{what}: cta_group {group} is not 1 or 2")
    st = tmem_state(m)
    if st.group is None:
        st.group = (group, ins)
    elif st.group[0] != group:
        m.fail(IllegalInstructionError, ins, f"{what} with cta_group::{group} in a CTA whose tcgen05 "
               f"instructions use cta_group::{st.group[0]} (every tcgen05 instruction of a kernel takes one "
               "cta_group)", other_instr=st.group[1])


def pair_of(m: Machine, ins: Instr, what: str) -> Machine:
    """The other CTA of ``m``'s pair (cluster ranks ``2p``, ``2p + 1``) for a cta_group::2 ``what``."""
    if (m.rank ^ 1) >= len(m.cluster):
        m.fail(IllegalInstructionError, ins, f"{what} with cta_group::2 runs on a pair of CTAs of one "
               f"cluster (ranks 2p and 2p+1), but block {m.block} is rank {m.rank} of a cluster of "
               f"{len(m.cluster)} CTA(s) (launch with cluster=(2, 1, 1) or a multiple)")
    return m.peer(m.rank ^ 1, ins, f"{what} with cta_group::2 (the pair's CTA)")


def _free_start(n: int, *states: TmemState) -> int | None:
    """The lowest ``n``-aligned start of ``n`` columns free in every state."""
    def free(st: TmemState, s: int) -> bool:
        taken = list(st.allocs.items()) + [(a, (k, None)) for a, (k, _w, _i) in st.joining.items()]
        return all(s + n <= a or a + k <= s for a, (k, _) in taken)

    return next((s for s in range(0, TMEM_COLUMNS, n) if all(free(st, s) for st in states)), None)


def tmem_alloc(m: Machine, ins: TmemAlloc, x: Active) -> None:
    if not len(x.tids):
        return
    st = tmem_state(m)
    check_group(m, ins, ins.cta_group, "tcgen05.alloc")
    for warp in whole_units(m, ins, x.tids, 32, "tcgen05.alloc"):
        n = ins.ncols
        if st.relinquished is not None:
            m.fail(IllegalInstructionError, ins, "tcgen05.alloc after tcgen05.relinquish_alloc_permit",
                   other_instr=st.relinquished)
        if n < 32 or n > TMEM_COLUMNS or n & (n - 1):
            m.fail(IllegalInstructionError, ins,
                   f"tcgen05.alloc of {n} columns: not a power of two in [32, {TMEM_COLUMNS}]")
        w = int(warp[0]) // 32
        if ins.cta_group == 2 and st.joining:      # the pair's CTA allocated first: join its block
            start = min(st.joining)
            k, pw, first = st.joining.pop(start)
            if (k, pw) != (n, w):
                m.fail(IllegalInstructionError, ins, f"tcgen05.alloc.cta_group::2 of {n} columns by warp "
                       f"{w}, but the pair's CTA allocated {k} columns by warp {pw} (the pair's warps "
                       "allocate together: same columns, same warp)", other_instr=first)
            st.allocs[start] = (n, ins)
        else:
            states = [st] if ins.cta_group == 1 else [st, tmem_state(pair_of(m, ins, "tcgen05.alloc"))]
            start = _free_start(n, *states)
            if start is None:
                full = next(s for s in states if _free_start(n, s) is None) if ins.cta_group == 2 else st
                used = sum(k for k, _ in full.allocs.values())
                where = "" if full is st else " in the pair's CTA"
                m.fail(IllegalInstructionError, ins, f"tcgen05.alloc of {n} columns with {used} of "
                       f"{TMEM_COLUMNS} in use{where} ({_blocks(full)}): no free block, the warp would wait "
                       "forever")
            st.allocs[start] = (n, ins)
            if ins.cta_group == 2:
                states[1].joining[start] = (n, w, ins)
        st.allocated_by = st.allocated_by or ins
        env = {**x.env, m.tvar: warp[:1]}
        addr = m.smem_addresses(ins.dst, env, warp[:1], 4, ins)
        idx = addr[:, None] + np.arange(4)
        m.smem_write(ins, warp[:1], idx, np.array([start], dtype=np.uint32).view(np.uint8)[None, :])


def _loads_of(st: TmemState, cols: np.ndarray) -> tuple[int, Instr] | None:
    for warp, lst in st.loads.items():
        for _ident, read, ld, _ref in lst:
            if np.isin(read, cols).any():
                return warp, ld
    return None


def tmem_dealloc(m: Machine, ins: TmemDealloc, x: Active) -> None:
    if not len(x.tids):
        return
    st = tmem_state(m)
    check_group(m, ins, ins.cta_group, "tcgen05.dealloc")
    whole_units(m, ins, x.tids, 32, "tcgen05.dealloc")
    taddr = m.ev_uniform(ins.taddr, x.env, ins, "tcgen05.dealloc address")
    start = taddr & 0xFFFF
    if st.allocs.get(start, (None,))[0] != ins.ncols or taddr >> 16:
        m.fail(IllegalInstructionError, ins, f"tcgen05.dealloc of {ins.ncols} columns at {taddr:#x}: not an "
               f"allocated block (allocated: {_blocks(st) or 'none'})", buffer="tmem", address=taddr)
    cols = np.arange(start, start + ins.ncols)
    busy = st.mma_pending[:, cols]
    if busy.any():
        m.fail(AsyncHazardError, ins, f"tcgen05.dealloc of columns [{start}, {start + ins.ncols}) while a "
               "tcgen05.mma into them is in flight (commit it and wait on its mbarrier first)")
    hit = _loads_of(st, cols)
    if hit is not None:
        m.fail(AsyncHazardError, ins, f"tcgen05.dealloc of columns [{start}, {start + ins.ncols}) before the "
               f"tcgen05.ld of warp {hit[0]} that reads them completed (tcgen05.wait::ld first)",
               other_instr=hit[1])
    del st.allocs[start]


def tmem_relinquish(m: Machine, ins: TmemRelinquish, x: Active) -> None:
    if len(x.tids):
        check_group(m, ins, ins.cta_group, "tcgen05.relinquish_alloc_permit")
        whole_units(m, ins, x.tids, 32, "tcgen05.relinquish_alloc_permit")
        tmem_state(m).relinquished = ins


def check_exit(m: Machine) -> None:
    """The block ends: its TMEM must be deallocated and its allocation permit relinquished."""
    st = m.state.get("tmem")
    if st is None:
        return
    if st.joining:
        start, (n, _w, ins) = min(st.joining.items())
        m.fail(IllegalInstructionError, ins, f"block {m.block} exits without joining the "
               f"tcgen05.alloc.cta_group::2 of columns [{start}, {start + n}) its pair's CTA made (the same "
               "warp of both CTAs allocates)", buffer="tmem", address=start)
    if st.allocs:
        start, (n, ins) = min(st.allocs.items())
        m.fail(IllegalInstructionError, ins, f"the block exits with TMEM columns [{start}, {start + n}) "
               "still allocated (tcgen05.dealloc them before the end)", buffer="tmem", address=start)
    if st.allocated_by is not None and st.relinquished is None:
        m.fail(IllegalInstructionError, st.allocated_by, "the block allocated tensor memory but exits "
               "without tcgen05.relinquish_alloc_permit")


def _fragment_cells(m: Machine, ins: Tcgen05Ld | Tcgen05St, warp: np.ndarray,
                    env: dict) -> tuple[np.ndarray, ...]:
    """``(lanes [32, R], cols [32, R])`` of the fragment of one warp, lane quarter checked."""
    if ins.shape not in TMEM_SHAPES:
        m.fail(IllegalInstructionError, ins, f"tcgen05 shape {ins.shape!r} is not one of "
               f"{', '.join(TMEM_SHAPES)}")
    s = TMEM_SHAPES[ins.shape]
    try:
        lay = tmem_copy_layout(ins.shape, ins.num)
    except ValueError as e:
        m.fail(IllegalInstructionError, ins, str(e))
    taddr = m.ev_uniform(ins.taddr, {**env, m.tvar: warp}, ins, "tcgen05.ld/st address")
    idx = lay.indices().reshape(-1, 32).T
    lane_off, col = idx % s.lanes, idx // s.lanes
    if ins.shape == "16x32bx2":
        split = ins.num if ins.half_split is None else ins.half_split
        col = np.where(col >= ins.num, col - ins.num + split, col)
    lanes, cols = (taddr >> 16) + lane_off, (taddr & 0xFFFF) + col
    q = int(warp[0]) // 32 % 4
    if (lanes < 32 * q).any() or (lanes >= 32 * q + 32).any():
        bad = int(lanes[(lanes < 32 * q) | (lanes >= 32 * q + 32)][0])
        m.fail(IllegalInstructionError, ins, f"warp {int(warp[0]) // 32} accesses TMEM lane {bad}, outside "
               f"its lane quarter [{32 * q}, {32 * q + 32}) (warp % 4 = {q})", thread=int(warp[0]),
               buffer="tmem", address=taddr)
    return lanes, cols


def _check_observed(m: Machine, ins: Instr, warp: np.ndarray, lanes: np.ndarray, cols: np.ndarray) -> None:
    """Cells an MMA writes are readable once its commit arrived and the reader observed it."""
    st = tmem_state(m)
    pend = st.mma_pending[lanes, cols]
    if pend.any():
        r, c = np.argwhere(pend)[0]
        op = m.async_ops.get(int(pend[r, c]))
        kind = "tcgen05.mma" if op is None else op.kind
        m.fail(AsyncHazardError, ins, f"tcgen05.ld reads TMEM cell (lane {int(lanes[r, c])}, column "
               f"{int(cols[r, c])}) that a {kind} writes before its tcgen05.commit arrived on the "
               "mbarrier (commit, then wait on the mbarrier and tcgen05.fence::after_thread_sync)",
               thread=int(warp[r]), buffer="tmem", other_instr=None if op is None else op.instr)
    if not m.options.check_races:
        return
    wr = st.writer[lanes, cols]
    clocks = m.shadow.clocks
    for ident in np.unique(wr[wr > 0]):
        issuer, epoch, mma = st.writers[int(ident)]
        seen = clocks.c[warp, issuer]
        rows = np.flatnonzero((wr == ident).any(axis=1) & (seen < epoch))
        if len(rows):
            m.fail(AsyncHazardError, ins, "tcgen05.ld reads an accumulator whose tcgen05.commit arrived, but "
                   f"thread {int(warp[rows[0]])} has not observed it (wait on the commit's mbarrier first)",
                   thread=int(warp[rows[0]]), buffer="tmem", other_instr=mma)


def _warp_cells(m: Machine, ins: Tcgen05Ld | Tcgen05St, x: Active, regs: Any, what: str,
                verb: str) -> Iterator[tuple[np.ndarray, dict[Any, Any], np.ndarray, np.ndarray]]:
    """Per whole warp of ``x`` executing the ``tcgen05.ld`` / ``st`` ``ins``: ``(warp, env, lanes,
    cols)``, the ``[32, R]`` TMEM cells of its fragment, each checked to be allocated, and its
    register slice ``regs`` checked to hold the ``R`` 32-bit registers per thread the access
    moves (``verb``: "load writes" / "store reads", for the error)."""
    for warp in whole_units(m, ins, x.tids, 32, what):
        env = {**x.env, m.tvar: warp}
        lanes, cols = _fragment_cells(m, ins, warp, env)
        check_cells(m, ins, lanes.reshape(-1), cols.reshape(-1), what)
        if m.reg_bytes_of(regs) != 4 * lanes.shape[1]:
            m.fail(IllegalInstructionError, ins, f"{what}.{ins.shape}.x{ins.num}: register slice "
                   f"{regs.array.name} holds {m.reg_bytes_of(regs)} bytes, the {verb} "
                   f"{lanes.shape[1]} 32-bit registers per thread")
        yield warp, env, lanes, cols


def tcgen05_ld(m: Machine, ins: Tcgen05Ld, x: Active) -> None:
    if not len(x.tids):
        return
    st = tmem_state(m)
    for warp, env, lanes, cols in _warp_cells(m, ins, x, ins.dst, "tcgen05.ld", "load writes"):
        _check_observed(m, ins, warp, lanes, cols)
        data = np.ascontiguousarray(st.cells[lanes, cols]).view(np.uint8).reshape(32, -1)
        m.write_reg_bytes(ins.dst, warp, env, ins, data)
        op = m.new_async("tcgen05.ld", ins, warp)
        lo, hi = m.reg_range(ins.dst, env, ins)
        m.regs.pending_marks(ins.dst.array, write=True)[warp, lo:hi] = op.ident
        st.loads.setdefault(int(warp[0]) // 32, []).append((op.ident, np.unique(cols), ins, ins.dst))
        st.order.load(int(warp[0]) // 32, lanes, cols, warp, m.shadow.clocks.off + warp)


def tcgen05_st(m: Machine, ins: Tcgen05St, x: Active) -> None:
    if not len(x.tids):
        return
    st = tmem_state(m)
    for warp, env, lanes, cols in _warp_cells(m, ins, x, ins.src, "tcgen05.st", "store reads"):
        if st.mma_pending[lanes, cols].any():
            m.fail(AsyncHazardError, ins, "tcgen05.st writes TMEM cells an in-flight tcgen05.mma writes")
        reading = st.a_reading[lanes, cols]
        if reading.any():
            r, c = np.argwhere(reading)[0]
            op = m.async_ops.get(int(reading[r, c]))
            m.fail(AsyncHazardError, ins, f"tcgen05.st writes TMEM cell (lane {int(lanes[r, c])}, column "
                   f"{int(cols[r, c])}), which an in-flight tcgen05.mma reads as its A operand (its "
                   "tcgen05.commit has not landed: wait on the commit's mbarrier before rewriting A)",
                   thread=int(warp[r]), buffer="tmem", other_instr=None if op is None else op.instr)
        raw = m.read_reg_bytes(ins.src, warp, env, ins)
        st.cells[lanes, cols] = np.ascontiguousarray(raw).view(np.uint32).reshape(lanes.shape)
        st.future[lanes, cols] = st.cells[lanes, cols]
        st.writer[lanes, cols] = 0
        ident = st.next_store
        st.next_store += 1
        st.st_pending[lanes, cols] = ident
        st.order.store(int(warp[0]) // 32, lanes, cols, warp, m.shadow.clocks.off + warp)
        st.st_instr[ident] = ins
        st.stores.setdefault(int(warp[0]) // 32, []).append((ident, lanes, cols, warp, ins))


def _wait_st(m: Machine, ins: Tcgen05Wait, x: Active) -> None:
    """``wait::st``: the warp's stores complete; each cell remembers its storing thread's epoch."""
    st = tmem_state(m)
    clocks = m.shadow.clocks
    for warp in whole_units(m, ins, x.tids, 32, "tcgen05.wait::st"):
        for ident, lanes, cols, _threads, _st in st.stores.pop(int(warp[0]) // 32, []):
            mine = st.st_pending[lanes, cols] == ident
            st.st_pending[lanes[mine], cols[mine]] = 0
        st.order.wait_st(int(warp[0]) // 32, dict(zip(warp.tolist(), clocks.epoch(warp).tolist())))


def check_a_stores(m: Machine, ins: Instr, issuer: int, lanes: np.ndarray, cols: np.ndarray,
                   what: str, owner: Machine | None = None) -> None:
    """The cells ``(lanes, cols)`` of the TMEM of ``owner`` (default ``m``; a pair's MMA reads each
    CTA's A in that CTA's TMEM) that an MMA issued by thread ``issuer`` of ``m`` reads as its A
    operand: each written by a ``tcgen05.st``, none still in flight (before its warp's ``wait::st``),
    and the issuer observed every storing thread's ``wait::st`` (module docstring; the clocks span
    the cluster, so the odd CTA's stores are observed through a cluster barrier)."""
    c = m if owner is None else owner
    st = tmem_state(c)
    pend = st.st_pending[lanes, cols]
    if pend.any():
        i = np.argwhere(pend)[0]
        m.fail(AsyncHazardError, ins, f"{what}: reads TMEM cell (lane {int(lanes[tuple(i)])}, column "
               f"{int(cols[tuple(i)])}) written by a tcgen05.st its warp has not waited for "
               "(tcgen05.wait::st, then a fenced barrier, before the MMA's issue)", thread=issuer,
               buffer="tmem",
               other_instr=st.st_instr.get(int(pend[tuple(i)])))
    by = st.order.st_by[lanes, cols]
    if (by == 0).any():
        i = np.argwhere(by == 0)[0]
        m.fail(AsyncHazardError, ins, f"{what}: reads TMEM cell (lane {int(lanes[tuple(i)])}, column "
               f"{int(cols[tuple(i)])}) that no tcgen05.st wrote (A in TMEM is stored before the "
               "MMA's issue, and the issuer synchronizes with the stores)", thread=issuer, buffer="tmem")
    if not m.options.check_races:
        return
    clocks = m.shadow.clocks
    u = st.order.unordered_store(lanes, cols, clocks.off + issuer, clocks.c[issuer])
    if u is not None:
        m.fail(AsyncHazardError, ins, f"{what}: reads TMEM cells thread {u.gid - c.shadow.clocks.off} stored "
               f"(tcgen05.st) without the issuing thread {issuer} synchronizing with it after its "
               "tcgen05.wait::st (tcgen05.fence::before_thread_sync, a barrier - a cluster barrier for "
               "the pair's other CTA - and tcgen05.fence::after_thread_sync before the issue)",
               thread=issuer, buffer="tmem")


def check_loads_done(m: Machine, ins: Instr, issuer: int, lanes: np.ndarray, cols: np.ndarray,
                     what: str, owner: Machine | None = None) -> None:
    """The cells ``(lanes, cols)`` of the TMEM of ``owner`` (default ``m``; a pair's MMA writes
    both CTAs') that an MMA issued by thread ``issuer`` of ``m`` writes: every ``tcgen05.ld`` of
    them by another thread was waited for (``wait::ld``), fenced (``fence::before_thread_sync``:
    the cell's epoch is its reader's at the fence) and that fence happened before the issue (a
    barrier, or an mbarrier arrival - a peer CTA's remote one included - that the issuer waited
    on: the clocks span the cluster) - else the MMA overwrites an accumulator still being read
    (an epilogue of the previous tile in another warp role, or in the pair's other CTA)."""
    if not m.options.check_races:
        return
    c = m if owner is None else owner
    st = tmem_state(c)
    clocks = m.shadow.clocks
    t = clocks.c.shape[0]
    u = st.order.unordered_load(lanes, cols, clocks.off + issuer, clocks.c[issuer])
    if u is not None:
        reader = (f"thread {u.gid - clocks.off}" if c is m else
                  f"thread {u.gid % t} of block {c.block} (cluster rank {u.gid // t})")
        m.fail(AsyncHazardError, ins, f"{what}: writes TMEM cell (lane {u.lane}, column {u.col}) that "
               f"{reader} reads with tcgen05.ld, without the issuing thread {issuer} of block {m.block} "
               f"being ordered after that read{u.why()} (its tcgen05.wait::ld, fence::before_thread_sync, "
               "then an arrive the issuer waits on, e.g. the accumulator's empty barrier - the even "
               "CTA's, for a pair's MMA)", thread=issuer, buffer="tmem")


def tcgen05_wait(m: Machine, ins: Tcgen05Wait, x: Active) -> None:
    if not len(x.tids):
        return
    if ins.kind == "st":
        _wait_st(m, ins, x)
        return
    if ins.kind != "ld":
        return
    st = tmem_state(m)
    for warp in whole_units(m, ins, x.tids, 32, "tcgen05.wait::ld"):
        st.order.wait_ld(int(warp[0]) // 32)    # completed; ordered for other threads once fenced
        for ident, _cols, _ld, ref in st.loads.pop(int(warp[0]) // 32, []):
            marks = m.regs.pending_write.get(ref.array)
            if marks is not None:
                rows = marks[warp]
                rows[rows == ident] = 0
                marks[warp] = rows
            m.async_ops.pop(ident, None)


def tcgen05_fence(m: Machine, ins: Tcgen05Fence, x: Active) -> None:
    """``fence::before_thread_sync``: the executing threads' completed loads (``wait::ld``) take
    their epochs now, so a later release (barrier, arrive) orders them before its observers."""
    if ins.kind not in ("before_thread_sync", "after_thread_sync"):
        m.fail(IllegalInstructionError, ins, f"tcgen05.fence::{ins.kind} is not before_thread_sync or "
               "after_thread_sync")
    if ins.kind != "before_thread_sync" or not len(x.tids):
        return
    st = tmem_state(m)
    clocks = m.shadow.clocks
    for w in np.unique(x.tids // 32):
        st.order.fence(int(w), x.tids, clocks.epoch(x.tids))


HANDLERS = {TmemAlloc: tmem_alloc, TmemDealloc: tmem_dealloc, TmemRelinquish: tmem_relinquish,
            Tcgen05Ld: tcgen05_ld, Tcgen05St: tcgen05_st, Tcgen05Wait: tcgen05_wait,
            Tcgen05Fence: tcgen05_fence}
