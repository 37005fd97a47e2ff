"""Attention kernels for sm_90a (wgmma) in the tile language, layout-free
(``hexlayout.ops.attention`` dispatches to them on sm_90a).

``paged_attention_sm90_kernel(dtype, split)`` has the semantics, arguments and constants of
``attention_kernels.paged_attention_kernel`` (same math: for sequence ``s`` and query head
``h = kvh * G + g``, ``o_i = sum_j softmax_j(s_ij) v_j`` over the visible keys with ``s_ij =
(q_i . k_j) * scale`` (softcap: ``c * tanh(s_ij / c)``), bottom-right causal / window masks,
``lse_i = log sum_j exp(s_ij)``; split-KV partials for ``paged_attention_combine_kernel``);
only the machine code differs:

- one or two consumer warp groups (``WG``; ``BM = 64 * WG`` rows of (token, query head of the
  group), each warp group owning 64 rows);
- ``S = Q K^T`` is one wgmma group reading Q and K from shared memory; ``O += P V`` a wgmma
  group whose A operand is P in registers (the f32 scores of the first product, exponentiated
  and cast in place) and whose B operand is the V tile in shared memory, read transposed
  (MN-major);
- K and V pages are gathered through the block table with cp.async into two shared buffers:
  block ``j + 1`` loads while block ``j`` is used. cp.async writes through the generic
  proxy and wgmma reads through the async proxy, so every thread fences its landed copies
  (``hl.fence_proxy_async``) before the barrier that precedes the wgmma;
- the online softmax runs in the log2 domain (``qk_scale = scale * log2(e)``, or ``scale / c``
  and ``cap = c * log2(e)`` with a softcap), with masks only in the key blocks that need them:
  without a window, the blocks below ``n_full`` are visible to every row of the tile.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

from .attention_kernels import LN2, NEG_INF

__all__ = ["paged_attention_sm90_kernel"]

TQ, H, D, NB, BS, KVH, B1, B, MAXB, SP = hl.dims("TQ H D NB BS KVH B1 B MAXB SP")
SQT, SQH, SKB, SKS, SKC, SVB, SVS, SVC, SBT = hl.dims("SQT SQH SKB SKS SKC SVB SVS SVC SBT")


@cache
def paged_attention_sm90_kernel(dtype: DType, split: bool = False) -> Any:
    """The sm_90a paged attention kernel for ``dtype`` (f16 / bf16); ``split``: split-KV partial
    outputs (see the module docstring and ``attention_kernels.paged_attention_kernel``).
    Constants: ``BM`` (= 64 * ``WG``), ``BN``, ``HEAD_DIM``, ``BLOCK``, ``WG``, ``CAUSAL``,
    ``WINDOW``, ``SOFTCAP``, ``TILES``, ``SPLITS``."""
    dt = dtype
    o_t = f32[SP, TQ, H, D] if split else dt[TQ, H, D]  # type: ignore
    lse_t = f32[SP, H, TQ] if split else f32[H, TQ]

    @hl.kernel(threads=lambda c: 128 * c["WG"], name=f"paged_attention_sm90_{dt}")
    def paged_attention_sm90(q: dt[TQ, H, D].strides(SQT, SQH, 1),  # type: ignore
                             k_cache: dt[NB, BS, KVH, D].strides(SKB, SKS, SKC, 1),  # type: ignore
                             v_cache: dt[NB, BS, KVH, D].strides(SVB, SVS, SVC, 1),  # type: ignore
                             cu_seqlens_q: i32[B1], seqused_k: i32[B],
                             block_table: i32[B, MAXB].strides(SBT, 1),
                             o: o_t, lse: lse_t,  # type: ignore
                             G: i32, qk_scale: f32, cap: f32, left: i32, right: i32,
                             SQT: i32, SQH: i32, SKB: i32, SKS: i32, SKC: i32,
                             SVB: i32, SVS: i32, SVC: i32, SBT: i32,
                             *, BM: int = 64, BN: int = 64, HEAD_DIM: int = 128, BLOCK: int = 16, WG: int = 1,
                             CAUSAL: bool = True, WINDOW: bool = False, SOFTCAP: bool = False, TILES: int = 1,
                             SPLITS: int = 1):
        s, kvh, pid = hl.grid(hl.spatial(seqused_k.shape[0], k_cache.shape[2], TILES * SPLITS))
        mt, sp = (pid, 0) if SPLITS == 1 else (pid % TILES, pid // TILES)
        q0 = cu_seqlens_q[s]
        sq_len = cu_seqlens_q[s + 1] - q0
        n = seqused_k[s]
        m0 = mt * BM
        r = hl.iota((BM,), 0) + m0                             # this block's rows
        tok = hl.where(r < sq_len * G, r // G + q0, -1)        # past the sequence: no row
        head = r % G + kvh * G
        shift = n - sq_len                                     # bottom-right alignment
        n_end = hl.minimum(n, (m0 + BM - 1) // G + shift + 1) if CAUSAL else n
        nblk = hl.cdiv(n_end, BN)
        per = hl.cdiv(nblk, SPLITS)                            # key blocks per split
        lo, hi = (0, nblk) if SPLITS == 1 else (sp * per, hl.minimum(nblk, sp * per + per))
        if WINDOW:
            n_full = lo                                        # every block masked (no unmasked loop)
        elif CAUSAL:                                           # keys every row sees: j <= m0 // G + shift
            n_full = hl.maximum(lo, hl.minimum(hi, hl.minimum(n, m0 // G + shift + 1) // BN))
        else:
            n_full = hl.maximum(lo, hl.minimum(hi, n // BN))
        lim = hl.minimum(n, hi * BN)                           # keys this split loads

        sq = hl.shared(dt, (BM, HEAD_DIM))
        sk = hl.shared(dt, (BN, HEAD_DIM, 2))
        sv = hl.shared(dt, (BN, HEAD_DIM, 2))

        def load(j: Any, buf: Any) -> None:                    # key block j into buffer buf
            pos = hl.iota((BN,), 0) + j * BN
            page = hl.register(i32, (BN,))
            hl.copy(block_table[s, pos // BLOCK], page)
            page = hl.where(pos < lim, page, -1)               # past the end: no row, no read
            hl.copy(k_cache[page, pos % BLOCK, kvh, 0:HEAD_DIM], sk[:, :, buf])
            hl.copy(v_cache[page, pos % BLOCK, kvh, 0:HEAD_DIM], sv[:, :, buf])

        hl.copy(q[tok, head, 0:HEAD_DIM], sq)                  # gathered (token, head) rows
        load(lo, lo % 2)
        hl.commit_group()
        m_i = hl.full((BM, 1), NEG_INF, f32)
        l_i = hl.zeros((BM, 1), f32)
        acc = hl.zeros((BM, HEAD_DIM), f32)
        qpos = (hl.iota((BM, BN), 0) + m0) // G + shift        # the key aligned with each row
        for masked in (True,) if WINDOW else (False, True):
            for j in (hl.range(n_full, hi) if masked else hl.range(lo, n_full)):
                buf = j % 2
                hl.wait_group(0)                               # block j landed (this thread's part)
                hl.fence_proxy_async()                         # ... and is visible to wgmma
                hl.syncthreads()                               # everyone's part; buf ^ 1 is free
                load(j + 1, 1 - buf)
                hl.commit_group()

                sc = hl.zeros((BM, BN), f32)
                hl.wgmma_fence()
                hl.mma(sq, sk[:, :, buf], sc)
                hl.wgmma_commit()
                hl.wgmma_wait(0)
                if SOFTCAP:
                    sc = hl.tanh(sc * qk_scale) * cap
                else:
                    sc *= qk_scale
                if masked:
                    kj = hl.iota((BM, BN), 1) + j * BN
                    valid = kj < n
                    if CAUSAL:
                        valid = valid & (kj <= qpos)
                    if WINDOW:
                        valid = valid & (kj >= qpos - left) & (kj <= qpos + right)
                    sc = hl.where(valid, sc, NEG_INF)
                m_new = hl.maximum(m_i, hl.max_reduce(sc, 1))
                m_use = hl.where(m_new.eq(NEG_INF), 0.0, m_new)
                p = hl.exp2(sc - m_use)
                alpha = hl.exp2(m_i - m_use)
                hl.assign(l_i, l_i * alpha + hl.sum(p, 1))
                acc *= alpha
                hl.assign(m_i, m_new)
                hl.wgmma_fence()
                hl.mma(hl.cast(p, dt), sv[:, :, buf].T, acc)   # P from registers, V^T from shared
                hl.wgmma_commit()
                hl.wgmma_wait(0)
        hl.wait_group(0)

        l_safe = hl.where(l_i.eq(0.0), 1.0, l_i)
        r2 = hl.iota((BM, 1), 0) + m0                          # the rows again, as a column
        tok2 = hl.where(r2 < sq_len * G, r2 // G + q0, -1)
        head2 = r2 % G + kvh * G
        if split:
            hl.copy(acc / l_safe, o[sp, tok, head, 0:HEAD_DIM])
            hl.copy((m_i + hl.log2(l_i)) * LN2, lse[sp, head2, tok2])
        else:
            hl.copy(hl.cast(acc / l_safe, dt), o[tok, head, 0:HEAD_DIM])
            hl.copy((m_i + hl.log2(l_i)) * LN2, lse[head2, tok2])

    return paged_attention_sm90
