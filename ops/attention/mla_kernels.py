"""The MLA decode kernel in the tile language, layout-free (``hexlayout.ops.attention``).

Multi-head latent attention (DeepSeek-V2/V3/R1) with the absorbed query: every query head
attends over one shared latent KV cache whose row ``j`` is ``[c_j (LATENT), k_pe_j (ROPE)]``
(``kv_cache [NB, BS, LATENT + ROPE]``, row ``j`` of sequence ``s`` at block
``block_table[s, j // BS]``, slot ``j % BS``). For sequence ``s`` (queries ``cu_seqlens_q[s] ..
cu_seqlens_q[s+1]``, ``Sq`` of them; keys ``0 .. seqused_k[s]``, ``Sk`` of them) and head
``h``::

    s_ij = (q_i[:LATENT] . c_j + q_i[LATENT:] . k_pe_j) * scale
    visible(i, j) = j <= i + Sk - Sq                 (causal, bottom-right aligned)
    o_i = sum_j softmax_j(s_ij over visible j) c_j   ([LATENT]: the values are the latents)
    lse_i = log(sum_j exp(s_ij) over visible j)

One thread block owns ``BM`` rows (query token, head) of one sequence, row ``r`` = token ``r //
H``, head ``r % H`` (``G = H``: all heads share the one KV head, so a decode step's heads share
every latent row the block reads). Per step of ``BN`` keys the latents and rope keys are
gathered through the block table into shared memory once and serve both products: S = Q_c
C^T + Q_pe K_pe^T (the LATENT part in chunks of ``DCH`` columns) and O += P C. The online
softmax, the row tile and the masks are paged attention's (``tiles``); no layout is written.

An FP8 cache (E4M3 / E5M2, holding ``[c_j, k_pe_j] / k_scale[0]``, vLLM's ``kv_cache_dtype``
"fp8") is converted to ``dtype`` on its way to shared memory (exact), ``k_scale`` folded into
the scores' scale and into the output (the latents are the values: ``o_i = k_scale * sum_j p_ij
c8_j``).
"""

from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

from .tiles import mask_paged, paged_tile, scalar_rows, store_paged

__all__ = ["mla_decode_kernel"]

TQ, H, DQ, DV, NB, BS, B1, B, MAXB, NSC = hl.dims("TQ H DQ DV NB BS B1 B MAXB NSC")
SQT, SQH, SKB, SKS, SBT = hl.dims("SQT SQH SKB SKS SBT")


def gather_rows(cache: Any, page: Any, row: Any, c0: int, c1: int, dst: Any, *, rows: int, dt: Any,
                fp8: Any) -> None:
    """``dst`` (shared, ``rows`` x ``c1 - c0`` of ``dt``) = columns ``c0:c1`` of the cache rows
    ``cache[page, row]`` (page -1: no row): a cp.async gather, or for an FP8 cache (``fp8`` its
    element type) a load into registers (0 for no row) converted to ``dt`` and stored."""
    if fp8 is None:
        hl.copy(cache[page, row, c0:c1], dst)
        return
    x = hl.register(fp8, (rows, c1 - c0))
    hl.copy(cache[page, row, c0:c1], x, other=0.0)
    hl.copy(hl.cast(x, dt), dst)


