"""FP8 fused-MoE grouped GEMMs for sm_90a: e4m3 ``wgmma`` with swapped operands.

The same products as ``moe_fp8_kernels``' gate-up and down kernels (see its docstring for the
math), for Hopper, where ``mma.sync`` with e4m3 operands has no native instruction (ptxas
emulates it with f16 HMMA and conversions): ``wgmma.mma_async`` m64nNk32 e4m3 from shared
memory. Swap-AB: the weight tile (``BN`` = 64 output columns x ``BK``) is the 64-row A operand
and the gathered token rows (``BM`` of them: 16, 32 or 64) the N side, so a decode step with a
few tokens per expert wastes no MMA rows; the accumulator is the transposed ``BN x BM`` tile and
the epilogue scales rows by the weight scales and columns by the token scales. Token rows are
gathered with cp.async (never TMA), hence ``fence_proxy_async`` before the barrier that precedes
each wgmma; ``STAGES`` shared buffers (4), loaded ``STAGES - 2`` k-tiles ahead, so that the
stage refilled at k-tile ``k`` is ``k - 2``'s while ``k - 1``'s wgmma group is still in flight:
with per-expert scales one group stays in flight across the loop's back edge
(``wgmma.wait_group 1``); with block scales each k-tile's partial (scale-d 0) is scaled and
added once its group retired, two k-tiles per iteration (``blocks.wgmma_pipeline``: two
partials used alternately, the first scaled while the second k-tile's wgmma runs, then a full
wait, since ptxas serializes every wgmma (C7514) when a group crosses the back edge while a
partial is read in the loop).
``split=True``: the split-K forms (decode), as ``moe_fp8_kernels``' (scaled f32 partials of the
k-tiles of split ``sp`` added atomically into a workspace; the ``*_ws`` kernels never split).

The large-token kernels (``*_ws``, prefill) put the tokens on the wgmma M side instead:
``BM = 64 * CONSUMERS`` gathered token rows (64 per consumer warp group) times two 64-column
weight halves (gate and up columns of w13, or the two halves of a 128-column tile of w2),
warp-specialized as ``gemm_kernels.gemm_sm90_kernel``: warp group 0 (register budget lowered
with setmaxnreg) loads a ``STAGES``-deep ring, the weight tiles by TMA (``full[st]`` expects
their bytes) and the token rows by cp.async (rows are indirect: never TMA); each producer
thread waits for its own cp.async group ``STAGES - 2`` k-tiles later, fences the async proxy
and arrives on ``full[st]`` (128 + 1 arrivals per phase). The consumers wait on ``full``, issue
both halves' wgmma (A = token tile, B = weight tile, both K-major from shared memory) and keep
one wgmma group in flight, releasing the previous k-tile's stage on ``empty``. Per-expert
scales are applied once in the epilogue; 128 x 128 block scales go through a partial product
per half and k-tile (``BK = 128``: one scale block): the halves are committed as separate
groups so that the first partial is scaled and added while the second half's wgmma runs.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import e4m3, f32, i32

from .blocks import (
    block_rows,
    expert_block,
    gathered_stages,
    k_tile_range,
    load_tile,
    sorted_rows,
    sorted_tokens,
    warp_specialized,
    wgmma_in_flight,
    wgmma_pipeline,
)
from .fp8_kernels_sm89 import SCALE_BLOCK, _scale, check_down_tiles, scale_down
from .kernels_sm90 import arch_tag

__all__ = ["moe_fp8_gate_up_sm90_kernel", "moe_fp8_down_sm90_kernel", "moe_fp8_gate_up_sm90_ws_kernel",
           "moe_fp8_down_sm90_ws_kernel", "store_gate_up"]

K, T, E, N, NB, KB, EM, NBLK, TK, I = hl.dims("K T E N NB KB EM NBLK TK I")



@cache
def moe_fp8_gate_up_sm90_kernel(dtype: DType, split: bool = False, arch: str = "sm_90a") -> Any:
    """Gate-up with the activation epilogue, ``h[r, n] = act(g) * u`` (``moe_fp8_kernels``),
    wgmma swap-AB. Constants: ``BM`` (16 / 32 / 64 sorted rows), ``BN`` (64), ``BK`` (128),
    ``STAGES``, ``TOPK``, ``GELU``, ``BLOCK_SCALE``, ``UNIFORM``, ``SPLIT_K`` (as the sm_89
    kernel's; ``split``: its split-K form, the scaled gate / up partials of split ``sp`` added
    atomically into the f32 workspace ``h [2, T * k, I]``)."""
    dt = dtype
    h_t = f32[2, TK, I] if split else dt[TK, I]
    name = f"moe_fp8_gate_up_{arch_tag(arch)}_{dt}" + ("_splitk" if split else "")

    @hl.kernel(threads=128, name=name)
    def moe_fp8_gate_up_sm90(xq: e4m3[T, K], xs: f32[T], w: e4m3[E, N, K], ws: f32[E, NB, KB],  # type: ignore
                             sorted_ids: i32[EM], block_expert: i32[NBLK],
                             h: h_t,  # type: ignore
                             *, BM: int = 16, BN: int = 64, BK: int = 128, STAGES: int = 4, TOPK: int = 1,
                             GELU: bool = False, BLOCK_SCALE: bool = False, UNIFORM: bool = False,
                             SPLIT_K: int = 1):
        Tx, Kx = xq.shape
        Ix = h.shape[-1]
        e, m0, n0, sp = expert_block(block_expert, Ix, BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)
            rid, rrow = block_rows(sorted_ids, m0, BM, Tx * TOPK)
            tok = hl.where(rid >= 0, rid // TOPK, -1)
            num_k, k0, ktile = k_tile_range(Kx, BK, SPLIT_K, sp)
            sa, (sg, su), load = gathered_stages(xq, tok, m0, k0, e4m3, BM, BK, STAGES,
                                                 w, e, (n0, Ix + n0), BN)
            acc_g = hl.zeros((BN, BM), f32)
            acc_u = hl.zeros((BN, BM), f32)
            col = hl.iota((BN, 1), 0) + n0

            if BLOCK_SCALE:  # a partial per k-tile, two used alternately (wgmma_pipeline's slots)
                parts = [(hl.register(f32, (BN, BM)), hl.register(f32, (BN, BM))) for _ in range(2)]

                def step(kt: Any, st: Any, slot: int) -> None:
                    hl.wgmma_fence()
                    hl.mma(sg[:, :, st], sa[:, :, st], parts[slot][0], accumulate=False)
                    hl.mma(su[:, :, st], sa[:, :, st], parts[slot][1], accumulate=False)
                    hl.wgmma_commit()  # in flight while the previous k-tile's partials are scaled

                def finish(kt: Any, slot: int) -> None:
                    kb = ktile(kt) * BK // SCALE_BLOCK
                    pg, pu = parts[slot]
                    hl.assign(acc_g, acc_g + pg * _scale(ws, e, col, n0, kb, UNIFORM))
                    hl.assign(acc_u, acc_u + pu * _scale(ws, e, col + Ix, n0 + Ix, kb, UNIFORM))

                wgmma_pipeline(name, num_k, STAGES, load, step, finish)
            else:  # one group in flight; cp.async STAGES - 2 ahead: a stage stays free for it
                wgmma_in_flight(name, num_k, STAGES, load, [(sg, acc_g), (su, acc_u)], sa, arch)
            sx = load_tile(xs[hl.where(rrow >= 0, rrow // TOPK, -1)], (1, BM))
            g = acc_g * sx
            u = acc_u * sx
            if not BLOCK_SCALE:
                we = load_tile(ws[e, col * 0, 0], (BN, 1))
                g = g * we
                u = u * we
            store_gate_up(h, g, u, rid, rrow, col, n0, BM, BN, dt, split, GELU)

    return moe_fp8_gate_up_sm90


def store_gate_up(h: Any, g: Any, u: Any, rid: Any, rrow: Any, col: Any, n0: Any, bm: int, bn: int, dt: Any,
                  split: bool, gelu: bool) -> None:
    """The swap-AB gate-up epilogue of the scaled ``(BN, BM)`` gate / up products ``g``, ``u``:
    ``h[r, n0 + n] = dt(act(g) * u)`` through the sorted slots ``rid`` (-1: padding), or, ``split``,
    ``g`` and ``u`` added atomically into the f32 workspace ``h [2, T * k, I]`` by slot ``rrow``."""
    if split:                                    # scaled partials; padding rows: none
        hl.atomic_add(h[0, rrow, col], g)
        hl.atomic_add(h[1, rrow, col], u)
    else:
        a = hl.gelu(g) if gelu else hl.silu(g)
        hl.copy(hl.cast(a * u, dt), hl.view(h, (bm, bn), (None, n0), rows=rid).T)


@cache
def moe_fp8_down_sm90_kernel(dtype: DType, split: bool = False, arch: str = "sm_90a") -> Any:
    """Down with the top-k weight epilogue, ``y[r, n] = tw[r] * s_r * (W2[e] @ hq[r])``
    (``moe_fp8_kernels``), wgmma swap-AB. Constants as the gate-up kernel's and ``ROUTER``
    (``split``: the scaled partials added atomically into the f32 workspace ``y [T * k, N]``)."""
    y_t = f32[TK, N] if split else dtype[TK, N]
    name = f"moe_fp8_down_{arch_tag(arch)}_{dtype}" + ("_splitk" if split else "")

    @hl.kernel(threads=128, name=name)
    def moe_fp8_down_sm90(hq: e4m3[TK, K], hs: f32[TK], w: e4m3[E, N, K], ws: f32[E, NB, KB], tw: f32[TK],
                          sorted_ids: i32[EM], block_expert: i32[NBLK], y: y_t,  # type: ignore
                          *, BM: int = 16, BN: int = 64, BK: int = 128, STAGES: int = 4,
                          ROUTER: bool = False, BLOCK_SCALE: bool = False, SPLIT_K: int = 1):
        TKx, Kx = hq.shape
        check_down_tiles(BN, BK, BLOCK_SCALE)
        e, m0, n0, sp = expert_block(block_expert, y.shape[1], BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)
            rid, rrow = block_rows(sorted_ids, m0, BM, TKx)
            num_k, k0, ktile = k_tile_range(Kx, BK, SPLIT_K, sp)
            sa, (sb,), load = gathered_stages(hq, rid, m0, k0, e4m3, BM, BK, STAGES, w, e, (n0,), BN)
            acc = hl.zeros((BN, BM), f32)
            col = hl.iota((BN, 1), 0) + n0

            if BLOCK_SCALE:  # a partial per k-tile, two used alternately (wgmma_pipeline's slots)
                parts = [hl.register(f32, (BN, BM)) for _ in range(2)]

                def step(kt: Any, st: Any, slot: int) -> None:
                    hl.wgmma_fence()
                    hl.mma(sb[:, :, st], sa[:, :, st], parts[slot], accumulate=False)
                    hl.wgmma_commit()  # in flight while the previous k-tile's partial is scaled

                def finish(kt: Any, slot: int) -> None:
                    sw = _scale(ws, e, col, n0, ktile(kt) * BK // SCALE_BLOCK, True)   # BN | 128: one block
                    hl.assign(acc, acc + parts[slot] * sw)

                wgmma_pipeline(name, num_k, STAGES, load, step, finish)
            else:  # one group in flight; cp.async STAGES - 2 ahead: a stage stays free for it
                wgmma_in_flight(name, num_k, STAGES, load, [(sb, acc)], sa, arch)
            out = scale_down(acc, hs, tw, ws, e, rrow, col, ROUTER, BLOCK_SCALE)
            if split:                                    # scaled partials; padding rows: none
                hl.atomic_add(y[rrow, col], out)
            else:
                hl.copy(hl.cast(out, dtype), hl.view(y, (BM, BN), (None, n0), rows=rid).T)

    return moe_fp8_down_sm90


def _straddle(ws: Any, e: Any, col: Any, first: Any, kb: Any) -> Any:
    """The block scales at k-block ``kb`` of the ``(1, BN)`` columns ``col`` (``BN <= 128``) from
    ``first`` on, which span at most two 128-row blocks: two scalar loads now, the per-column
    select when called."""
    b0 = first // SCALE_BLOCK
    s0 = load_tile(ws[e, hl.iota((1, 1), 0) + b0, kb], (1, 1))
    s1 = load_tile(ws[e, hl.iota((1, 1), 0) + hl.minimum(b0 + 1, ws.shape[1] - 1), kb], (1, 1))
    return lambda: hl.where((col // SCALE_BLOCK).eq(b0), s0, s1)


def _check_ws(name: str, bm: int, bn: int, bk: int, stages: int, consumers: int, block_scale: bool) -> None:
    if bm != 64 * consumers or stages < 2 or (block_scale and (bk != SCALE_BLOCK or SCALE_BLOCK % bn)):
        raise ValueError(f"{name}: BM ({bm}) must be 64 * CONSUMERS ({consumers}), STAGES ({stages}) >= 2 "
                         f"and with block scales BK ({bk}) = {SCALE_BLOCK} and BN ({bn}) divide it")


@cache
def moe_fp8_gate_up_sm90_ws_kernel(dtype: DType, arch: str = "sm_90a") -> Any:
    """Gate-up for many tokens per expert, tokens on the wgmma M side (see the module docstring):
    for the ``BM`` sorted rows ``r`` (token ``t = r // TOPK``) of a block of expert ``e`` and the
    ``BN`` intermediate columns ``n0 + n``::

        g[r, n] = s_t * sum_c xq[t, c] * W[e, n0 + n, c]          (gate rows of w13)
        u[r, n] = s_t * sum_c xq[t, c] * W[e, I + n0 + n, c]      (up rows)
        h[r, n0 + n] = dtype(act(g) * u)                          (act: SiLU or exact GELU)

    ``W = w * ws`` (per expert: ``ws[e, 0, 0]`` once in the epilogue; block scales: per 128-column
    k-tile, per column or, ``UNIFORM``, one per tile). Constants: ``BM`` (``64 * CONSUMERS``),
    ``BN`` (64), ``BK`` (128), ``STAGES`` (>= 2), ``CONSUMERS`` (1 or 2), ``TOPK``, ``GELU``,
    ``BLOCK_SCALE``, ``UNIFORM``."""
    dt = dtype

    @hl.kernel(threads=lambda c: 128 * (1 + c["CONSUMERS"]), name=f"moe_fp8_gate_up_{arch_tag(arch)}_ws_{dt}")
    def moe_fp8_gate_up_sm90_ws(xq: e4m3[T, K], xs: f32[T], w: e4m3[E, N, K], ws: f32[E, NB, KB],  # type: ignore
                                sorted_ids: i32[EM], block_expert: i32[NBLK], h: dt[TK, I],  # type: ignore
                                *, BM: int = 128, BN: int = 64, BK: int = 128, STAGES: int = 4,
                                CONSUMERS: int = 2, TOPK: int = 1, GELU: bool = False,
                                BLOCK_SCALE: bool = False, UNIFORM: bool = False):
        _check_ws("moe_fp8_gate_up_sm90_ws", BM, BN, BK, STAGES, CONSUMERS, BLOCK_SCALE)
        Tx, Kx = xq.shape
        Ix = h.shape[1]
        e, m0, n0, _ = expert_block(block_expert, Ix, BM, BN)
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)

            def consume(mainloop: Any) -> None:
                col = hl.iota((1, BN), 1) + n0
                if BLOCK_SCALE:
                    acc_g, acc_u = hl.zeros((BM, BN), f32), hl.zeros((BM, BN), f32)
                    mainloop(acc_g, acc_u,
                             lambda kt: _scale(ws, e, col, n0, kt * BK // SCALE_BLOCK, True),   # BN | 128
                             lambda kt: (_scale(ws, e, col, n0 + Ix, kt * BK // SCALE_BLOCK, True) if UNIFORM
                                         else _straddle(ws, e, col + Ix, n0 + Ix, kt * BK // SCALE_BLOCK)))
                else:
                    acc_g, acc_u = hl.register(f32, (BM, BN)), hl.register(f32, (BM, BN))
                    mainloop(acc_g, acc_u)
                rid = sorted_rows(sorted_ids, m0, BM, Tx * TOPK)
                sx = load_tile(xs[hl.where(rid >= 0, rid // TOPK, -1)], (BM, 1))
                if not BLOCK_SCALE:
                    sx = sx * load_tile(ws[e, hl.iota((1, 1), 0) * 0, 0], (1, 1))
                g = acc_g * sx
                a = hl.gelu(g) if GELU else hl.silu(g)
                hl.copy(hl.cast(a * (acc_u * sx), dt), hl.view(h, (BM, BN), (None, n0), rows=rid))

            def tokens() -> Any:                         # the producer's rows of xq
                return sorted_tokens(sorted_ids, m0, BM, Tx, TOPK)

            warp_specialized(xq, tokens, w, e, (n0, Ix + n0), Kx, e4m3, BM, BN, BK, STAGES, CONSUMERS,
                             consume, arch)

    return moe_fp8_gate_up_sm90_ws


@cache
def moe_fp8_down_sm90_ws_kernel(dtype: DType, arch: str = "sm_90a") -> Any:
    """Down for many tokens per expert, tokens on the wgmma M side (see the module docstring): for
    the ``BM`` sorted rows ``r`` of a block of expert ``e`` and the ``BN`` output columns ``n0 + n``
    (two wgmma halves of ``BN / 2``)::

        y[r, n0 + n] = dtype(tw[r] * s_r * sum_c hq[r, c] * W2[e, n0 + n, c])

    ``tw[r]`` is 1 with ``ROUTER`` (applied to the input); ``W2 = w * ws`` (per expert: once in the
    epilogue; block scales: one per 128-column k-tile, ``BN`` divides 128). Constants: ``BM``
    (``64 * CONSUMERS``), ``BN`` (128), ``BK`` (128), ``STAGES``, ``CONSUMERS``, ``ROUTER``,
    ``BLOCK_SCALE``."""

    @hl.kernel(threads=lambda c: 128 * (1 + c["CONSUMERS"]), name=f"moe_fp8_down_{arch_tag(arch)}_ws_{dtype}")
    def moe_fp8_down_sm90_ws(hq: e4m3[TK, K], hs: f32[TK], w: e4m3[E, N, K], ws: f32[E, NB, KB], tw: f32[TK],
                             sorted_ids: i32[EM], block_expert: i32[NBLK], y: dtype[TK, N],  # type: ignore
                             *, BM: int = 128, BN: int = 128, BK: int = 128, STAGES: int = 4,
                             CONSUMERS: int = 2, ROUTER: bool = False, BLOCK_SCALE: bool = False):
        _check_ws("moe_fp8_down_sm90_ws", BM, BN, BK, STAGES, CONSUMERS, BLOCK_SCALE)
        if BN % 2:
            raise ValueError(f"moe_fp8_down_sm90_ws: BN ({BN}) must be even (two wgmma halves)")
        TKx, Kx = hq.shape
        H2 = BN // 2
        e, m0, n0, _ = expert_block(block_expert, y.shape[1], BM, BN)
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)

            def consume(mainloop: Any) -> None:
                if BLOCK_SCALE:
                    acc_x, acc_y = hl.zeros((BM, H2), f32), hl.zeros((BM, H2), f32)

                    def sw(kt: Any) -> Any:                  # BN | 128: the tile's one block
                        return _scale(ws, e, None, n0, kt * BK // SCALE_BLOCK, True)

                    mainloop(acc_x, acc_y, sw, sw)
                else:
                    acc_x, acc_y = hl.register(f32, (BM, H2)), hl.register(f32, (BM, H2))
                    mainloop(acc_x, acc_y)
                rid = sorted_rows(sorted_ids, m0, BM, TKx)
                rs = load_tile(hs[rid], (BM, 1))
                if not ROUTER:
                    rs = rs * load_tile(tw[rid], (BM, 1))
                if not BLOCK_SCALE:
                    rs = rs * load_tile(ws[e, hl.iota((1, 1), 0) * 0, 0], (1, 1))
                hl.copy(hl.cast(acc_x * rs, dtype), hl.view(y, (BM, H2), (None, n0), rows=rid))
                hl.copy(hl.cast(acc_y * rs, dtype), hl.view(y, (BM, H2), (None, n0 + H2), rows=rid))

            def slots() -> Any:                          # the producer's rows of hq
                return sorted_rows(sorted_ids, m0, BM, TKx)

            warp_specialized(hq, slots, w, e, (n0, n0 + H2), Kx, e4m3, BM, H2, BK, STAGES, CONSUMERS, consume,
                             arch)

    return moe_fp8_down_sm90_ws
