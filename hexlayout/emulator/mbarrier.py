"""``mbarrier`` (sm_80 / sm_90): arrival-count and transaction-count barriers with phases.

State per barrier (``MbarRef`` name and index): expected arrivals (from ``MbarInit``),
pending arrivals and transaction bytes of the current phase, and the phase number.
``MbarArrive`` counts one arrival per executing thread; with ``tx_bytes > 0`` it is
``arrive.expect_tx``: the transaction count grows by ``tx_bytes`` per thread first. A TMA
load issued on the barrier is *in flight* until it lands, which the emulator delays as
long as the program allows: until some thread tests the barrier (``MbarWait``), or no
thread group can run otherwise (before a deadlock is declared), or the block ends. Landing
lowers the transaction count by the box's bytes. The current phase completes when both
counts reach zero: the TMA writes that landed in it reach shared memory, the pending count
resets to the expected count and the phase number advances. (So a read of a TMA
destination that does not wait on the barrier always sees the write still pending, and an
``arrive`` without ``expect_tx`` lets the phase complete before the data is there.)

``MbarWait(phase)`` (``try_wait.parity`` loop) returns once the phase with parity ``phase``
has completed, i.e. while the current phase's parity differs from ``phase`` (so waiting for
parity 1 on a fresh barrier passes at once, the producer-start idiom).

Happens-before: arrivals release the arriving threads' clocks into the barrier (a TMA
releases its issuing thread's); a completed phase publishes their join, which a successful
wait acquires.

Clusters: ``MbarArrive`` with ``cta`` arrives on the barrier of the same name and index in
the cluster's CTA of that rank (which must not have exited), and a multicast TMA load
completes its bytes on each destination CTA's barrier. Clocks span the cluster's threads
(``shadow.py``), so these arrivals and transfers release and acquire across CTAs like local
ones.

``WarpSync`` (``bar.warp.sync``, whole warps) joins each warp's clocks, so an arrive by one
elected lane after it releases the whole warp's earlier accesses.

``tcgen05.commit`` (sm_100a) is an arrival that lands like a transfer: it counts at once but
holds the phase with one pending transaction until it lands, and its landing completes the
committed MMAs (their accumulators reach tensor memory, ``emulator/tcgen05.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from hexlayout.ir.lowered import Instr, MbarArrive, MbarInit, MbarRef, WarpSync

from .cpasync import complete_rows
from .errors import EmulationError, IllegalInstructionError, OutOfBoundsError
from .machine import Active, AsyncOp, Machine
from .warps import whole_units

__all__ = [
    "HANDLERS",
    "MbarState",
    "barrier_key",
    "get_barrier",
    "is_complete",
    "acquire",
    "complete_tx",
    "describe",
    "land",
    "land_all",
]


@dataclass
class MbarState:
    name: str
    index: int
    expected: int
    pending: int
    clock: np.ndarray
    tx: int = 0
    phase: int = 0
    completed: dict[int, np.ndarray] = field(default_factory=dict)
    attached: list[AsyncOp] = field(default_factory=list)
    inflight: list[tuple[AsyncOp | None, int]] = field(default_factory=list)
    init_instr: Instr | None = None


def barrier_key(m: Machine, ref: MbarRef, env: dict[Any, Any], ins: Instr) -> tuple[str, int]:
    idx = m.ev_uniform(ref.index, env, ins, f"mbarrier index of {ref.name}")
    if not 0 <= idx < max(ref.count, 1):
        _fail_on(m, OutOfBoundsError, ins, (ref.name, idx),
                 f"mbarrier {ref.name}[{idx}] is outside its array of {ref.count}")
    return ref.name, idx


def _fail_on(m: Machine, cls: type[EmulationError], ins: Instr, key: tuple[str, int],
             detail: str) -> NoReturn:
    """Fail with ``cls`` and ``detail`` about barrier ``key`` (``(array name, index)``: the
    error's buffer and address)."""
    m.fail(cls, ins, detail, buffer=key[0], address=key[1])


def _barriers(m: Machine) -> dict[tuple[str, int], MbarState]:
    return m.state.setdefault("mbarrier", {})


def get_barrier(m: Machine, key: tuple[str, int], ins: Instr) -> MbarState:
    st = _barriers(m).get(key)
    if st is None:
        _fail_on(m, IllegalInstructionError, ins, key,
                 f"mbarrier {key[0]}[{key[1]}] is used before mbarrier.init")
    return st


def describe(st: MbarState) -> str:
    return (
        f"mbarrier {st.name}[{st.index}]: phase {st.phase} (parity {st.phase & 1}) in progress, "
        f"{st.pending}/{st.expected} arrival(s) missing, {st.tx} transaction byte(s) outstanding"
        + (f", {len(st.inflight)} TMA transfer(s) in flight" if st.inflight else "")
    )


def _maybe_complete(m: Machine, st: MbarState) -> None:
    if st.pending != 0 or st.tx != 0:
        return
    for op in st.attached:
        if callable(op.extra):  # completes by its own rule (the MMAs of a tcgen05.commit)
            op.extra(m)
        else:
            assert op.done is not None
            complete_rows(m, op, ~op.done)
        m.async_ops.pop(op.ident, None)
    st.attached = []
    st.completed[st.phase & 1] = st.clock.copy()
    st.phase += 1
    st.pending = st.expected


def is_complete(st: MbarState, parity: int) -> bool:
    return (st.phase & 1) != (parity & 1)


def acquire(m: Machine, st: MbarState, parity: int, tids: np.ndarray) -> None:
    clk = st.completed.get(parity & 1)
    if clk is not None and m.options.check_races:
        m.shadow.clocks.acquire(tids, clk)


def complete_tx(
    m: Machine, st: MbarState, nbytes: int, op: AsyncOp | None, issuer: np.ndarray, issuer_clocks: Any = None
) -> None:
    """A TMA transfer of ``nbytes`` (writing ``op``) is issued to complete on the barrier; it is in
    flight until ``land`` (its completion releases the issuing thread's clock into the barrier;
    ``issuer_clocks``: the clocks of the issuing CTA when it is a peer of ``m``)."""
    if m.options.check_races:
        clocks = m.shadow.clocks if issuer_clocks is None else issuer_clocks
        st.clock = np.maximum(st.clock, clocks.release(issuer))
    st.inflight.append((op, nbytes))


def land(m: Machine, st: MbarState) -> None:
    """Complete the barrier's in-flight transfers (transaction bytes; maybe the phase)."""
    while st.inflight:
        op, nbytes = st.inflight.pop(0)
        if op is not None:
            st.attached.append(op)
        st.tx -= nbytes
        _maybe_complete(m, st)


def land_all(m: Machine) -> bool:
    """Land every in-flight transfer of every barrier; True if there were any."""
    any_ = False
    for st in _barriers(m).values():
        if st.inflight:
            any_ = True
            land(m, st)
    return any_


def mbar_init(m: Machine, ins: MbarInit, x: Active) -> None:
    if not len(x.tids):
        return
    if ins.arrivals < 1 or ins.arrivals >= 1 << 20:
        m.fail(
            IllegalInstructionError, ins, f"mbarrier.init with {ins.arrivals} arrivals (must be in [1, 2^20))"
        )
    idx = m.ev_vec(ins.bar.index, x.env, len(x.tids))
    for i in np.unique(idx):
        key = barrier_key(m, ins.bar, {**x.env, m.tvar: x.tids[idx == i]}, ins)
        _barriers(m)[key] = MbarState(
            key[0], key[1], ins.arrivals, ins.arrivals, np.zeros(m.shadow.clocks.c.shape[1], dtype=np.int32),
            init_instr=ins
        )


def mbar_arrive(m: Machine, ins: MbarArrive, x: Active) -> None:
    if not len(x.tids):
        return
    idx = m.ev_vec(ins.bar.index, x.env, len(x.tids))
    ranks = m.ev_vec(ins.cta, x.env, len(x.tids)) if ins.cta is not None else np.full(len(x.tids), m.rank)
    for i in np.unique(idx):
        for r in np.unique(ranks[idx == i]):
            sel = (idx == i) & (ranks == r)
            sub = x.tids[sel]
            key = barrier_key(m, ins.bar, {**x.env, m.tvar: sub}, ins)
            what = f"mbarrier.arrive on {key[0]}[{key[1]}] of a peer CTA"
            tm = m if ins.cta is None else m.peer(int(r), ins, what)
            st = get_barrier(tm, key, ins)
            st.tx += ins.tx_bytes * len(sub)
            if len(sub) > st.pending:
                where = "" if tm is m else f" of block {tm.block} (cluster rank {int(r)})"
                _fail_on(m, IllegalInstructionError, ins, key, f"{len(sub)} arrival(s) on {describe(st)}"
                         f"{where}: more arrivals than the phase expects")
            st.pending -= len(sub)
            if m.options.check_races:
                st.clock = np.maximum(st.clock, m.shadow.clocks.release(sub))
            _maybe_complete(tm, st)


def warp_sync(m: Machine, ins: WarpSync, x: Active) -> None:
    """``bar.warp.sync`` of whole warps: each warp's clocks join (a barrier among its lanes), so a
    lane's later release - an elected arrive - publishes every lane's earlier accesses."""
    if not len(x.tids):
        return
    grid = whole_units(m, ins, x.tids, 32, "bar.warp.sync (__syncwarp)")
    if m.options.check_races:
        m.shadow.clocks.join_units(grid)


HANDLERS = {MbarInit: mbar_init, MbarArrive: mbar_arrive, WarpSync: warp_sync}