@cache
def mla_decode_kernel(dtype: DType, cache_dtype: DType | None = None) -> Any:
    """The MLA decode kernel for ``dtype`` (f16 / bf16) over a cache of ``cache_dtype`` (None:
    ``dtype``; e4m3 / e5m2: FP8 rows times ``k_scale[0]``). Constants: ``BM`` rows and ``BN`` keys
    per step, ``LATENT`` / ``ROPE`` (the latent and rope widths, 512 and 64 for DeepSeek),
    ``DCH`` (columns of the latent product per MMA chunk), ``BLOCK`` (the cache's block size),
    ``WARPS``, ``TILES`` (row tiles per sequence)."""
    dt = dtype
    cdt = cache_dtype or dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"mla_decode_{dt}")
    def mla_decode(q: dt[TQ, H, DQ].strides(SQT, SQH, 1),  # type: ignore
                   kv_cache: cdt[NB, BS, DQ].strides(SKB, SKS, 1),  # type: ignore
                   cu_seqlens_q: i32[B1], seqused_k: i32[B], block_table: i32[B, MAXB].strides(SBT, 1),
                   o: dt[TQ, H, DV], lse: f32[H, TQ], k_scale: f32[NSC],  # type: ignore
                   qk_scale: f32, SQT: i32, SQH: i32, SKB: i32, SKS: i32, SBT: i32,
                   *, BM: int = 16, BN: int = 32, LATENT: int = 512, ROPE: int = 64, DCH: int = 128,
                   BLOCK: int = 64, WARPS: int = 4, TILES: int = 1):
        s, mt = hl.grid(hl.spatial(seqused_k.shape[0], TILES))
        heads = q.shape[1]
        t = paged_tile(cu_seqlens_q, seqused_k, s, 0, mt, heads, BM=BM, CAUSAL=True)
        _, _, n, m0, tok, head, shift, n_end = t

        sq = hl.shared(dt, (BM, LATENT))
        sqr = hl.shared(dt, (BM, ROPE))
        sc_lat = hl.shared(dt, (BN, LATENT))                   # the step's latents: K and V
        sc_rope = hl.shared(dt, (BN, ROPE))
        sp = hl.shared(dt, (BM, BN))                           # P, from S's layout to P V's
        hl.copy(q[tok, head, 0:LATENT], sq)                    # gathered (token, head) rows
        hl.copy(q[tok, head, LATENT:LATENT + ROPE], sqr)
        hl.commit_group()
        hl.wait_group(0)                                       # (the first step syncs the block)
        sm = hl.OnlineSoftmax(BM)
        acc = hl.zeros((BM, LATENT), f32)
        qks = qk_scale if cache_dtype is None else scalar_rows(k_scale, BM=BM) * qk_scale
        qi = hl.iota((BM, BN), 0) + m0
        qpos = qi // heads + shift                             # the key aligned with each row
        nblk = hl.cdiv(n_end, BN)
        n_full = hl.maximum(hl.minimum(n, m0 // heads + shift + 1), 0) // BN   # every row sees these

        def step(j: Any, masked: bool) -> None:
            """Key block ``j``: gather the latents and rope keys, S = Q_c C^T + Q_pe K_pe^T,
            the online softmax (log2 domain), O += P C."""
            pos = hl.iota((BN,), 0) + j * BN
            page = hl.register(i32, (BN,))
            hl.copy(block_table[s, pos // BLOCK], page)
            if masked:
                page = hl.where(pos < n, page, -1)             # past the end: no row, no read
            row = pos % BLOCK
            if cache_dtype is None:
                gather_rows(kv_cache, page, row, 0, LATENT, sc_lat, rows=BN, dt=dt, fp8=None)
            else:                                              # FP8: a chunk of columns at a time
                for c in range(LATENT // DCH):
                    gather_rows(kv_cache, page, row, c * DCH, (c + 1) * DCH, sc_lat[:, c * DCH:(c + 1) * DCH],
                                rows=BN, dt=dt, fp8=cache_dtype)
            gather_rows(kv_cache, page, row, LATENT, LATENT + ROPE, sc_rope, rows=BN, dt=dt, fp8=cache_dtype)
            hl.commit_group()
            hl.wait_group(0)
            hl.syncthreads()
            sc = hl.zeros((BM, BN), f32)
            for c in range(LATENT // DCH):
                rq = hl.register(dt, (BM, DCH))
                hl.copy(sq[:, c * DCH:(c + 1) * DCH], rq)
                rk = hl.register(dt, (BN, DCH))
                hl.copy(sc_lat[:, c * DCH:(c + 1) * DCH], rk)
                hl.mma(rq, rk, sc)
            rqr = hl.register(dt, (BM, ROPE))
            hl.copy(sqr, rqr)
            rkr = hl.register(dt, (BN, ROPE))
            hl.copy(sc_rope, rkr)
            hl.mma(rqr, rkr, sc)
            if masked:
                sc = mask_paged(sc, j, t, qpos, 0, 0, BM=BM, BN=BN, CAUSAL=True, WINDOW=False)
            p = sm.step(sc, acc, qks, masked=masked)
            hl.copy(hl.cast(p, dt), sp)                        # S's columns are split over the
            hl.syncthreads()                                   # warps, P V's rows are not
            rp = hl.register(dt, (BM, BN))
            hl.copy(sp, rp)
            rv = hl.register(dt, (LATENT, BN))
            hl.copy(sc_lat.T, rv)
            hl.mma(rp, rv, acc)
            hl.syncthreads()                                   # before the next step overwrites them

        mid = hl.minimum(nblk, n_full)
        for j in hl.range(0, mid):
            step(j, False)
        for j in hl.range(mid, nblk):
            step(j, True)

        vs = None if cache_dtype is None else scalar_rows(k_scale, BM=BM)
        store_paged(sm, acc, o, lse, t, 0, heads, 0, split=False, dt=dt, BM=BM, HEAD_DIM=LATENT, v_scale=vs)

    return mla_decode
