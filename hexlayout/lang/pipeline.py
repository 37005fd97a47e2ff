"""Pipeline building blocks: a kernel states its software pipeline instead of spelling it out.

- ``hl.pipeline(num_k, stages, load)``: the multistage k-loop of cp.async (or any
  commit-group) copies. Stage ``s`` of a ring of ``stages`` shared buffers holds k-tile
  ``k`` with ``s = k % stages``; the loads run ``ahead`` k-tiles in front of the k-tile the
  body consumes. It yields ``(k, s)`` for the body of each k-tile (traced once, inside an
  ``hl.range`` loop), as TileLang's ``T.Pipelined(..., num_stages=)`` or Pallas'
  ``emit_pipeline``.
- ``hl.Ring(stages, producers, consumers)``: the full / empty mbarrier pair of a
  producer / consumer ring of a warp-specialized kernel, with the phase arithmetic of
  iteration ``it`` (stage ``it % stages``, phase ``(it // stages) % 2``).
- ``hl.OnlineSoftmax(rows)``: the running row max ``m`` and row sum ``l`` of a softmax
  streamed over key blocks (FlashAttention), in the log2 domain.

Each emits exactly the operations a kernel would otherwise write by hand: they are not new
instructions, only one definition of patterns that every pipelined kernel shares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hexlayout.ir.expr import ExprLike

from . import source
from .checks import begin
from .control import range_
from .dtypes import f32
from .math import exp2_approx, log2, maximum, where
from .ops import assign, cast, full, max_reduce, mma, sum_, zeros
from .sync import (
    Barriers,
    arrive,
    commit_group,
    fence_proxy_async,
    mbarrier,
    mbarrier_init,
    syncthreads,
    wait,
    wait_group,
    wgmma_commit,
    wgmma_wait,
)
from .tensor import Tile

__all__ = ["pipeline", "mma_stages", "wait_stage_free", "Ring", "OnlineSoftmax"]

NEG_INF = float("-inf")


def pipeline(num_k: ExprLike, stages: int, load: Callable[[Any, Any], None], *, ahead: int | None = None,
             async_proxy: bool = False, wgmma_in_flight: bool = False,
             mma_release: bool = False, unroll: bool | int = False) -> Iterator[tuple[Any, Any]]:
    """The multistage k-loop: ``load(k, s)`` fills stage ``s`` with k-tile ``k`` by
    asynchronous copies ``ahead`` k-tiles before the body consumes it.

    Emits: ``load(j, j); hl.commit_group()`` for ``j < ahead``; then a runtime loop over
    ``k < num_k`` of ``hl.wait_group(ahead - 1)`` (this thread's copies of k-tile ``k``
    landed), ``hl.fence_proxy_async()`` (with ``async_proxy``: the k-tile is read by wgmma),
    ``hl.syncthreads()`` (every thread's copies landed, and stage ``(k + ahead) % stages`` is
    no longer read), ``load(k + ahead, (k + ahead) % stages); hl.commit_group()`` and the
    body for ``(k, k % stages)``; after the loop ``hl.wgmma_wait(0)`` (with
    ``wgmma_in_flight``: the body leaves one wgmma group running) and ``hl.wait_group(0)``.
    Loads past ``num_k`` read out of bounds and fill with zeros (views carry their extent).

    ``mma_release`` (sm_100a, the body's tensor-core mmas read the stages): the mmas release
    their stage themselves and the body waits for none of them. After the body of k-tile ``k``,
    ``hl.arrive(done, k % stages, who="mma")`` (a ``tcgen05.commit`` onto the stage's barrier of
    an array ``done[stages]`` of one arrival each, made before the first load: the barrier's
    phase completes once every mma issued so far completed); before the refill of stage ``s =
    (k + ahead) % stages`` each thread waits on ``done[s]`` for the phase of k-tile ``k + ahead -
    stages``, the last reader of the stage (parity ``((k + ahead) // stages + 1) % 2``; the first
    round, ``k + ahead < stages``, passes at once; the body's ``hl.wgmma_fence()`` before its
    mmas orders what they write to tensor memory after the mmas the wait retired). After the
    loop ``hl.wgmma_commit()`` and ``hl.wgmma_wait(0)``: the accumulators are complete. With
    ``ahead = stages - 2`` the wait is for the mmas of two k-tiles back, so the mmas of the last
    k-tile run while the next one is prepared.

    Args:
        num_k (int | Expr): the number of k-tiles.
        stages (int): the shared buffers of the ring (static, >= 2).
        load (Callable): ``load(k, s)`` issues the copies of k-tile ``k`` into stage ``s``.
        ahead (int | None): k-tiles loaded ahead of the consumed one, ``1 <= ahead < stages``;
            default ``stages - 1`` (``stages - 2`` keeps one more stage free for a wgmma group
            still reading it).
        async_proxy (bool): the body reads the stages through the async proxy (wgmma).
        wgmma_in_flight (bool): the body leaves a wgmma group in flight at its end.
        mma_release (bool): the body's tcgen05 mmas release the stages (sm_100a); the body
            commits and waits for none of them.
        unroll (bool | int): the runtime loop's unrolling (``hl.range``'s ``unroll``).

    Returns:
        Iterator[tuple[Expr, Expr]]: ``(k, s)`` once (the body is traced once).

    Raises:
        ValueError: ``stages`` or ``ahead`` out of range.
        KernelError: as ``hl.range`` (called outside a kernel trace, a non-integer ``num_k``).

    Example:
        A 3-stage cp.async k-loop::

            @hl.kernel(threads=128)
            def ksum(a: hl.f16["M", "K"], c: hl.f32["M", "N"]):
                M, K = a.shape
                sa = hl.shared(hl.f16, (64, 32, 3))
                acc = hl.zeros((64, 32), hl.f32)

                def load(k, s):
                    hl.copy(a.tile((64, 32), (0, k * 32)), sa[:, :, s])

                for k, s in hl.pipeline(hl.cdiv(K, 32), 3, load):
                    r = hl.register(hl.f16, (64, 32))
                    hl.copy(sa[:, :, s], r)
                    acc += hl.cast(r, hl.f32)
                hl.copy(acc, c.tile((64, 32), (0, 0)))

            tk = ksum.trace()
            assert [op.name for op in tk.body.ops].count("AsyncCommit") == 2
    """
    ahead = stages - 1 if ahead is None else ahead
    if stages < 2 or not 1 <= ahead < stages:
        raise ValueError(f"hl.pipeline: stages={stages}, ahead={ahead}: need stages >= 2 and "
                         f"1 <= ahead < stages")
    done = mma_stages(stages) if mma_release else None
    for j in range(ahead):
        load(j, j)
        commit_group()
    for k in range_(num_k, unroll=unroll):
        wait_group(ahead - 1)
        if async_proxy:
            fence_proxy_async()
        syncthreads()
        kn = k + ahead
        if done is not None:
            wait_stage_free(done, kn, stages)
        load(kn, kn % stages)
        commit_group()
        yield k, k % stages
        if done is not None:
            arrive(done, k % stages, who="mma")
    if done is not None:
        wgmma_commit()
    if wgmma_in_flight or done is not None:
        wgmma_wait(0)
    wait_group(0)


def mma_stages(stages: int) -> Barriers:
    """The barriers ``done[stages]`` (one arrival each) on which tensor-core mmas release the
    stages of a ring they read (``hl.arrive(done, s, who="mma")``, ``wait_stage_free``); the
    kernel's next block barrier makes their initialization visible.

    Args:
        stages (int): the stages of the ring.

    Returns:
        Barriers: the array, named ``mma_done``.

    Raises:
        KernelError: as ``hl.mbarrier`` / ``hl.mbarrier_init``.

    Example:
        A 2-stage ring whose stages the mmas release (tcgen05 commits on sm_100a)::

            @hl.kernel(threads=128)
            def ring(a: hl.f16["M", "K"], b: hl.f16["N", "K"], c: hl.f32["M", "N"]):
                sa, sb = hl.shared(hl.f16, (64, 16, 2)), hl.shared(hl.f16, (64, 16, 2))
                done = hl.mma_stages(2)
                acc = hl.zeros((64, 64), hl.f32)
                hl.syncthreads()
                for k in hl.range(4):
                    hl.wait_stage_free(done, k, 2)       # the mmas of k - 2 are done with it
                    hl.copy(a.tile((64, 16), (0, k * 16)), sa[:, :, k % 2])
                    hl.copy(b.tile((64, 16), (0, k * 16)), sb[:, :, k % 2])
                    hl.fence_proxy_async()
                    hl.syncthreads()
                    hl.wgmma_fence()
                    hl.mma(sa[:, :, k % 2], sb[:, :, k % 2], acc)
                    hl.arrive(done, k % 2, who="mma")
                hl.wgmma_commit()
                hl.wgmma_wait(0)
                hl.copy(acc, c.tile((64, 64), (0, 0)))

            _ = ring.trace()
    """
    done = mbarrier(stages, name="mma_done")
    for st in range(stages):
        mbarrier_init(done, st, arrivals=1)
    return done


def wait_stage_free(done: Barriers, it: ExprLike, stages: int) -> None:
    """Wait until stage ``it % stages`` may be refilled with iteration ``it``: the phase of
    ``done[it % stages]`` that the mmas of iteration ``it - stages`` completed (parity
    ``((it // stages) % 2) ^ 1``: the first round passes at once). The ``hl.wgmma_fence()``
    (``tcgen05.fence::after_thread_sync``) that precedes the next mma orders the tensor-memory
    operations issued for it (an A operand's ``tcgen05.st``) after the mmas the wait retired.

    Args:
        done (Barriers): the ring's ``mma_stages`` barriers.
        it (int | Expr): the iteration that refills the stage.
        stages (int): the stages of the ring.

    Returns:
        None: the calling threads continue once the stage is free.

    Raises:
        KernelError: as ``hl.wait``.

    Example:
        Refilling stage ``k % 2`` of a ring the mmas release (``hl.mma_stages`` has the whole
        k-loop)::

            @hl.kernel(threads=128)
            def refill(a: hl.f16["M", "K"]):
                sa = hl.shared(hl.f16, (64, 16, 2))
                done = hl.mma_stages(2)
                hl.syncthreads()
                for k in hl.range(4):
                    hl.wait_stage_free(done, k, 2)
                    hl.copy(a.tile((64, 16), (0, k * 16)), sa[:, :, k % 2])

            _ = refill.trace()
    """
    wait(done, it % stages, phase=((it // stages) % 2) ^ 1)


class Ring:
    """The full / empty mbarriers of a producer / consumer ring of ``stages`` shared stages.

    Iteration ``it`` (a k-tile counted across every tile a persistent block takes) uses
    stage ``it % stages`` in phase ``(it // stages) % 2``. The producer waits until the stage
    is ``empty`` (``acquire``), then fills it and arrives on ``full`` (``fill``: with the
    bulk-copy bytes it expects, or as one of ``producers`` arriving threads); the consumers
    wait until it is ``full`` (``wait_full``) and release it by arriving on ``empty``
    (``release``, once per consumer warp group). ``full`` expects ``producers`` arrivals and
    ``empty`` ``consumers``. The barriers are initialized by the constructor; the kernel then
    synchronizes (``hl.syncthreads()``, or ``hl.cluster_sync()`` when a peer CTA arrives on
    them) before the ring is used.

    Args:
        stages (int): the number of stages.
        producers (int): arrivals that complete a phase of ``full``.
        consumers (int): arrivals that complete a phase of ``empty``.
        name (str | None): the barriers are ``<name>_full`` and ``<name>_empty``; default the
            name the ring is assigned to (``ring = hl.Ring(...)``: ``ring_full``).

    Raises:
        KernelError: as ``hl.mbarrier`` / ``hl.mbarrier_init``.

    Example:
        A TMA producer warp group and one consumer warp group::

            @hl.kernel(threads=256)
            def ring(a: hl.f16["M", "K"], c: hl.f16["M", "K"]):
                M, K = a.shape
                sa = hl.shared(hl.f16, (64, 64, 2))
                r = hl.Ring(2, producers=1, consumers=128)     # each consumer thread releases
                hl.syncthreads()
                with hl.warp_group(0):
                    for k in hl.range(hl.cdiv(K, 64)):
                        r.acquire(k)
                        r.fill(k, tx_bytes=sa[:, :, 0].nbytes)
                        hl.copy(a.tile((64, 64), (0, k * 64)), sa[:, :, k % 2], mbarrier=r.full[k % 2])
                with hl.else_():
                    for k in hl.range(hl.cdiv(K, 64)):
                        r.wait_full(k)
                        x = hl.register(hl.f16, (64, 64))
                        hl.copy(sa[:, :, k % 2], x)
                        r.release(k % 2, who="thread")
                        hl.copy(x, c.tile((64, 64), (0, k * 64)))

            tk = ring.trace()
            assert len(tk.mbarriers) == 2
    """

    def __init__(self, stages: int, producers: int = 1, consumers: int = 1, *,
                 name: str | None = None) -> None:
        _, loc = begin("Ring")
        base = name or source.assigned_name(loc) or "ring"
        self.stages = stages
        self.full: Barriers = mbarrier(stages, name=f"{base}_full")
        self.empty: Barriers = mbarrier(stages, name=f"{base}_empty")
        for st in range(stages):
            mbarrier_init(self.full, st, arrivals=producers)
            mbarrier_init(self.empty, st, arrivals=consumers)

    def acquire(self, it: ExprLike) -> None:
        """Producer: wait until stage ``it % stages`` is empty (the consumers released
        iteration ``it - stages``; the first round passes at once).

        Args:
            it (int | Expr): the iteration.

        Raises:
            KernelError: as ``hl.wait``.

        Example:
            See the class example.
        """
        wait(self.empty, it % self.stages, phase=((it // self.stages) % 2) ^ 1)

    def fill(self, it: ExprLike, tx_bytes: int = 0, who: str = "one") -> None:
        """Producer: arrive on ``full`` of iteration ``it``'s stage, expecting ``tx_bytes``
        bytes of bulk (TMA) copies into it (``who`` as ``hl.arrive``).

        Args:
            it (int | Expr): the iteration.
            tx_bytes (int): bytes the stage's bulk copies deliver.
            who (str): which threads arrive ("thread", "warp", "warpgroup", "one").

        Raises:
            KernelError: as ``hl.arrive``.

        Example:
            See the class example.
        """
        arrive(self.full, it % self.stages, tx_bytes=tx_bytes, who=who)

    def wait_full(self, it: ExprLike) -> None:
        """Consumer: wait until iteration ``it``'s stage is full.

        Args:
            it (int | Expr): the iteration.

        Raises:
            KernelError: as ``hl.wait``.

        Example:
            See the class example.
        """
        wait(self.full, it % self.stages, phase=(it // self.stages) % 2)

    def release(self, stage: ExprLike, cta: ExprLike | None = None, who: str = "warpgroup") -> None:
        """Consumer: arrive on ``empty[stage]`` (of cluster CTA ``cta`` when given): the stage
        may be refilled. One arrival per warp group (``who="warpgroup"``, after a wgmma wait
        that retired the warp group's reads of the stage), or per thread (``who="thread"``,
        ``consumers`` counting threads) when each thread read the stage itself.

        Args:
            stage (int | Expr): the stage (not the iteration).
            cta (int | Expr | None): the cluster rank whose barrier to arrive on.
            who (str): "warpgroup" or "thread" (as ``hl.arrive``).

        Raises:
            KernelError: as ``hl.arrive``.

        Example:
            See the class example.
        """
        if cta is None:
            arrive(self.empty, stage, who=who)
        else:
            arrive(self.empty, stage, who=who, cta=cta)


class OnlineSoftmax:
    """The streaming softmax of FlashAttention over key blocks, in the log2 domain.

    State per row: the running max ``m`` (``-inf`` before any visible key) and the running
    sum ``l`` of ``exp2(x - m)``. ``step(s, acc, scale)`` takes a block of scores ``s``
    (rows x keys; masked keys ``-inf``), with ``x = s * scale``: ``m' = max(m, max_j s *
    scale)``, ``p = exp2(s * scale - m')``, ``alpha = exp2(m - m')``, ``acc *= alpha``,
    ``l = l * alpha + sum_j p``, ``m = m'``, and returns ``p`` (for ``acc += p @ V``). A row
    whose keys so far are all masked keeps ``m = -inf`` and uses 0 in its place, so ``p`` and
    ``alpha`` are 0 there, not NaN. ``out(acc)`` is ``acc / l`` (0 for a row that saw no key)
    and ``lse()`` the natural-log sum ``(m + log2 l) * ln 2``.

    A sink (attention sinks, as gpt-oss uses: a logit ``t`` per row, in the log2 domain, that
    joins the denominator only) starts the state at ``m = t``, ``l = exp2(t - t) = 1`` (``t =
    -inf``: no sink, ``m = -inf``, ``l = 0``), so at the end ``out = sum_j exp2(x_j - m) v_j /
    (sum_j exp2(x_j - m) + exp2(t - m))`` and ``lse = ln(sum_j e^(s_j) + e^(t ln 2))``; a row
    that sees no key gives 0 and the sink's natural logit.

    Row sums by an MMA (``sums=dt``, f16 / bf16, the dtype ``p`` is cast to for ``p @ V``): ``l``
    is a rows x 8 f32 accumulator, ``l += cast(p, dt) @ 1`` (an MMA against a keys x 8 tile of
    ones: every column holds ``sum_j cast(p_j)``, f32 accumulation) in place of the per-row
    sum's in-thread adds and shuffles; ``out`` / ``lse`` take column 0's value (the row max
    of equal columns). The denominator then sums the same rounded ``p`` the numerator does.
    ``p`` is finite (0 <= p <= 1; 0 at masked keys), so the MMA adds no NaN or inf.

    The row max of a block given as several chunks is reduced once, over their elementwise
    maximum (exact: max is associative).

    Args:
        rows (int): the rows of the score blocks (a static int).
        sink (Tile | Expr | float | None): the rows' sink logits in the log2 domain (rows x 1
            f32, or one value for every row), or None.
        sums (DType | None): row sums by an MMA of ``p`` cast to this dtype against ones
            (f16 / bf16), or None (a sum reduction per row and block).
        keys (int): with ``sums``, the width of every score chunk (the ones tile, ``8 x keys``,
            is made once, here).

    Raises:
        KernelError: as ``hl.full`` / ``hl.zeros``.

    Example:
        Softmax-weighted sums over two blocks of 32 scores per row (``acc`` accumulates
        ``p``, as it would accumulate ``p @ V``)::

            @hl.kernel(threads=128)
            def attn(s: hl.f32["M", "N"], o: hl.f32["M", "N"]):
                sm = hl.OnlineSoftmax(64)
                acc = hl.zeros((64, 32), hl.f32)
                for j in range(2):
                    sc = hl.register(hl.f32, (64, 32))
                    hl.copy(s.tile((64, 32), (0, 32 * j)), sc)
                    acc += sm.step(sc, acc, 1.4426950408889634)
                hl.copy(sm.out(acc), o.tile((64, 32), (0, 0)))

            attn.trace()
    """

    def __init__(self, rows: int, sink: Any = None, sums: Any = None, keys: int = 0) -> None:
        self.sums = sums
        self.m: Tile = full((rows, 1), NEG_INF, f32)
        self.l: Tile = zeros((rows, 1 if sums is None else 8), f32)
        # made here, before any loop: a tile first made inside a loop body that runs no
        # iteration would be read uninitialized by the next loop
        self._ones = None if sums is None else full((8, keys), 1.0, sums)
        if sink is not None:                                   # m = t, l = 1 (0 where t = -inf)
            assign(self.m, maximum(self.m, sink))
            assign(self.l, where(self.m.eq(NEG_INF), self.l, self.l + 1.0))

    def _row_sum(self, p: Tile) -> Any:
        """With ``sums``: ``l += cast(p) @ ones`` (an MMA; returns None); else ``sum_j p``."""
        if self.sums is None:
            return sum_(p, 1)
        if p.shape[1] != self._ones.shape[1]:
            ctx, loc = begin("OnlineSoftmax")
            raise ctx.error("OnlineSoftmax", loc, f"a score chunk of {p.shape[1]} keys; the row sums by "
                            f"MMA were set up for keys={self._ones.shape[1]}")
        mma(cast(p, self.sums), self._ones, self.l)
        return None

    def _update_l(self, alpha: Tile, sums: list[Any]) -> None:
        """``l = l * alpha + sum(sums)`` (with ``sums`` by MMA: already rescaled and added)."""
        if self.sums is not None:
            return
        total = sums[0]
        for x in sums[1:]:
            total = total + x
        assign(self.l, self.l * alpha + total)

    def _total(self) -> Tile:
        """The rows' sums ``l`` (rows x 1)."""
        return self.l if self.sums is None else max_reduce(self.l, 1)

    def step(self, s: Tile, acc: Tile, scale: Any = None, *, masked: bool = True,
             rescale_first: bool = False) -> Tile:
        """One key block: rescale ``acc`` and the state, return the block's ``p``.

        Args:
            s (Tile): the block's scores, rows x keys (f32 registers).
            acc (Tile): the output accumulator (rows x head dim), rescaled in place.
            scale (float | Tile | None): the multiplier into the log2 domain (``> 0``); None:
                ``s`` is in it already.
            masked (bool): a row may have no visible key yet (``-inf`` max): False leaves out
                the guard for blocks known to hold a visible key in every row.
            rescale_first (bool): the order of the (independent) updates, which moves register
                pressure but not a value: ``acc *= alpha`` before ``p`` is computed (True), or
                ``p`` first and ``acc`` rescaled just before it is used (False).

        Returns:
            Tile: ``p``, rows x keys, f32.

        Raises:
            KernelError: as the elementwise ops and reductions it issues.

        Example:
            See the class example.
        """
        out: list[Tile] = []
        self.step_chunks([s], acc, lambda _c, p: out.append(p), scale, masked=masked,
                         rescale_first=rescale_first)
        return out[0]

    def step_chunks(self, chunks: list[Tile], acc: Tile | None, consume: Callable[[int, Tile], None],
                    scale: Any = None, *, masked: bool = True, rescale_first: bool = True) -> Tile:
        """One key block given as column chunks of its scores: the row max over every chunk, then
        ``p_c = exp2(s_c * scale - m')`` handed to ``consume(c, p_c)`` (which accumulates
        ``p_c @ V_c``), ``acc *= alpha``, ``l = l * alpha + sum_c sum_j p_c`` and ``m = m'``.
        Returns ``alpha = exp2(m - m')`` (rows x 1).

        Args:
            chunks (list[Tile]): the score chunks, rows x chunk keys each.
            acc (Tile | None): the output accumulator, rescaled in place (None: not rescaled,
                with ``rescale_first`` False; ``step_scores`` returns the factor).
            consume (Callable): ``consume(c, p_c)`` for chunk ``c``, after ``acc`` is rescaled.
            scale (float | Tile | None): as ``step``.
            masked (bool): as ``step``.
            rescale_first (bool): as ``step``: ``acc *= alpha`` before the ``p_c`` (each then
                consumed as it is computed), or every ``p_c`` first.

        Raises:
            KernelError: as the elementwise ops and reductions it issues.

        Example:
            See the class example (``step`` is ``step_chunks`` of one chunk).
        """
        tops = chunks
        if all(s.shape == chunks[0].shape for s in chunks):   # one max reduction per row
            tops = [chunks[0]]
            for s in chunks[1:]:
                tops[0] = maximum(tops[0], s)
        m_new = self.m
        for s in tops:
            x = max_reduce(s, 1)
            m_new = maximum(m_new, x if scale is None else x * scale)
        m_use = where(m_new.eq(NEG_INF), 0.0, m_new) if masked else m_new

        def p_of(s: Tile) -> Tile:
            return exp2_approx((s if scale is None else s * scale) - m_use)

        if rescale_first and acc is not None:
            alpha = exp2_approx(self.m - m_use)
            acc *= alpha
            sums: list[Tile] = []
            if self.sums is not None:
                assign(self.l, self.l * alpha)
            for c, s in enumerate(chunks):
                p = p_of(s)
                sums.append(self._row_sum(p))
                consume(c, p)
            self._update_l(alpha, sums)
            assign(self.m, m_new)
            return alpha
        ps = [p_of(s) for s in chunks]
        alpha = exp2_approx(self.m - m_use)
        if self.sums is not None:
            assign(self.l, self.l * alpha)
        self._update_l(alpha, [self._row_sum(p) for p in ps])
        if acc is not None:
            acc *= alpha
        assign(self.m, m_new)
        for c, p in enumerate(ps):
            consume(c, p)
        return alpha

    def step_scores(self, s: Tile, scale: Any = None, *, masked: bool = True) -> tuple[Tile, Tile]:
        """One key block whose accumulator is rescaled by the caller: the state update of
        ``step`` (``m' = max(m, max_j s * scale)``, ``l = l * alpha + sum_j p``, ``m = m'``)
        without touching the accumulator. Returns ``(p, alpha)``, ``p = exp2(s * scale - m')``
        and ``alpha = exp2(m - m')`` (rows x 1); the caller applies ``acc *= alpha`` before it
        adds ``p @ V`` -- e.g. after a wait, when the previous block's ``p @ V`` was in flight
        while this ``p`` was computed (FlashAttention-3's intra-warpgroup overlap).

        Args:
            s (Tile): the block's scores, rows x keys (f32 registers).
            scale (float | Tile | None): as ``step``.
            masked (bool): as ``step``.

        Returns:
            tuple[Tile, Tile]: ``p`` (rows x keys, f32) and ``alpha`` (rows x 1, f32).

        Raises:
            KernelError: as the elementwise ops and reductions it issues.

        Example:
            The class example with the rescale written out::

                p, alpha = sm.step_scores(sc, 1.4426950408889634)
                acc *= alpha
                acc += p
        """
        out: list[Tile] = []
        alpha = self.step_chunks([s], None, lambda _c, p: out.append(p), scale, masked=masked,
                                 rescale_first=False)
        return out[0], alpha

    def merge(self, acc: Tile, m: Tile, l: Tile, acc2: Tile) -> None:
        """Fold in the state of a softmax over other keys of the same rows: its max ``m``, sums
        ``l`` and accumulator ``acc2``. With ``M = max(self.m, m)`` (0 where both are ``-inf``),
        ``a = exp2(self.m - M)``, ``b = exp2(m - M)``: ``acc = acc * a + acc2 * b``, ``l = l * a
        + l_2 * b``, ``m = M`` -- the state one softmax over both key sets would have (keys
        split between warp groups, each with its own ``OnlineSoftmax``).

        Args:
            acc (Tile): this state's accumulator, updated in place.
            m (Tile): the other state's row max (rows x 1, f32).
            l (Tile): the other state's row sums (the shape of ``self.l``).
            acc2 (Tile): the other state's accumulator (the shape of ``acc``).

        Raises:
            KernelError: as the elementwise ops.

        Example:
            Two halves of one block's scores, then one state::

                @hl.kernel(threads=128)
                def halves(s: hl.f32["M", "N"], o: hl.f32["M", "N"]):
                    a, b = hl.OnlineSoftmax(64), hl.OnlineSoftmax(64)
                    acc, acc2 = hl.zeros((64, 32), hl.f32), hl.zeros((64, 32), hl.f32)
                    for sm, x, j in ((a, acc, 0), (b, acc2, 1)):
                        sc = hl.register(hl.f32, (64, 32))
                        hl.copy(s.tile((64, 32), (0, 32 * j)), sc)
                        x += sm.step(sc, x, 1.0)
                    a.merge(acc, b.m, b.l, acc2)
                    hl.copy(a.out(acc), o.tile((64, 32), (0, 0)))

                halves.trace()
        """
        top = maximum(self.m, m)
        use = where(top.eq(NEG_INF), 0.0, top)
        a, b = exp2_approx(self.m - use), exp2_approx(m - use)
        assign(acc, acc * a + acc2 * b)
        assign(self.l, self.l * a + l * b)
        assign(self.m, top)

    def out(self, acc: Tile, reciprocal: bool = False) -> Tile:
        """``acc / l`` per row, 0 for a row that saw no visible key (``reciprocal``: as
        ``acc * (1 / l)``, one division per row instead of one per element).

        Args:
            acc (Tile): the accumulator.
            reciprocal (bool): multiply by the rows' reciprocals.

        Returns:
            Tile: the normalized output (f32).

        Raises:
            KernelError: as the elementwise ops.

        Example:
            See the class example.
        """
        total = self._total()
        safe = where(total.eq(0.0), 1.0, total)
        return acc * (1.0 / safe) if reciprocal else acc / safe

    def lse(self) -> Tile:
        """The natural-log row sums ``ln(sum_j e^(x_j))`` of the scores seen (``-inf`` for a
        row with none).

        Returns:
            Tile: rows x 1, f32.

        Raises:
            KernelError: as the elementwise ops.

        Example:
            See the class example.
        """
        return (self.m + log2(self._total())) * 0.6931471805599453
