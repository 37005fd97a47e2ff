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
- clusters (``@hl.kernel(cluster=...)``, sm_90): ``hl.cluster_sync()`` is a barrier of every
  thread of the cluster (after the mbarrier inits, and before exit when peers write into this
  CTA); ``hl.arrive(..., cta=r)`` arrives on barrier ``i`` of the cluster's CTA ``r``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexlayout.ir.expr import Expr, ExprLike
from hexlayout.ir.tile import (
    AsyncCommit,
    AsyncWait,
    ClusterSync,
    FenceProxyAsync,
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
    "mbarrier_init", "arrive", "wait", "wgmma_fence", "wgmma_commit", "wgmma_wait", "fence_proxy_async",
    "setmaxnreg", "cluster_sync",
]


@dataclass(frozen=True)
class BarrierRef:
    """Barrier ``index`` of an mbarrier array."""

    bar: Mbarrier
    index: ExprLike


class Barriers:
    """An array of shared-memory transaction barriers (mbarriers), from ``hl.mbarrier(count)``.

    ``bars[i]`` (an int or ``Expr`` index) is a ``BarrierRef`` to barrier ``i``, as
    ``hl.copy(..., mbarrier=bars[i])`` takes it; the other barrier functions take
    ``bars, i`` or ``bars[i]``.
    """

    def __init__(self, bar: Mbarrier, ctx: TraceContext) -> None:
        self.bar = bar
        self._ctx = ctx

    @property
    def count(self) -> int:
        """The number of barriers in the array."""
        return self.bar.count

    def __getitem__(self, i: ExprLike) -> BarrierRef:
        """Barrier ``i`` of the array: ``bars[i]``.

        Args:
            i (int | Expr): the index, in ``[0, count)`` (checked when static).

        Returns:
            BarrierRef: a reference to barrier ``i``.

        Raises:
            KernelError: ``i`` is not an integer index, or a static ``i`` is out of range.

        Example:
            A TMA load completing on barrier ``s`` of a two-stage pipeline::

                @hl.kernel(threads=128)
                def tma(a: hl.f16["M", "K"]):
                    bars = hl.mbarrier(2)
                    sa = hl.shared(hl.f16, (64, 64))
                    hl.copy(a.tile((64, 64), (0, 0)), sa, mbarrier=bars[1])

                tma.trace()
        """
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
    """A block barrier: ``__syncthreads()``.

    Every thread waits until all threads of the block have arrived, and shared-memory
    writes before it are visible to reads after it. Inside ``hl.warp_group(...)`` (or its
    ``hl.else_()``) it synchronizes only the warp groups running that branch (a named
    barrier).

    Returns:
        None: the ``Sync`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace.

    Example:
        Make a shared tile written by some threads visible to all::

            @hl.kernel(threads=128)
            def publish(a: hl.f16["M", "K"]):
                sa = hl.shared(hl.f16, (64, 32))
                ra = hl.register(hl.f16, (64, 32))
                hl.copy(a.tile((64, 32), (0, 0)), sa)
                hl.syncthreads()
                hl.copy(sa, ra)

            publish.trace()
    """
    ctx, loc = begin("syncthreads")
    ctx.emit(Sync(loc=loc))


def commit_group() -> None:
    """Close the current group of asynchronous copies: ``cp.async.commit_group``.

    The cp.async copies issued since the previous commit form one group, which
    ``hl.wait_group(n)`` can wait for.

    Returns:
        None: the ``AsyncCommit`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace.

    Example:
        A two-stage cp.async prologue::

            @hl.kernel(threads=128)
            def prologue(a: hl.f16["M", "K"]):
                sa = hl.shared(hl.f16, (64, 32, 2))
                for s in range(2):
                    hl.copy(a.tile((64, 32), (0, 32 * s)), sa[:, :, s])
                    hl.commit_group()
                hl.wait_group(1)

            prologue.trace()
    """
    ctx, loc = begin("commit_group")
    ctx.emit(AsyncCommit(loc=loc))


def _count(ctx: TraceContext, op: str, loc: SourceLoc | None, n: Any) -> int:
    v = static_int(n)
    if v is None or v < 0:
        raise ctx.error(op, loc, f"{n!r} must be a static non-negative integer")
    return v


