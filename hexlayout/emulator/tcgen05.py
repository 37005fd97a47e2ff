"""``tcgen05.mma`` and ``tcgen05.commit`` (sm_100a) in the emulator.

``Tcgen05Mma``: one thread issues ``D (+)= A @ B^T`` of a ``kind="tcgen05"`` atom. A and B are
read from shared memory at issue through their descriptors (the canonical layouts of wgmma,
``wgmma._desc_operand``; the fields must also fit the sm_100a encoding) or A from TMEM; D is
the atom's accumulator in TMEM at the address ``d`` (``arch.tmem.accumulator_layout``). The
result is computed at issue but stays *in flight*: the D cells are marked with the MMA until it
completes, and so are the shared bytes it reads (writing them earlier is an error). It
completes only through ``Tcgen05Commit``: an arrival on the mbarrier that lands like a TMA
transfer (``mbarrier.py``), i.e. when some thread waits on that barrier. A commit tracks every
earlier tcgen05 operation of its thread (PTX ISA): its landing first lands the thread's earlier
commits that have not landed (a stage released per k-tile onto its own barrier, then one commit
for the tile's accumulator). Then the result
reaches TMEM, and a ``tcgen05.ld`` may read it if the reading thread observed the commit
(happens-before through the mbarrier wait or a later barrier, checked with the race detector's
vector clocks). An MMA accumulating into cells of an earlier in-flight one chains onto its
result (the hardware runs a thread's MMAs in order).

A read from TMEM (a ``_TS`` atom, ``arch.tmem.operand_a_layout``) must have been written by
``tcgen05.st`` that their warps waited for (``wait::st``) and the issuing thread observed
(``tmem.check_a_stores``; a cell no ``tcgen05.st`` wrote is an error); its cells stay marked as
read until the MMA completes, and a ``tcgen05.st`` into them before that is an error. For a
pair's MMA the same holds in each CTA's TMEM: the odd CTA's stores must be observed by the even
CTA's issuer (a cluster barrier after them).

``Tcgen05Cp``: one thread copies shared memory (its descriptor, read at issue; the bytes stay
marked as read until completion, so overwriting them earlier is an error) to the TMEM cells of
``tcgen05.cp.{shape}`` (``arch.tcgen05_cp``, replicas included). Like an MMA it is in flight
until the issuing thread's next ``tcgen05.commit`` lands; it is ordered before that thread's
later MMAs (which read its result), while any other reader of its cells before the commit
landed (a ``tcgen05.ld``, another thread's MMA) is an error.

**Block-scaled MMA** (``atom.scale_type`` "ue8m0" or "ue4m3"; kind::mxf8f6f4, K = 32, or kind::mxf4 /
mxf4nvf4, K = 64 with e2m1 operands packed two per byte, ``arch.fp4``), ``VS = atom.scale_vec`` K
elements per factor, ``K / VS`` factors per row (``j``)::

    D[m, n] (+)= sum_k A[m, k] SFA[m, k // VS] B[n, k] SFB[n, k // VS]

with ``SFA[m, j]`` the byte ``sfa_id + j`` of TMEM column ``sfa + m // 32`` in lane ``m`` and, for the
D rows of lane quarter ``q``, ``SFB[n, j]`` the byte ``sfb_id + j`` of column ``sfb + n // 32`` in
lane ``32 q + n % 32`` (``arch.block_scale``: each subpartition reads its own replica), decoded as
UE8M0 (``2^(e - 127)``) or UE4M3; the products are summed exactly (float64) and rounded to f32 once
per MMA. A factor cell must be allocated and written by a completed copy the issuer observed or
by an earlier copy of the issuing thread; a never-written byte holds the poison 0xFF, i.e. NaN
(both encodings).

**cta_group::2** (a pair of CTAs of a cluster, ranks ``2p`` and ``2p + 1``; ``tmem.py`` for the
pair's allocation). A thread of the even CTA issues; the descriptors (and a TMEM A address) are
evaluated once and name the same offsets in both CTAs. CTA ``c`` holds A's rows
``c M/2 .. c M/2 + M/2 - 1`` and B's rows ``c N/2 ..`` (``arch.sm100._operand``), and gets its
``M/2`` rows of ``D = A @ B^T`` in its own TMEM at the same address, in the accumulator layout of
``accumulator_layout(M, N, 2)``::

    D_c (+)= A_c @ [B_0; B_1]^T

Each CTA's operand bytes stay marked as read, and its D cells as written, until the MMA
completes: when the first arrival of its ``tcgen05.commit.cta_group::2`` lands (a commit tracks
the issuing thread's MMAs and copies of its own cta_group). ``multicast`` (a CTA mask) arrives
on the barrier of the same name and index in every CTA of the mask. A reader of D in either CTA
must have observed an arrival of that commit (the race detector's vector clocks span the
cluster), and the issue must be ordered after every earlier ``tcgen05.ld`` of D's cells in
both CTAs (``tmem.check_loads_done``: the odd CTA's readers release them by arriving on a barrier
of the even CTA that the issuer waits on). Errors: the odd CTA issuing, no pair in the cluster,
the pair's TMEM not allocated (or its allocation not yet joined), its operand bytes written while
the MMA is in flight, reading D before the commit arrived, writing D unordered after a read of
it in either CTA. Block-scaled and ``tcgen05.cp`` with cta_group::2 are not emulated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexlayout.arch.block_scale import decode_factors
from hexlayout.arch.dtypes import U8
from hexlayout.arch.fp4 import from_e2m1, unpack_fp4
from hexlayout.arch.tcgen05 import UmmaDescriptor
from hexlayout.arch.tcgen05_cp import CP_SHAPES, tmem_cp_layout
from hexlayout.arch.tmem import accumulator_layout
from hexlayout.ir.expr import ExprLike
from hexlayout.ir.lowered import Instr, SmemDesc
from hexlayout.ir.lowered_tcgen05 import Tcgen05Commit, Tcgen05Cp, Tcgen05Mma, TmemRef

from . import mbarrier
from .errors import AsyncHazardError, IllegalInstructionError, RaceError
from .machine import Active, AsyncOp, Machine
from .mma import finish_accumulator, instruction_atom
from .numerics import atom_numpy, to_compute
from .proxy import check_async_read
from .shadow import Conflict
from .tmem import check_a_stores, check_cells, check_group, check_loads_done, pair_of, tmem_state
from .wgmma import _desc_operand

__all__ = ["HANDLERS"]

_SWIZZLE_BYTES = {0: 0, 1: 128, 2: 64, 3: 32}  # SmemDesc.swizzle (PTX wgmma layout type) -> bytes


@dataclass
class _Issued:
    #: (issuing thread, cta_group) -> its MMAs and copies not yet committed, each with the CTA whose
    #: TMEM and shared memory it touches
    uncommitted: dict[tuple[int, int], list[tuple[Machine, AsyncOp]]] = field(default_factory=dict)
    #: (issuing thread, cta_group) -> the landings of its earlier commits that have not landed yet
    landings: dict[tuple[int, int], list[Any]] = field(default_factory=dict)


def _cells(m: Machine, ins: Instr, base: int, rows: int, cols: int, m_atom: int, what: str, group: int = 1
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(lanes, columns)`` ``[rows, cols]`` of one CTA's share of a TMEM matrix in the accumulator
    layout at ``base`` (``rows = m_atom / group``)."""
    addr = accumulator_layout(m_atom, cols, group).indices().reshape(cols, rows).T
    lanes, columns = (base >> 16) + (addr >> 16), (base & 0xFFFF) + (addr & 0xFFFF)
    check_cells(m, ins, lanes.reshape(-1), columns.reshape(-1), what)
    return lanes, columns


