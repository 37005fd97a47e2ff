"""Thread-block clusters (sm_90, PTX ISA "Cluster"): ``mapa`` and ``barrier.cluster``.

The CTAs of a cluster (``.reqnctapercluster``, or the launch's cluster shape) run in one
batch. ``%cluster_ctarank`` is ``x % cx + cx * (y % cy + cy * (z % cz))`` of ``%ctaid``.

* ``mapa.shared::cluster.u32 d, a, r``: the ``shared::cluster`` address of shared offset
  ``a`` in the cluster's CTA of rank ``r``, encoded ``(r + 1) << 24 | a``
  (``machine.CLUSTER_RANK_SHIFT``); instructions with a ``shared::cluster`` operand
  (``mbarrier.arrive``, TMA destinations) decode it, and a CTA that has exited cannot be
  reached.
* ``barrier.cluster.arrive`` / ``barrier.cluster.wait``: a thread's ``wait`` returns once
  every live thread of every CTA of its cluster has made the ``arrive`` it pairs with (the
  thread's own last one). Until then the thread is parked (state ``WAIT``); a cluster barrier
  that cannot complete is a deadlock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import clocks
from .alu import _reg
from .errors import PtxError
from .machine import CLUSTER_RANK_SHIFT, EXITED, RUN, WAIT, Machine
from .parse import Instruction

__all__ = ["cluster_barrier", "release_clusters"]


@_reg("mapa")
def _mapa(m: Machine, ins: Instruction, idx: Any) -> None:
    threads = np.arange(m.T)[idx]
    if "shared::cluster" not in ins.parts:
        raise m.unsupported("mapa on generic addresses")
    a = np.asarray(m.read(ins.operands[1], "u32", idx)).astype(np.int64)
    r = np.broadcast_to(np.asarray(m.read(ins.operands[2], "u32", idx)).astype(np.int64), threads.shape)
    if (r >= m.csize).any():
        i = int(np.argmax(r >= m.csize))
        raise PtxError(f"mapa to CTA rank {int(r[i])} of a {m.csize}-CTA cluster", **m.where(int(threads[i])))
    off = a & ((1 << CLUSTER_RANK_SHIFT) - 1)
    m.write(ins.operands[0], "u32", idx, ((r + 1) << CLUSTER_RANK_SHIFT | off).astype(np.uint32))


def _state(m: Machine) -> dict[str, Any]:
    st = getattr(m, "cluster_barrier", None)
    if st is None:
        st = m.cluster_barrier = {
            "arrived": np.zeros(m.T, dtype=np.int64),  # type: ignore[attr-defined]
            "waited": np.zeros(m.T, dtype=np.int64),
        }
    return st


def _clusters(m: Machine) -> np.ndarray:
    """Per thread, the index of its cluster in the batch."""
    cl = getattr(m, "cluster_index", None)
    if cl is None:
        ids = {c: i for i, c in enumerate(dict.fromkeys(m.cluster_id))}
        cl = m.cluster_index = np.array([ids[c] for c in m.cluster_id], dtype=np.int64)[m.blk]  # type: ignore[attr-defined]
    return cl


def _complete(m: Machine, st: dict[str, Any], threads: np.ndarray) -> np.ndarray:
    """Per thread of ``threads``: whether every live thread of its cluster has made the arrive
    that the thread's next wait pairs with."""
    cl = _clusters(m)
    live = m.state != EXITED
    least = np.full(int(cl.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(least, cl[live], st["arrived"][live])
    return least[cl[threads]] >= st["waited"][threads] + 1


def release_clusters(m: Machine) -> None:
    """Wake the threads parked on a cluster barrier whose arrivals are all in."""
    st = getattr(m, "cluster_barrier", None)
    if st is None:
        return
    parked = np.nonzero((m.state == WAIT) & (m.waiting_on == -2))[0]  # type: ignore[attr-defined]
    if len(parked):
        m.state[parked[_complete(m, st, parked)]] = RUN


def cluster_barrier(m: Machine, ins: Instruction, idx: Any) -> bool:
    """``barrier.cluster.arrive`` / ``.wait`` (the scheduler's control handler)."""
    threads = np.arange(m.T)[idx]
    st = _state(m)
    if "arrive" in ins.parts:
        st["arrived"][threads] += 1
        if getattr(m, "clocks", None) is not None:     # each cluster's arrivals release into its clock
            own = st.setdefault("clock", {})
            cl = _clusters(m)
            for c in np.unique(cl[threads]):
                own[int(c)] = clocks.release(m, threads[cl[threads] == c], own.get(int(c)))
        m.pc[threads] += 1
        release_clusters(m)
        return True
    if "wait" not in ins.parts:
        raise m.unsupported()
    ready = _complete(m, st, threads)
    go = threads[ready]
    st["waited"][go] += 1
    for c in np.unique(_clusters(m)[go]) if "clock" in st else []:
        clocks.acquire(m, go[_clusters(m)[go] == c], st["clock"].get(int(c)))
    m.pc[go] += 1
    park = threads[~ready]
    m.state[park] = WAIT
    m.waiting_on[park] = -2  # type: ignore[attr-defined]
    if m.races is not None and len(go):
        m.races.epoch[np.unique(m.blk[go])] += 1
    return True
