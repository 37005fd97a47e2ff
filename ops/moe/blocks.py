"""The building blocks the MoE kernels of every weight kind share (bf16 / f16, W4A16 / W8A16,
FP8; sm_80 to sm_90a): the grid over (row block, column block[, K split]), the k-tile range of
a K split, the gathered rows of a row block, loads into new register tiles, and the
warp-specialized ring of the large-token kernels (a producer warp group filling shared stages
by TMA and cp.async, consumer warp groups issuing wgmma), on ``hl.Ring``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import hexlayout.lang as hl
from hexlayout.lang import f32, i32

__all__ = ["load_tile", "moe_grid", "expert_block", "k_tile_range", "split_range", "split_k0", "block_rows",
           "routed_rows", "sorted_rows", "sorted_tokens", "gathered_stages", "ws_ring", "produce_ring",
           "consume_ring", "warp_specialized", "wgmma_pipeline", "wgmma_in_flight", "check_in_flight_stages",
           "mma_release", "in_flight_loop", "mma_group_end",
           "PRODUCER_REGS", "CONSUMER_REGS"]

#: setmaxnreg budgets of the warp-specialized kernels: producer (index math of 128 gathered rows,
#: cp.async addresses) and consumers; 128 * 40 + 256 * 232 <= 64K registers
PRODUCER_REGS, CONSUMER_REGS = 40, 232
#: sm_100a's swap-AB k loops (``in_flight_loop``) are unrolled by the compiler by this factor
UNROLL_SM100 = 2


def load_tile(view: Any, shape: tuple[int, ...]) -> Any:
    """A gathered f32 global view copied into a register tile of ``shape``."""
    r = hl.register(f32, shape)
    hl.copy(view, r)
    return r


def moe_grid(blocks: Any, cols: Any, split: bool, split_k: int) -> tuple[Any, Any, Any]:
    """``(pid_m, pid_n, sp)`` of a grouped GEMM's grid: ``blocks x cols`` tiles, times ``split_k``
    splits of K for a split kernel (``sp`` its split index; ``None`` without split, where
    ``SPLIT_K`` must be 1)."""
    if not split:
        if split_k != 1:
            raise ValueError(f"SPLIT_K ({split_k}) > 1 needs the split kernel (split=True: f32 partials)")
        pid_m, pid_n = hl.grid(hl.spatial(blocks, cols))
        return pid_m, pid_n, None
    if split_k < 1:
        raise ValueError(f"SPLIT_K ({split_k}) must be >= 1")
    return hl.grid(hl.spatial(blocks, cols, split_k))


def expert_block(block_expert: Any, n: Any, bm: int, bn: int, split: bool = False,
                 split_k: int = 1) -> tuple[Any, Any, Any, Any]:
    """``(e, m0, n0, sp)`` of this block of a grouped GEMM over ``n`` output columns
    (``moe_grid``): its expert ``e = block_expert[pid_m]`` (-1: no block, past the padded
    total), its first sorted row ``m0 = pid_m * bm``, first column ``n0 = pid_n * bn`` and split
    ``sp`` (``None`` without split)."""
    pid_m, pid_n, sp = moe_grid(block_expert.shape[0], hl.cdiv(n, bn), split, split_k)
    e = block_expert[pid_m]
    return e, pid_m * bm, pid_n * bn, sp


def k_tile_range(kx: Any, bk: int, split_k: int, sp: Any, unit: int = 1) -> tuple[Any, Any, Any]:
    """This block's k-tiles ``(n, k0, kt)``: their count, the k origin ``k0(j)`` of local tile ``j``
    and its index ``kt(j)`` in ``ceil(K / BK)``. Without split (``sp`` None) all of them (``k0(j) =
    j * BK``); split ``sp`` takes ``[lo, hi)`` of ``split_range`` (``lo`` a multiple of ``unit``;
    ``k0`` of the pipeline's prefetches past ``hi``: past ``K``, no memory read)."""
    if sp is None:
        return hl.cdiv(kx, bk), (lambda j: j * bk), (lambda j: j)
    kt_all, lo, hi = split_range(kx, bk, split_k, sp, unit)
    return hl.maximum(hi - lo, 0), (lambda j: split_k0(lo + j, hi, kt_all, bk)), (lambda j: lo + j)


def block_rows(sorted_ids: Any, m0: Any, bm: int, limit: Any) -> tuple[Any, Any]:
    """This block's sorted slots as a ``(bm,)`` column index tile and a ``(1, bm)`` row tile
    (padding slots ``>= limit``: -1)."""
    rid = hl.register(i32, (bm,))
    hl.copy(hl.view(sorted_ids, (bm,), (m0,)), rid)
    row = hl.register(i32, (1, bm))
    hl.copy(sorted_ids[hl.iota((1, bm), 1) + m0], row)
    return hl.where(rid < limit, rid, -1), hl.where(row < limit, row, -1)


def routed_rows(sorted_ids: Any, m0: Any, bm: int, limit: Any) -> Any:
    """The block's routed rows ``sorted_ids[m0 .. m0 + bm]`` as a ``(bm,)`` index tile, -1 for
    padding (ids ``>= limit``)."""
    rid = hl.register(i32, (bm,))
    hl.copy(hl.view(sorted_ids, (bm,), (m0,)), rid)
    return hl.where(rid < limit, rid, -1)


def gathered_stages(a: Any, rows: Any, m0: Any, k0: Callable[[Any], Any] | None, dt: Any, bm: int, bk: int,
                    stages: int, w: Any = None, e: Any = None, w_rows: tuple[Any, ...] = (),
                    bn: int = 0) -> tuple[Any, tuple[Any, ...], Any]:
    """``(sa, sw, load)``: shared stages of ``bm`` rows of ``a`` (``sa``) and of ``bn`` weight
    rows of ``w`` from each of ``w_rows`` of expert ``e`` (``sw``; none without ``w_rows``), and
    the ``hl.pipeline`` load filling stage ``st`` with k-tile ``kt`` (columns from ``k0(kt)``,
    ``None``: ``kt * bk``; the rows of ``a`` gathered through the index tile ``rows``, or with
    ``rows=None`` rows ``m0 ..``)."""
    sa = hl.shared(dt, (bm, bk, stages))
    sw = tuple(hl.shared(dt, (bn, bk, stages)) for _ in w_rows)

    def load(kt: Any, st: Any) -> None:
        c0 = kt * bk if k0 is None else k0(kt)
        if rows is None:
            hl.copy(hl.view(a, (bm, bk), (m0, c0)), sa[:, :, st])
        else:
            hl.copy(hl.view(a, (bm, bk), (None, c0), rows=rows), sa[:, :, st])
        for r0, s in zip(w_rows, sw):
            hl.copy(w[e, r0:r0 + bn, c0:c0 + bk], s[:, :, st])

    return sa, sw, load


def check_in_flight_stages(name: str, stages: int) -> None:
    """Kernel ``name``'s ``STAGES`` fits a ring read by a wgmma group in flight: at least 3 (the
    k-tiles loaded ``STAGES - 2`` ahead, one more stage free for the group in flight)."""
    if stages < 3:
        raise ValueError(f"{name}: STAGES ({stages}) must be >= 3: k-tiles are loaded STAGES - 2 ahead and "
                         "one more stage stays free for the wgmma group in flight")


def wgmma_in_flight(name: str, num_k: Any, stages: int, load: Callable[[Any, Any], None],
                    mmas: list[tuple[Any, Any]], b: Any, arch: str = "sm_90a") -> None:
    """The k loop of shared-memory swap-AB wgmma with one group in flight across the back edge:
    per k-tile ``st``, ``acc += a[:, :, st] @ b[:, :, st]`` for each ``(a, acc)`` of ``mmas``,
    committed as one group and waited down to 1; cp.async ``stages - 2`` k-tiles ahead, so a
    stage stays free for the group in flight (``check_in_flight_stages``). On sm_100a
    (``mma_release``) the k-tile's mmas release its stage themselves and nothing waits for them
    in the loop (``in_flight_loop``)."""
    check_in_flight_stages(name, stages)
    for _kt, st in in_flight_loop(num_k, stages, load, arch):
        hl.wgmma_fence()
        for a, acc in mmas:
            hl.mma(a[:, :, st], b[:, :, st], acc)
        mma_group_end(arch)


def mma_release(arch: str) -> bool:
    """Whether the mmas of ``arch`` release a stage they read themselves (sm_100a: ``tcgen05.commit``
    onto the stage's barrier, ``hl.arrive(..., who="mma")``) instead of a wait for them in the
    issuing loop (sm_90a: ``wgmma.wait_group``)."""
    return arch == "sm_100a"


def in_flight_loop(num_k: Any, stages: int, load: Callable[[Any, Any], None], arch: str) -> Any:
    """``hl.pipeline`` of a swap-AB k loop whose mmas stay in flight: cp.async ``stages - 2``
    k-tiles ahead into shared stages read through the async proxy; on sm_100a the mmas release
    their stage (``mma_release``: the refill of a stage waits for the mmas two k-tiles back), on
    sm_90a the body keeps one wgmma group in flight (``mma_group_end``)."""
    tc = mma_release(arch)
    return hl.pipeline(num_k, stages, load, ahead=stages - 2, async_proxy=True, wgmma_in_flight=not tc,
                       mma_release=tc, unroll=UNROLL_SM100 if tc else False)


def mma_group_end(arch: str) -> None:
    """The end of a k-tile's mmas in ``in_flight_loop``: sm_90a commits them as one wgmma group and
    waits down to one group in flight; sm_100a nothing (the pipeline's stage release follows)."""
    if not mma_release(arch):
        hl.wgmma_commit()
        hl.wgmma_wait(1)


def _check_pipeline(name: str, stages: int, finish: bool, unroll: int, ku: int, arch: str) -> None:
    """``wgmma_pipeline``'s arguments: a ``ValueError`` naming kernel ``name`` unless ``stages >=
    3``, ``unroll`` an even multiple of ``ku`` (2 and 1 with a finish; on sm_100a no finish)."""
    check_in_flight_stages(name, stages)
    if ku < 1 or unroll < 2 or unroll % 2 or unroll % ku or (finish and (unroll, ku) != (2, 1)):
        raise ValueError(f"{name}: wgmma_pipeline unroll ({unroll}) must be an even multiple of ku ({ku}) "
                         "(unroll 2 and ku 1 with a finish)")
    if mma_release(arch) and (finish or ku != 1 or unroll != 2):
        raise ValueError(f"{name}: on {arch} the mmas release their stage: wgmma_pipeline takes no finish, "
                         f"ku 1 and unroll 2 (got finish={finish}, ku={ku}, unroll={unroll})")


def wgmma_pipeline(name: str, num_k: Any, stages: int, load: Callable[[Any, Any], None],
                   step: Callable[[Any, Any, int], None],
                   finish: Callable[[Any, int], None] | None = None, unroll: int = 2, ku: int = 1,
                   arch: str = "sm_90a") -> None:
    """The k-loop of a swap-AB sm_90a kernel that does not wait for each k-tile's wgmma group.

    The shared ring holds ``stages`` steps of ``ku`` k-tiles each (``stages * ku`` buffers: step
    ``p``'s k-tile ``h`` in buffer ``(p % stages) * ku + h``), loaded ``stages - 2`` steps ahead
    (``load(k, buffer)`` fills a buffer with k-tile ``k``; one cp.async group per step). Before
    the first k-tile of step ``p``: ``wait_group``, ``fence_proxy_async``, ``syncthreads`` and the
    load of step ``p + stages - 2`` into step ``p - 2``'s buffers (``ku`` k-tiles share one wait and
    one barrier). The body ``step(k, buffer, slot)`` issues and commits one wgmma group per k-tile.
    Unrolled by ``unroll`` k-tiles (2, or with ``finish`` None an even multiple of ``ku``; ``unroll
    = stages * ku``: every buffer index of the loop is a constant): ``step`` is traced for k-tiles
    ``U j + s`` (``slot`` ``s < U``) of iteration ``j``, and for the ``num_k % U`` last k-tiles once
    more after the loop (k-tile ``U J + s`` in slot ``s``, each nested in the previous one's
    branch, so what slot ``s - 1`` defined is in scope), so the register tiles a traced ``step``
    creates (the register A operand) or that belong to its slot (a partial) have ``U`` copies used
    in turn.

    - ``finish`` ``None`` (the products accumulate in the wgmma accumulators): ``wgmma_wait(1)``
      after each k-tile's group retires k-tile ``k - 1``'s and leaves ``k``'s in flight, across
      the loop's back edge, while k-tile ``k + 1`` is dequantized. A register tile of a traced
      ``step`` is rewritten ``U`` k-tiles later, after the wait that retired its reader; at step
      ``p`` every k-tile before ``p * ku - 1`` is retired, in every thread before the barrier, so
      the reads of step ``p - 2``'s buffers (k-tiles up to ``(p - 1) * ku - 1``) that the refill
      overwrites are done.
    - ``finish(k, slot)`` given (what reads k-tile ``k``'s results: a block-scaled partial;
      ``unroll`` 2, ``ku`` 1): k-tile ``2j + 1``'s group is issued while ``2j``'s runs;
      ``wgmma_wait(1)``, ``finish(2j, 0)`` while ``2j + 1``'s runs, ``wgmma_wait(0)``, ``finish(2j
      + 1, 1)``. No group crosses the back edge: ptxas serializes every wgmma (C7514) when a group
      is in flight across it while an accumulator is read in the loop.
    - sm_100a (``mma_release(arch)``, ``finish`` ``None``, ``ku`` 1, ``unroll`` 2): ``step`` issues
      its mmas and commits none; the mmas of slot ``s`` release what they read themselves
      (``hl.arrive(done, s, who="mma")``, a ``tcgen05.commit`` onto the slot's barrier of
      ``hl.mma_stages(2)``) and the loop waits for no mma: before k-tile ``k = 2 j + s`` refills
      the buffer of ``k - 2`` (the same slot one iteration back) each thread waits on ``done[s]``
      for phase ``j - 1`` (parity ``(j % 2) ^ 1``; iteration 0 passes at once), which also retires
      the mmas that read the tensor-memory A columns of slot ``s`` (``k - 2``'s) before ``step``
      rewrites them; one barrier per slot keeps the barrier index a constant of the unrolled
      body. After the loop one ``wgmma_commit`` for the accumulators.

    After the loop ``wgmma_wait(0)``. Needs ``stages >= 3`` (else a ``ValueError`` naming kernel
    ``name``: ``check_in_flight_stages``)."""
    _check_pipeline(name, stages, finish is not None, unroll, ku, arch)
    released = hl.mma_stages(unroll) if mma_release(arch) else None   # one per unrolled slot
    ahead = stages - 2
    for j in range(ahead):
        for h in range(ku):
            load(j * ku + h, j * ku + h)
        hl.commit_group()

    def buffer(p: Any, h: int) -> Any:   # k-tile h of step p
        return p % stages if ku == 1 else p % stages * ku + h

    def tile(k: Any, p: Any, slot: int, j: Any) -> None:   # k-tile k of step p, slot of iteration j
        if slot % ku == 0:
            hl.wait_group(ahead - 1)
            hl.fence_proxy_async()
            hl.syncthreads()
            if released is not None:     # the slot's mmas of iteration j - 1 (k - 2: the buffer's last
                hl.wait(released, slot, phase=(j % 2) ^ 1)   # reader) completed (j = 0: at once)
            for h in range(ku):
                load(k + ahead * ku + h if ku > 1 else k + ahead, buffer(p + ahead, h))
            hl.commit_group()
        step(k, buffer(p, slot % ku), slot)
        if released is not None:
            hl.arrive(released, slot, who="mma")
        elif finish is None:
            hl.wgmma_wait(1)

    steps = unroll // ku   # steps per iteration
    for j in hl.range(num_k // unroll):
        for s in range(unroll):
            k = unroll * j + s
            tile(k, k if ku == 1 else steps * j + s // ku, s, j)
        if finish is not None:
            hl.wgmma_wait(1)
            finish(2 * j, 0)
            hl.wgmma_wait(0)
            finish(2 * j + 1, 1)
    done = num_k // unroll
    with contextlib.ExitStack() as tail:   # the num_k % unroll last k-tiles, nested
        for s in range(unroll - 1):
            more = (num_k % 2).eq(1) if unroll == 2 else (num_k % unroll) > s
            tail.enter_context(hl.if_(more))
            k = num_k - 1 if unroll == 2 else done * unroll + s   # (2: the last k-tile)
            tile(k, k if ku == 1 else done * steps + s // ku, s, done)
            if finish is not None:
                hl.wgmma_wait(0)
                finish(k, s)
    if released is not None:    # the accumulators' mmas, waited for before their tensor-memory loads
        hl.wgmma_commit()
    hl.wgmma_wait(0)
    hl.wait_group(0)


def produce_ring(a: Any, rows: Any, w: Any, e: Any, w_rows: tuple[Any, ...], sa: Any, sw: tuple[Any, ...],
             ring: hl.Ring, num_k: Any, stages: int) -> None:
    """Warp group 0 of a ``*_ws`` kernel: per k-tile, once ``empty[st]`` frees the stage, the weight
    tiles (rows ``w_rows`` of expert ``e``) by TMA on ``full[st]`` and the gathered rows of ``a`` by
    cp.async; every thread arrives on ``full`` for the k-tile ``stages - 2`` back once its own
    copies of it have landed and are fenced for the async proxy (wgmma)."""
    bm, bk = sa.shape[0], sa.shape[1]
    lag = stages - 2
    tx = sum(s[:, :, 0].nbytes for s in sw)
    for kt in hl.range(num_k):
        st = kt % stages
        ring.acquire(kt)
        ring.fill(kt, tx_bytes=tx)
        for r0, s in zip(w_rows, sw):
            tile = hl.view(w, (1, s.shape[0], bk), (e, r0, kt * bk))[0, :, :]
            hl.copy(tile, s[:, :, st], mbarrier=ring.full[st])
        hl.copy(hl.view(a, (bm, bk), (None, kt * bk), rows=rows), sa[:, :, st])
        hl.commit_group()
        hl.wait_group(lag)
        hl.fence_proxy_async()
        with hl.if_(kt >= lag):
            ring.fill(kt - lag, who="thread")
    hl.wait_group(0)
    hl.fence_proxy_async()
    for j in range(lag):
        with hl.if_(num_k - lag + j >= 0):
            ring.fill(num_k - lag + j, who="thread")


def consume_ring(sa: Any, sx: Any, sy: Any, acc_x: Any, acc_y: Any, ring: hl.Ring, num_k: Any,
             stages: int, consumers: int, scale_x: Any = None, scale_y: Any = None,
             arch: str = "sm_90a") -> None:
    """The consumer warp groups of a ``*_ws`` kernel: ``acc_x = A @ X^T``, ``acc_y = A @ Y^T`` over the
    k-tiles of the ring (A: ``sa``, token rows; X / Y: ``sx`` / ``sy``, weight rows). Without scales
    the first k-tile writes the accumulators (scale-d 0) and one group stays in flight; with block
    scales each half's partial ``p`` of k-tile ``kt`` (scale-d 0) is added as ``acc += p * scale(kt)``
    (scales loaded before the wait; a callable is evaluated at the addition): the x half's while the
    y half's wgmma runs, the y half's after it (the other consumer warp group's wgmmas keep the
    tensor cores busy meanwhile). On sm_100a (``mma_release``) the k-tile's MMAs release its stage
    themselves (``ring.release(st, who="mma")``, the ring's one ``empty`` arrival); without scales
    nothing waits for them in the loop (one commit after it, waited for before the accumulators'
    tensor-memory loads)."""
    warps = hl.spatial(consumers, 1)
    tc = mma_release(arch)
    blocked = scale_x is not None
    px = hl.register(f32, acc_x.shape) if blocked else acc_x
    py = hl.register(f32, acc_y.shape) if blocked else acc_y

    def tile(kt: Any, first: bool) -> None:
        st = kt % stages
        if blocked:
            gx, gy = scale_x(kt), scale_y(kt)
        ring.wait_full(kt)
        hl.wgmma_fence()
        hl.mma(sa[:, :, st], sx[:, :, st], px, warps=warps, accumulate=not (first or blocked))
        if blocked:
            hl.wgmma_commit()
        hl.mma(sa[:, :, st], sy[:, :, st], py, warps=warps, accumulate=not (first or blocked))
        if tc:                   # the stage is free once these MMAs completed
            ring.release(st, who="mma")
            if not blocked:
                return
        hl.wgmma_commit()
        hl.wgmma_wait(1)         # blocked: x of k-tile kt is done, y runs; else k-tile kt - 1 is done
        if blocked:
            hl.assign(acc_x, acc_x + px * (gx() if callable(gx) else gx))
            hl.wgmma_wait(0)     # (a wgmma in flight across the loop's back edge while a partial is
            hl.assign(acc_y, acc_y + py * (gy() if callable(gy) else gy))   # read: ptxas C7514)
            if not tc:
                ring.release(st)
        elif not first:
            ring.release((kt - 1) % stages)

    with hl.if_(num_k > 0):
        tile(0, True)
    for kt in hl.range(1, num_k):
        tile(kt, False)
    if tc and not blocked:       # the accumulators' MMAs: one commit, waited for before their loads
        hl.wgmma_commit()
    hl.wgmma_wait(0)
    if not blocked:
        with hl.if_(num_k.eq(0)):                             # K = 0: the products are zero
            hl.assign(acc_x, hl.zeros(acc_x.shape, f32))
            hl.assign(acc_y, hl.zeros(acc_y.shape, f32))


def ws_ring(dt: Any, bm: int, bn: int, bk: int, stages: int, consumers: int,
            arch: str = "sm_90a") -> tuple[Any, ...]:
    """Shared stages of a ``*_ws`` kernel (``dt`` token rows, two ``dt`` weight halves) and its
    full / empty mbarriers (full: 128 producer threads + the TMA expect-tx arrival; empty: one per
    consumer warp group, on sm_100a one: the MMAs' commit, ``mma_release``)."""
    sa = hl.shared(dt, (bm, bk, stages))
    sx = hl.shared(dt, (bn, bk, stages))
    sy = hl.shared(dt, (bn, bk, stages))
    ring = hl.Ring(stages, producers=129, consumers=1 if mma_release(arch) else consumers)
    hl.syncthreads()
    return sa, sx, sy, ring


def warp_specialized(a: Any, rows: Callable[[], Any], w: Any, e: Any, w_rows: tuple[Any, Any], kx: Any,
                     dt: Any, bm: int, bn: int, bk: int, stages: int, consumers: int,
                     consume: Callable[[Callable[..., None]], None], arch: str = "sm_90a") -> None:
    """A ``*_ws`` block over ``ceil(kx / bk)`` k-tiles: the ``ws_ring`` stages; warp group 0, its
    registers lowered to ``PRODUCER_REGS``, fills them (``produce_ring``: the rows ``rows()`` of
    ``a``, computed there, and ``bn`` weight rows from each of ``w_rows`` of expert ``e``); the
    consumer warp groups, raised to ``CONSUMER_REGS``, run ``consume(mainloop)``, where
    ``mainloop(acc_x, acc_y, scale_x=None, scale_y=None)`` is ``consume_ring`` over that ring
    (``arch``: sm_100a's MMAs release the stages, ``mma_release``)."""
    num_k = hl.cdiv(kx, bk)
    sa, sx, sy, ring = ws_ring(dt, bm, bn, bk, stages, consumers, arch)
    with hl.warp_group(0):
        hl.setmaxnreg(PRODUCER_REGS, increase=False)
        produce_ring(a, rows(), w, e, w_rows, sa, (sx, sy), ring, num_k, stages)
    with hl.else_():
        hl.setmaxnreg(CONSUMER_REGS)

        def mainloop(acc_x: Any, acc_y: Any, *scales: Any) -> None:
            consume_ring(sa, sx, sy, acc_x, acc_y, ring, num_k, stages, consumers, *scales, arch=arch)

        consume(mainloop)


def sorted_rows(sorted_ids: Any, m0: Any, bm: int, limit: Any) -> Any:
    """This block's sorted slots as a ``(bm, 1)`` index tile (padding slots ``>= limit``: -1)."""
    rid = hl.register(i32, (bm, 1))
    hl.copy(sorted_ids[hl.iota((bm, 1), 0) + m0], rid)
    return hl.where(rid < limit, rid, -1)


def sorted_tokens(sorted_ids: Any, m0: Any, bm: int, num_tokens: Any, topk: int) -> Any:
    """The tokens of this block's sorted slots, ``slot // topk``, as a ``(bm, 1)`` index tile
    (padding slots ``>= num_tokens * topk``: -1)."""
    rid = sorted_rows(sorted_ids, m0, bm, num_tokens * topk)
    return hl.where(rid >= 0, rid // topk, -1)


def split_range(k: Any, bk: int, split_k: int, sp: Any, unit: int = 1) -> tuple[Any, Any, Any]:
    """``(KT, lo, hi)``: ``KT = ceil(k / bk)`` k-tiles, split ``sp`` takes ``[lo, hi)`` with
    ``lo = sp * P``, ``hi = min(KT, lo + P)``, ``P = ceil(KT / split_k)`` rounded up to a multiple
    of ``unit`` (every split starts on a ``unit``-k-tile boundary; ``split_k * P >= KT`` still
    covers every k-tile; empty when ``lo >= KT``)."""
    kt_all = hl.cdiv(k, bk)
    per = hl.cdiv(kt_all, split_k)
    if unit > 1:
        per = hl.cdiv(per, unit) * unit
    lo = sp * per
    return kt_all, lo, hl.minimum(kt_all, lo + per)


def split_k0(kt: Any, hi: Any, kt_all: Any, bk: int) -> Any:
    """The k origin of k-tile ``kt`` of a split ending at ``hi``: ``kt * bk``, or from
    ``kt >= hi`` on (the pipeline's prefetches past the split) an origin past ``K`` (``kt +
    (kt - hi + 1) * KT >= KT`` tiles): an empty window, no memory read."""
    return (kt + hl.maximum(kt - hi + 1, 0) * kt_all) * bk
