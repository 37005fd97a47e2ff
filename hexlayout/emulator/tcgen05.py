"""``tcgen05.mma`` and ``tcgen05.commit`` (sm_100a) in the emulator.

``Tcgen05Mma``: one thread issues ``D (+)= A @ B^T`` of a ``kind="tcgen05"`` atom. A and B are
read from shared memory at issue through their descriptors (the canonical layouts of wgmma,
``wgmma._desc_operand``; the fields must also fit the sm_100a encoding) or A from TMEM; D is
the atom's accumulator in TMEM at the address ``d`` (``arch.tmem.accumulator_layout``). The
result is computed at issue but stays *in flight*: the D cells are marked with the MMA until it
completes, and so are the shared bytes it reads (writing them earlier is an error). It
completes only through ``Tcgen05Commit``: an arrival on the mbarrier that lands like a TMA
transfer (``mbarrier.py``), i.e. when some thread waits on that barrier. Then the result
reaches TMEM, and a ``tcgen05.ld`` may read it if the reading thread observed the commit
(happens-before through the mbarrier wait or a later barrier, checked with the race detector's
vector clocks). An MMA accumulating into cells of an earlier in-flight one chains onto its
result (the hardware runs a thread's MMAs in order).

``cta_group::2`` (a pair of CTAs) is not emulated: such an atom is an error here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hexlayout.arch.tcgen05 import UmmaDescriptor
from hexlayout.arch.tmem import accumulator_layout
from hexlayout.ir.lowered import Instr, SmemDesc
from hexlayout.ir.lowered_tcgen05 import Tcgen05Commit, Tcgen05Mma, TmemRef

from . import mbarrier
from .errors import IllegalInstructionError
from .machine import Active, AsyncOp, Machine
from .mma import finish_accumulator, instruction_atom
from .numerics import atom_numpy, to_compute
from .proxy import check_async_read
from .tmem import check_cells, tmem_state
from .wgmma import _desc_operand

__all__ = ["HANDLERS"]

_SWIZZLE_BYTES = {0: 0, 1: 128, 2: 64, 3: 32}  # SmemDesc.swizzle (PTX wgmma layout type) -> bytes


@dataclass
class _Issued:
    uncommitted: dict[int, list[AsyncOp]] = field(default_factory=dict)  # issuing thread -> its MMAs


def _cells(m: Machine, ins: Instr, base: int, rows: int, cols: int, m_atom: int, what: str
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(lanes, columns)`` ``[rows, cols]`` of a TMEM matrix in the accumulator layout at ``base``."""
    addr = accumulator_layout(m_atom, cols).indices().reshape(cols, rows).T
    lanes, columns = (base >> 16) + (addr >> 16), (base & 0xFFFF) + (addr & 0xFFFF)
    check_cells(m, ins, lanes.reshape(-1), columns.reshape(-1), what)
    return lanes, columns


