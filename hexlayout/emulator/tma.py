"""TMA bulk tensor copies (sm_90): ``cp.async.bulk.tensor`` loads and stores of a box.

A ``TmaDesc`` is a tensor map: the global tensor, the box extent per mode (innermost
first), which tensor modes it spans (``dims``), the swizzle (0 / 32 / 64 / 128 bytes) and
the out-of-bounds fill. Each executing thread issues one copy at its box origin ``coords``.

* Shared layout of a box: dense, innermost mode contiguous (element ``(c0, c1, ...)`` at
  byte ``(c0 + box0 * (c1 + box1 * ...)) * esize``), then ``Swizzle<B,4,3>`` on the absolute
  shared byte address (B = 1, 2, 3 for 32, 64, 128 bytes); the destination must be aligned
  to the swizzle period (128 B without swizzle). Legality (``hexlayout.arch.check_tma``) is
  checked at issue.
* ``TmaLoad``: global is read at issue; elements outside the tensor read as zero (or NaN
  without ``oob_fill_zero``); the full box's bytes complete as transactions on the mbarrier;
  the shared bytes stay pending (any access is an error) until the barrier phase completes.
* ``TmaLoad`` with ``multicast`` (a CTA mask of the cluster): the box is written at the same
  shared address of every CTA in the mask and its bytes complete on each one's barrier of the
  same name and index (a destination that has exited is an error).
* ``TmaLoad`` with ``pair_bar`` (``cp.async.bulk.tensor.cta_group::2``, 2-CTA clusters): the box
  lands in the issuing CTA's ``dst`` (or the multicast CTAs'), but its bytes complete on the
  barrier of the same name and index in the even CTA of the destination's pair; the bytes land
  when that barrier's phase completes.
* ``TmaStore``: the box is read from shared memory at issue (race- and pending-checked) and
  written to the in-bounds global elements (bytes written by ordinary stores must have been
  fenced, ``proxy.py``); the shared bytes stay marked as being read
  (writing them is an error) until ``TmaStoreWait`` retires its bulk group
  (``TmaStoreCommit`` closes a group per thread).
"""

from __future__ import annotations

import numpy as np

from hexlayout.arch.tma import check_tma, tma_swizzle_period
from hexlayout.ir.lowered import Instr, TmaDesc, TmaLoad, TmaStore, TmaStoreCommit, TmaStoreWait

from .cpasync import AsyncGroups, complete_rows, group_state, wait_groups
from .errors import IllegalInstructionError, RaceError
from .machine import Active, AsyncOp, Machine
from .mbarrier import barrier_key, complete_tx, get_barrier
from .memory import GlobalTensor
from .proxy import check_async_read
from .shadow import Conflict

__all__ = ["HANDLERS", "box_geometry"]

_SWZ_BITS = {0: 0, 32: 1, 64: 2, 128: 3}