def wait_group(n: int) -> None:
    """Wait for asynchronous copies: ``cp.async.wait_group n``.

    Blocks the thread until at most ``n`` of its committed cp.async groups are still
    pending (``n = 0``: all have completed). Follow with ``hl.syncthreads()`` before
    other threads read the data.

    Args:
        n (int): a static non-negative number of groups that may stay in flight.

    Returns:
        None: the ``AsyncWait`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace; ``n`` is not a static non-negative integer.

    Example:
        Wait for the oldest of two stages::

            @hl.kernel(threads=128)
            def oldest(a: hl.f16["M", "K"]):
                sa = hl.shared(hl.f16, (64, 32, 2))
                for s in range(2):
                    hl.copy(a.tile((64, 32), (0, 32 * s)), sa[:, :, s])
                    hl.commit_group()
                hl.wait_group(1)
                hl.syncthreads()

            oldest.trace()
    """
    ctx, loc = begin("wait_group")
    ctx.emit(AsyncWait(_count(ctx, "wait_group", loc, n), loc=loc))


def mbarrier(count: int = 1, *, name: str | None = None) -> Barriers:
    """A new array of ``count`` shared-memory transaction barriers (mbarriers).

    Each barrier counts arrivals and transaction bytes of one phase; a phase completes
    when the expected arrivals (``hl.mbarrier_init``) have arrived and every expected byte
    (``hl.arrive(tx_bytes=)``) has landed, then the next phase begins (phase parity
    alternates 0, 1, 0, ...). The array is named after the assignment target.

    Args:
        count (int): a static positive number of barriers; default 1.
        name (str | None): the array's name in the IR (default: the assignment target).

    Returns:
        Barriers: the array; ``bars[i]`` refers to one barrier.

    Raises:
        KernelError: called outside a kernel trace; ``count`` is not a static positive integer.

    Example:
        One barrier per pipeline stage, initialized by one thread::

            @hl.kernel(threads=128)
            def setup():
                full = hl.mbarrier(2)
                with hl.if_(hl.thread_index().eq(0)):
                    for s in range(2):
                        hl.mbarrier_init(full, s, 1)
                hl.syncthreads()

            tk = setup.trace()
            assert [b.count for b in tk.mbarriers] == [2]
    """
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
    """Set the expected arrival count of barrier ``i``: ``mbarrier.init``.

    Executed by one thread (put it under ``hl.if_(hl.thread_index().eq(0))``), followed by
    ``hl.syncthreads()`` before any thread uses the barrier.

    Args:
        bars (Barriers | BarrierRef): the array (with ``i``) or ``bars[i]``.
        i (int | Expr | None): the barrier's index when ``bars`` is an array (default 0).
        arrivals (int): a static positive number of arrivals that completes a phase.

    Returns:
        None: the ``MbarrierInit`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace; ``bars`` is not an mbarrier; the index
            is out of range; ``arrivals`` is not a static positive integer.

    Example:
        Two arrivals per phase (two producer warps)::

            @hl.kernel(threads=128)
            def init2():
                bars = hl.mbarrier(1)
                with hl.if_(hl.thread_index().eq(0)):
                    hl.mbarrier_init(bars[0], arrivals=2)
                hl.syncthreads()

            init2.trace()
    """
    ctx, loc = begin("mbarrier_init")
    ref = as_barrier(ctx, "mbarrier_init", loc, bars, i)
    n = _count(ctx, "mbarrier_init", loc, arrivals)
    if n == 0:
        raise ctx.error("mbarrier_init", loc, "arrivals must be positive")
    ctx.emit(MbarrierInit(ref.bar, ref.index, n, loc=loc))


_WHO = ("thread", "warp", "warpgroup", "one", "mma")


