"""FP8 fused-MoE grouped GEMMs for sm_90a: e4m3 ``wgmma`` with swapped operands.

The same products as ``moe_fp8_kernels``' gate-up and down kernels (see its docstring for the
math), for Hopper, where ``mma.sync`` with e4m3 operands has no native instruction (ptxas
emulates it with f16 HMMA and conversions): ``wgmma.mma_async`` m64nNk32 e4m3 from shared
memory. Swap-AB: the weight tile (``BN`` = 64 output columns x ``BK``) is the 64-row A operand
and the gathered token rows (``BM`` of them: 16, 32 or 64) the N side, so a decode step with a
few tokens per expert wastes no MMA rows; the accumulator is the transposed ``BN x BM`` tile and
the epilogue scales rows by the weight scales and columns by the token scales. Token rows are
gathered with cp.async (never TMA), hence ``fence_proxy_async`` before the barrier that precedes
each wgmma; ``STAGES`` shared buffers, the next k-tile's copies issued before the current
wgmma.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import e4m3, f32, i32

from .moe_fp8_kernels import SCALE_BLOCK, _load, _scale

__all__ = ["moe_fp8_gate_up_sm90_kernel", "moe_fp8_down_sm90_kernel"]

K, T, E, N, NB, KB, EM, NBLK, TK, I = hl.dims("K T E N NB KB EM NBLK TK I")


def _rows(sorted_ids: Any, m0: Any, bm: int, limit: Any) -> tuple[Any, Any]:
    """This block's sorted slots as a ``(bm,)`` column index tile and a ``(1, bm)`` row tile
    (padding slots ``>= limit``: -1)."""
    rid = hl.register(i32, (bm,))
    hl.copy(hl.view(sorted_ids, (bm,), (m0,)), rid)
    row = hl.register(i32, (1, bm))
    hl.copy(sorted_ids[hl.iota((1, bm), 1) + m0], row)
    return hl.where(rid < limit, rid, -1), hl.where(row < limit, row, -1)


def _pipeline(load: Any, step: Any, num_k: Any, stages: int) -> None:
    """cp.async into ``stages`` buffers, ``step(kt, stage)`` (the wgmma) on each k-tile."""
    for st in range(stages - 1):
        load(st, st)
        hl.commit_group()
    for kt in hl.range(num_k):
        hl.wait_group(stages - 2)
        hl.fence_proxy_async()
        hl.syncthreads()
        kn = kt + (stages - 1)
        load(kn, kn % stages)
        hl.commit_group()
        step(kt, kt % stages)
    hl.wait_group(0)


@cache
def moe_fp8_gate_up_sm90_kernel(dtype: DType) -> Any:
    """Gate-up with the activation epilogue, ``h[r, n] = act(g) * u`` (``moe_fp8_kernels``),
    wgmma swap-AB. Constants: ``BM`` (16 / 32 / 64 sorted rows), ``BN`` (64), ``BK`` (128),
    ``STAGES``, ``TOPK``, ``GELU``, ``BLOCK_SCALE``, ``UNIFORM`` (as the sm_89 kernel's)."""
    dt = dtype

    @hl.kernel(threads=128, name=f"moe_fp8_gate_up_sm90_{dt}")
    def moe_fp8_gate_up_sm90(xq: e4m3[T, K], xs: f32[T], w: e4m3[E, N, K], ws: f32[E, NB, KB],  # type: ignore
                             sorted_ids: i32[EM], block_expert: i32[NBLK],
                             h: dt[TK, I],  # type: ignore
                             *, BM: int = 16, BN: int = 64, BK: int = 128, STAGES: int = 2, TOPK: int = 1,
                             GELU: bool = False, BLOCK_SCALE: bool = False, UNIFORM: bool = False):
        Tx, Kx = xq.shape
        Ix = h.shape[1]
        pid_m, pid_n = hl.grid(hl.spatial(block_expert.shape[0], hl.cdiv(Ix, BN)))
        e = block_expert[pid_m]
        m0, n0 = pid_m * BM, pid_n * BN
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)
            rid, rrow = _rows(sorted_ids, m0, BM, Tx * TOPK)
            tok = hl.where(rid >= 0, rid // TOPK, -1)
            sa = hl.shared(e4m3, (BM, BK, STAGES))
            sg = hl.shared(e4m3, (BN, BK, STAGES))
            su = hl.shared(e4m3, (BN, BK, STAGES))
            acc_g = hl.zeros((BN, BM), f32)
            acc_u = hl.zeros((BN, BM), f32)
            col = hl.iota((BN, 1), 0) + n0

            def load(kt: Any, st: Any) -> None:
                hl.copy(hl.view(xq, (BM, BK), (None, kt * BK), rows=tok), sa[:, :, st])
                hl.copy(w[e, n0:n0 + BN, kt * BK:kt * BK + BK], sg[:, :, st])
                hl.copy(w[e, Ix + n0:Ix + n0 + BN, kt * BK:kt * BK + BK], su[:, :, st])

            def step(kt: Any, st: Any) -> None:
                if BLOCK_SCALE:
                    pg = hl.zeros((BN, BM), f32)
                    pu = hl.zeros((BN, BM), f32)
                else:
                    pg, pu = acc_g, acc_u
                hl.wgmma_fence()
                hl.mma(sg[:, :, st], sa[:, :, st], pg)
                hl.mma(su[:, :, st], sa[:, :, st], pu)
                hl.wgmma_commit()
                hl.wgmma_wait(0)
                if BLOCK_SCALE:
                    kb = kt * BK // SCALE_BLOCK
                    hl.assign(acc_g, acc_g + pg * _scale(ws, e, col, n0, kb, UNIFORM))
                    hl.assign(acc_u, acc_u + pu * _scale(ws, e, col + Ix, n0 + Ix, kb, UNIFORM))

            _pipeline(load, step, hl.cdiv(Kx, BK), STAGES)
            sx = _load(xs[hl.where(rrow >= 0, rrow // TOPK, -1)], (1, BM))
            g = acc_g * sx
            u = acc_u * sx
            if not BLOCK_SCALE:
                we = _load(ws[e, col * 0, 0], (BN, 1))
                g = g * we
                u = u * we
            a = hl.gelu(g) if GELU else hl.silu(g)
            hl.copy(hl.cast(a * u, dt), hl.view(h, (BM, BN), (None, n0), rows=rid).T)

    return moe_fp8_gate_up_sm90


@cache
def moe_fp8_down_sm90_kernel(dtype: DType) -> Any:
    """Down with the top-k weight epilogue, ``y[r, n] = tw[r] * s_r * (W2[e] @ hq[r])``
    (``moe_fp8_kernels``), wgmma swap-AB. Constants as the gate-up kernel's and ``ROUTER``."""

    @hl.kernel(threads=128, name=f"moe_fp8_down_sm90_{dtype}")
    def moe_fp8_down_sm90(hq: e4m3[TK, K], hs: f32[TK], w: e4m3[E, N, K], ws: f32[E, NB, KB], tw: f32[TK],
                          sorted_ids: i32[EM], block_expert: i32[NBLK], y: dtype[TK, N],  # type: ignore
                          *, BM: int = 16, BN: int = 64, BK: int = 128, STAGES: int = 2,
                          ROUTER: bool = False, BLOCK_SCALE: bool = False):
        TKx, Kx = hq.shape
        if BLOCK_SCALE and (SCALE_BLOCK % BN or BK != SCALE_BLOCK):
            raise ValueError(f"moe_fp8_down: with block scales BN ({BN}) must divide and BK ({BK}) equal "
                             f"{SCALE_BLOCK}")
        Nx = y.shape[1]
        pid_m, pid_n = hl.grid(hl.spatial(block_expert.shape[0], hl.cdiv(Nx, BN)))
        e = block_expert[pid_m]
        m0, n0 = pid_m * BM, pid_n * BN
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)
            rid, rrow = _rows(sorted_ids, m0, BM, TKx)
            sa = hl.shared(e4m3, (BM, BK, STAGES))
            sb = hl.shared(e4m3, (BN, BK, STAGES))
            acc = hl.zeros((BN, BM), f32)
            col = hl.iota((BN, 1), 0) + n0

            def load(kt: Any, st: Any) -> None:
                hl.copy(hl.view(hq, (BM, BK), (None, kt * BK), rows=rid), sa[:, :, st])
                hl.copy(w[e, n0:n0 + BN, kt * BK:kt * BK + BK], sb[:, :, st])

            def step(kt: Any, st: Any) -> None:
                p = hl.zeros((BN, BM), f32) if BLOCK_SCALE else acc
                hl.wgmma_fence()
                hl.mma(sb[:, :, st], sa[:, :, st], p)
                hl.wgmma_commit()
                hl.wgmma_wait(0)
                if BLOCK_SCALE:
                    sw = _scale(ws, e, col, n0, kt * BK // SCALE_BLOCK, True)   # BN | 128: one block
                    hl.assign(acc, acc + p * sw)

            _pipeline(load, step, hl.cdiv(Kx, BK), STAGES)
            rs = _load(hs[rrow], (1, BM))
            if not ROUTER:
                rs = rs * _load(tw[rrow], (1, BM))
            out = acc * rs
            if not BLOCK_SCALE:
                out = out * _load(ws[e, col * 0, 0], (BN, 1))
            hl.copy(hl.cast(out, dtype), hl.view(y, (BM, BN), (None, n0), rows=rid).T)

    return moe_fp8_down_sm90
