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

When no task can run and some wait, the block is deadlocked: ``DeadlockError`` lists every
waiting group (threads, instruction, source line, and the state of what it waits for).
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
from .interpreter import BarRequest, Group, MbarRequest, SpawnRequest, exec_body
from .machine import Machine

__all__ = ["run_block", "thread_ranges"]


@dataclass(eq=False)
class _Task:
    gen: Generator[Any, None, None]
    group: Group
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


def _deadlock(m: Machine, blocked: list[_Task]) -> None:
    lines = []
    first: Instr | None = None
    bars: dict[int, list[tuple[_Task, BarRequest]]] = m.state.get("bar", {})
    for t in blocked:
        req = t.waiting
        if isinstance(req, MbarRequest):
            st = mbarrier.get_barrier(m, req.key, req.instr)
            what = f"waits for parity {req.parity} of {mbarrier.describe(st)}"
        elif isinstance(req, BarRequest):
            arrived = sum(len(r.tids) for _, r in bars.get(req.instr.barrier_id, []))
            what = (
                f"waits at bar.sync {req.instr.barrier_id}: {arrived} of {req.expected} thread(s) have "
                f"arrived"
            )
        else:
            continue
        first = first or req.instr
        who = "thread" if len(req.tids) == 1 else "threads"
        lines.append(f"{who} {thread_ranges(req.tids)}: {describe_instr(req.instr)} {what}")
    m.fail(DeadlockError, first, "every remaining thread group is waiting:\n    " + "\n    ".join(lines))


def run_block(m: Machine) -> None:
    root_group = Group(np.arange(m.T, dtype=np.int64), {**m.base_env, m.tvar: np.arange(m.T, dtype=np.int64)})
    root = _Task(exec_body(m, m.kernel.body, root_group), root_group)
    ready: deque[_Task] = deque([root])
    mbar_wait: list[_Task] = []
    bars: dict[int, list[tuple[_Task, BarRequest]]] = m.state.setdefault("bar", {})
    alive = 1
    while alive:
        if not ready:
            still = []
            for t in mbar_wait:
                req: MbarRequest = t.waiting
                st = mbarrier.get_barrier(m, req.key, req.instr)
                mbarrier.land(m, st)
                if mbarrier.is_complete(st, req.parity):
                    t.waiting = None
                    ready.append(t)
                else:
                    still.append(t)
            mbar_wait = still
            if not ready and mbarrier.land_all(m):
                continue
            if not ready:
                blocked = mbar_wait + [t for lst in bars.values() for t, _ in lst]
                _deadlock(m, blocked)
        task = ready.popleft()
        try:
            req = next(task.gen)
        except StopIteration:
            alive -= 1
            p = task.parent
            if p is not None:
                p.children_left -= 1
                if p.children_left == 0:
                    ready.appendleft(p)
            continue
        if isinstance(req, SpawnRequest):
            kids = [_Task(exec_body(m, body, g), g, parent=task) for body, g in req.children]
            task.children_left = len(kids)
            alive += len(kids)
            ready.extendleft(reversed(kids))
        elif isinstance(req, BarRequest):
            task.waiting = req
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
