"""Execution of instruction lists by a *thread group*, as a generator.

A thread group (``Group``: sorted thread ids and an environment binding the thread
variable to them, the block index, the scalar arguments and the loop variables) executes
every instruction vectorized over its threads. Straight-line instructions run through the
per-family ``HANDLERS`` with the threads their predicate selects. The generator yields to
the scheduler only where it must wait:

* ``BarSync``: yields ``BarRequest`` unless the group alone completes the barrier;
* ``MbarWait``: yields ``MbarRequest`` unless the awaited phase has already completed;
* ``ClusterBarrier``: yields ``ClusterRequest`` (every thread of the cluster's CTAs meets);
* an ``IfThen`` whose condition differs across the group yields ``SpawnRequest`` with one
  child group per branch; the parent resumes (reconverges) when both have finished, and the
  children run as independent tasks, so they may wait on each other (warp specialization).

``ForLoop`` bounds must be the same in all threads of the group (an error otherwise); the
body runs once per iteration with the loop variable bound to a Python int.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexlayout.ir.expr import Var
from hexlayout.ir.lowered import BarSync, ClusterBarrier, CpAsync, ForLoop, IfThen, Instr, LdGlobal, MbarWait

from . import alu, atomics, cpasync, ldmatrix, mbarrier, memops, mma, proxy, tcgen05, tma, tmem, wgmma
from .errors import IllegalInstructionError
from .machine import Active, Machine

__all__ = ["Group", "BarRequest", "ClusterRequest", "MbarRequest", "SpawnRequest", "exec_body", "HANDLERS"]

HANDLERS: dict[type, Callable[[Machine, Any, Active], None]] = {}
for _mod in (memops, cpasync, ldmatrix, mma, wgmma, tma, mbarrier, alu, atomics, proxy, tmem, tcgen05):
    HANDLERS.update(_mod.HANDLERS)  # type: ignore[attr-defined]

# instructions that act on predicated-off threads too (zero fill)
_RUN_WHEN_OFF = (LdGlobal, CpAsync)


@dataclass
class Group:
    tids: np.ndarray
    env: dict[Var, Any]


@dataclass
class BarRequest:
    instr: BarSync
    tids: np.ndarray
    expected: int


@dataclass
class MbarRequest:
    instr: MbarWait
    tids: np.ndarray
    key: tuple[str, int]
    parity: int


@dataclass
class ClusterRequest:
    instr: ClusterBarrier
    tids: np.ndarray


@dataclass
class SpawnRequest:
    instr: IfThen
    children: list[tuple[list[Instr], Group]]


Request = BarRequest | MbarRequest | SpawnRequest | ClusterRequest


def _activate(m: Machine, ins: Instr, g: Group) -> Active:
    tids = g.tids
    if ins.pred is None:
        x = Active(tids, g.env, tids, g.env, None)
    else:
        p = m.ev_vec(ins.pred, g.env, len(tids)) != 0
        if p.all():
            x = Active(tids, g.env, tids, g.env, None)
        else:
            sub = tids[p]
            x = Active(sub, {**g.env, m.tvar: sub}, tids, g.env, p)
    if len(x.tids) and m.options.count:
        s = m.report.site(ins)
        s.executions += 1
        s.warp_executions += int(np.count_nonzero(np.diff(x.tids >> 5))) + 1
    return x


def exec_body(m: Machine, body: list[Instr], g: Group) -> Generator[Request, None, None]:
    """Run ``body`` for group ``g``; yields where the scheduler must decide."""
    for ins in body:
        h = HANDLERS.get(type(ins))
        if h is not None:
            x = _activate(m, ins, g)
            if len(x.tids) or isinstance(ins, _RUN_WHEN_OFF):
                h(m, ins, x)
            continue
        if isinstance(ins, ForLoop):
            x = _activate(m, ins, g)
            if not len(x.tids):
                continue
            start = m.ev_uniform(ins.start, x.env, ins, f"start of loop over {ins.var.name}")
            stop = m.ev_uniform(ins.stop, x.env, ins, f"end of loop over {ins.var.name}")
            if ins.step == 0:
                m.fail(IllegalInstructionError, ins, f"loop over {ins.var.name} has step 0")
            sub = g if x.mask is None else Group(x.tids, x.env)
            for i in range(start, stop, ins.step):
                env = {**sub.env, ins.var: i}
                yield from exec_body(m, ins.body, Group(sub.tids, env))
        elif isinstance(ins, IfThen):
            x = _activate(m, ins, g)
            if not len(x.tids):
                continue
            c = m.ev_vec(ins.cond, x.env, len(x.tids)) != 0
            if c.all():
                yield from exec_body(m, ins.then_body, Group(x.tids, x.env))
            elif not c.any():
                yield from exec_body(m, ins.else_body, Group(x.tids, x.env))
            else:
                children = []
                for sel, body_ in ((c, ins.then_body), (~c, ins.else_body)):
                    if body_:
                        t = x.tids[sel]
                        children.append((body_, Group(t, {**x.env, m.tvar: t})))
                if children:
                    yield SpawnRequest(ins, children)
        elif isinstance(ins, BarSync):
            x = _activate(m, ins, g)
            if not len(x.tids):
                continue
            expected = m.T if ins.threads is None else int(ins.threads)
            waiting = m.state.get("bar", {}).get(ins.barrier_id)
            if not waiting and len(x.tids) == expected:
                if m.options.check_races:
                    m.shadow.clocks.barrier(x.tids)
                continue
            yield BarRequest(ins, x.tids, expected)
        elif isinstance(ins, ClusterBarrier):
            x = _activate(m, ins, g)
            if len(x.tids):
                yield ClusterRequest(ins, x.tids)
        elif isinstance(ins, MbarWait):
            x = _activate(m, ins, g)
            if not len(x.tids):
                continue
            key = mbarrier.barrier_key(m, ins.bar, x.env, ins)
            parity = m.ev_uniform(ins.phase, x.env, ins, "mbarrier wait parity")
            st = mbarrier.get_barrier(m, key, ins)
            mbarrier.land(m, st)
            if not mbarrier.is_complete(st, parity):
                yield MbarRequest(ins, x.tids, key, parity)
            mbarrier.acquire(m, st, parity, x.tids)
        else:
            m.fail(
                IllegalInstructionError, ins, f"the emulator does not know instruction {type(ins).__name__}"
            )