def box_geometry(
    t: GlobalTensor, desc: TmaDesc, origin: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(element offsets, in-bounds mask, box byte offsets before swizzle)`` of every box element
    in box order (innermost fastest)."""
    r = len(desc.box)
    crd = np.indices(tuple(reversed(desc.box))).reshape(r, -1)[::-1]
    off = np.zeros(crd.shape[1], dtype=np.int64)
    inb = np.ones(crd.shape[1], dtype=bool)
    for i, d in enumerate(desc.dims):
        g = origin[i] + crd[i]
        inb &= (g >= 0) & (g < t.shape[d])
        off += g * t.strides[d]
    es = t.esize
    lin = np.arange(crd.shape[1], dtype=np.int64) * es
    return off, inb, (lin[:, None] + np.arange(es)).reshape(-1)


def _prepare(
    m: Machine, ins: Instr, desc: TmaDesc, coords: tuple, ref: object, env: dict, tid: int
) -> tuple[GlobalTensor, np.ndarray, np.ndarray, np.ndarray]:
    t = m.tensors.get(id(desc.param))
    if t is None:
        m.fail(
            IllegalInstructionError,
            ins,
            f"TMA descriptor {desc.name!r}: tensor {desc.param.name!r} is not a kernel parameter",
        )
    if len(coords) != len(desc.box) or len(desc.dims) != len(desc.box):
        m.fail(
            IllegalInstructionError,
            ins,
            f"TMA descriptor {desc.name!r}: box rank {len(desc.box)}, dims "
            f"{len(desc.dims)}, coordinates {len(coords)} differ",
        )
    tenv = {**env, m.tvar: np.array([tid])}
    origin = [m.ev_uniform(c, tenv, ins, "TMA coordinate") for c in coords]
    es = t.esize
    nbytes = int(np.prod(desc.box)) * es
    if desc.swizzle_bytes not in _SWZ_BITS:
        m.fail(
            IllegalInstructionError,
            ins,
            f"TMA descriptor {desc.name!r}: swizzle {desc.swizzle_bytes} bytes is not 0, 32, 64 or 128",
        )
    period = tma_swizzle_period(desc.swizzle_bytes)
    buf = ref.buffer  # type: ignore[attr-defined]
    raw_base = (
        buf.offset
        + m.ev_uniform(ref.offset, tenv, ins, "TMA shared address")
        * np.dtype(  # type: ignore
            buf.dtype.numpy()
        ).itemsize
    )
    problems = check_tma(
        es * 8,
        [t.shape[d] for d in desc.dims],
        [t.strides[d] for d in desc.dims],
        list(desc.box),
        swizzle=desc.swizzle_bytes,
        smem_address=int(raw_base),
    )
    if problems:
        m.fail(
            IllegalInstructionError,
            ins,
            f"TMA descriptor {desc.name!r} on tensor {t.name!r} is illegal: " + "; ".join(problems),
            buffer=t.name,
        )
    base = m.smem_addresses(ref, tenv, np.array([tid]), nbytes, ins, align=period)[0]  # type: ignore[arg-type]
    goff, inb, boff = box_geometry(t, desc, origin)
    addr = base + boff
    b = _SWZ_BITS[desc.swizzle_bytes]
    if b:
        addr = addr ^ ((addr >> 3) & (((1 << b) - 1) << 4))
    return t, goff, inb, addr.reshape(1, -1)


def tma_load(m: Machine, ins: TmaLoad, x: Active) -> None:
    for tid in x.tids:
        t, goff, inb, idx = _prepare(m, ins, ins.desc, ins.coords, ins.dst, x.env, int(tid))
        vals = np.zeros(len(goff), dtype=t.flat.dtype)
        if not ins.desc.oob_fill_zero and t.param.dtype.is_float:
            vals[:] = np.nan
        vals[inb] = t.flat[goff[inb]]
        issuer = np.array([tid])
        tenv = {**x.env, m.tvar: issuer}
        key = barrier_key(m, ins.bar, tenv, ins)
        targets = m.multicast_targets(ins.multicast, tenv, ins, "TMA multicast")
        for tm in targets:
            data = vals.view(np.uint8).reshape(1, -1)
            if tm is m:
                m.smem_write_check(ins, issuer, idx)
                op = m.new_async("TMA load", ins, issuer, addr=idx, data=data, done=np.zeros(1, dtype=bool),
                                 epochs=m.shadow.clocks.epoch(issuer).copy())
            else:                # a peer's bytes: pending, and ordered after its earlier accesses
                what = f"writes (TMA multicast from block {m.block})"
                tm._pending(ins, tm.shadow.pend_write, idx, what, issuer)
                tm._pending(ins, tm.shadow.pend_read, idx, what, issuer)
                g = issuer + m.shadow.clocks.off
                if m.options.check_races:
                    flat = idx.reshape(-1)
                    zero = np.zeros(len(flat), dtype=np.int64)
                    c = tm.shadow.check_write_by(m.shadow.clocks.c[issuer], zero, zero + int(g[0]), flat)
                    if c is not None:
                        _remote_race(tm, m, ins, c, int(tid))
                op = tm.new_async("TMA load", ins, issuer, addr=idx, data=data.copy(),
                                  done=np.zeros(1, dtype=bool), epochs=m.shadow.clocks.epoch(issuer).copy(),
                                  extra=("remote", g))
            tm.shadow.pend_write[idx] = op.ident
            bm = tm if not ins.pair_bar else _pair_even(m, tm, ins)
            carrier = op if bm is tm else _carrier(bm, tm, op, ins, issuer)
            st = get_barrier(bm, key, ins)
            complete_tx(bm, st, idx.shape[1], carrier, issuer, None if bm is m else m.shadow.clocks)
        s = m.report.site(ins)
        s.gmem_requests += 1
        s.gmem_bytes += int(inb.sum()) * t.esize


def _pair_even(m: Machine, tm: Machine, ins: TmaLoad) -> Machine:
    """The even CTA of ``tm``'s pair (whose barrier a ``.cta_group::2`` TMA load completes on)."""
    if (tm.rank ^ 1) >= len(tm.cluster):
        m.fail(IllegalInstructionError, ins, f"a TMA load completing on the pair's barrier (cta_group::2) "
               f"needs a pair of CTAs in one cluster; block {tm.block} is rank {tm.rank} of a cluster of "
               f"{len(tm.cluster)}")
    return m.peer(tm.rank & ~1, ins, "TMA load completing on the pair's barrier")


def _carrier(bm: Machine, tm: Machine, op: AsyncOp, ins: TmaLoad, issuer: np.ndarray) -> AsyncOp:
    """An op of the barrier's CTA ``bm`` whose completion lands ``op``'s bytes in ``tm``."""

    def land(_bm: Machine) -> None:
        complete_rows(tm, op, ~op.done)
        tm.async_ops.pop(op.ident, None)

    return bm.new_async("TMA load", ins, issuer, extra=land)


def _remote_race(tm: Machine, m: Machine, ins: Instr, c: Conflict, tid: int) -> None:
    """A multicast from ``m`` into ``tm`` that is not ordered after ``tm``'s last access of a byte."""
    other = tm.sites[c.other_site] if c.other_site >= 0 else None
    blk = tm.cluster[c.other_rank].block if c.other_rank >= 0 else tm.block
    acc = "read" if c.what == "write-after-read" else "written"
    buf = tm.smem.buffer_at(c.address)
    tm.fail(RaceError, ins,
            f"{c.what} race on shared buffer {buf!r}, shared address {c.address}: a TMA multicast "
            f"issued by thread {tid} of block {m.block} overwrites bytes {acc} by thread {c.other_thread} "
            f"of block {blk} without synchronizing with it (the release of the stage must reach the CTA "
            "that refills it: hl.arrive(..., cta=) on its barrier)",
            buffer=buf, address=c.address, other_instr=other, other_thread=c.other_thread)


def _store_state(m: Machine) -> AsyncGroups:
    return group_state(m, "tma.store")


def tma_store(m: Machine, ins: TmaStore, x: Active) -> None:
    st = _store_state(m)
    for tid in x.tids:
        t, goff, inb, idx = _prepare(m, ins, ins.desc, ins.coords, ins.src, x.env, int(tid))
        issuer = np.array([tid])
        m.smem_read(ins, issuer, idx)
        check_async_read(m, ins, idx)
        vals = np.ascontiguousarray(m.smem.raw[idx[0]]).view(t.flat.dtype)
        t.flat[goff[inb]] = vals[inb]
        op = m.new_async("TMA store", ins, issuer, addr=idx, group=st.committed[issuer].copy())
        m.shadow.pend_read[idx] = op.ident
        st.open.append(op.ident)
        s = m.report.site(ins)
        s.gmem_requests += 1
        s.gmem_bytes += int(inb.sum()) * t.esize


def tma_store_commit(m: Machine, ins: TmaStoreCommit, x: Active) -> None:
    _store_state(m).committed[x.tids] += 1


def tma_store_wait(m: Machine, ins: TmaStoreWait, x: Active) -> None:
    def finish(op: AsyncOp, waiting: np.ndarray, limit: np.ndarray) -> bool:
        tid = int(op.tids[0])
        if waiting[tid] and op.group[0] < limit[tid]:  # type: ignore[index]
            m.shadow.clear_marks(m.shadow.pend_read, op.addr, op.ident)  # type: ignore[arg-type]
            return True
        return False

    wait_groups(m, _store_state(m), x.tids, ins.pending, finish)


HANDLERS = {
    TmaLoad: tma_load,
    TmaStore: tma_store,
    TmaStoreCommit: tma_store_commit,
    TmaStoreWait: tma_store_wait,
}
