"""Happens-before race detection over shared memory, and marks of pending async accesses.

Vector clocks (``clocks``, a ``threads x threads`` int32 matrix): row ``t`` is what thread
``t`` knows of every thread's progress; ``clocks[t, t]`` is ``t``'s own epoch. A release
(bar.sync, mbarrier arrive, TMA complete_tx) publishes a thread's row and then advances
its epoch; an acquire (bar.sync, mbarrier wait) joins a published clock into the row.
``bar.sync`` is a release + acquire among all participants. Warp-collective instructions
(ldmatrix, stmatrix) join their warp's clocks after their accesses, warp-group
ones (wgmma) their warp group's: the lanes are converged there, and the shared-memory
accesses of such an instruction are recorded as those of one lane (the lane giving the row
address; the warp group's first thread for wgmma), so another lane's later release must
cover them.

Per shared-memory byte the shadow keeps the last writer (thread, epoch, site) and the last
reader (thread, epoch, site). An access by thread ``t`` races with the recorded access of
another thread ``u`` at epoch ``e`` when ``clocks[t, u] < e`` (``t`` has not synchronized
with ``u`` since): read-after-write against the last writer; write-after-write and
write-after-read against the last writer and the last reader. A write clears the reader
(later writes are ordered after it by the write-after-write check). Keeping only the last
reader per byte can miss a race with an earlier unsynchronized reader (FastTrack keeps a
read set); it never reports a false one.

Clusters: the columns of the clock matrix cover every thread of the block's cluster (CTA of
rank ``r``'s thread ``t`` is column ``r * threads + t``: ``offset`` + ``t``), and the shadow
records accessors by those cluster-wide ids, so arrivals on a peer CTA's barrier, multicast
TMA transfers and cluster barriers carry happens-before between CTAs: a peer's multicast write
into this CTA's bytes races with this CTA's earlier unsynchronized reads (``check_write_by``),
e.g. when the consumers' release of a stage never reached the peer that refills it.

Pending asynchronous accesses: ``pend_write[b]`` is the id of an incomplete cp.async / TMA
write of byte ``b`` (any access of it is an error until it completes); ``pend_read[b]`` the
id of an in-flight wgmma / TMA store that reads byte ``b`` (writing it is an error).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["VectorClocks", "SmemShadow", "Conflict"]


class VectorClocks:
    """``c[t]``: thread ``t``'s clock row, its own epoch in column ``col[t]`` (``offset + t``, or
    the given ``cols``: the PTX executor names a batch's threads by their cluster-wide index)."""

    def __init__(self, threads: int, offset: int = 0, width: int | None = None,
                 cols: np.ndarray | None = None) -> None:
        self.off = offset
        t = np.arange(threads)
        self.col = offset + t if cols is None else np.asarray(cols, dtype=np.int64)
        self.c = np.zeros((threads, threads if width is None else width), dtype=np.int32)
        self.c[t, self.col] = 1

    def epoch(self, tids: np.ndarray) -> np.ndarray:
        return self.c[tids, self.col[tids]]

    def barrier(self, tids: np.ndarray) -> None:
        """bar.sync among ``tids``: everyone learns the join, then advances its epoch."""
        self.c[tids] = self.c[tids].max(axis=0)
        self.c[tids, self.col[tids]] += 1

    def join_units(self, grid: np.ndarray) -> None:
        """A collective ``.sync.aligned`` instruction: each row of ``grid`` (a warp or warp group)
        joins its clocks, like a barrier among those threads."""
        rows = self.c[grid]
        self.c[grid] = np.broadcast_to(rows.max(axis=1, keepdims=True), rows.shape)
        self.c[grid, self.col[grid]] += 1

    def release(self, tids: np.ndarray) -> np.ndarray:
        """The join of ``tids``' clocks (to publish), then ``tids`` advance their epochs."""
        out = self.c[tids].max(axis=0)
        self.c[tids, self.col[tids]] += 1
        return out

    def acquire(self, tids: np.ndarray, clock: np.ndarray) -> None:
        self.c[tids] = np.maximum(self.c[tids], clock)


@dataclass
class Conflict:
    """A race found by the shadow: ``what`` is "read-after-write", "write-after-write" or
    "write-after-read"; ``thread`` accessed byte ``address``, ``other_thread`` at ``other_site``."""

    what: str
    address: int
    thread: int
    other_thread: int
    other_site: int
    other_rank: int = -1          # the other thread's CTA in the cluster when it is not this CTA