def arrive(bars: Barriers | BarrierRef, i: ExprLike | None = None, tx_bytes: int = 0, *,
           who: str = "thread", cta: ExprLike | None = None) -> None:
    """Arrive on barrier ``i``: ``mbarrier.arrive`` (``.expect_tx`` with ``tx_bytes``).

    Each arrival counts once towards the phase's expected arrivals; with ``tx_bytes`` the
    arrival also adds that many bytes the phase waits for (the bytes of TMA copies issued
    with ``hl.copy(..., mbarrier=bars[i])``; ``tile.nbytes`` gives them). ``who`` says
    which of the executing threads arrive: every ``"thread"``, one per ``"warp"`` (lane 0, after a
    ``__syncwarp()`` so that its arrival releases the whole warp's earlier work), one per
    ``"warpgroup"``, or ``"one"`` elected thread; ``"mma"``: the tensor cores arrive, once
    every tcgen05 mma the executing threads issued so far has completed (sm_100a:
    ``tcgen05.commit`` onto the barrier by the mmas' issuing thread; in a kernel of CTA pairs,
    ``cta_group::2``, onto the barrier at ``i`` of both CTAs of the pair) - a stage the mmas read
    is released without a wait in the issuing loop. With ``cta`` (a kernel with a cluster) the
    arrival goes to barrier ``i`` of the cluster's CTA of rank ``cta`` (``mapa`` +
    ``mbarrier.arrive.shared::cluster``, at cluster scope, ``.release.cluster``, in a kernel of
    tcgen05 mmas; ``cta`` may be this CTA's rank): a stage that a peer multicasts into is
    released to that peer this way, and so are TMEM columns a pair's MMA (issued by the even CTA)
    writes in the odd CTA, after the odd CTA's epilogue read them.

    Args:
        bars (Barriers | BarrierRef): the array (with ``i``) or ``bars[i]``.
        i (int | Expr | None): the barrier's index when ``bars`` is an array (default 0).
        tx_bytes (int): static non-negative bytes of bulk copies this phase expects.
        who (str): ``"thread"`` (default), ``"warp"``, ``"warpgroup"``, ``"one"`` or ``"mma"``.
        cta (int | Expr | None): the rank in the cluster of the CTA whose barrier is
            arrived on; ``None`` (default): this CTA's.

    Returns:
        None: the ``MbarrierArrive`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace; ``bars`` is not an mbarrier; the index
            is out of range; ``tx_bytes`` is not a static non-negative integer; ``who`` is
            not one of the five (``"mma"`` with ``tx_bytes`` or ``cta``); ``cta`` in a kernel
            without a cluster, with ``tx_bytes``,
            not an integer expression or (static) outside the cluster.

    Example:
        A TMA load announced and awaited on one barrier::

            @hl.kernel(threads=128)
            def load(a: hl.f16["M", "K"]):
                bars = hl.mbarrier(1)
                sa = hl.shared(hl.f16, (64, 64))
                with hl.if_(hl.thread_index().eq(0)):
                    hl.mbarrier_init(bars, 0, 1)
                hl.syncthreads()
                hl.arrive(bars, 0, tx_bytes=sa.nbytes, who="one")
                hl.copy(a.tile((64, 64), (0, 0)), sa, mbarrier=bars[0])
                hl.wait(bars, 0, phase=0)

            load.trace()
    """
    ctx, loc = begin("arrive")
    ref = as_barrier(ctx, "arrive", loc, bars, i)
    tx = _count(ctx, "arrive", loc, tx_bytes)
    if who not in _WHO:
        raise ctx.error("arrive", loc, f"who={who!r} must be one of {', '.join(_WHO)}")
    if who == "mma" and (tx or cta is not None):
        raise ctx.error("arrive", loc, "who='mma' (the tensor cores arrive when the mmas complete) takes "
                        "no tx_bytes and no cta")
    if cta is not None:
        size = cluster_size(ctx)
        if size is None:
            raise ctx.error("arrive", loc, f"cta={cta!r}: the kernel has no cluster "
                            "(@hl.kernel(cluster=...))")
        if tx:
            raise ctx.error("arrive", loc, "cta= with tx_bytes: expect transaction bytes on this "
                            "CTA's barrier")
        if not isinstance(cta, (int, Expr)) or isinstance(cta, bool):
            raise ctx.error("arrive", loc, f"cta={cta!r} must be an integer expression")
        c = static_int(cta)
        if c is not None and not 0 <= c < size:
            raise ctx.error("arrive", loc, f"cta={c} is outside the cluster of {size} CTAs")
    ctx.emit(MbarrierArrive(ref.bar, ref.index, tx, who, cta, loc=loc))


