"""``mbarrier`` (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier"):
barriers in shared memory that count arrivals and transaction bytes, phase by phase.

State per barrier (the CTA and the shared offset of its 8 bytes): the expected arrival
count (``init``), the pending arrivals and the transaction count (tx-count, bytes) of the
current phase, and the phase number. A phase completes when its pending arrivals and its
tx-count are both zero: the phase number advances and the pending count resets to the
expected count.

* ``mbarrier.init.b64 [a], n``: expected = pending = n, tx-count 0, phase 0.
* ``mbarrier.arrive{.expect_tx}{.shared::cta|.shared::cluster}.b64 state, [a]{, n}``: with
  ``expect_tx`` the tx-count grows by ``n`` first; then one arrival (``n`` arrivals without
  ``expect_tx`` when given); ``state`` receives the phase the arrival belongs to. A
  ``shared::cluster`` address from ``mapa`` arrives on that CTA's barrier.
  ``arrive_drop`` also lowers the expected count. ``mbarrier.expect_tx`` only adds bytes;
  ``mbarrier.complete_tx`` removes them.
* ``mbarrier.try_wait{.parity}`` / ``test_wait{.parity}`` ``p, [a], x``: true when the phase
  ``x`` names has completed: with ``.parity``, when the current phase's parity differs from
  ``x`` (so parity 1 on a fresh barrier is true at once, the producer-start idiom); with a
  state token, when the phase has moved past the token's. A false answer would only make
  the program test again, so the executor parks the thread instead (state ``WAIT``) and
  runs it again once the barrier completes a phase: the spin loop costs nothing and a
  barrier that never completes is a deadlock, not an endless loop. Before parking, the TMA
  copies in flight on that barrier land (``land``; ``pend_transaction`` queues them):
  copies land as late as the program allows, so a read that does not wait for them sees
  them still pending.
  A ``tcgen05.commit`` (``pend_commit``) is queued the same way: when it lands, the MMAs and
  copies it tracks complete, then it arrives once on the barrier.
* ``mbarrier.inval``: forgets the barrier; ``pending_count``: the pending arrivals of a
  state token (here, of the current phase).

A completed phase is a synchronization point: the block's race-detection epoch advances.
The barrier's bytes in shared memory are not touched (its state lives here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import clocks
from .alu import _reg
from .errors import PtxDeadlockError, PtxError
from .machine import EXITED, RUN, SHARED_WINDOW, WAIT, Machine
from .parse import Instruction

__all__ = ["Mbarrier", "barrier_index", "arrive", "complete_tx", "try_wait", "describe_waits",
           "mbarrier_waits", "pend_transaction", "pend_commit", "land", "land_all"]


@dataclass
class Mbarrier:
    expected: int
    pending: int
    tx: int = 0
    phase: int = 0
    waiters: list[np.ndarray] = field(default_factory=list)
    #: the join of the clocks released into the barrier (``clocks``), and its value when the last
    #: phase completed (what a passed wait acquires); None: nothing released yet
    clock: np.ndarray | None = None
    completed: np.ndarray | None = None


def _table(m: Machine) -> dict[int, Mbarrier]:
    t = getattr(m, "mbarriers", None)
    if t is None:
        t = m.mbarriers = {}  # type: ignore[attr-defined]
    return t


def barrier_index(m: Machine, ins: Instruction, op: Any, idx: Any) -> np.ndarray:
    """Flat shared-memory indices (``blk * smem_size + offset``) of the barrier operand ``op``
    for threads ``idx``: a ``shared::cta`` offset, a ``mapa`` ``shared::cluster`` address, or a
    generic address in the shared window."""
    threads = np.arange(m.T)[idx]
    addr = m.address(op, idx)
    if not any(p.startswith("shared") for p in ins.parts):
        if len(addr) and not ((addr >= np.uint64(SHARED_WINDOW)).all()):
            raise PtxError(
                f"{ins.opcode}: the barrier address is not in shared memory", **m.where(int(threads[0]))
            )
        addr = addr - np.uint64(SHARED_WINDOW)
    return m.cluster_shared(addr, threads, 8, ins.opcode)


def _get(m: Machine, key: int, t: int) -> Mbarrier:
    b = _table(m).get(key)
    if b is None:
        raise PtxError(
            f"mbarrier at shared offset {key % m.smem_size} is used before mbarrier.init", **m.where(t)
        )
    return b


def _complete(m: Machine, key: int, b: Mbarrier) -> None:
    """Advance ``b``'s phase while both of its counts are zero; wake its waiters."""
    while b.pending <= 0 and b.tx == 0 and b.expected > 0:
        b.phase += 1
        b.pending = b.expected
        b.completed = b.clock
        for w in b.waiters:
            m.state[w] = np.where(m.state[w] == WAIT, RUN, m.state[w])
        b.waiters = []
        if m.races is not None:
            m.races.epoch[key // m.smem_size] += 1


def arrive(m: Machine, key: int, count: int, t: int, tx: int = 0, clock: np.ndarray | None = None) -> int:
    """``count`` arrivals (after ``tx`` expected bytes) on the barrier at ``key``, releasing
    ``clock`` into it; returns the phase they belong to."""
    b = _get(m, key, t)
    if clock is not None:
        b.clock = clock if b.clock is None else np.maximum(b.clock, clock)
    b.tx += tx
    ph = b.phase
    if count > b.pending:
        raise PtxError(
            f"mbarrier at shared offset {key % m.smem_size}: {count} arrival(s) where "
            f"{b.pending} of {b.expected} are pending in phase {b.phase}",
            **m.where(t),
        )
    b.pending -= count
    _complete(m, key, b)
    return ph


def complete_tx(m: Machine, key: int, nbytes: int, t: int, clock: np.ndarray | None = None) -> None:
    """``nbytes`` transaction bytes completed on the barrier at ``key`` (a TMA copy landed; its
    issuer's ``clock`` at the issue is released into the barrier)."""
    b = _get(m, key, t)
    if clock is not None:
        b.clock = clock if b.clock is None else np.maximum(b.clock, clock)
    b.tx -= nbytes
    _complete(m, key, b)


def _done(b: Mbarrier, x: int, parity: bool) -> bool:
    return (b.phase & 1) != (x & 1) if parity else b.phase > x


def pend_transaction(m: Machine, key: int, flat: np.ndarray, data: np.ndarray, t: int) -> None:
    """An asynchronous copy of ``data`` to the shared bytes ``flat`` (flat indices), issued by
    thread ``t``, completing its bytes on the barrier at ``key`` when it lands; until then its
    bytes are pending (``Machine.check_tma_pending``)."""
    m.check_mma_reads(np.asarray(flat).reshape(1, -1), np.array([t]), "a TMA copy")
    m.tma_pending[flat] += 1
    m.tma_pending_count += 1
    _queue(m).append({"flat": flat, "data": data, "key": key, "bytes": len(data), "thread": t,
                      "clock": clocks.release(m, np.array([t]), None)})


def pend_commit(m: Machine, key: int, complete: Any, t: int, clock: np.ndarray | None = None) -> None:
    """A ``tcgen05.commit`` of thread ``t``: when it lands, ``complete()`` finishes the MMAs and
    copies it tracks, then one arrival on the barrier at ``key`` releasing ``clock`` (thread
    ``t``'s at the commit)."""
    _queue(m).append({"key": key, "commit": complete, "thread": t, "clock": clock})


def _queue(m: Machine) -> list[dict[str, Any]]:
    q = getattr(m, "tma_queue", None)
    if q is None:
        q = m.tma_queue = []  # type: ignore[attr-defined]
    return q


def land(m: Machine, key: int) -> None:
    """Land every TMA copy in flight on the barrier at flat index ``key``."""
    q = _queue(m)
    mine = [c for c in q if c["key"] == key]
    if not mine:
        return
    m.tma_queue = [c for c in q if c["key"] != key]  # type: ignore[attr-defined]
    for c in mine:
        if "commit" in c:
            c["commit"]()
            arrive(m, key, 1, c["thread"], clock=c["clock"])
            continue
        m.tma_pending[c["flat"]] -= 1
        m.tma_pending_count -= 1
        m.smem[c["flat"]] = c["data"]
        complete_tx(m, key, c["bytes"], c["thread"], clock=c["clock"])


def land_all(m: Machine) -> bool:
    """Land every copy in flight; whether any did."""
    keys = sorted({c["key"] for c in _queue(m)})
    for k in keys:
        land(m, k)
    return bool(keys)


@_reg("mbarrier")
def _mbarrier(m: Machine, ins: Instruction, idx: Any) -> None:
    parts = ins.parts
    op = parts[1]
    threads = np.arange(m.T)[idx]
    table = _table(m)
    if op in ("try_wait", "test_wait"):
        raise PtxError("mbarrier waits run through the scheduler", **m.where(int(threads[0])))
    if op == "fence":
        return
    ops = ins.operands
    if op == "pending_count":
        m.write(ops[0], "u32", idx, np.zeros(len(threads), dtype=np.uint32))
        return
    a_op = ops[0] if op in ("init", "inval", "expect_tx", "complete_tx") else ops[1]
    keys = barrier_index(m, ins, a_op, idx)
    if op == "init":
        cnt = np.broadcast_to(np.asarray(m.read(ops[1], "u32", idx), dtype=np.int64), threads.shape)
        for k, c, t in zip(keys, cnt, threads):
            if not 0 < int(c) < 1 << 20:
                raise PtxError(f"mbarrier.init with count {int(c)} (1 .. 2^20 - 1)", **m.where(int(t)))
            table[int(k)] = Mbarrier(int(c), int(c))
        return
    if op == "inval":
        for k in keys:
            table.pop(int(k), None)
        return
    if op in ("expect_tx", "complete_tx"):
        n = np.broadcast_to(np.asarray(m.read(ops[1], "u32", idx), dtype=np.int64), threads.shape)
        for k, c, t in zip(keys, n, threads):
            if op == "expect_tx":
                b = _get(m, int(k), int(t))
                b.tx += int(c)
            else:
                complete_tx(m, int(k), int(c), int(t))
        return
    if op not in ("arrive", "arrive_drop"):
        raise m.unsupported()
    third = ops[2] if len(ops) > 2 else None
    vals = (
        np.broadcast_to(np.asarray(m.read(third, "u32", idx), dtype=np.int64), threads.shape)
        if third is not None
        else np.ones(len(threads), dtype=np.int64)
    )
    expect = "expect_tx" in parts
    phases = np.zeros(len(threads), dtype=np.uint64)
    for i, (k, v, t) in enumerate(zip(keys, vals, threads)):
        if op == "arrive_drop":
            b = _get(m, int(k), int(t))
            b.expected -= 1
        phases[i] = arrive(m, int(k), 1 if expect else int(v), int(t), tx=int(v) if expect else 0,
                           clock=clocks.release(m, np.array([t]), None))
    if ops[0] is not None:
        m.write(ops[0], "b64", idx, phases)


def try_wait(m: Machine, ins: Instruction, idx: Any) -> bool:
    """The scheduler's handler of ``mbarrier.try_wait`` / ``test_wait``: threads whose phase has
    completed get ``p = true`` and move on; the others first land the barrier's TMA copies,
    then park until it completes a phase."""
    threads = np.arange(m.T)[idx]
    parity = "parity" in ins.parts
    keys = barrier_index(m, ins, ins.operands[1], idx)
    xs = np.broadcast_to(
        np.asarray(m.read(ins.operands[2], "u64" if not parity else "u32", idx), dtype=np.int64),
        threads.shape,
    )
    ok = np.zeros(len(threads), dtype=bool)
    for i, (k, x, t) in enumerate(zip(keys, xs, threads)):
        b = _get(m, int(k), int(t))
        if not _done(b, int(x), parity):
            land(m, int(k))
        ok[i] = _done(b, int(x), parity)
        if ok[i]:
            clocks.acquire(m, np.array([t]), b.completed)
    go = threads[ok]
    if len(go):
        m.write(ins.operands[0], "pred", go, np.ones(len(go), dtype=bool))
        m.pc[go] += 1
    for k in np.unique(keys[~ok]):
        park = threads[~ok & (keys == k)]
        m.state[park] = WAIT
        _table(m)[int(k)].waiters.append(park)
        m.waiting_on[park] = int(k)  # type: ignore[attr-defined]
    return True


def describe_waits(m: Machine) -> PtxDeadlockError | None:
    """The deadlock of threads parked on mbarriers (None when none is parked)."""
    parked = np.nonzero(m.state == WAIT)[0]
    if not len(parked):
        return None
    t = int(parked[0])
    m.ins = m.entry.body[int(m.pc[t])]
    key = int(m.waiting_on[t])  # type: ignore[attr-defined]
    b = _table(m).get(key)
    live = int(np.count_nonzero(m.state != EXITED))
    what = (
        f"threads wait on the mbarrier at shared offset {key % m.smem_size} (phase {b.phase}: "
        f"{b.pending} of {b.expected} arrivals and {b.tx} transaction bytes pending), "
        if b is not None
        else "threads wait on a cluster barrier, "
    )
    also = mbarrier_waits(m) if b is None else ""
    return PtxDeadlockError(what + f"and none of the {live} live threads can run{also}", **m.where(t))


def mbarrier_waits(m: Machine, limit: int = 3) -> str:
    """The mbarrier waits of parked threads, for a deadlock message (empty when none): per barrier
    its phase and pending counts, the first waiting thread and the PTX line of its wait."""
    parked = np.nonzero((m.state == WAIT) & (m.waiting_on >= 0))[0]  # type: ignore[attr-defined]
    out = []
    for key in list(dict.fromkeys(int(k) for k in m.waiting_on[parked]))[:limit]:  # type: ignore[attr-defined]
        t = int(parked[m.waiting_on[parked] == key][0])  # type: ignore[attr-defined]
        b = _table(m).get(key)
        ins = m.entry.body[int(m.pc[t])]
        state = "" if b is None else f" (phase {b.phase}: {b.pending} of {b.expected} arrivals pending)"
        out.append(f"thread {int(m.tid[t])} of block {m.blocks[key // m.smem_size]} waits on the mbarrier "
                   f"at shared offset {key % m.smem_size}{state} at PTX line {ins.line}: `{ins.text}`")
    return "; meanwhile " + "; ".join(out) if out else ""