class SmemShadow:
    def __init__(self, nbytes: int, threads: int) -> None:
        n = max(nbytes, 1)
        self.clocks = VectorClocks(threads)
        self.w_tid = np.full(n, -1, dtype=np.int32)
        self.w_clk = np.zeros(n, dtype=np.int32)
        self.w_site = np.full(n, -1, dtype=np.int32)
        self.r_tid = np.full(n, -1, dtype=np.int32)
        self.r_clk = np.zeros(n, dtype=np.int32)
        self.r_site = np.full(n, -1, dtype=np.int32)
        self.pend_write = np.zeros(n, dtype=np.int32)
        self.pend_read = np.zeros(n, dtype=np.int32)

    def set_cluster(self, rank: int, size: int) -> None:
        """Clock columns for every thread of a cluster of ``size`` CTAs; this CTA has ``rank``."""
        t = self.clocks.c.shape[0]
        self.clocks = VectorClocks(t, rank * t, size * t)

    # ---- race checks ----------------------------------------------------------------
    def _check(
        self,
        clk: np.ndarray,
        ridx: np.ndarray,
        who: np.ndarray,
        other: np.ndarray,
        oclk: np.ndarray,
        osite: np.ndarray,
        addr: np.ndarray,
        what: str,
    ) -> Conflict | None:
        """``clk[ridx[i]]``: the clock of accessor ``who[i]`` (a cluster-wide id) of byte ``addr[i]``."""
        m = (other >= 0) & (other != who)
        if not m.any():
            return None
        known = clk[ridx[m], other[m]]
        bad = known < oclk[m]
        if not bad.any():
            return None
        i = int(np.flatnonzero(bad)[0])
        t = self.clocks.c.shape[0]
        off = self.clocks.off
        o = int(other[m][i])
        local = off <= o < off + t
        return Conflict(what, int(addr[m][i]), int(who[m][i]) - off if off <= int(who[m][i]) < off + t
                        else int(who[m][i]) % t, o - off if local else o % t, int(osite[m][i]),
                        -1 if local else o // t)

    def _who(self, tids: np.ndarray, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per accessed byte (flat): the accessing thread's row and its cluster-wide id."""
        ridx = np.broadcast_to(tids.reshape(-1, 1), addr.shape).reshape(-1)
        return ridx, ridx + self.clocks.off

    def read(self, tids: np.ndarray, addr: np.ndarray, site: int, check: bool = True) -> Conflict | None:
        """Record reads of bytes ``addr`` (``[n, nb]``) by threads ``tids`` (``[n]``)."""
        if check:
            ridx, who = self._who(tids, addr)
            a = addr.reshape(-1)
            c = self._check(self.clocks.c, ridx, who, self.w_tid[a], self.w_clk[a], self.w_site[a], a,
                            "read-after-write")
            if c is not None:
                return c
        self.r_tid[addr] = np.broadcast_to((tids + self.clocks.off).reshape(-1, 1), addr.shape)
        self.r_clk[addr] = np.broadcast_to(self.clocks.epoch(tids).reshape(-1, 1), addr.shape)
        self.r_site[addr] = site
        return None

    def read_by(self, clk: np.ndarray, gid: int, epoch: int, addr: np.ndarray, site: int) -> Conflict | None:
        """Check and record reads of the bytes ``addr`` (flat) by the peer CTA's thread with
        cluster-wide id ``gid``, clock row ``clk`` and epoch ``epoch`` (a ``tcgen05.mma.cta_group::2``
        reading the pair's shared memory)."""
        zero = np.zeros(len(addr), dtype=np.int64)
        c = self._check(clk.reshape(1, -1), zero, zero + gid, self.w_tid[addr], self.w_clk[addr],
                        self.w_site[addr], addr, "read-after-write")
        if c is None:
            self.r_tid[addr] = gid
            self.r_clk[addr] = epoch
            self.r_site[addr] = site
        return c

    def check_write(self, tids: np.ndarray, addr: np.ndarray) -> Conflict | None:
        ridx, who = self._who(tids, addr)
        return self.check_write_by(self.clocks.c, ridx, who, addr.reshape(-1))

    def check_write_by(
        self, clk: np.ndarray, ridx: np.ndarray, who: np.ndarray, addr: np.ndarray
    ) -> Conflict | None:
        """Write-after-write / write-after-read check of a write of the bytes ``addr`` (flat) by the
        cluster-wide thread ids ``who`` whose clocks are the rows ``clk[ridx]`` (for a peer CTA's
        multicast: ``clk`` is the issuing thread's clock, one row)."""
        c = self._check(clk, ridx, who, self.w_tid[addr], self.w_clk[addr], self.w_site[addr], addr,
                        "write-after-write")
        if c is None:
            c = self._check(clk, ridx, who, self.r_tid[addr], self.r_clk[addr], self.r_site[addr], addr,
                            "write-after-read")
        return c

    def record_write(
        self, tids: np.ndarray, addr: np.ndarray, site: int, epochs: np.ndarray | None = None,
        gids: np.ndarray | None = None,
    ) -> None:
        """Record writes of ``addr`` by ``tids`` (or by the cluster-wide thread ids ``gids`` of a
        peer CTA, with their ``epochs``)."""
        g = tids + self.clocks.off if gids is None else gids
        who = np.broadcast_to(np.asarray(g).reshape(-1, 1), addr.shape)
        ep = self.clocks.epoch(tids) if epochs is None else epochs
        self.w_tid[addr] = who
        self.w_clk[addr] = np.broadcast_to(np.asarray(ep).reshape(-1, 1), addr.shape)
        self.w_site[addr] = site
        self.r_tid[addr] = -1

    def write(self, tids: np.ndarray, addr: np.ndarray, site: int, check: bool = True) -> Conflict | None:
        if check:
            c = self.check_write(tids, addr)
            if c is not None:
                return c
        self.record_write(tids, addr, site)
        return None

    # ---- pending asynchronous accesses ------------------------------------------------
    @staticmethod
    def first_mark(marks: np.ndarray, addr: np.ndarray) -> tuple[int, int] | None:
        """``(byte address, mark id)`` of the first marked byte among ``addr``, or None."""
        p = marks[addr]
        if not p.any():
            return None
        i = np.flatnonzero(p.reshape(-1))[0]
        return int(addr.reshape(-1)[i]), int(p.reshape(-1)[i])

    @staticmethod
    def clear_marks(marks: np.ndarray, addr: np.ndarray, ident: int) -> None:
        sel = marks[addr] == ident
        marks[addr[sel]] = 0