def wait(bars: Barriers | BarrierRef, i: ExprLike | None = None, phase: ExprLike = 0) -> None:
    """Wait until the phase of barrier ``i`` with parity ``phase`` has completed.

    ``mbarrier.try_wait.parity`` (``test_wait`` on sm_80 / sm_89) in a loop: the thread
    blocks until that phase's expected arrivals and transaction bytes are all in. A loop
    over stages flips ``phase`` each time it reuses a barrier (``(k // STAGES) % 2``).

    Args:
        bars (Barriers | BarrierRef): the array (with ``i``) or ``bars[i]``.
        i (int | Expr | None): the barrier's index when ``bars`` is an array (default 0).
        phase (int | Expr): the parity (0 or 1) of the phase waited for; default 0.

    Returns:
        None: the ``MbarrierWait`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace; ``bars`` is not an mbarrier; the index
            is out of range; ``phase`` is not an integer expression.

    Example:
        The consumer side of a two-stage pipeline::

            @hl.kernel(threads=128)
            def consume(n: hl.i32):
                full = hl.mbarrier(2)
                for k in hl.range(n):
                    hl.wait(full[k % 2], phase=(k // 2) % 2)

            consume.trace()
    """
    ctx, loc = begin("wait")
    ref = as_barrier(ctx, "wait", loc, bars, i)
    if not isinstance(phase, (int, Expr)) or isinstance(phase, bool):
        raise ctx.error("wait", loc, f"phase {phase!r} must be an integer expression (0 or 1 parity)")
    ctx.emit(MbarrierWait(ref.bar, ref.index, phase, loc=loc))


def wgmma_fence() -> None:
    """``wgmma.fence``: order register writes before the wgmma that reads them.

    Required before the first wgmma of a sequence whose register operands or
    accumulator were written by other instructions.

    Returns:
        None: the ``WgmmaFence`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace.

    Example:
        The fence / commit / wait protocol around an asynchronous wgmma::

            @hl.kernel(threads=128)
            def hopper():
                sa = hl.shared(hl.f16, (64, 64))
                sb = hl.shared(hl.f16, (64, 64))
                acc = hl.zeros((64, 64), hl.f32)
                hl.wgmma_fence()
                hl.mma(sa, sb, acc)
                hl.wgmma_commit()
                hl.wgmma_wait(0)

            hopper.trace()
    """
    ctx, loc = begin("wgmma_fence")
    ctx.emit(WgmmaFence(loc=loc))


def fence_proxy_async() -> None:
    """``fence.proxy.async.shared::cta``: make this thread's shared-memory writes through the
    generic proxy (``hl.copy`` stores and cp.async copies into shared memory) visible to later
    reads through the async proxy (wgmma shared operands, TMA stores).

    On sm_90 a wgmma reads its shared operands through the async proxy: a tile filled by
    cp.async (e.g. rows gathered through an index tile, which TMA cannot load) or stored from
    registers needs, in every thread that wrote it, ``hl.wait_group`` then this fence, then a
    barrier before the wgmma. Writing it is optional: the lowering inserts the fence wherever
    such writes reach a wgmma or TMA store without one (after the writes, once;
    ``hexlayout.ir.passes.insert_proxy_fences``), and keeps a fence written here instead of
    adding another. Nothing is emitted for architectures without the async proxy (sm_80,
    sm_89).

    Returns:
        None: the ``FenceProxyAsync`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace.

    Example:
        A cp.async-loaded tile read by wgmma::

            @hl.kernel(threads=128)
            def gathered(a: hl.f16["M", "K"]):
                sa = hl.shared(hl.f16, (64, 64))
                sb = hl.shared(hl.f16, (64, 64))
                hl.copy(a.tile((64, 64), (0, 0)), sa)
                hl.copy(a.tile((64, 64), (0, 0)), sb)
                hl.commit_group()
                hl.wait_group(0)
                hl.fence_proxy_async()
                hl.syncthreads()
                acc = hl.zeros((64, 64), hl.f32)
                hl.wgmma_fence()
                hl.mma(sa, sb, acc)
                hl.wgmma_commit()
                hl.wgmma_wait(0)

            gathered.trace()
    """
    ctx, loc = begin("fence_proxy_async")
    ctx.emit(FenceProxyAsync(loc=loc))


