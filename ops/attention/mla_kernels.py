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
"""

from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

from .tiles import mask_paged, paged_tile, store_paged

__all__ = ["mla_decode_kernel"]

TQ, H, DQ, DV, NB, BS, B1, B, MAXB = hl.dims("TQ H DQ DV NB BS B1 B MAXB")
SQT, SQH, SKB, SKS, SBT = hl.dims("SQT SQH SKB SKS SBT")


@cache
def mla_decode_kernel(dtype: DType) -> Any:
    """The MLA decode kernel for ``dtype`` (f16 / bf16). Constants: ``BM`` rows and ``BN`` keys
    per step, ``LATENT`` / ``ROPE`` (the latent and rope widths, 512 and 64 for DeepSeek),
    ``DCH`` (columns of the latent product per MMA chunk), ``BLOCK`` (the cache's block size),
    ``WARPS``, ``TILES`` (row tiles per sequence)."""
    dt = dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"mla_decode_{dt}")
    def mla_decode(q: dt[TQ, H, DQ].strides(SQT, SQH, 1),  # type: ignore
                   kv_cache: dt[NB, BS, DQ].strides(SKB, SKS, 1),  # type: ignore
                   cu_seqlens_q: i32[B1], seqused_k: i32[B], block_table: i32[B, MAXB].strides(SBT, 1),
                   o: dt[TQ, H, DV], lse: f32[H, TQ],  # type: ignore
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
            hl.copy(kv_cache[page, row, 0:LATENT], sc_lat)
            hl.copy(kv_cache[page, row, LATENT:LATENT + ROPE], sc_rope)
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
            p = sm.step(sc, acc, qk_scale, masked=masked)
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

        store_paged(sm, acc, o, lse, t, 0, heads, 0, split=False, dt=dt, BM=BM, HEAD_DIM=LATENT)

    return mla_decode
