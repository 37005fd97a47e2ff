"""FlashAttention-2-style forward: ``o = softmax(q k^T * scale [+ causal mask]) v`` per head.

Layouts ``[batch, seq, heads, head_dim]``; grouped-query attention: query head ``h``
reads kv head ``h // (H // KVH)``. Each block owns ``BM`` query rows of one (batch,
head); it streams ``BN``-row blocks of k and v through two shared buffers (cp.async,
the next block loads while this one is used), computes ``S = Q K^T`` with mma, keeps the
online-softmax row max ``m_i`` and sum ``l_i`` in registers, and accumulates ``P V``
where ``P`` (cast to f16) is the A operand and ``V^T`` (a transposed view of the shared v
tile) the B operand. ``HEAD_DIM`` is the padded head size: views clamp to the real ``D``.
Causal masking is bottom-right aligned (query ``i`` sees keys ``j <= i + Sk - Sq``); rows
with no visible key produce zeros.

Softmax in the log2 domain: ``qk_scale = sm_scale * log2(e)`` (given by the host, > 0) is
applied to the row max of the unscaled scores once and to each score inside the
exponential's argument, ``2**(s * qk_scale - m)`` (one FMA), and the exponentials are
``hl.exp2_approx`` (PTX ``ex2.approx.ftz.f32``: one MUFU.EX2; weights below 2**-126 flush
to 0, as in Triton and FlashAttention). The key loop is split: the blocks whose keys every
row of the query block sees (``n_full``: all but a partial last block; with ``CAUSAL``
also before the diagonal) run without a per-element mask; the rest compare and select.

``CHUNK`` / ``DCHUNK`` (0 = the whole block; clamped to ``BN`` / ``HEAD_DIM``) bound what
a warp holds in registers: S is computed per sub-block of ``CHUNK`` keys (the row max is
still the whole block's; P V is accumulated per sub-block), summed over ``DCHUNK``
columns of the head dimension, with q read from shared memory per column chunk when
``DCHUNK < HEAD_DIM`` instead of kept in registers. The defaults (BM=128, BN=64,
CHUNK=32, DCHUNK=64, HEAD_DIM=128, 8 warps) compile for sm_80 without spills (255
registers) at 3.11 non-MMA instructions per HMMA in the main loop (issue 10 item 4;
``benchmarks/results/static*.md``); sm_89 and sm_90a compile them without spills too.
"""

from __future__ import annotations

import hexlayout.lang as hl
from hexlayout.lang import f16, f32

B, Sq, Sk, H, KVH, D = hl.dims("B Sq Sk H KVH D")

NEG_INF = float("-inf")


