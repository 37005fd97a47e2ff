"""Paged decode attention with grouped-query heads: K/V rows gathered through a block table.

``o[s, h, g] = softmax(q[s, h, g] . K_s^T * scale) V_s`` for sequence ``s``, KV head ``h`` and
its ``G`` query heads ``g`` (GQA: the ``H = KVH * G`` query heads of a token, viewed as
``[B, KVH, G, D]``). Sequence ``s`` has ``seq_lens[s]`` keys (read from memory: the loop
bound); key ``j`` lives in the KV cache (vLLM's NHD layout ``[num_blocks, block_size, KVH,
D]``) at block ``block_table[s, j // block_size]``, row ``j % block_size``. Block table
entries past a sequence's last block are never read (the index is masked to -1, which
reads nothing).

Each thread block owns one (sequence, KV head): its ``G`` query rows (padded to the 16 rows
of an mma; the view's extent zero-fills the rest and skips them on the store) against
``BN`` keys per step: the key positions are an index tile (``hl.iota``), their blocks a
gather of the block table through it, and K and V rows a gather of the caches through the
computed (block, row) pair, copied with cp.async. The online softmax is FlashAttention's
(``exp2``, ``qk_scale = scale * log2(e)``). With 16 query rows the warps split the keys of
``S = Q K^T`` and the head dimension of ``O += P V``, so P goes from the first mma's
accumulators to the second's A operand through shared memory (stmatrix on sm_90a). The
defaults (4 warps, 64 keys per step) compile to 128 registers without spills for sm_80
and sm_90a. No layout is written anywhere; ``BLOCK`` is the cache's block size.
"""

from __future__ import annotations

import hexlayout.lang as hl
from hexlayout.lang import f16, f32, i32

B, NB, BS, KVH, G, D, MAXB = hl.dims("B NB BS KVH G D MAXB")

NEG_INF = float("-inf")


@hl.kernel(threads=lambda c: 32 * c["WARPS"])
def paged_decode(q: f16[B, KVH, G, D], k_cache: f16[NB, BS, KVH, D], v_cache: f16[NB, BS, KVH, D],
                 block_table: i32[B, MAXB], seq_lens: i32[B], o: f16[B, KVH, G, D], qk_scale: f32, *,
                 BN: int = 64, HEAD_DIM: int = 128, BLOCK: int = 16, ROWS: int = 16, WARPS: int = 4):
    s, kvh = hl.grid(hl.spatial(q.shape[0], q.shape[1]))
    n = seq_lens[s]                                          # this sequence's length, from memory
    sq = hl.shared(f16, (ROWS, HEAD_DIM))
    sk = hl.shared(f16, (BN, HEAD_DIM))
    sv = hl.shared(f16, (BN, HEAD_DIM))
    hl.copy(q.tile((1, 1, ROWS, HEAD_DIM), (s, kvh, 0, 0))[0, 0, :, :], sq)    # the G query heads
    hl.commit_group()
    m_i = hl.full((ROWS, 1), NEG_INF, f32)
    l_i = hl.zeros((ROWS, 1), f32)
    acc = hl.zeros((ROWS, HEAD_DIM), f32)
    rq = hl.register(f16, (ROWS, HEAD_DIM))
    hl.wait_group(0)
    hl.syncthreads()
    hl.copy(sq, rq)

    for j in hl.range(hl.cdiv(n, BN)):
        pos = hl.iota((BN,), 0) + j * BN                      # key positions of this step
        page = hl.register(i32, (BN,))
        hl.copy(block_table[s, pos // BLOCK], page)          # their KV-cache blocks
        page = hl.where(pos < n, page, -1)                    # past the end: no row
        row = pos % BLOCK
        hl.copy(k_cache[page, row, kvh, 0:HEAD_DIM], sk)      # gathered rows, cp.async
        hl.copy(v_cache[page, row, kvh, 0:HEAD_DIM], sv)
        hl.commit_group()
        hl.wait_group(0)
        hl.syncthreads()

        rk = hl.register(f16, (BN, HEAD_DIM))
        hl.copy(sk, rk)
        sc = hl.zeros((ROWS, BN), f32)
        hl.mma(rq, rk, sc)
        sc *= qk_scale
        sc = hl.where(hl.iota((ROWS, BN), 1) + j * BN < n, sc, NEG_INF)
        m_new = hl.maximum(m_i, hl.max_reduce(sc, 1))
        m_use = hl.where(m_new.eq(NEG_INF), 0.0, m_new)
        p = hl.exp2(sc - m_use)
        alpha = hl.exp2(m_i - m_use)
        hl.assign(l_i, l_i * alpha + hl.sum(p, 1))
        acc *= alpha
        hl.assign(m_i, m_new)
        rv = hl.register(f16, (HEAD_DIM, BN))
        hl.copy(sv.T, rv)
        sp = hl.shared(f16, (ROWS, BN))                       # P changes hands between warps
        hl.copy(hl.cast(p, f16), sp)
        hl.syncthreads()
        rp = hl.register(f16, (ROWS, BN))
        hl.copy(sp, rp)
        hl.mma(rp, rv, acc)
        hl.syncthreads()                                      # before the next step overwrites sk, sv

    l_safe = hl.where(l_i.eq(0.0), 1.0, l_i)
    hl.copy(hl.cast(acc / l_safe, f16), o.tile((1, 1, ROWS, HEAD_DIM), (s, kvh, 0, 0))[0, 0, :, :])