def _smem_operand(m: Machine, ins: Tcgen05Mma, desc: SmemDesc, env: dict, rows: int, k: int, dtype: object,
                  what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(values, byte addresses)`` of a descriptor operand; its fields must fit the sm_100a encoding."""
    if desc.swizzle in _SWIZZLE_BYTES:
        try:
            UmmaDescriptor(0, desc.lbo, desc.sbo, _SWIZZLE_BYTES[desc.swizzle]).encode()
        except ValueError as e:
            m.fail(IllegalInstructionError, ins, f"{what}: {e}")
    return _desc_operand(m, ins, desc, env, rows, k, dtype, what)  # type: ignore[arg-type]


def _tmem_a(m: Machine, ins: Tcgen05Mma, ref: TmemRef, env: dict, rows: int, k: int,
            dtype: object) -> np.ndarray:
    """A ``[rows, k]`` from TMEM: row ``i`` in the accumulator layout's lane, elements packed in
    32-bit columns (low bits first)."""
    npd = atom_numpy(dtype)
    words = k * npd.itemsize // 4
    base = m.ev_uniform(ref.addr, env, ins, "A tensor-memory address")
    lanes, cols = _cells(m, ins, base, rows, words, rows, "A")
    st = tmem_state(m)
    if st.mma_pending[lanes, cols].any():
        m.fail(IllegalInstructionError, ins, "A: reads TMEM cells an in-flight tcgen05.mma writes")
    return np.ascontiguousarray(st.future[lanes, cols]).view(npd).reshape(rows, k)


def tcgen05_mma(m: Machine, ins: Tcgen05Mma, x: Active) -> None:
    if not len(x.tids):
        return
    atom = instruction_atom(m, ins, "tcgen05", "Tcgen05Mma")
    if atom.cta_group != 1:
        m.fail(IllegalInstructionError, ins, f"{atom.name}: cta_group::2 (a pair of CTAs) is not emulated")
    if len(x.tids) != 1:
        m.fail(IllegalInstructionError, ins, f"tcgen05.mma is issued by one thread, {len(x.tids)} are active "
               "(predicate it to one thread)", thread=int(x.tids[1]))
    if isinstance(ins.a, TmemRef) != (atom.a_source == "tmem"):
        m.fail(IllegalInstructionError, ins, f"atom {atom.name} takes A from {atom.a_source}")
    M, N, K = atom.shape_mnk
    st = tmem_state(m)
    env = x.env
    reads = []
    if isinstance(ins.a, TmemRef):
        A = to_compute(_tmem_a(m, ins, ins.a, env, M, K, atom.a_dtype), atom.a_dtype)
    else:
        av, aidx = _smem_operand(m, ins, ins.a, env, M, K, atom.a_dtype, "A")
        A = to_compute(av, atom.a_dtype)
        reads.append(aidx)
    bv, bidx = _smem_operand(m, ins, ins.b, env, N, K, atom.b_dtype, "B")
    reads.append(bidx)
    for idx in reads:
        flat = idx.reshape(1, -1)
        check_async_read(m, ins, flat, "the tcgen05.mma")
        m.smem_read(ins, x.tids, flat)
    d = m.ev_uniform(ins.d, env, ins, "D tensor-memory address")
    lanes, cols = _cells(m, ins, d, M, N, M, "D")
    D = A @ to_compute(bv, atom.b_dtype).T
    if m.ev_uniform(ins.accumulate, env, ins, "enable_input_d"):
        D = D + st.future[lanes, cols].view(np.float32)
    vals = finish_accumulator(D, atom.c_dtype).astype(np.float32).view(np.uint32)
    st.future[lanes, cols] = vals
    op = m.new_async("tcgen05.mma", ins, x.tids, extra=(lanes, cols, vals, reads))
    st.mma_pending[lanes, cols] = op.ident
    for idx in reads:
        m.shadow.pend_read[idx] = op.ident
    m.family_state("tcgen05", _Issued).uncommitted.setdefault(int(x.tids[0]), []).append(op)


def _complete(ops: list[AsyncOp], issuer: int, epoch: int, commit: Instr):
    """The landing of a commit: its MMAs' results reach TMEM, in issue order."""

    def run(m: Machine) -> None:
        st = tmem_state(m)
        for op in ops:
            lanes, cols, vals, reads = op.extra
            st.cells[lanes, cols] = vals
            mine = st.mma_pending[lanes, cols] == op.ident
            st.mma_pending[lanes[mine], cols[mine]] = 0
            st.writer[lanes, cols] = op.ident
            st.writers[op.ident] = (issuer, epoch, op.instr)
            for idx in reads:
                m.shadow.clear_marks(m.shadow.pend_read, idx, op.ident)
            m.async_ops.pop(op.ident, None)

    return run


def tcgen05_commit(m: Machine, ins: Tcgen05Commit, x: Active) -> None:
    issued = m.family_state("tcgen05", _Issued)
    for t in x.tids:
        env = {**x.env, m.tvar: np.array([t])}
        key = mbarrier.barrier_key(m, ins.bar, env, ins)
        bar = mbarrier.get_barrier(m, key, ins)
        if bar.pending < 1:
            m.fail(IllegalInstructionError, ins, f"tcgen05.commit arrives on {mbarrier.describe(bar)}: more "
                   "arrivals than the phase expects", thread=int(t))
        ops = issued.uncommitted.pop(int(t), [])
        clocks = m.shadow.clocks
        epoch = int(clocks.c[t, clocks.off + t])
        group = m.new_async("tcgen05.commit", ins, np.array([t]))
        group.extra = _complete(ops, int(t), epoch, ins)
        bar.pending -= 1
        bar.tx += 1
        mbarrier.complete_tx(m, bar, 1, group, np.array([t]))


HANDLERS = {Tcgen05Mma: tcgen05_mma, Tcgen05Commit: tcgen05_commit}
