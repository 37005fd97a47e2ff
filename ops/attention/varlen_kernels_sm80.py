"""The varlen (prefill) attention kernel in the tile language, layout-free
(``hexlayout.ops.attention_varlen``).

``attention_varlen_kernel(dtype)`` computes, for sequence ``s`` (queries ``cu_seqlens_q[s] ..
cu_seqlens_q[s+1]``, ``Sq`` of them; keys and values ``cu_seqlens_k[s] .. cu_seqlens_k[s+1]``,
``Sk`` of them) and query head ``h`` (KV head ``h // (H / KVH)``)::

    s_ij = (q_i . k_j) * scale                  (softcap c > 0: c * tanh(s_ij / c))
    visible(i, j) = j < Sk  [and j >= i + Sk - Sq - left] [and j <= i + Sk - Sq + right]
    o_i = sum_j softmax_j(s_ij over visible j) v_j      (0 when no key is visible)
    lse_i = log(sum_j exp(s_ij) over visible j)         (-inf when none)

Causal masking is the bound ``right = 0`` (bottom-right aligned), intersected with a window's
(the host passes ``min(right, 0)``); each bound is compiled in only when given (``LEFT``,
``RIGHT``). One thread block owns
one (sequence, query head, tile of ``BM`` query rows); the grid's tile count comes from
``max_seqlen_q`` (no tensor contents), and a tile past its sequence's queries runs no key
step and writes nothing. Q rows, K/V rows and output rows are gathered / scattered through
index tiles (-1 past the sequence: never read, never written), so rows of other sequences and
rows past ``cu_seqlens_q[-1]`` are never touched. K/V blocks of ``BN`` keys are double
buffered (cp.async: block ``j + 1`` loads while block ``j`` is used; inside an unmasked run,
whose blocks are whole, as a plain window of rows: one address add per row, no gather
predicates; the run's last block is peeled and gathers the next); only the key blocks some
row of the tile sees are visited (causal and windowed tiles skip the rest), and only the
blocks with an invisible key compare and select (the loop is split in masked / unmasked
segments). Softmax in the log2 domain (FlashAttention-2's online form): ``qk_scale = scale *
log2(e)`` is applied to the row max once and inside the exponential's argument (an FMA;
with a softcap ``qk_scale = scale / c`` and ``cap = c * log2(e)``); ``hl.exp2_approx`` (one
MUFU.EX2). ``CHUNK`` / ``DCHUNK`` bound what a warp holds in registers: S per sub-block of
``CHUNK`` keys, summed over ``DCHUNK`` columns of q and k (q read from shared memory per
column chunk when ``DCHUNK < HEAD_DIM``); P (cast to the input dtype) stays in registers as
the A operand of P V and, in f16, of the row sums ``P 1`` (an MMA against ones,
``hl.OnlineSoftmax``'s ``sums``: no shuffles for them), V streamed from shared memory per
``CHUNK`` keys. No layout is written
anywhere.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

from .tiles import mask_window, mma_sums, sink_rows, varlen_key_blocks, varlen_tile

__all__ = ["attention_varlen_kernel"]

TQ, TK, H, KVH, D, B1, NS = hl.dims("TQ TK H KVH D B1 NS")
SQT, SQH, SKT, SKH, SVT, SVH = hl.dims("SQT SQH SKT SKH SVT SVH")


@cache
def attention_varlen_kernel(dtype: DType) -> Any:
    """The varlen attention kernel for ``dtype`` (f16 / bf16). Constants: ``BM`` query rows
    and ``BN`` keys per step on ``WARPS`` warps, ``HEAD_DIM`` (the head size padded to 64 / 128
    / 256), ``CHUNK`` / ``DCHUNK`` (register blocking, see the module docstring), ``LEFT`` /
    ``RIGHT`` (keys bounded below by ``left`` / above by ``right``: a window, causal),
    ``SOFTCAP``, ``SINKS`` (``sinks[h]``, f32 per query head, joins the softmax denominator:
    ``hl.OnlineSoftmax``'s sink; else ``sinks`` is not read). The argument ``tiles`` (query
    tiles per sequence, ``ceil(max_seqlen_q / BM)``)
    sizes the grid at launch: one build serves every ``max_seqlen_q``."""
    dt = dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"attention_varlen_{dt}")
    def attention_varlen(q: dt[TQ, H, D].strides(SQT, SQH, 1),  # type: ignore
                         k: dt[TK, KVH, D].strides(SKT, SKH, 1),  # type: ignore
                         v: dt[TK, KVH, D].strides(SVT, SVH, 1),  # type: ignore
                         cu_seqlens_q: i32[B1], cu_seqlens_k: i32[B1],
                         o: dt[TQ, H, D], lse: f32[H, TQ], sinks: f32[NS],  # type: ignore
                         qk_scale: f32, cap: f32, left: i32, right: i32, tiles: i32,
                         SQT: i32, SQH: i32, SKT: i32, SKH: i32, SVT: i32, SVH: i32,
                         *, BM: int = 128, BN: int = 64, HEAD_DIM: int = 128, WARPS: int = 8,
                         CHUNK: int = 32, DCHUNK: int = 64, LEFT: bool = False, RIGHT: bool = False,
                         SOFTCAP: bool = False, SINKS: bool = False):
        s, h, mt = hl.grid(hl.spatial(cu_seqlens_q.shape[0] - 1, q.shape[1], tiles))
        t = varlen_tile(q, k, cu_seqlens_q, cu_seqlens_k, s, h, mt, BM)     # the block's rows and keys
        kvh, q0, sq_len, k0, sk_len, m0, shift = t
        k_end, lo, _, segments = varlen_key_blocks(t, left, right, BM=BM, BN=BN, LEFT=LEFT, RIGHT=RIGHT)

        sq = hl.shared(dt, (BM, HEAD_DIM))
        sk = hl.shared(dt, (BN, HEAD_DIM, 2))
        sv = hl.shared(dt, (BN, HEAD_DIM, 2))
        r = hl.iota((BM,), 0) + m0
        tok = hl.where(r < sq_len, r + q0, -1)                 # past the sequence: no row
        hl.copy(q[tok, h, 0:HEAD_DIM], sq)
        hl.commit_group()
        pos = hl.iota((BN,), 0) + lo * BN
        krow = hl.where(pos < k_end, pos + k0, -1)
        hl.copy(k[krow, kvh, 0:HEAD_DIM], sk[:, :, lo % 2])
        hl.copy(v[krow, kvh, 0:HEAD_DIM], sv[:, :, lo % 2])
        hl.commit_group()

        chunk = min(CHUNK or BN, BN)
        # row sums of P by an MMA against ones (no shuffles in the loop)
        sm = hl.OnlineSoftmax(BM, sink_rows(sinks, h, BM=BM) if SINKS else None,
                              sums=mma_sums(dt), keys=chunk)
        acc = hl.zeros((BM, HEAD_DIM), f32)
        dchunk = min(DCHUNK or HEAD_DIM, HEAD_DIM)
        mult = 1.0 if SOFTCAP else qk_scale                    # softcapped scores are scaled
        hl.wait_group(1)                                       # Q has landed
        hl.syncthreads()
        if dchunk == HEAD_DIM:
            rq_full = hl.register(dt, (BM, HEAD_DIM))
            hl.copy(sq, rq_full)

        def prefetch(j1: Any, buf: Any, full: bool) -> None:
            """Start loading key block ``j1`` into buffer ``buf``: a plain window of rows ``k0 +
            j1 * BN ..`` when the block is known to be whole (``full``: every key below ``Sk``,
            the address one add per row), else gathered rows (-1 past ``k_end``: zeros)."""
            if full:
                r0 = k0 + j1 * BN
                hl.copy(k[r0:r0 + BN, kvh, 0:HEAD_DIM], sk[:, :, buf])
                hl.copy(v[r0:r0 + BN, kvh, 0:HEAD_DIM], sv[:, :, buf])
            else:
                pos = hl.iota((BN,), 0) + j1 * BN
                krow = hl.where(pos < k_end, pos + k0, -1)
                hl.copy(k[krow, kvh, 0:HEAD_DIM], sk[:, :, buf])
                hl.copy(v[krow, kvh, 0:HEAD_DIM], sv[:, :, buf])
            hl.commit_group()

        def step(j: Any, masked: bool, full_next: bool) -> None:
            """Key block ``j`` (block ``j + 1`` loading meanwhile): S, the mask where
            ``masked``, the online softmax, O += P V."""
            buf = j % 2
            hl.wait_group(0)                                   # block j has landed
            hl.syncthreads()                                   # and the other buffer is free
            prefetch(j + 1, 1 - buf, full_next)
            scores = []
            for c in range(BN // chunk):
                sc = hl.zeros((BM, chunk), f32)
                for d in range(HEAD_DIM // dchunk):
                    if dchunk < HEAD_DIM:
                        rq = hl.register(dt, (BM, dchunk))
                        hl.copy(sq[:, d * dchunk:(d + 1) * dchunk], rq)
                    else:
                        rq = rq_full
                    rk = hl.register(dt, (chunk, dchunk))
                    hl.copy(sk[c * chunk:(c + 1) * chunk, d * dchunk:(d + 1) * dchunk, buf], rk)
                    hl.mma(rq, rk, sc)
                if SOFTCAP:
                    sc = hl.tanh(sc * qk_scale) * cap
                if masked:
                    kj = hl.iota((BM, chunk), 1) + (j * BN + c * chunk)
                    valid = kj < sk_len
                    qpos = hl.iota((BM, chunk), 0) + (m0 + shift)   # each row's aligned key
                    sc = mask_window(sc, valid, kj, qpos, left, right, LEFT, RIGHT)
                scores.append(sc)

            def pv(c: int, p: Any) -> None:                    # acc += P_c V_c
                rv = hl.register(dt, (HEAD_DIM, chunk))
                hl.copy(sv[c * chunk:(c + 1) * chunk, :, buf].T, rv)
                hl.mma(hl.cast(p, dt), rv, acc)

            # a row may have no visible key yet only in a masked block (else it sees BN keys)
            sm.step_chunks(scores, acc, pv, mult, masked=masked)

        # an unmasked run's blocks are whole, so the next one, inside the run, loads as a plain
        # window; its last block (peeled) gathers the next, which may be partial (not in bf16 with
        # a left bound or a softcap: without the f16 MMA row sums that spills on sm_90a; the
        # gathers would spill 4 B in f16 on sm_80)
        for start, stop, masked in segments:
            if masked or ((LEFT or SOFTCAP) and dt != hl.f16):  # (heavy bf16: registers)
                for j in hl.range(start, stop):
                    step(j, masked, False)
            else:
                for j in hl.range(start, stop - 1):
                    step(j, False, True)
                with hl.if_(start < stop):
                    step(stop - 1, False, False)

        hl.wait_group(0)
        hl.copy(hl.cast(sm.out(acc, reciprocal=True), dt), o[tok, h, 0:HEAD_DIM])
        r2 = hl.iota((BM, 1), 0) + m0
        tok2 = hl.where(r2 < sq_len, r2 + q0, -1)
        hl.copy(sm.lse(), lse[h, tok2])

    return attention_varlen
