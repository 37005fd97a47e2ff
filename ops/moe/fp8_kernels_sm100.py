"""FP8 fused-MoE grouped GEMMs for sm_100a with UE8M0 block scales inside the MMA.

The products of ``fp8_kernels_sm90``'s swap-AB gate-up and down kernels (see ``fp8.py`` for the
math), for weights whose 128 x 128 block scales are all powers of two (``prepare_fp8`` records
``scale_format="ue8m0"``: DeepSeek-V3.1's UE8M0 checkpoints, MXFP8): the weight scales are not
applied to per-k-tile partial products in registers but by the block-scaled ``tcgen05.mma``
(kind::mxf8f6f4, ``hl.mma(..., scale_a=, scale_b=)``)::

    acc[n, r] += sum_kb (W[n, kb] * 2^(SFW[n, kb] - 127)) @ (xq[r, kb] * 2^(127 - 127))

over the 32-wide k-blocks ``kb`` of each 128-wide k-tile, with ``SFW[n, kb]`` the exponent of
``ws[e, n // 128, k-tile]`` (bits 23..30 of the f32 scale: exact for a power of two, 2^-127
included), so the accumulator holds ``W @ xq`` with the true weights and the per-token scale
``s_t`` stays in the epilogue. Swap-AB as on sm_90a: the weight tile is the MMA's A (``BN`` =
128 rows: the block-scaled MMA's M), the ``BM`` gathered token rows its N side (16 .. 64, a
multiple of 8; ``MAX_BM``); the token side's factors are a constant tile of 127 (2^0), filled once. Each
stage holds, beside the operand tiles, the weight factors of its k-tile (gate and up tiles
separately), written by the threads when the stage is loaded (one f32 scale per row, its
exponent byte repeated for the k-tile's four k-blocks) and copied to tensor memory by the
issuing thread (``tcgen05.cp``) before its MMAs; ``STAGES`` cp.async stages loaded ``STAGES - 2``
ahead, each released by its k-tile's MMAs and copies when they complete
(``blocks.in_flight_loop``: a ``tcgen05.commit`` onto the stage's mbarrier, which the refill two
k-tiles later waits on; no wait for the MMAs in the loop). ``split=True``: the split-K forms
(``s_t``-scaled f32 partials added atomically), as the sm_90a kernels'.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import e4m3, f32, i32, u8, u32

from .blocks import (
    block_rows,
    check_in_flight_stages,
    expert_block,
    gathered_stages,
    in_flight_loop,
    k_tile_range,
    load_tile,
)
from .fp8_kernels_sm89 import SCALE_BLOCK
from .fp8_kernels_sm90 import store_gate_up

__all__ = ["moe_fp8_gate_up_sm100_kernel", "moe_fp8_down_sm100_kernel", "ue8m0_of", "BN_BS", "MAX_BM"]

K, T, E, N, NB, KB, EM, NBLK, TK, I = hl.dims("K T E N NB KB EM NBLK TK I")
#: weight rows per tile: the block-scaled tcgen05.mma's M (one CTA)
BN_BS = 128
#: most token rows per block: the epilogue holds the gate and up accumulators (128 x BM f32 each)
#: in the registers of 128 threads; at 128 rows ptxas spills
MAX_BM = 64
#: 32-wide k-blocks per 128-wide k-tile (one UE8M0 factor each)
KBLOCKS = SCALE_BLOCK // 32


def ue8m0_of(s: Any) -> Any:
    """The UE8M0 byte of power-of-two f32 scales ``s`` (a register tile): their exponent field,
    ``(bits >> 23) & 0xFF`` (``2^-127``, a subnormal, gives 0 = ``2^-127`` too)."""
    return hl.cast((hl.bitcast(s, u32) >> 23) & 255, u8)


def _check(name: str, bn: int, bk: int, bm: int, stages: int) -> None:
    if bn != BN_BS or bk != SCALE_BLOCK or bm % 8 or not 8 <= bm <= MAX_BM:
        raise ValueError(f"{name}: BN ({bn}) must be {BN_BS} (the block-scaled tcgen05.mma's M), BK "
                         f"({bk}) {SCALE_BLOCK} (one scale block per k-tile) and BM ({bm}) a multiple of 8 "
                         f"in [8, {MAX_BM}] (more token rows: the f32 accumulators exceed the registers)")
    check_in_flight_stages(name, stages)


def _factors(ws: Any, e: Any, r0: Any, kb: Any, nb: Any) -> Any:
    """The ``(BN, 4)`` UE8M0 factors of weight rows ``r0 ..`` at scale k-block ``kb``, the same for
    the four 32-wide k-blocks of the k-tile; rows past the weights (a tile's padding) read the
    last scale row, k-tiles past K (the pipeline's prefetches beyond the last) the last column."""
    idx = hl.minimum((hl.iota((BN_BS, KBLOCKS), 0) + r0) // SCALE_BLOCK, nb - 1)
    return ue8m0_of(load_tile(ws[e, idx, hl.minimum(kb, ws.shape[2] - 1)], (BN_BS, KBLOCKS)))


def _mainloop(num_k: Any, stages: int, load: Any, mmas: list[tuple[Any, Any, Any]], sa: Any, ft: Any) -> None:
    """``acc += (W * 2^SFW) @ xq`` per k-tile for each ``(weights, factors, acc)``; the k-tile's
    MMAs (and factor copies) release its stage when they complete, no wait for them in the loop
    (``blocks.in_flight_loop``: the refill of a stage waits for the MMAs two k-tiles back)."""
    for _kt, st in in_flight_loop(num_k, stages, load, "sm_100a"):
        hl.wgmma_fence()
        for sw, fw, acc in mmas:
            hl.mma(sw[:, :, st], sa[:, :, st], acc, scale_a=fw[:, :, st], scale_b=ft)


def _unit_factors() -> Any:
    """The token side's factors: a shared ``(128, 4)`` tile of 127 (``2^0``)."""
    ft = hl.shared(u8, (BN_BS, KBLOCKS))
    hl.copy(hl.full((BN_BS, KBLOCKS), 127, u8), ft)
    return ft


@cache
def moe_fp8_gate_up_sm100_kernel(dtype: DType, split: bool = False) -> Any:
    """Gate-up with the activation epilogue, ``h[r, n] = act(g) * u`` (``fp8.py``), UE8M0 block
    scales in the MMA. Constants: ``BM`` (sorted rows: 8 .. 64), ``BN`` (128), ``BK`` (128),
    ``STAGES`` (>= 3), ``TOPK``, ``GELU``, ``SPLIT_K`` (``split``: the scaled gate / up partials of
    split ``sp`` added atomically into the f32 workspace ``h [2, T * k, I]``)."""
    dt = dtype
    h_t = f32[2, TK, I] if split else dt[TK, I]
    name = f"moe_fp8_gate_up_sm100_ue8m0_{dt}" + ("_splitk" if split else "")

    @hl.kernel(threads=128, name=name)
    def moe_fp8_gate_up_sm100(xq: e4m3[T, K], xs: f32[T], w: e4m3[E, N, K], ws: f32[E, NB, KB],  # type: ignore
                              sorted_ids: i32[EM], block_expert: i32[NBLK],
                              h: h_t,  # type: ignore
                              *, BM: int = 16, BN: int = 128, BK: int = 128, STAGES: int = 4, TOPK: int = 1,
                              GELU: bool = False, SPLIT_K: int = 1):
        _check(name, BN, BK, BM, STAGES)
        Tx, Kx = xq.shape
        Ix = h.shape[-1]
        NBx = ws.shape[1]
        e, m0, n0, sp = expert_block(block_expert, Ix, BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)
            rid, rrow = block_rows(sorted_ids, m0, BM, Tx * TOPK)
            tok = hl.where(rid >= 0, rid // TOPK, -1)
            num_k, k0, ktile = k_tile_range(Kx, BK, SPLIT_K, sp)
            sa, (sg, su), load_ops = gathered_stages(xq, tok, m0, k0, e4m3, BM, BK, STAGES, w, e,
                                                     (n0, Ix + n0), BN)
            fg, fu = hl.shared(u8, (BN, KBLOCKS, STAGES)), hl.shared(u8, (BN, KBLOCKS, STAGES))
            ft = _unit_factors()
            rows = hl.iota((BN, 1), 0) + n0

            def load(kt: Any, st: Any) -> None:
                load_ops(kt, st)
                kb = ktile(kt) * BK // SCALE_BLOCK
                hl.copy(_factors(ws, e, n0, kb, NBx), fg[:, :, st])
                hl.copy(_factors(ws, e, n0 + Ix, kb, NBx), fu[:, :, st])

            acc_g = hl.zeros((BN, BM), f32)
            acc_u = hl.zeros((BN, BM), f32)
            _mainloop(num_k, STAGES, load, [(sg, fg, acc_g), (su, fu, acc_u)], sa, ft)
            sx = load_tile(xs[hl.where(rrow >= 0, rrow // TOPK, -1)], (1, BM))
            store_gate_up(h, acc_g * sx, acc_u * sx, rid, rrow, rows, n0, BM, BN, dt, split, GELU)

    return moe_fp8_gate_up_sm100


@cache
def moe_fp8_down_sm100_kernel(dtype: DType, split: bool = False) -> Any:
    """Down with the top-k weight epilogue, ``y[r, n] = tw[r] * s_r * (W2[e] @ hq[r])`` (``fp8.py``),
    UE8M0 block scales in the MMA. Constants as the gate-up kernel's and ``ROUTER`` (``split``: the
    scaled partials added atomically into the f32 workspace ``y [T * k, N]``)."""
    y_t = f32[TK, N] if split else dtype[TK, N]
    name = f"moe_fp8_down_sm100_ue8m0_{dtype}" + ("_splitk" if split else "")

    @hl.kernel(threads=128, name=name)
    def moe_fp8_down_sm100(hq: e4m3[TK, K], hs: f32[TK], w: e4m3[E, N, K], ws: f32[E, NB, KB], tw: f32[TK],
                           sorted_ids: i32[EM], block_expert: i32[NBLK], y: y_t,  # type: ignore
                           *, BM: int = 16, BN: int = 128, BK: int = 128, STAGES: int = 4,
                           ROUTER: bool = False, SPLIT_K: int = 1):
        _check(name, BN, BK, BM, STAGES)
        TKx, Kx = hq.shape
        NBx = ws.shape[1]
        e, m0, n0, sp = expert_block(block_expert, y.shape[1], BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)
            rid, rrow = block_rows(sorted_ids, m0, BM, TKx)
            num_k, k0, ktile = k_tile_range(Kx, BK, SPLIT_K, sp)
            sa, (sb,), load_ops = gathered_stages(hq, rid, m0, k0, e4m3, BM, BK, STAGES, w, e, (n0,), BN)
            fb = hl.shared(u8, (BN, KBLOCKS, STAGES))
            ft = _unit_factors()
            rows = hl.iota((BN, 1), 0) + n0

            def load(kt: Any, st: Any) -> None:
                load_ops(kt, st)
                hl.copy(_factors(ws, e, n0, ktile(kt) * BK // SCALE_BLOCK, NBx), fb[:, :, st])

            acc = hl.zeros((BN, BM), f32)
            _mainloop(num_k, STAGES, load, [(sb, fb, acc)], sa, ft)
            rs = load_tile(hs[rrow], rrow.shape)
            if not ROUTER:
                rs = rs * load_tile(tw[rrow], rrow.shape)
            out = acc * rs
            if split:                                    # scaled partials; padding rows: none
                hl.atomic_add(y[rrow, rows], out)
            else:
                hl.copy(hl.cast(out, dtype), hl.view(y, (BM, BN), (None, n0), rows=rid).T)

    return moe_fp8_down_sm100