def _smem_operand(m: Machine, ins: Tcgen05Mma | Tcgen05Cp, desc: SmemDesc, env: dict, rows: int, k: int,
                  dtype: object, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(values, byte addresses)`` of a descriptor operand; its fields must fit the sm_100a encoding."""
    if desc.swizzle in _SWIZZLE_BYTES:
        try:
            UmmaDescriptor(0, desc.lbo, desc.sbo, _SWIZZLE_BYTES[desc.swizzle]).encode()
        except ValueError as e:
            m.fail(IllegalInstructionError, ins, f"{what}: {e}")
    return _desc_operand(m, ins, desc, env, rows, k, dtype, what)  # type: ignore[arg-type]


def _tmem_a(m: Machine, ins: Tcgen05Mma, base: int, rows: int, k: int, dtype: object, issuer: int,
            what: str = "A", owner: Machine | None = None
            ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """A ``[rows, k]`` from the TMEM of ``owner`` (default ``m``; the pair's other CTA for its rows)
    at ``base`` (``arch.tmem.operand_a_layout``: the accumulator's lanes, elements packed in 32-bit
    columns, low bits first), and its cells; checked: no in-flight MMA writes them, the
    ``tcgen05.st`` that wrote them were waited for and observed by the issuing thread ``issuer`` of
    ``m`` (``tmem.check_a_stores``)."""
    c = m if owner is None else owner
    npd = atom_numpy(dtype)
    words = k * npd.itemsize // 4
    lanes, cols = _cells(c, ins, base, rows, words, rows, what)
    st = tmem_state(c)
    if st.mma_pending[lanes, cols].any():
        m.fail(IllegalInstructionError, ins, f"{what}: reads TMEM cells an in-flight tcgen05.mma writes")
    check_a_stores(m, ins, issuer, lanes, cols, what, owner=c)
    return np.ascontiguousarray(st.future[lanes, cols]).view(npd).reshape(rows, k), (lanes, cols)


def _where(m: Machine, c: Machine) -> str:
    return "" if c is m else f" in the pair's CTA (block {c.block}, cluster rank {c.rank})"


def _remote_read(c: Machine, m: Machine, ins: Tcgen05Mma, issuer: int, idx: np.ndarray) -> None:
    """The issuer (thread ``issuer`` of ``m``) reads the bytes ``idx`` (``[1, n]``) of the pair's
    CTA ``c``: not while an async write into them is pending; after their last writer (race check)."""
    who = f"reads (tcgen05.mma.cta_group::2 issued by block {m.block})"
    c._pending(ins, c.shadow.pend_write, idx, who, np.array([issuer]))
    check_async_read(c, ins, idx, f"the tcgen05.mma.cta_group::2 issued by block {m.block}")
    if not m.options.check_races:
        return
    clocks = m.shadow.clocks
    gid = clocks.off + issuer
    conflict: Conflict | None = c.shadow.read_by(clocks.c[issuer], gid, int(clocks.c[issuer, gid]),
                                                 idx.reshape(-1), c.site_id(ins))
    if conflict is not None:
        buf = c.smem.buffer_at(conflict.address)
        blk = c.cluster[conflict.other_rank].block if conflict.other_rank >= 0 else c.block
        other = c.sites[conflict.other_site] if conflict.other_site >= 0 else None
        m.fail(RaceError, ins, f"read-after-write race on shared buffer {buf!r} of block {c.block}, shared "
               f"address {conflict.address}: the tcgen05.mma.cta_group::2 issued by thread {issuer} of block "
               f"{m.block} reads bytes written by thread {conflict.other_thread} of block {blk} without "
               "synchronizing with it (a cluster barrier or an mbarrier of the issuing CTA the writer "
               "arrives on)", buffer=buf, address=conflict.address, other_instr=other,
               other_thread=conflict.other_thread)


def tcgen05_mma(m: Machine, ins: Tcgen05Mma, x: Active) -> None:
    if not len(x.tids):
        return
    atom = instruction_atom(m, ins, "tcgen05", "Tcgen05Mma")
    G = atom.cta_group
    check_group(m, ins, G, atom.name)
    if len(x.tids) != 1:
        m.fail(IllegalInstructionError, ins, f"tcgen05.mma is issued by one thread, {len(x.tids)} are active "
               "(predicate it to one thread)", thread=int(x.tids[1]))
    if isinstance(ins.a, TmemRef) != (atom.a_source == "tmem"):
        m.fail(IllegalInstructionError, ins, f"atom {atom.name} takes A from {atom.a_source}")
    ctas = [m]
    if G == 2:
        peer = pair_of(m, ins, atom.name)
        if m.rank % 2:
            m.fail(IllegalInstructionError, ins, f"{atom.name} (cta_group::2) is issued from the odd CTA "
                   f"of its pair (block {m.block}, cluster rank {m.rank}); the even CTA (rank {m.rank - 1}) "
                   "issues the pair's MMA", thread=int(x.tids[0]))
        if atom.scale_type:
            m.fail(IllegalInstructionError, ins, f"{atom.name}: block-scaled cta_group::2 is not emulated")
        ctas = [m, peer]
    M, N, K = atom.shape_mnk
    rows_a, rows_b = M // G, N // G
    env = x.env
    issuer = int(x.tids[0])
    reads: dict[int, list[np.ndarray]] = {id(c): [] for c in ctas}
    As, Bs = [], []
    a_tmem = isinstance(ins.a, TmemRef)
    a_base = m.ev_uniform(ins.a.addr, env, ins, "A tensor-memory address") if a_tmem else 0  # type: ignore
    a_cells: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for c in ctas:
        if isinstance(ins.a, TmemRef):
            av, a_cells[id(c)] = _tmem_a(m, ins, a_base, rows_a, K, atom.a_dtype, issuer, "A" + _where(m, c),
                                         owner=c)
        else:
            av, aidx = _operand(m, ins, ins.a, env, rows_a, K, atom.a_dtype, "A")
            reads[id(c)].append(aidx)
        bv, bidx = _operand(m, ins, ins.b, env, rows_b, K, atom.b_dtype, "B")
        reads[id(c)].append(bidx)
        if c is not m:                    # same offsets, the pair's bytes
            npd_a, npd_b = atom_numpy(atom.a_dtype), atom_numpy(atom.b_dtype)
            if not isinstance(ins.a, TmemRef):
                av = np.ascontiguousarray(c.smem.raw[aidx]).view(npd_a).reshape(rows_a, K)
            bv = np.ascontiguousarray(c.smem.raw[bidx]).view(npd_b).reshape(rows_b, K)
        As.append(to_compute(av, atom.a_dtype))
        Bs.append(to_compute(bv, atom.b_dtype))
    B = np.concatenate(Bs, axis=0)
    if not atom.scale_type and (ins.sfa is not None or ins.sfb is not None):
        m.fail(IllegalInstructionError, ins, f"{atom.name} is not block-scaled; it takes no scale factors")
    scaled = _block_scales(m, ins, atom, x, M, N) if atom.scale_type else None
    for c in ctas:
        for idx in reads[id(c)]:
            flat = idx.reshape(1, -1)
            if c is m:
                check_async_read(m, ins, flat, "the tcgen05.mma")
                m.smem_read(ins, x.tids, flat)
            else:
                _remote_read(c, m, ins, issuer, flat)
    d = m.ev_uniform(ins.d, env, ins, "D tensor-memory address")
    issued = m.family_state("tcgen05", _Issued).uncommitted.setdefault((issuer, G), [])
    parts = []
    for c, A in zip(ctas, As):
        lanes, cols = _cells(c, ins, d, rows_a, N, M, "D" + _where(m, c), G)
        parts.append((c, A, lanes, cols))
    for c, A, lanes, cols in parts:
        st = tmem_state(c)
        # no other thread's tcgen05.ld of D (in either CTA of a pair) still unordered before this MMA
        check_loads_done(m, ins, issuer, lanes, cols, "tcgen05.mma D" + _where(m, c), owner=c)
        if scaled is None:
            D = A @ B.T
        else:                               # per lane quarter q: rows 32q.., SFB from its own replica
            sa, sb = scaled                 # [M, K / VS], [4, N, K / VS]: factors per K element
            vs = atom.scale_vec
            As_ = A.astype(np.float64) * np.repeat(sa, vs, axis=1)
            Bf = B.astype(np.float64)
            D = np.concatenate([As_[32 * q:32 * q + 32] @ (Bf * np.repeat(sb[q], vs, axis=1)).T
                                for q in range(M // 32)], axis=0)
        if m.ev_uniform(ins.accumulate, env, ins, "enable_input_d"):
            D = D + st.future[lanes, cols].view(np.float32)
        vals = finish_accumulator(D, atom.c_dtype).astype(np.float32).view(np.uint32)
        st.future[lanes, cols] = vals
        extra = (lanes, cols, vals, reads[id(c)], a_cells.get(id(c)))
        op = c.new_async("tcgen05.mma", ins, x.tids, extra=extra)
        st.mma_pending[lanes, cols] = op.ident
        if id(c) in a_cells:                 # A's cells stay read until the MMA completes
            st.a_reading[a_cells[id(c)]] = op.ident
        for idx in reads[id(c)]:
            c.shadow.pend_read[idx] = op.ident
        issued.append((c, op))


def _operand(m: Machine, ins: Tcgen05Mma, desc: SmemDesc, env: dict, rows: int, k: int, dtype: Any,
             what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(values [rows, k], byte addresses)`` of a shared operand; e2m1 is packed (``arch.fp4``):
    the descriptor reads ``k / 2`` bytes per row, element ``j`` is nibble ``j % 2`` of byte ``j // 2``."""
    if dtype.name != "e2m1":
        return _smem_operand(m, ins, desc, env, rows, k, dtype, what)
    raw, idx = _smem_operand(m, ins, desc, env, rows, k // 2, U8, what)
    return from_e2m1(unpack_fp4(raw)).astype(np.float32), idx


def _scale_bytes(m: Machine, ins: Tcgen05Mma, addr: ExprLike, byte: int, nsf: int, scale_type: str,
                 lanes: np.ndarray, cols: np.ndarray, issuer: int, env: dict, what: str) -> np.ndarray:
    """The factors ``[cells, nsf]`` in bytes ``byte .. byte + nsf - 1`` of the factor cells ``(lanes,
    cols)`` (relative to the address ``addr``), decoded as ``scale_type``; checked: the ID is a byte
    leaving room for ``nsf`` factors (a multiple of ``nsf``), the cells allocated, and not written by a
    copy the issuing thread is not ordered after."""
    if not 0 <= byte < 4 or byte % nsf:
        m.fail(IllegalInstructionError, ins, f"{what} scale-factor ID {byte} is not a byte 0..3 that is a "
               f"multiple of {nsf} (the MMA reads {nsf} factors per row)")
    base = m.ev_uniform(addr, env, ins, f"{what} scale-factor address")
    if base >> 16:
        m.fail(IllegalInstructionError, ins, f"{what} scale factors: TMEM address {base:#x} is not at lane 0 "
               "(the factors of row r are found in lane r)", buffer="tmem", address=base)
    lanes, cols = lanes.reshape(-1), (base & 0xFFFF) + cols.reshape(-1)
    check_cells(m, ins, lanes, cols, f"{what} scale factors")
    st = tmem_state(m)
    pend = st.mma_pending[lanes, cols]
    for ident in np.unique(pend[pend > 0]):
        op = m.async_ops.get(int(ident))
        if op is None or op.kind != "tcgen05.cp" or int(op.tids[0]) != issuer:
            i = int(np.flatnonzero(pend == ident)[0])
            who = ("a tcgen05.mma" if op is None or op.kind != "tcgen05.cp"
                   else f"thread {int(op.tids[0])}'s tcgen05.cp")
            m.fail(AsyncHazardError, ins, f"{what} scale factors: TMEM cell (lane {int(lanes[i])}, column "
                   f"{int(cols[i])}) is written by {who} that is not complete (commit it and wait on its "
                   "mbarrier first)", buffer="tmem", other_instr=None if op is None else op.instr)
    if m.options.check_races:
        clocks = m.shadow.clocks
        wr = st.writer[lanes, cols]
        for ident in np.unique(wr[wr > 0]):
            src, epoch, cp = st.writers[int(ident)]
            if src != clocks.off + issuer and clocks.c[issuer, src] < epoch:
                m.fail(AsyncHazardError, ins, f"{what} scale factors were copied by thread "
                       f"{src - clocks.off}'s "
                       f"tcgen05.cp whose commit thread {issuer} has not observed (wait on the commit's "
                       "mbarrier first)",
                       thread=issuer, buffer="tmem", other_instr=cp)
    words = st.future[lanes, cols][:, None]
    e = (words >> (np.uint32(8) * (byte + np.arange(nsf, dtype=np.uint32)))) & np.uint32(0xFF)
    return decode_factors(e, scale_type)


def _block_scales(m: Machine, ins: Tcgen05Mma, atom: Any, x: Active, M: int, N: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(sa [M, nsf], sb [4, N, nsf])``: the factors of A's rows and, per lane quarter, of B's rows
    (``nsf = K / VS`` per row)."""
    if ins.sfa is None or ins.sfb is None:
        m.fail(IllegalInstructionError, ins, f"{atom.name} is block-scaled: give the TMEM addresses of "  # type: ignore[attr-defined]
               "its scale factors (sfa, sfb)")
    if M != 128:
        m.fail(IllegalInstructionError, ins, f"{atom.name}: only M = 128 is emulated")  # type: ignore[attr-defined]
    issuer = int(x.tids[0])
    nsf, st = atom.shape_mnk[2] // atom.scale_vec, atom.scale_type
    r = np.arange(M)
    sa = _scale_bytes(m, ins, ins.sfa, ins.sfa_id, nsf, st, r, r // 32, issuer, x.env, "A")  # type: ignore[arg-type]
    n = np.arange(N)
    q = np.arange(4)[:, None]
    sb = _scale_bytes(m, ins, ins.sfb, ins.sfb_id, nsf, st, 32 * q + n % 32, np.broadcast_to(n // 32, (4, N)),
                      issuer, x.env, "B").reshape(4, N, nsf)  # type: ignore[arg-type]
    return sa, sb


def tcgen05_cp(m: Machine, ins: Tcgen05Cp, x: Active) -> None:
    if not len(x.tids):
        return
    if len(x.tids) != 1:
        m.fail(IllegalInstructionError, ins, f"tcgen05.cp is issued by one thread, {len(x.tids)} are active "
               "(predicate it to one thread)", thread=int(x.tids[1]))
    if ins.shape not in CP_SHAPES:
        m.fail(IllegalInstructionError, ins, f"tcgen05.cp: shape {ins.shape!r} is not one of "
               f"{', '.join(CP_SHAPES)}")
    check_group(m, ins, 1, "tcgen05.cp")
    shape = CP_SHAPES[ins.shape]
    env = x.env
    raw, idx = _smem_operand(m, ins, ins.src, env, shape.rows, shape.bits // 8, U8, "tcgen05.cp source")
    flat = idx.reshape(1, -1)
    check_async_read(m, ins, flat, "the tcgen05.cp")
    m.smem_read(ins, x.tids, flat)
    base = m.ev_uniform(ins.taddr, env, ins, "tcgen05.cp TMEM address")
    cells = np.asarray(tmem_cp_layout(ins.shape).indices())
    cells = cells.reshape(-1, shape.words, shape.rows).transpose(2, 1, 0)
    lanes, cols = (base >> 16) + (cells >> 16), (base & 0xFFFF) + (cells & 0xFFFF)   # [row, word, replica]
    check_cells(m, ins, lanes.reshape(-1), cols.reshape(-1), "tcgen05.cp")
    st = tmem_state(m)
    issuer = int(x.tids[0])
    pend = st.mma_pending[lanes, cols]
    for ident in np.unique(pend[pend > 0]):
        op = m.async_ops.get(int(ident))
        if op is None or int(op.tids[0]) != issuer:
            m.fail(AsyncHazardError, ins, "tcgen05.cp writes TMEM cells an in-flight tcgen05 operation of "
                   "another thread writes", other_instr=None if op is None else op.instr)
    words = np.ascontiguousarray(raw).view(np.uint32).reshape(shape.rows, shape.words)
    vals = np.broadcast_to(words[:, :, None], lanes.shape)
    lanes, cols, vals = lanes.reshape(-1), cols.reshape(-1), np.ascontiguousarray(vals).reshape(-1)
    st.future[lanes, cols] = vals
    op = m.new_async("tcgen05.cp", ins, x.tids, extra=(lanes, cols, vals, [idx]))
    st.mma_pending[lanes, cols] = op.ident
    m.shadow.pend_read[idx] = op.ident
    m.family_state("tcgen05", _Issued).uncommitted.setdefault((issuer, 1), []).append((m, op))


def _complete(ops: list[tuple[Machine, AsyncOp]], issuer: int, epoch: int, prior: list[Any] = ()):
    """The landing of a commit (``issuer``: the committing thread's cluster-wide id): its MMAs'
    results and copies reach TMEM, in issue order, in each CTA they write. The first arrival that
    lands completes them (a multicast commit lands once per CTA of its mask). A commit tracks every
    earlier tcgen05 operation of its thread (PTX ISA), so the landings of the thread's earlier
    commits (``prior``) that have not landed run first."""
    done: list[bool] = []

    def run(_landing: Machine) -> None:
        if done:
            return
        done.append(True)
        for p in prior:
            p(_landing)
        for c, op in ops:
            st = tmem_state(c)
            lanes, cols, vals, reads = op.extra[:4]
            a_cells = op.extra[4] if len(op.extra) > 4 else None
            if a_cells is not None:
                done_a = st.a_reading[a_cells] == op.ident
                st.a_reading[a_cells[0][done_a], a_cells[1][done_a]] = 0
            st.cells[lanes, cols] = vals
            mine = st.mma_pending[lanes, cols] == op.ident
            st.mma_pending[lanes[mine], cols[mine]] = 0
            st.writer[lanes, cols] = op.ident
            st.writers[op.ident] = (issuer, epoch, op.instr)
            for idx in reads:
                c.shadow.clear_marks(c.shadow.pend_read, idx, op.ident)
            c.async_ops.pop(op.ident, None)

    run.landed = done          # type: ignore[attr-defined]  (non-empty once it ran)
    return run


def tcgen05_commit(m: Machine, ins: Tcgen05Commit, x: Active) -> None:
    if not len(x.tids):
        return
    issued = m.family_state("tcgen05", _Issued)
    check_group(m, ins, ins.cta_group, "tcgen05.commit")
    for t in x.tids:
        env = {**x.env, m.tvar: np.array([t])}
        key = mbarrier.barrier_key(m, ins.bar, env, ins)
        targets = m.multicast_targets(ins.multicast, env, ins, "tcgen05.commit multicast", thread=int(t))
        bars = [mbarrier.get_barrier(tm, key, ins) for tm in targets]
        for tm, bar in zip(targets, bars):
            if bar.pending < 1:
                where = "" if tm is m else f" of block {tm.block} (cluster rank {tm.rank})"
                m.fail(IllegalInstructionError, ins, f"tcgen05.commit arrives on {mbarrier.describe(bar)}"
                       f"{where}: more arrivals than the phase expects", thread=int(t))
        ops = issued.uncommitted.pop((int(t), ins.cta_group), [])
        clocks = m.shadow.clocks
        gid = int(clocks.off + t)
        prior = [p for p in issued.landings.get((int(t), ins.cta_group), []) if not p.landed]
        run = _complete(ops, gid, int(clocks.c[t, gid]), prior)
        issued.landings[(int(t), ins.cta_group)] = prior + [run]
        for tm, bar in zip(targets, bars):
            group = tm.new_async("tcgen05.commit", ins, np.array([t]))
            group.extra = run
            bar.pending -= 1
            bar.tx += 1
            mbarrier.complete_tx(tm, bar, 1, group, np.array([t]), None if tm is m else clocks)


HANDLERS = {Tcgen05Mma: tcgen05_mma, Tcgen05Cp: tcgen05_cp, Tcgen05Commit: tcgen05_commit}