@hl.kernel(threads=lambda c: 32 * c["WARPS"])
def flash_attention_fwd(q: f16[B, Sq, H, D], k: f16[B, Sk, KVH, D],
                        v: f16[B, Sk, KVH, D], o: f16[B, Sq, H, D], qk_scale: f32, *,
                        BM: int = 128, BN: int = 64, HEAD_DIM: int = 128, CAUSAL: bool = False,
                        WARPS: int = 8, CHUNK: int = 32, DCHUNK: int = 64):
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    KVH = k.shape[2]
    pid_b, pid_h, pid_m = hl.grid(hl.spatial(B, H, hl.cdiv(Sq, BM)))
    kvh = pid_h // (H // KVH)
    m0 = pid_m * BM

    # key blocks this query block needs
    if CAUSAL:
        n_end = hl.minimum(Sk, m0 + BM + (Sk - Sq))
    else:
        n_end = Sk
    num_kv = hl.cdiv(n_end, BN)

    sq = hl.shared(f16, (BM, HEAD_DIM))
    sk = hl.shared(f16, (BN, HEAD_DIM, 2))
    sv = hl.shared(f16, (BN, HEAD_DIM, 2))

    hl.copy(q.tile((1, BM, 1, HEAD_DIM), (pid_b, m0, pid_h, 0))[0, :, 0, :], sq)
    hl.commit_group()
    hl.copy(k.tile((1, BN, 1, HEAD_DIM), (pid_b, 0, kvh, 0))[0, :, 0, :], sk[:, :, 0])
    hl.copy(v.tile((1, BN, 1, HEAD_DIM), (pid_b, 0, kvh, 0))[0, :, 0, :], sv[:, :, 0])
    hl.commit_group()

    sm = hl.OnlineSoftmax(BM)     # the row max m and row sum l of the streamed softmax
    acc = hl.zeros((BM, HEAD_DIM), f32)
    chunk = min(CHUNK or BN, BN)
    dchunk = min(DCHUNK or HEAD_DIM, HEAD_DIM)
    hl.wait_group(1)  # Q has landed (k/v block 0 may still be in flight)
    hl.syncthreads()
    if dchunk == HEAD_DIM:
        rq_full = hl.register(f16, (BM, HEAD_DIM))
        hl.copy(sq, rq_full)

    # loop split: blocks whose keys every row of this query block sees run unmasked; the
    # rest (the partial last block, and with CAUSAL the blocks crossing the diagonal) masked
    if CAUSAL:
        n_full = hl.minimum(Sk // BN, hl.maximum(m0 + (Sk - Sq) + 1, 0) // BN)
    else:
        n_full = Sk // BN
    for masked in (False, True):
        for j in (hl.range(n_full, num_kv) if masked else hl.range(n_full)):
            # key block j: prefetch the next, S = Q K^T, online softmax, O += P V
            buf = j % 2
            nxt = (j + 1) % 2
            # block j has landed; every warp is done with the buffer the prefetch overwrites
            hl.wait_group(0)
            hl.syncthreads()
            n1 = (j + 1) * BN
            hl.copy(k.tile((1, BN, 1, HEAD_DIM), (pid_b, n1, kvh, 0))[0, :, 0, :], sk[:, :, nxt])
            hl.copy(v.tile((1, BN, 1, HEAD_DIM), (pid_b, n1, kvh, 0))[0, :, 0, :], sv[:, :, nxt])
            hl.commit_group()

            # S = Q K^T (unscaled) per sub-block of `chunk` keys, summed over `dchunk` columns of
            # the head dimension (q from shared memory when dchunk < HEAD_DIM); masked (-inf) only
            # in the blocks that hold invisible keys
            scores = []
            for c in range(BN // chunk):
                s = hl.zeros((BM, chunk), f32)
                for d in range(HEAD_DIM // dchunk):
                    if dchunk < HEAD_DIM:
                        rq = hl.register(f16, (BM, dchunk))
                        hl.copy(sq[:, d * dchunk:(d + 1) * dchunk], rq)
                    else:
                        rq = rq_full
                    rk = hl.register(f16, (chunk, dchunk))
                    hl.copy(sk[c * chunk:(c + 1) * chunk, d * dchunk:(d + 1) * dchunk, buf], rk)
                    hl.mma(rq, rk, s)
                if masked:
                    cols = hl.iota((BM, chunk), 1) + (j * BN + c * chunk)
                    valid = cols < Sk
                    if CAUSAL:
                        rows = hl.iota((BM, chunk), 0) + (m0 + (Sk - Sq))
                        valid = valid & (cols <= rows)
                    s = hl.where(valid, s, NEG_INF)
                scores.append(s)

            # online softmax over the whole key block, in the log2 domain: the scale (> 0) applied
            # to the row max once and to each score inside the exp2 argument (s * qk_scale - m: an FMA)
            def pv(c, p, buf=buf):
                # O += P V: P is the A operand (BM x chunk), V^T the B operand (HEAD_DIM x chunk)
                rv = hl.register(f16, (HEAD_DIM, chunk))
                hl.copy(sv[c * chunk:(c + 1) * chunk, :, buf].T, rv)
                hl.mma(hl.cast(p, f16), rv, acc)

            sm.step_chunks(scores, acc, pv, qk_scale)

    hl.wait_group(0)
    out = hl.cast(sm.out(acc), f16)
    hl.copy(out, o.tile((1, BM, 1, HEAD_DIM), (pid_b, m0, pid_h, 0))[0, :, 0, :])