def wgmma_commit() -> None:
    """``wgmma.commit_group``: close the group of wgmma operations issued so far.

    Returns:
        None: the ``WgmmaCommit`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace.

    Example:
        Commit one wgmma and wait for it::

            @hl.kernel(threads=128)
            def one():
                sa = hl.shared(hl.f16, (64, 16))
                sb = hl.shared(hl.f16, (64, 16))
                acc = hl.zeros((64, 64), hl.f32)
                hl.wgmma_fence()
                hl.mma(sa, sb, acc)
                hl.wgmma_commit()
                hl.wgmma_wait()

            one.trace()
    """
    ctx, loc = begin("wgmma_commit")
    ctx.emit(WgmmaCommit(loc=loc))


def wgmma_wait(n: int = 0) -> None:
    """``wgmma.wait_group n``: wait until at most ``n`` wgmma groups are pending.

    After it, the accumulators of the completed groups may be read.

    Args:
        n (int): a static non-negative number of groups that may stay in flight; default 0.

    Returns:
        None: the ``WgmmaWait`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace; ``n`` is not a static non-negative integer.

    Example:
        Keep one wgmma group in flight::

            @hl.kernel(threads=128)
            def overlap():
                hl.wgmma_commit()
                hl.wgmma_wait(1)

            overlap.trace()
    """
    ctx, loc = begin("wgmma_wait")
    ctx.emit(WgmmaWait(_count(ctx, "wgmma_wait", loc, n), loc=loc))


def setmaxnreg(n: int, increase: bool = True) -> None:
    """``setmaxnreg.inc`` / ``.dec``: change the warp group's register budget to ``n`` per thread.

    For warp-specialized kernels: producer warp groups give registers back
    (``increase=False``), consumer warp groups take them (``increase=True``). Executed by
    whole warp groups.

    Args:
        n (int): the registers per thread after the instruction: a multiple of 8 in [24, 256].
        increase (bool): ``True`` for ``.inc`` (default), ``False`` for ``.dec``.

    Returns:
        None: the ``SetMaxNReg`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace; ``n`` is not a static multiple of 8
            in [24, 256].

    Example:
        A producer with 40 registers and consumers with 232::

            @hl.kernel(threads=384)
            def budget():
                with hl.warp_group(0):
                    hl.setmaxnreg(40, increase=False)
                with hl.else_():
                    hl.setmaxnreg(232, increase=True)

            budget.trace()
    """
    ctx, loc = begin("setmaxnreg")
    v = static_int(n)
    if v is None or not 24 <= v <= 256 or v % 8:
        raise ctx.error("setmaxnreg", loc, f"{n!r} registers: must be a multiple of 8 in [24, 256]")
    ctx.emit(SetMaxNReg(v, bool(increase), loc=loc))


def cluster_size(ctx: TraceContext) -> int | None:
    """The number of CTAs in the traced kernel's cluster (``None`` without ``cluster=``)."""
    if not ctx.cluster:
        return None
    n = 1
    for c in ctx.cluster:
        n *= int(c)
    return n


def cluster_sync() -> None:
    """A barrier of every thread of every CTA of the cluster (sm_90).

    ``fence.mbarrier_init.release.cluster`` (the mbarrier inits become visible to the peers),
    then ``barrier.cluster.arrive.release`` and ``barrier.cluster.wait.acquire``: no thread
    continues before all threads of the cluster's CTAs arrived, and their earlier shared-memory
    writes are visible. Needed after initializing mbarriers that peers arrive on or multicast
    into, and before exit when a peer may still write into this CTA's shared memory. Executed
    by all threads of the block (outside warp-group branches).

    Returns:
        None: the ``ClusterSync`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace, or in a kernel without ``cluster=``.

    Example:
        Each CTA of a pair releases its barrier and its peer's::

            @hl.kernel(threads=128, cluster=(2, 1, 1))
            def pair():
                hl.grid(hl.spatial(2))
                empty = hl.mbarrier(1)
                hl.mbarrier_init(empty, 0, arrivals=2)
                hl.cluster_sync()
                hl.arrive(empty, 0, who="one")
                hl.arrive(empty, 0, who="one", cta=1 - hl.cluster_rank())
                hl.wait(empty, 0, phase=0)
                hl.cluster_sync()

            pair.trace()
    """
    ctx, loc = begin("cluster_sync")
    if cluster_size(ctx) is None:
        raise ctx.error("cluster_sync", loc, "the kernel has no cluster: declare "
                        "@hl.kernel(cluster=(2, 1, 1))")
    ctx.emit(ClusterSync(loc=loc))
