"""``wgmma.mma_async`` (sm_90a) and its fence / commit_group / wait_group.

``Wgmma``: each complete warp group (128 threads) of the executing group computes
``D[64, N] = A[64, K] @ B[N, K]^T (+ D if scale_d)``. A comes from registers (RS; the atom's
A layout over 128 threads) or from shared memory through an ``SmemDesc``; B always through an
``SmemDesc``. A descriptor is encoded into its 64 hardware bits and decoded back
(``gmma_desc``), and the operand is read from shared memory at the addresses that encoding
describes, so a wrong LBO / SBO / swizzle mode gives wrong results, not an error. D uses
the atom's C layout (``m + 64*n``); f16 accumulators are rounded at the end.

Asynchrony: shared memory is read at issue (checked against pending TMA / cp.async writes
and races), D is written at issue, but until a ``WgmmaWait`` retires the wgmma's commit
group its D registers (and register A) are marked in flight: another instruction reading or
writing D, or writing A, is an error, and so is writing the shared memory it reads. A later
wgmma may accumulate into the same D (hardware chains them in order).
``WgmmaCommit`` closes the warp group's current group; ``WgmmaWait(n)`` retires all but the
``n`` most recent committed groups. ``WgmmaFence`` has no effect here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hexlayout.arch.gmma import LAYOUT_TYPE, GmmaDescriptor, gmma_desc_addresses
from hexlayout.ir.lowered import RegRef, SmemDesc, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait

from .errors import IllegalInstructionError, MisalignedAccessError, OutOfBoundsError
from .machine import Active, Machine
from .mma import (
    dense_from_fragments,
    finish_accumulator,
    fragments_from_dense,
    instruction_atom,
    read_operand,
    tv_index,
)
from .numerics import atom_numpy, to_compute
from .proxy import check_async_read
from .warps import whole_units

__all__ = ["HANDLERS", "WgmmaState"]

_LAYOUT_TYPES = {0: 0, 1: 1, 2: 2, 3: 3}


@dataclass
class WgmmaState:
    uncommitted: dict[int, list[int]] = field(default_factory=dict)  # warp group -> op ids
    committed: dict[int, list[list[int]]] = field(default_factory=dict)  # warp group -> groups


def _state(m: Machine) -> WgmmaState:
    return m.family_state("wgmma", WgmmaState)


def _desc_operand(
    m: Machine, ins: Wgmma, desc: SmemDesc, env: dict, rows: int, k: int, dtype: object, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(values [rows, k], byte addresses [rows, k * esize])`` of a descriptor operand."""
    npd = atom_numpy(dtype)
    es = npd.itemsize
    buf = desc.buffer
    bes = np.dtype(buf.dtype.numpy()).itemsize
    off = m.ev_uniform(desc.offset, env, ins, f"{what} descriptor offset")
    start = buf.offset + off * bes
    if desc.swizzle not in _LAYOUT_TYPES:
        m.fail(IllegalInstructionError, ins, f"{what}: descriptor layout type {desc.swizzle} is not 0..3")
    if desc.major not in ("K", "MN"):
        m.fail(IllegalInstructionError, ins, f"{what}: descriptor major {desc.major!r} is not 'K' or 'MN'")
    for name, v in (
        ("start address", start),
        ("leading byte offset", desc.lbo),
        ("stride byte offset", desc.sbo),
    ):
        if v % 16 or v < 0 or v >= 1 << 18:
            m.fail(
                MisalignedAccessError,
                ins,
                f"{what}: descriptor {name} {v} of buffer {buf.name!r} is not a "
                f"multiple of 16 in [0, 2^18) (the descriptor drops its low 4 bits)",
                buffer=buf.name,
                address=v,
            )
    swizzle = {v: b for b, v in LAYOUT_TYPE.items()}[desc.swizzle]
    d = GmmaDescriptor.decode(GmmaDescriptor(start, desc.lbo, desc.sbo, swizzle).encode())
    addr = gmma_desc_addresses(d, desc.major, es * 8, rows, k)
    if addr.min() < 0 or addr.max() + es > m.smem.nbytes:
        bad = int(addr.max())
        m.fail(
            OutOfBoundsError,
            ins,
            f"{what}: descriptor (buffer {buf.name!r}, start {start}, LBO {desc.lbo}, "
            f"SBO {desc.sbo}, {d.swizzle or 'no'}-byte swizzle, {desc.major}-major) reaches shared "
            f"address {bad}, "
            f"beyond the {m.smem.nbytes} bytes of shared memory",
            buffer=buf.name,
            address=bad,
        )
    idx = (addr[..., None] + np.arange(es)).reshape(rows, k * es)
    vals = np.ascontiguousarray(m.smem.raw[idx]).view(npd).reshape(rows, k)
    return vals, idx


