"""Paged attention kernels in the tile language, layout-free (``hexlayout.ops.attention``).

``paged_attention_kernel(dtype)`` computes, for sequence ``s`` (queries ``cu_seqlens_q[s] ..
cu_seqlens_q[s+1]``, ``Sq`` of them; keys ``0 .. seqused_k[s]``, ``Sk`` of them, key ``j`` at
block ``block_table[s, j // BLOCK]``, row ``j % BLOCK`` of the caches) and query head
``h = kvh * G + g`` (GQA: ``G = H / KVH`` query heads per KV head)::

    s_ij = (q_i . k_j) * scale                  (softcap c > 0: c * tanh(s_ij / c))
    visible(i, j) = j < Sk  [and j <= i + Sk - Sq if causal]
                    [and i + Sk - Sq - left <= j <= i + Sk - Sq + right for a window]
    o_i = sum_j softmax_j(s_ij over visible j) v_j      (0 when no key is visible)
    lse_i = log(sum_j exp(s_ij) over visible j)         (-inf when none)

One thread block owns one (sequence, KV head, tile of ``BM`` rows), a row being one (query
token, query head of the group): row ``r`` is token ``r // G``, head ``kvh * G + r % G``, so
a decode step's ``G`` heads share the block's K/V traffic. Q rows are gathered through the
two computed index tiles (token, head); K and V rows through the block table (``BN`` keys per
step, cp.async: in a block whose keys all lie below ``Sk``, page by page as plain windows of
the cache, one scalar block-table load per page; else gathered rows, -1 past ``Sk``); the
online softmax is FlashAttention's in the log2 domain (``qk_scale = scale * log2(e)``, or
``scale / c`` and ``cap = c * log2(e)`` with a softcap); P stays in registers as the A operand
of P V and, in f16, of the row sums ``P 1`` (an MMA against ones, ``hl.OnlineSoftmax``'s
``sums``: no shuffles in the loop). Key blocks every row of the tile sees run
unmasked (no bound, causal or page predicates); only the rest are masked. Output rows and
the LSE are scattered back through the same index tiles: rows of other sequences or past
``cu_seqlens_q[-1]`` are never written. The caches are ``[NB, BLOCK, KVH, D]`` views with
strides given as arguments (the HND layout is the permuted view). No layout is written anywhere.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

from .tiles import (
    NEG_INF,
    copy_cache_pages,
    copy_cache_rows,
    mask_paged,
    mma_sums,
    paged_tile,
    scalar_rows,
    sink_rows,
    store_paged,
)

__all__ = ["paged_attention_kernel", "paged_attention_combine_kernel"]

TQ, H, D, NB, BS, KVH, B1, B, MAXB, SP, NS, NSC = hl.dims("TQ H D NB BS KVH B1 B MAXB SP NS NSC")
SQT, SQH, SKB, SKS, SKC, SVB, SVS, SVC, SBT = hl.dims("SQT SQH SKB SKS SKC SVB SVS SVC SBT")


@cache
def paged_attention_kernel(dtype: DType, split: bool = False, cache_dtype: DType | None = None,
                           whole: tuple[int, int] | None = None) -> Any:
    """The paged attention kernel for ``dtype`` (f16 / bf16). Constants: ``BM`` rows and ``BN``
    keys per step, ``HEAD_DIM`` (the head size padded to 64 / 128 / 256), ``BLOCK`` (the
    caches' block size), ``CAUSAL``, ``WINDOW`` (a left or right bound is given), ``SOFTCAP``,
    ``SPLITS``, ``SINKS`` (``sinks[h]``, f32 per query head, joins row ``h``'s softmax
    denominator: ``hl.OnlineSoftmax``'s sink; else ``sinks`` is not read), ``CHUNK`` /
    ``DCHUNK`` (0: all of ``BN`` / ``HEAD_DIM``: S per sub-block of ``CHUNK`` keys summed over
    ``DCHUNK`` columns of Q and K, Q read from shared memory per column chunk when ``DCHUNK <
    HEAD_DIM``: the registers a warp holds), ``SUMS`` (the softmax row sums: -1 as
    ``mma_sums(dtype)``, 1 by an MMA of P in ``dtype`` against ones, 0 f32 sums of P by
    reduction). ``split``: split-KV:
    split ``sp`` of ``SPLITS`` takes its share of the key blocks and writes its normalized
    partial output and LSE (f32) to ``o[sp]`` / ``lse[sp]`` (``[SPLITS, TQ, H, D]``, ``[SPLITS,
    H, TQ]``), merged by ``paged_attention_combine_kernel``. ``cache_dtype`` (e4m3 / e5m2): FP8
    caches holding ``k / k_scale[0]``, ``v / v_scale[0]``: rows converted to ``dtype`` on their
    way to shared memory (exact), ``k_scale`` folded into the scores' scale, ``v_scale`` into
    the output; else the scales are not read. ``whole = (block_size, head_size)`` (the caches'
    block size, ``BLOCK``, and a head size equal to ``HEAD_DIM``, known when the kernel is made:
    static modes of q, the caches and o): a key block whose keys all lie below ``Sk`` reads its
    pages as plain windows (no row past a page, no column past the head: no padding to zero);
    else (None, and always with ``cache_dtype``) every block gathers its rows."""
    dt = dtype
    cdt = cache_dtype or dtype
    BSC, DC = whole or (BS, D)                                 # static block and head sizes
    o_t = f32[SP, TQ, H, DC] if split else dt[TQ, H, DC]  # type: ignore
    lse_t = f32[SP, H, TQ] if split else f32[H, TQ]

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"paged_attention_{dt}")
    def paged_attention(q: dt[TQ, H, DC].strides(SQT, SQH, 1),  # type: ignore
                        k_cache: cdt[NB, BSC, KVH, DC].strides(SKB, SKS, SKC, 1),  # type: ignore
                        v_cache: cdt[NB, BSC, KVH, DC].strides(SVB, SVS, SVC, 1),  # type: ignore
                        cu_seqlens_q: i32[B1], seqused_k: i32[B], block_table: i32[B, MAXB].strides(SBT, 1),
                        o: o_t, lse: lse_t, sinks: f32[NS], k_scale: f32[NSC], v_scale: f32[NSC],  # type: ignore
                        G: i32, qk_scale: f32, cap: f32, left: i32, right: i32,
                        SQT: i32, SQH: i32, SKB: i32, SKS: i32, SKC: i32,
                        SVB: i32, SVS: i32, SVC: i32, SBT: i32,
                        *, BM: int = 64, BN: int = 32, HEAD_DIM: int = 128, BLOCK: int = 16, WARPS: int = 4,
                        CAUSAL: bool = True, WINDOW: bool = False, SOFTCAP: bool = False, TILES: int = 1,
                        SPLITS: int = 1, SINKS: bool = False, CHUNK: int = 0, DCHUNK: int = 0,
                        SUMS: int = -1):
        s, kvh, pid = hl.grid(hl.spatial(seqused_k.shape[0], k_cache.shape[2], TILES * SPLITS))
        mt, sp = (pid, 0) if SPLITS == 1 else (pid % TILES, pid // TILES)
        t = paged_tile(cu_seqlens_q, seqused_k, s, kvh, mt, G, BM=BM, CAUSAL=CAUSAL)   # the block's rows
        _, _, n, m0, tok, head, shift, n_end = t

        sq = hl.shared(dt, (BM, HEAD_DIM))
        sk = hl.shared(dt, (BN, HEAD_DIM))
        sv = hl.shared(dt, (BN, HEAD_DIM))
        hl.copy(q[tok, head, 0:HEAD_DIM], sq)                  # gathered (token, head) rows
        hl.commit_group()
        heads = hl.iota((BM, 1), 0) % G + kvh * G
        sm = hl.OnlineSoftmax(BM, sink_rows(sinks, heads, BM=BM, sp=sp) if SINKS else None,
                              sums=mma_sums(dt) if SUMS < 0 else dt if SUMS else None,
                              keys=min(CHUNK or BN, BN))
        acc = hl.zeros((BM, HEAD_DIM), f32)
        hl.wait_group(0)
        hl.syncthreads()
        chunk = min(CHUNK or BN, BN)
        dchunk = min(DCHUNK or HEAD_DIM, HEAD_DIM)
        if dchunk == HEAD_DIM:
            rq_full = hl.register(dt, (BM, HEAD_DIM))
            hl.copy(sq, rq_full)
        # FP8 caches: the scores' scale times k_scale, the output times v_scale (rows x 1 tiles)
        qks = qk_scale if cache_dtype is None else scalar_rows(k_scale, BM=BM) * qk_scale
        qi = hl.iota((BM, chunk), 0) + m0
        qpos = qi // G + shift                                 # the key aligned with each row

        nblk = hl.cdiv(n_end, BN)
        per = hl.cdiv(nblk, SPLITS)                            # key blocks per split
        lo, hi = (0, nblk) if SPLITS == 1 else (sp * per, hl.minimum(nblk, sp * per + per))
        # loop split: blocks whose keys every row of the tile sees (all below n, and with CAUSAL
        # at or left of the first row's diagonal, key m0 // G + shift) run unmasked; the rest
        # (the partial last block, the blocks crossing the diagonal, every block of a window)
        # masked
        if WINDOW:
            n_full = lo
        elif CAUSAL:
            n_full = hl.maximum(hl.minimum(n, m0 // G + shift + 1), 0) // BN
        else:
            n_full = n // BN
        mid = hl.maximum(lo, hl.minimum(hi, n_full))

        def step(j: Any, masked: bool) -> None:
            """Key block ``j``: gather K and V, S = Q K^T, the online softmax in the log2
            domain (the scale, > 0, applied to the row max once and inside each exp2 argument:
            ``s * qk_scale - m``, an FMA), O += P V."""
            nonlocal acc
            if masked or whole is None or cache_dtype is not None:
                pos = hl.iota((BN,), 0) + j * BN               # key positions of this step
                page = hl.register(i32, (BN,))
                hl.copy(block_table[s, pos // BLOCK], page)
                if masked:
                    page = hl.where(pos < n, page, -1)         # past the end: no row, no read
                row = pos % BLOCK
                for cache_, dst in ((k_cache, sk), (v_cache, sv)):
                    copy_cache_rows(cache_, page, row, kvh, dst, rows=BN, HEAD_DIM=HEAD_DIM, dt=dt,
                                    fp8=cache_dtype)
            else:                                              # every key below n: whole pages
                copy_cache_pages(k_cache, v_cache, sk, sv, block_table, s, j, kvh, BN=BN, BLOCK=BLOCK,
                                 HEAD_DIM=HEAD_DIM)
            hl.commit_group()
            hl.wait_group(0)
            hl.syncthreads()

            scores = []
            for c in range(BN // chunk):                       # S per sub-block of chunk keys
                sc = hl.zeros((BM, chunk), f32)
                for d in range(HEAD_DIM // dchunk):            # summed over dchunk columns
                    if dchunk < HEAD_DIM:
                        rq = hl.register(dt, (BM, dchunk))
                        hl.copy(sq[:, d * dchunk:(d + 1) * dchunk], rq)
                    else:
                        rq = rq_full
                    rk = hl.register(dt, (chunk, dchunk))
                    hl.copy(sk[c * chunk:(c + 1) * chunk, d * dchunk:(d + 1) * dchunk], rk)
                    hl.mma(rq, rk, sc)
                if SOFTCAP:
                    sc = hl.tanh(sc * qks) * cap               # already in the log2 domain
                if masked:
                    sc = mask_paged(sc, j, t, qpos, left, right, BM=BM, BN=chunk, CAUSAL=CAUSAL,
                                    WINDOW=WINDOW, key0=j * BN + c * chunk)
                scores.append(sc)

            def pv(c: int, p: Any) -> None:                    # acc += P_c V_c
                rv = hl.register(dt, (HEAD_DIM, chunk))
                hl.copy(sv[c * chunk:(c + 1) * chunk, :].T, rv)
                hl.mma(hl.cast(p, dt), rv, acc)

            # rows with no visible key yet only where keys are masked (else every row sees BN)
            sm.step_chunks(scores, acc, pv, None if SOFTCAP else qks, masked=masked)
            hl.syncthreads()                                   # before the next step overwrites sk, sv

        for j in hl.range(lo, mid):
            step(j, False)
        for j in hl.range(mid, hi):
            step(j, True)

        vs = None if cache_dtype is None else scalar_rows(v_scale, BM=BM)
        store_paged(sm, acc, o, lse, t, kvh, G, sp, split=split, dt=dt, BM=BM, HEAD_DIM=HEAD_DIM, v_scale=vs)

    return paged_attention


@cache
def paged_attention_combine_kernel(dtype: DType) -> Any:
    """Split-KV's merge: ``lse = log sum_sp exp(lse[sp])`` and ``o = sum_sp exp(lse[sp] - lse)
    o[sp]`` per (token, head), written in ``dtype`` for tokens below ``cu_seqlens_q[-1]`` only (a
    row no split saw a key for: 0, -inf). Constants: ``ROWS`` tokens per block, ``HEAD_DIM``,
    ``SPLITS``."""
    dt = dtype

    @hl.kernel(threads=128, name=f"paged_attention_combine_{dt}")
    def paged_attention_combine(o_part: f32[SP, TQ, H, D], lse_part: f32[SP, H, TQ], cu_seqlens_q: i32[B1],
                                o: dt[TQ, H, D], lse: f32[H, TQ],  # type: ignore
                                *, ROWS: int = 16, HEAD_DIM: int = 128, SPLITS: int = 2):
        tb, h = hl.grid(hl.spatial(hl.cdiv(o.shape[0], ROWS), o.shape[1]))
        total = cu_seqlens_q[cu_seqlens_q.shape[0] - 1]        # rows past it are not written
        t = hl.iota((ROWS,), 0) + tb * ROWS
        tok = hl.where(t < total, t, -1)
        t2 = hl.iota((ROWS, 1), 0) + tb * ROWS
        tok2 = hl.where(t2 < total, t2, -1)
        parts = []
        m = hl.full((ROWS, 1), NEG_INF, f32)
        for sp in range(SPLITS):
            ls = hl.register(f32, (ROWS, 1))
            hl.copy(lse_part[sp, h, tok2], ls)
            m = hl.maximum(m, ls)
            parts.append(ls)
        m_use = hl.where(m.eq(NEG_INF), 0.0, m)
        acc = hl.zeros((ROWS, HEAD_DIM), f32)
        tot = hl.zeros((ROWS, 1), f32)
        for sp in range(SPLITS):
            w = hl.exp(parts[sp] - m_use)
            tot += w
            x = hl.register(f32, (ROWS, HEAD_DIM))
            hl.copy(o_part[sp, tok, h, 0:HEAD_DIM], x)
            acc += x * w
        t_safe = hl.where(tot.eq(0.0), 1.0, tot)
        hl.copy(hl.cast(acc / t_safe, dt), o[tok, h, 0:HEAD_DIM])
        hl.copy(m_use + hl.log(tot), lse[h, tok2])

    return paged_attention_combine
