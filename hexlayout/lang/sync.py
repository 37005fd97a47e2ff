"""Synchronization: block barriers, cp.async groups, mbarriers, wgmma fences, registers.

- ``hl.syncthreads()``: ``__syncthreads()`` (``Sync``).
- ``hl.commit_group()`` / ``hl.wait_group(n)``: close the current group of asynchronous
  (cp.async) copies; wait until at most ``n`` groups are pending.
- ``bars = hl.mbarrier(count)``: an array of ``count`` shared-memory transaction barriers
  (``TileKernel.mbarriers``). ``bars[i]`` refers to one (for ``hl.copy(mbarrier=...)``).
  ``hl.mbarrier_init(bars, i, arrivals)`` sets its expected arrival count (one elected
  thread initializes; follow with ``hl.syncthreads()`` before use).
  ``hl.arrive(bars, i, tx_bytes=0, who="thread")``: arrive (``who``: every executing
  "thread", one per "warp" / "warpgroup", or "one" elected thread); with ``tx_bytes``
  the arrival also expects that many bytes of bulk copies (arrive.expect_tx).
  ``hl.wait(bars, i, phase)``: block until the phase with parity ``phase`` completed.
- ``hl.wgmma_fence()``, ``hl.wgmma_commit()``, ``hl.wgmma_wait(n)``: wgmma.fence,
  commit_group, wait_group n.
- ``hl.setmaxnreg(n, increase=True)``: setmaxnreg.inc/dec to ``n`` registers per thread
  (24..256, a multiple of 8), for warp-specialized kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexlayout.ir.expr import Expr, ExprLike
from hexlayout.ir.tile import (
    AsyncCommit,
    AsyncWait,
    Mbarrier,
    MbarrierArrive,
    MbarrierInit,
    MbarrierWait,
    SetMaxNReg,
    SourceLoc,
    Sync,
    WgmmaCommit,
    WgmmaFence,
    WgmmaWait,
)

from . import source
from .checks import as_index, begin, static_int
from .context import TraceContext

__all__ = [
    "Barriers", "BarrierRef", "as_barrier", "syncthreads", "commit_group", "wait_group", "mbarrier",
    "mbarrier_init", "arrive", "wait", "wgmma_fence", "wgmma_commit", "wgmma_wait", "setmaxnreg",
]


@dataclass(frozen=True)
class BarrierRef:
    """Barrier ``index`` of an mbarrier array."""

    bar: Mbarrier
    index: ExprLike


class Barriers:
    """An array of mbarriers (``hl.mbarrier(count)``); ``bars[i]`` is a ``BarrierRef``."""

    def __init__(self, bar: Mbarrier, ctx: TraceContext) -> None:
        self.bar = bar
        self._ctx = ctx

    @property
    def count(self) -> int:
        return self.bar.count

    def __getitem__(self, i: ExprLike) -> BarrierRef:
        loc = self._ctx.loc()
        return BarrierRef(self.bar, _index(self._ctx, "mbarrier", loc, self.bar, i))

    def __repr__(self) -> str:
        return f"Barriers(%{self.bar.name}[{self.bar.count}])"


def _index(ctx: TraceContext, op: str, loc: SourceLoc | None, bar: Mbarrier, i: Any) -> ExprLike:
    e = as_index(ctx, op, loc, i, f"index into mbarrier %{bar.name}")
    v = static_int(e)
    if v is not None and not 0 <= v < bar.count:
        raise ctx.error(op, loc, f"index {v} out of range for mbarrier %{bar.name} of {bar.count}")
    return e


def as_barrier(ctx: TraceContext, op: str, loc: SourceLoc | None, x: Any, index: Any = None) -> BarrierRef:
    """``bars[i]``, ``(bars, i)``, or ``bars`` with ``index`` (default 0) as a ``BarrierRef``."""
    if isinstance(x, tuple) and len(x) == 2 and index is None:
        x, index = x
    if isinstance(x, BarrierRef):
        if index is not None:
            raise ctx.error(op, loc, "give either bars[i] or (bars, i), not both")
        return x
    if isinstance(x, Barriers):
        return BarrierRef(x.bar, _index(ctx, op, loc, x.bar, 0 if index is None else index))
    raise ctx.error(op, loc, f"{x!r} is not an mbarrier (hl.mbarrier(count))")


def syncthreads() -> None:
    """A barrier: of the whole block, or, inside ``hl.warp_group(...)`` / its ``else_``, of the
    warp groups running that branch."""
    ctx, loc = begin("syncthreads")
    ctx.emit(Sync(loc=loc))


def commit_group() -> None:
    ctx, loc = begin("commit_group")
    ctx.emit(AsyncCommit(loc=loc))


def _count(ctx: TraceContext, op: str, loc: SourceLoc | None, n: Any) -> int:
    v = static_int(n)
    if v is None or v < 0:
        raise ctx.error(op, loc, f"{n!r} must be a static non-negative integer")
    return v


def wait_group(n: int) -> None:
    ctx, loc = begin("wait_group")
    ctx.emit(AsyncWait(_count(ctx, "wait_group", loc, n), loc=loc))


def mbarrier(count: int = 1, *, name: str | None = None) -> Barriers:
    """A new array of ``count`` mbarriers."""
    ctx, loc = begin("mbarrier")
    n = _count(ctx, "mbarrier", loc, count)
    if n == 0:
        raise ctx.error("mbarrier", loc, "needs at least one barrier")
    base = name or source.assigned_name(loc) or "bar"
    used = {b.name for b in ctx.mbarriers}
    nm, k = base, 0
    while nm in used:
        k += 1
        nm = f"{base}_{k}"
    bar = Mbarrier(nm, n, loc)
    ctx.mbarriers.append(bar)
    return Barriers(bar, ctx)


def mbarrier_init(bars: Barriers | BarrierRef, i: ExprLike | None = None, arrivals: int = 1) -> None:
    ctx, loc = begin("mbarrier_init")
    ref = as_barrier(ctx, "mbarrier_init", loc, bars, i)
    n = _count(ctx, "mbarrier_init", loc, arrivals)
    if n == 0:
        raise ctx.error("mbarrier_init", loc, "arrivals must be positive")
    ctx.emit(MbarrierInit(ref.bar, ref.index, n, loc=loc))


_WHO = ("thread", "warp", "warpgroup", "one")


def arrive(bars: Barriers | BarrierRef, i: ExprLike | None = None, tx_bytes: int = 0, *,
           who: str = "thread") -> None:
    ctx, loc = begin("arrive")
    ref = as_barrier(ctx, "arrive", loc, bars, i)
    tx = _count(ctx, "arrive", loc, tx_bytes)
    if who not in _WHO:
        raise ctx.error("arrive", loc, f"who={who!r} must be one of {', '.join(_WHO)}")
    ctx.emit(MbarrierArrive(ref.bar, ref.index, tx, who, loc=loc))


def wait(bars: Barriers | BarrierRef, i: ExprLike | None = None, phase: ExprLike = 0) -> None:
    ctx, loc = begin("wait")
    ref = as_barrier(ctx, "wait", loc, bars, i)
    if not isinstance(phase, (int, Expr)) or isinstance(phase, bool):
        raise ctx.error("wait", loc, f"phase {phase!r} must be an integer expression (0 or 1 parity)")
    ctx.emit(MbarrierWait(ref.bar, ref.index, phase, loc=loc))


def wgmma_fence() -> None:
    ctx, loc = begin("wgmma_fence")
    ctx.emit(WgmmaFence(loc=loc))


def wgmma_commit() -> None:
    ctx, loc = begin("wgmma_commit")
    ctx.emit(WgmmaCommit(loc=loc))


def wgmma_wait(n: int = 0) -> None:
    ctx, loc = begin("wgmma_wait")
    ctx.emit(WgmmaWait(_count(ctx, "wgmma_wait", loc, n), loc=loc))


def setmaxnreg(n: int, increase: bool = True) -> None:
    ctx, loc = begin("setmaxnreg")
    v = static_int(n)
    if v is None or not 24 <= v <= 256 or v % 8:
        raise ctx.error("setmaxnreg", loc, f"{n!r} registers: must be a multiple of 8 in [24, 256]")
    ctx.emit(SetMaxNReg(v, bool(increase), loc=loc))
