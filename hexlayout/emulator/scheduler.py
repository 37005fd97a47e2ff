"""Cooperative scheduling of the thread groups of one block.

Each task is a generator from ``interpreter.exec_body`` for one thread group. A task runs
until it finishes or yields a request:

* ``SpawnRequest`` (divergent ``IfThen``): the children become tasks (run first); the parent
  waits until all have finished, then resumes with its whole group (reconvergence);
* ``BarRequest`` (``bar.sync``): the task's threads arrive at the named barrier; when the
  expected number of threads has arrived, all waiting tasks resume (a bar.sync
  happens-before join among them);
* ``MbarRequest``: the task waits until the barrier's phase of that parity completes
  (waiters are re-tested when no task is ready; in-flight TMA transfers land then).

* ``ClusterRequest`` (``barrier.cluster``): the task's threads arrive at the cluster
  barrier; when every thread of every CTA of the cluster has arrived, all resume.

The CTAs of a thread-block cluster run together (``run_cluster``): their tasks share one
ready queue, so a CTA's TMA multicast lands in a peer's shared memory and its remote arrives
count on the peer's barriers while the peer runs. A CTA whose threads have all finished is
*exited*: a later multicast or remote arrive into it is an error (the cluster barrier before
exit that prevents this is missing).

When no task can run and some wait, the cluster is deadlocked: ``DeadlockError`` lists every
waiting group (block when the cluster has several, threads, instruction, source line, and the
state of what it waits for).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexlayout.ir.lowered import Instr

from . import mbarrier
from .errors import DeadlockError, describe_instr
from .interpreter import BarRequest, ClusterRequest, Group, MbarRequest, SpawnRequest, exec_body
from .machine import Machine

__all__ = ["run_block", "run_cluster", "thread_ranges"]


@dataclass(eq=False)
class _Task:
    gen: Generator[Any, None, None]
    group: Group
    m: Machine
    parent: _Task | None = None
    children_left: int = 0
    waiting: Any = None
    children: list[_Task] = field(default_factory=list)


def thread_ranges(tids: np.ndarray) -> str:
    """``0-31, 64-95`` style summary of sorted thread ids."""
    if len(tids) == 0:
        return "none"
    breaks = np.flatnonzero(np.diff(tids) != 1)
    starts = np.concatenate(([tids[0]], tids[breaks + 1]))
    ends = np.concatenate((tids[breaks], [tids[-1]]))
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in zip(starts, ends))


def _deadlock(ms: list[Machine], blocked: list[_Task],
              cluster_wait: list[tuple[_Task, ClusterRequest]]) -> None:
    lines = []
    first: tuple[Machine, Instr] | None = None
    arrived_cluster = sum(len(r.tids) for _, r in cluster_wait)
    for t in blocked:
        req = t.waiting
        m = t.m
        if isinstance(req, MbarRequest):
            st = mbarrier.get_barrier(m, req.key, req.instr)
            what = f"waits for parity {req.parity} of {mbarrier.describe(st)}"
        elif isinstance(req, BarRequest):
            bars: dict[int, list[tuple[_Task, BarRequest]]] = m.state.get("bar", {})
            arrived = sum(len(r.tids) for _, r in bars.get(req.instr.barrier_id, []))
            what = (
                f"waits at bar.sync {req.instr.barrier_id}: {arrived} of {req.expected} thread(s) have "
                f"arrived"
            )
        elif isinstance(req, ClusterRequest):
            what = (f"waits at barrier.cluster: {arrived_cluster} of {sum(x.T for x in ms)} thread(s) of the "
                    f"cluster have arrived")
        else:
            continue
        first = first or (m, req.instr)
        who = "thread" if len(req.tids) == 1 else "threads"
        where = f"block {m.block} " if len(ms) > 1 else ""
        lines.append(f"{where}{who} {thread_ranges(req.tids)}: {describe_instr(req.instr)} {what}")
    m0, ins0 = first if first is not None else (ms[0], None)
    m0.fail(DeadlockError, ins0, "every remaining thread group is waiting:\n    " + "\n    ".join(lines))


def run_block(m: Machine) -> None:
    """Run one block (a cluster of one)."""
    run_cluster([m])


def run_cluster(ms: list[Machine]) -> None:
    """Run the blocks ``ms`` of one cluster together (rank = position in ``ms``)."""
    for r, m in enumerate(ms):
        m.cluster = ms
        m.rank = r
        m.exited = False
        if len(ms) > 1:
            m.shadow.set_cluster(r, len(ms))
    ready: deque[_Task] = deque()
    alive: dict[int, int] = {}
    for m in ms:
        tids = np.arange(m.T, dtype=np.int64)
        root_group = Group(tids, {**m.base_env, m.tvar: tids})
        ready.append(_Task(exec_body(m, m.kernel.body, root_group), root_group, m))
        alive[id(m)] = 1
        m.state.setdefault("bar", {})
    mbar_wait: list[_Task] = []
    cluster_wait: list[tuple[_Task, ClusterRequest]] = []
    cluster_threads = sum(m.T for m in ms)
    while any(alive.values()):
        if not ready:
            still = []
            for t in mbar_wait:
                req: MbarRequest = t.waiting
                st = mbarrier.get_barrier(t.m, req.key, req.instr)
                mbarrier.land(t.m, st)
                if mbarrier.is_complete(st, req.parity):
                    t.waiting = None
                    ready.append(t)
                else:
                    still.append(t)
            mbar_wait = still
            if not ready and any([mbarrier.land_all(m) for m in ms]):
                continue
            if not ready:
                blocked = mbar_wait + [t for m in ms for lst in m.state["bar"].values() for t, _ in lst]
                _deadlock(ms, blocked + [t for t, _ in cluster_wait], cluster_wait)
        task = ready.popleft()
        m = task.m
        try:
            req = next(task.gen)
        except StopIteration:
            alive[id(m)] -= 1
            if not alive[id(m)]:
                m.exited = True
            p = task.parent
            if p is not None:
                p.children_left -= 1
                if p.children_left == 0:
                    ready.appendleft(p)
            continue
        if isinstance(req, SpawnRequest):
            kids = [_Task(exec_body(m, body, g), g, m, parent=task) for body, g in req.children]
            task.children_left = len(kids)
            alive[id(m)] += len(kids)
            ready.extendleft(reversed(kids))
        elif isinstance(req, BarRequest):
            task.waiting = req
            bars = m.state["bar"]
            lst = bars.setdefault(req.instr.barrier_id, [])
            lst.append((task, req))
            arrived = sum(len(r.tids) for _, r in lst)
            if arrived >= req.expected:
                tids = np.concatenate([r.tids for _, r in lst])
                if m.options.check_races:
                    m.shadow.clocks.barrier(tids)
                for t, _ in lst:
                    t.waiting = None
                    ready.append(t)
                bars[req.instr.barrier_id] = []
        elif isinstance(req, MbarRequest):
            task.waiting = req
            mbar_wait.append(task)
        elif isinstance(req, ClusterRequest):
            task.waiting = req
            cluster_wait.append((task, req))
            if sum(len(r.tids) for _, r in cluster_wait) >= cluster_threads:
                if m.options.check_races:   # every thread of the cluster learns the join of all
                    join = np.max([x.shadow.clocks.c.max(axis=0) for x in ms], axis=0)
                    for x in ms:
                        x.shadow.clocks.acquire(np.arange(x.T), join)
                        x.shadow.clocks.c[np.arange(x.T), x.shadow.clocks.off + np.arange(x.T)] += 1
                for t, _ in cluster_wait:
                    t.waiting = None
                    ready.append(t)
                cluster_wait = []
