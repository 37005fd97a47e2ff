"""The order of tensor-memory accesses against the MMAs that read and write the same cells, by
vector clocks (``shadow.VectorClocks``): shared by the IR emulator (``emulator/tmem.py``,
``emulator/tcgen05.py``) and the PTX executor (``ptx/tcgen05.py``), which only differ in how they
name threads and report errors.

Threads are named by their clock column ``g`` (``VectorClocks.col``: cluster-wide). Per TMEM cell
``(lane, column)`` of one CTA:

* ``ld_by`` = ``g + 1`` of the last ``tcgen05.ld`` of the cell (0: none) and ``ld_epoch``: the
  reader's epoch from which a later MMA into the cell is ordered after the read. It is
  ``LD_IN_FLIGHT`` from the load to its warp's ``tcgen05.wait::ld``, ``LD_UNFENCED`` from there
  to the reading thread's ``tcgen05.fence::before_thread_sync``, and then the reader's epoch at
  the fence. An MMA issued by thread ``i`` (clock row ``c_i``) may write the cell only if
  ``ld_by - 1 == g_i`` or ``c_i[ld_by - 1] >= ld_epoch`` (``unordered_load``): the reader's
  wait, fence, then a release (barrier, mbarrier arrival) the issuer acquired - the two
  sentinels exceed every real epoch, so a read not waited for or not fenced is never ordered.
* ``st_by`` = ``g + 1`` of the last ``tcgen05.st`` into the cell and ``st_epoch``: the storing
  thread's epoch at its warp's ``tcgen05.wait::st`` (``ST_IN_FLIGHT`` before). An MMA reading
  the cell (A in TMEM) issued by ``i`` needs ``st_by - 1 == g_i`` or ``c_i[st_by - 1] >=
  st_epoch`` (``unordered_store``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hexlayout.arch.tmem import TMEM_COLUMNS, TMEM_LANES

__all__ = ["TmemOrder", "LD_IN_FLIGHT", "LD_UNFENCED", "ST_IN_FLIGHT", "Unordered"]

#: the epoch of a cell's last tcgen05.ld before its warp's wait::ld (no MMA may be ordered after it)
LD_IN_FLIGHT = np.iinfo(np.int32).max
#: ... after the wait::ld, before the reading thread's tcgen05.fence::before_thread_sync
LD_UNFENCED = LD_IN_FLIGHT - 1
#: the epoch of a cell's last tcgen05.st before its warp's wait::st
ST_IN_FLIGHT = LD_IN_FLIGHT

#: cells of one warp's access: ``(lanes [32, R], cols [32, R], threads [32], gids [32])``
_Cells = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _grid() -> np.ndarray:
    return np.zeros((TMEM_LANES, TMEM_COLUMNS), dtype=np.int64)


@dataclass
class Unordered:
    """An access an MMA is not ordered after: by thread ``gid`` (clock column), first at cell
    ``(lane, col)``; ``need`` its epoch (``LD_IN_FLIGHT`` / ``LD_UNFENCED``: not waited / not
    fenced)."""

    gid: int
    lane: int
    col: int
    need: int

    def why(self) -> str:
        """The reason in words, for an error message (empty for a missing release)."""
        return {LD_IN_FLIGHT: " (its tcgen05.wait::ld has not run)",
                LD_UNFENCED: " (it waited, tcgen05.wait::ld, but no tcgen05.fence::before_thread_sync "
                             "followed)"}.get(self.need, "")


@dataclass
class TmemOrder:
    """The reads and stores of one CTA's TMEM an MMA must be ordered with (module docstring)."""

    ld_by: np.ndarray = field(default_factory=_grid)
    ld_epoch: np.ndarray = field(default_factory=_grid)
    #: per warp key, its loads not yet waited for / waited but not fenced
    ld_cells: dict[int, list[_Cells]] = field(default_factory=dict)
    ld_unfenced: dict[int, list[_Cells]] = field(default_factory=dict)
    st_by: np.ndarray = field(default_factory=_grid)
    st_epoch: np.ndarray = field(default_factory=_grid)
    #: per warp key, its stores not yet waited for
    st_cells: dict[int, list[_Cells]] = field(default_factory=dict)

    # --- loads -------------------------------------------------------------------------------------

    def load(self, warp: int, lanes: np.ndarray, cols: np.ndarray, threads: np.ndarray,
             gids: np.ndarray) -> None:
        """A ``tcgen05.ld`` by the 32 ``threads`` (clock columns ``gids``) of warp key ``warp``."""
        self.ld_by[lanes, cols] = (gids + 1)[:, None]
        self.ld_epoch[lanes, cols] = LD_IN_FLIGHT
        self.ld_cells.setdefault(warp, []).append((lanes, cols, threads, gids))

    def load_in_flight(self, cols: np.ndarray) -> int | None:
        """The warp key of a load not yet waited for that reads one of the columns ``cols`` (None:
        there is none)."""
        hits = (w for w, lst in self.ld_cells.items() for _l, c, _t, _g in lst if np.isin(c, cols).any())
        return next(hits, None)

    def wait_ld(self, warp: int) -> None:
        """``tcgen05.wait::ld`` of warp key ``warp``: its loads completed, not yet fenced."""
        done = self.ld_cells.pop(warp, [])
        for lanes, cols, _threads, gids in done:
            mine = self.ld_by[lanes, cols] == (gids + 1)[:, None]
            self.ld_epoch[lanes[mine], cols[mine]] = LD_UNFENCED
        self.ld_unfenced.setdefault(warp, []).extend(done)

    def fence(self, warp: int, threads: np.ndarray, epochs: np.ndarray) -> None:
        """``tcgen05.fence::before_thread_sync`` by ``threads`` of warp key ``warp`` (their epochs
        ``epochs`` now): their waited loads take those epochs."""
        at = dict(zip(threads.tolist(), epochs.tolist()))
        keep = []
        for lanes, cols, thr, gids in self.ld_unfenced.pop(warp, []):
            on = np.isin(thr, threads)
            if not on.all():
                keep.append((lanes[~on], cols[~on], thr[~on], gids[~on]))
            lanes, cols, thr, gids = lanes[on], cols[on], thr[on], gids[on]
            mine = (self.ld_by[lanes, cols] == (gids + 1)[:, None]) & \
                (self.ld_epoch[lanes, cols] == LD_UNFENCED)
            ep = np.broadcast_to(np.array([at[int(t)] for t in thr], dtype=np.int64)[:, None], lanes.shape)
            self.ld_epoch[lanes[mine], cols[mine]] = ep[mine]
        if keep:
            self.ld_unfenced[warp] = keep

    def unordered_load(self, lanes: np.ndarray, cols: np.ndarray, me: int,
                       row: np.ndarray) -> Unordered | None:
        """The first read of the cells ``(lanes, cols)`` by another thread than clock column ``me``
        that an MMA issued with clock row ``row`` is not ordered after (None: all are)."""
        return _unordered(self.ld_by[lanes, cols], self.ld_epoch[lanes, cols], lanes, cols, me, row)

    # --- stores ------------------------------------------------------------------------------------

    def store(self, warp: int, lanes: np.ndarray, cols: np.ndarray, threads: np.ndarray,
              gids: np.ndarray) -> None:
        """A ``tcgen05.st`` by the 32 ``threads`` (clock columns ``gids``) of warp key ``warp``."""
        self.st_by[lanes, cols] = (gids + 1)[:, None]
        self.st_epoch[lanes, cols] = ST_IN_FLIGHT
        self.st_cells.setdefault(warp, []).append((lanes, cols, threads, gids))

    def wait_st(self, warp: int, epochs_of: dict[int, int]) -> None:
        """``tcgen05.wait::st`` of warp key ``warp``: each of its stores' cells takes its storing
        thread's epoch (``epochs_of[thread]``)."""
        for lanes, cols, threads, gids in self.st_cells.pop(warp, []):
            mine = self.st_by[lanes, cols] == (gids + 1)[:, None]
            ep = np.broadcast_to(np.array([epochs_of[int(t)] for t in threads], dtype=np.int64)[:, None],
                                 lanes.shape)
            self.st_epoch[lanes[mine], cols[mine]] = ep[mine]

    def store_in_flight(self, lanes: np.ndarray, cols: np.ndarray) -> Unordered | None:
        """The first of the cells a ``tcgen05.st`` wrote whose warp has not run ``wait::st``."""
        hit = (self.st_by[lanes, cols] > 0) & (self.st_epoch[lanes, cols] == ST_IN_FLIGHT)
        if not hit.any():
            return None
        i = tuple(np.argwhere(hit)[0])
        return Unordered(int(self.st_by[lanes, cols][i]) - 1, int(lanes[i]), int(cols[i]), ST_IN_FLIGHT)

    def unordered_store(self, lanes: np.ndarray, cols: np.ndarray, me: int,
                        row: np.ndarray) -> Unordered | None:
        """The first store into the cells by another thread than ``me`` that an MMA issued with
        clock row ``row`` (reading the cells) is not ordered after."""
        return _unordered(self.st_by[lanes, cols], self.st_epoch[lanes, cols], lanes, cols, me, row)


def _unordered(by: np.ndarray, epoch: np.ndarray, lanes: np.ndarray, cols: np.ndarray, me: int,
               row: np.ndarray) -> Unordered | None:
    for src in np.unique(by[by > 0]) - 1:
        if src == me:
            continue
        cells = by == src + 1
        need = int(epoch[cells].max())
        if row[src] < need:
            i = tuple(np.argwhere(cells)[0])
            return Unordered(int(src), int(lanes[i]), int(cols[i]), need)
    return None