def wgmma(m: Machine, ins: Wgmma, x: Active) -> None:
    if not len(x.tids):
        return
    atom = instruction_atom(m, ins, "wgmma", "Wgmma")
    M, N, K = atom.shape_mnk
    rs = isinstance(ins.a, RegRef)
    if rs != (atom.a_source == "rmem"):
        m.fail(
            IllegalInstructionError,
            ins,
            f"atom {ins.atom} takes A from {atom.a_source}, the instruction "
            f"gives {'registers' if rs else 'a shared-memory descriptor'}",
        )
    st = _state(m)
    grid = whole_units(m, ins, x.tids, 128, "wgmma")
    cnpd = atom_numpy(atom.c_dtype)
    if m.reg_bytes_of(ins.d) != atom.values_c * cnpd.itemsize:
        m.fail(
            IllegalInstructionError,
            ins,
            f"D: register slice {ins.d.array.name} holds {m.reg_bytes_of(ins.d)} "
            f"bytes, the atom writes {atom.values_c} {atom.c_dtype} element(s) per thread",
        )
    for wg_tids in grid:
        env = {**x.env, m.tvar: wg_tids}
        scale_d = m.ev_uniform(ins.scale_d, env, ins, "scale_d")
        reads = []
        if rs:
            a = read_operand(m, ins, ins.a, wg_tids, env, atom.a_dtype, atom.values_a, "A")  # type: ignore[arg-type]
            A = dense_from_fragments(to_compute(a, atom.a_dtype)[None], tv_index(ins.atom, "a"), M, K)[0]
        else:
            av, aidx = _desc_operand(m, ins, ins.a, env, M, K, atom.a_dtype, "A")  # type: ignore[arg-type]
            A = to_compute(av, atom.a_dtype)
            reads.append(aidx)
        bv, bidx = _desc_operand(m, ins, ins.b, env, N, K, atom.b_dtype, "B")
        B = to_compute(bv, atom.b_dtype)
        reads.append(bidx)
        reader = wg_tids[:1]
        for idx in reads:
            flat = idx.reshape(1, -1)
            check_async_read(m, ins, flat, "the wgmma")
            m.smem_read(ins, reader, flat)
        if m.options.check_races:
            m.shadow.clocks.join_units(wg_tids.reshape(1, -1))
        D = A @ B.T
        if scale_d:
            c = read_operand(
                m, ins, ins.d, wg_tids, env, atom.c_dtype, atom.values_c, "D", check_pending=False
            )
            D = D + dense_from_fragments(to_compute(c, atom.c_dtype)[None], tv_index(ins.atom, "c"), M, N)[0]
        d = fragments_from_dense(finish_accumulator(D, atom.c_dtype)[None], tv_index(ins.atom, "c"))[0]
        m.write_reg_bytes(
            ins.d, wg_tids, env, ins, np.ascontiguousarray(d).view(np.uint8), check_pending=False
        )
        op = m.new_async("wgmma", ins, wg_tids, extra=(ins.d, ins.a if rs else None, reads))
        lo, hi = m.reg_range(ins.d, env, ins)
        m.regs.pending_marks(ins.d.array, write=True)[wg_tids, lo:hi] = op.ident
        if rs:
            alo, ahi = m.reg_range(ins.a, env, ins)  # type: ignore[arg-type]
            m.regs.pending_marks(ins.a.array, write=False)[wg_tids, alo:ahi] = op.ident  # type: ignore[union-attr]
        for idx in reads:
            m.shadow.pend_read[idx] = op.ident
        op.extra = (ins.d, lo, hi, ins.a if rs else None, reads)
        st.uncommitted.setdefault(int(wg_tids[0]) // 128, []).append(op.ident)


def _retire(m: Machine, ident: int) -> None:
    op = m.async_ops.pop(ident, None)
    if op is None:
        return
    dref, _lo, _hi, aref, reads = op.extra
    for table, ref in ((m.regs.pending_write, dref), (m.regs.pending_read, aref)):
        if ref is None or ref.array not in table:
            continue
        marks = table[ref.array]
        rows = marks[op.tids]
        rows[rows == ident] = 0
        marks[op.tids] = rows
    for idx in reads:
        m.shadow.clear_marks(m.shadow.pend_read, idx, ident)


def wgmma_fence(m: Machine, ins: WgmmaFence, x: Active) -> None:
    return None


def wgmma_commit(m: Machine, ins: WgmmaCommit, x: Active) -> None:
    st = _state(m)
    for wg in np.unique(x.tids // 128):
        st.committed.setdefault(int(wg), []).append(st.uncommitted.pop(int(wg), []))


def wgmma_wait(m: Machine, ins: WgmmaWait, x: Active) -> None:
    st = _state(m)
    n = int(ins.pending)
    for wg in np.unique(x.tids // 128):
        groups = st.committed.get(int(wg), [])
        keep = groups[len(groups) - n :] if n else []
        for g in groups[: max(0, len(groups) - n)]:
            for ident in g:
                _retire(m, ident)
        st.committed[int(wg)] = keep


def retire_all(m: Machine) -> None:
    """End of the block: everything in flight completes."""
    st = m.state.get("wgmma")
    if st is None:
        return
    for groups in list(st.committed.values()) + [[g] for g in st.uncommitted.values()]:
        for g in groups:
            for ident in g:
                _retire(m, ident)


HANDLERS = {Wgmma: wgmma, WgmmaFence: wgmma_fence, WgmmaCommit: wgmma_commit, WgmmaWait: wgmma_wait}
