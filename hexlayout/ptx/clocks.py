"""Happens-before in the PTX executor: the IR emulator's vector clocks (``emulator.shadow.
VectorClocks``) over the threads of a batch, for the tensor-memory ordering checks
(``tcgen05``, ``emulator.tmem_order``).

Row ``t`` is batch thread ``t``'s clock; its column is its cluster-wide index ``rank * ntid +
tid`` (threads of different clusters never synchronize, so clusters of a batch share columns).
The clocks exist when the entry has ``tcgen05`` instructions (``make``; ``m.clocks`` is None
otherwise and every function here does nothing). Releases and acquires:

* ``bar.sync`` / ``barrier.sync`` / ``bar.arrive``: each arrival releases its thread's clock
  into the barrier; when it opens, its waiters acquire the join (``execute``);
* ``bar.warp.sync``: the threads of each warp join their clocks (``join_warps``), so a lane's
  later release - an elected arrive - publishes every lane's earlier fenced reads;
* ``mbarrier.arrive`` releases into the barrier (a remote one too), a TMA copy at issue and a
  ``tcgen05.commit`` at the commit release their issuer's clock into the barrier they complete
  on; the clock of a barrier when a phase completes is what a successful ``try_wait`` /
  ``test_wait`` acquires (``mbarrier``). The clocks are cumulative (a later phase's waiter also
  acquires earlier phases'), which can hide a missing release but never report a false one;
* ``barrier.cluster.arrive`` releases into its cluster's clock, a passed ``wait`` acquires it
  (``cluster``).
"""

from __future__ import annotations

import numpy as np

from hexlayout.emulator.shadow import VectorClocks

from .machine import Machine

__all__ = ["make", "release", "acquire", "join_warps", "gid"]


def make(m: Machine) -> VectorClocks | None:
    """The clocks of machine ``m`` when its entry has tcgen05 instructions, else None."""
    if not any(ins.parts[0] == "tcgen05" for ins in m.entry.body):
        return None
    cols = m.crank[m.blk] * m.ntid + m.tid
    return VectorClocks(m.T, width=m.csize * m.ntid, cols=cols)


def release(m: Machine, threads: np.ndarray, into: np.ndarray | None) -> np.ndarray | None:
    """``threads`` release: their joined clock, maxed into ``into`` (None: a fresh one), then they
    advance their epochs. None without clocks."""
    c = getattr(m, "clocks", None)
    if c is None:
        return None
    out = c.release(np.asarray(threads, dtype=np.int64).reshape(-1))
    return out if into is None else np.maximum(into, out)


def acquire(m: Machine, threads: np.ndarray, clock: np.ndarray | None) -> None:
    """``threads`` acquire ``clock`` (nothing when it or the clocks are None)."""
    c = getattr(m, "clocks", None)
    if c is not None and clock is not None and len(threads):
        c.acquire(np.asarray(threads, dtype=np.int64).reshape(-1), clock)


def join_warps(m: Machine, threads: np.ndarray) -> None:
    """The ``threads`` of each warp join their clocks (a barrier among them)."""
    c = getattr(m, "clocks", None)
    if c is None:
        return
    threads = np.asarray(threads, dtype=np.int64).reshape(-1)
    for w in np.unique(m.warp[threads]):
        c.barrier(threads[m.warp[threads] == w])


def gid(m: Machine, threads: np.ndarray) -> np.ndarray:
    """The clock columns (cluster-wide indices) of batch ``threads``."""
    return m.clocks.col[threads]
