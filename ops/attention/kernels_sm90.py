"""Attention kernels for sm_90a (wgmma) in the tile language, layout-free
(``hexlayout.ops.attention`` dispatches to them on sm_90a).

``paged_attention_sm90_kernel(dtype, split)`` has the semantics, arguments and constants of
``attention_kernels.paged_attention_kernel`` (same math: for sequence ``s`` and query head
``h = kvh * G + g``, ``o_i = sum_j softmax_j(s_ij) v_j`` over the visible keys with ``s_ij =
(q_i . k_j) * scale`` (softcap: ``c * tanh(s_ij / c)``), bottom-right causal / window masks,
``lse_i = log sum_j exp(s_ij)``; split-KV partials for ``paged_attention_combine_kernel``);
only the machine code differs:

- one or two consumer warp groups (``WG``; ``BM = 64 * WG`` rows of (token, query head of the
  group), each warp group owning 64 rows); with ``KSPLIT=2`` twice as many warp groups, the
  second of each pair over the odd key blocks of the same rows with its own K / V buffers,
  softmax state and accumulator, handed to the first through shared memory (an mbarrier) and
  merged there (``OnlineSoftmax.merge``) before the store;
- ``S = Q K^T`` is one wgmma group reading Q and K from shared memory; ``O += P V`` a wgmma
  group whose A operand is P in registers (the f32 scores of the first product, exponentiated
  and cast in place) and whose B operand is the V tile in shared memory, read transposed
  (MN-major);
- K and V pages are gathered through the block table with cp.async into two shared buffers:
  block ``j + 1`` loads while block ``j`` is used. cp.async writes through the generic
  proxy and wgmma reads through the async proxy, so every thread fences its landed copies
  (``hl.fence_proxy_async``) before the barrier that precedes the wgmma;
- the key-block loop is ``key_loop.wgmma_key_loop``: with ``OVERLAP`` FlashAttention-3's
  intra-warpgroup overlap (block ``j``'s softmax beside block ``j - 1``'s ``P V``; paged: block
  ``j + 1``'s gather issued beside them too, into a third K / V buffer), else each product
  waited for at once;
- the online softmax runs in the log2 domain (``qk_scale = scale * log2(e)`` (> 0) applied to
  the row max and inside the exponential's argument, one FMA; or ``scale / c`` and ``cap = c *
  log2(e)`` with a softcap), ``exp2_approx`` (one MUFU.EX2), with masks only in the key blocks
  that need them: without a window, the blocks below ``n_full`` are visible to every row.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

from .key_loop import wgmma_key_loop
from .tiles import (
    copy_cache_rows,
    mask_paged,
    mask_window,
    paged_tile,
    scalar_rows,
    sink_rows,
    store_paged,
    varlen_key_blocks,
    varlen_tile,
)

__all__ = ["paged_attention_sm90_kernel", "attention_varlen_sm90_kernel", "attention_varlen_sm90_consts",
           "VARLEN_SM90_CONFIGS", "tma_compatible"]

#: The varlen kernel's tiles per padded head size: 128 query rows (two consumer warp groups of
#: 64), ``BN`` keys per stage, ``STAGES`` K/V stages (``tests/ops/test_attention_sm90_compile.py``
#: compiles each without spills).
VARLEN_SM90_CONFIGS: dict[int, dict[str, int]] = {
    64: {"BM": 128, "BN": 64, "STAGES": 4},
    128: {"BM": 128, "BN": 64, "STAGES": 3},
    256: {"BM": 128, "BN": 64, "STAGES": 2, "OVERLAP": False},
}
#: With a left bound or a softcap (more live values in the masked blocks): head size 256 takes
#: 32 keys per stage.
VARLEN_SM90_HEAVY: dict[int, dict[str, int]] = {256: {"BN": 32, "STAGES": 3, "OVERLAP": True}}

TQ, TK, H, D, NB, BS, KVH, B1, B, MAXB, SP, NS, NSC = hl.dims("TQ TK H D NB BS KVH B1 B MAXB SP NS NSC")
SQT, SQH, SKB, SKS, SKC, SVB, SVS, SVC, SBT = hl.dims("SQT SQH SKB SKS SKC SVB SVS SVC SBT")
SKT, SKH, SVT, SVH = hl.dims("SKT SKH SVT SVH")


def _tag(arch: str) -> str:
    """The architecture a kernel's name carries: ``sm90`` for ``sm_90a``, ``sm100`` for ``sm_100a``."""
    return arch.replace("_", "").rstrip("a")


@cache
def paged_attention_sm90_kernel(dtype: DType, split: bool = False, cache_dtype: DType | None = None,
                                arch: str = "sm_90a") -> Any:
    """The sm_90a paged attention kernel for ``dtype`` (f16 / bf16); ``split``: split-KV partial
    outputs (see the module docstring and ``attention_kernels.paged_attention_kernel``).
    Constants: ``BM`` (= 64 * ``WG``), ``BN``, ``HEAD_DIM``, ``BLOCK``, ``WG``, ``CAUSAL``,
    ``WINDOW``, ``SOFTCAP``, ``TILES``, ``SPLITS``, ``SINKS``. ``cache_dtype`` (e4m3 / e5m2): FP8
    caches, converted on their way to shared memory (register loads instead of cp.async; the
    fp8 wgmma would need Q and P in FP8 too), scales as in the sm_80 kernel. ``arch``: the
    target the kernel's name carries (``paged_attention_sm100_f16`` for ``"sm_100a"``: the same
    source, built with tcgen05 there; module docstring)."""
    dt = dtype
    cdt = cache_dtype or dtype
    o_t = f32[SP, TQ, H, D] if split else dt[TQ, H, D]  # type: ignore
    lse_t = f32[SP, H, TQ] if split else f32[H, TQ]

    @hl.kernel(threads=lambda c: 128 * c["WG"] * c.get("KSPLIT", 1),
               name=f"paged_attention_{_tag(arch)}_{dt}")
    def paged_attention_sm90(q: dt[TQ, H, D].strides(SQT, SQH, 1),  # type: ignore
                             k_cache: cdt[NB, BS, KVH, D].strides(SKB, SKS, SKC, 1),  # type: ignore
                             v_cache: cdt[NB, BS, KVH, D].strides(SVB, SVS, SVC, 1),  # type: ignore
                             cu_seqlens_q: i32[B1], seqused_k: i32[B],
                             block_table: i32[B, MAXB].strides(SBT, 1),
                             o: o_t, lse: lse_t, sinks: f32[NS],  # type: ignore
                             k_scale: f32[NSC], v_scale: f32[NSC],
                             G: i32, qk_scale: f32, cap: f32, left: i32, right: i32,
                             SQT: i32, SQH: i32, SKB: i32, SKS: i32, SKC: i32,
                             SVB: i32, SVS: i32, SVC: i32, SBT: i32,
                             *, BM: int = 64, BN: int = 64, HEAD_DIM: int = 128, BLOCK: int = 16, WG: int = 1,
                             CAUSAL: bool = True, WINDOW: bool = False, SOFTCAP: bool = False, TILES: int = 1,
                             SPLITS: int = 1, SINKS: bool = False, OVERLAP: bool = True, KSPLIT: int = 1):
        s, kvh, pid = hl.grid(hl.spatial(seqused_k.shape[0], k_cache.shape[2], TILES * SPLITS))
        mt, sp = (pid, 0) if SPLITS == 1 else (pid % TILES, pid // TILES)
        t = paged_tile(cu_seqlens_q, seqused_k, s, kvh, mt, G, BM=BM, CAUSAL=CAUSAL)   # the block's rows
        _, _, n, m0, tok, head, shift, n_end = t
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

        nbuf = 3 if OVERLAP else 2                             # OVERLAP: block j - 1's V is still read
        sq = hl.shared(dt, (BM, HEAD_DIM))
        sk = hl.shared(dt, (BN, HEAD_DIM, nbuf * KSPLIT))      # warp group g: buffers g * nbuf + ...
        sv = hl.shared(dt, (BN, HEAD_DIM, nbuf * KSPLIT))
        segments = ((n_full, hi, True),) if WINDOW else ((lo, n_full, False), (n_full, hi, True))

        def load(j: Any, buf: Any) -> None:                    # key block j into buffer buf
            pos = hl.iota((BN,), 0) + j * BN
            page = hl.register(i32, (BN,))
            hl.copy(block_table[s, pos // BLOCK], page)
            page = hl.where(pos < lim, page, -1)               # past the end: no row, no read
            for cache_, dst in ((k_cache, sk[:, :, buf]), (v_cache, sv[:, :, buf])):
                copy_cache_rows(cache_, page, pos % BLOCK, kvh, dst, rows=BN, HEAD_DIM=HEAD_DIM, dt=dt,
                                fp8=cache_dtype)

        def consume(g: int) -> tuple[Any, Any]:
            """The softmax state and accumulator of warp group ``g`` over key blocks ``j = lo + g +
            KSPLIT * i`` (its ``i``-th block in buffer ``g * nbuf + i % nbuf``)."""
            def block(i: Any) -> Any:
                return lo + g + KSPLIT * i

            def first(j: Any) -> Any:                          # this warp group's blocks below j
                return hl.cdiv(hl.maximum(j - lo - g, 0), KSPLIT)

            heads = hl.iota((BM, 1), 0) % G + kvh * G
            sink = sink_rows(sinks, heads, BM=BM, sp=sp) if SINKS and g == 0 else None   # counted once
            sm = hl.OnlineSoftmax(BM, sink)
            acc = hl.zeros((BM, HEAD_DIM), f32)
            qpos = (hl.iota((BM, BN), 0) + m0) // G + shift    # the key aligned with each row
            qks = qk_scale if cache_dtype is None else scalar_rows(k_scale, BM=BM) * qk_scale  # FP8: k_scale
            mult = 1.0 if SOFTCAP else qks                     # softcapped scores are scaled

            def prefetch(i: Any) -> None:                      # block i + 1 into its buffer
                load(block(i + 1), g * nbuf + (i + 1) % nbuf)
                hl.commit_group()

            def scores(i: Any) -> Any:                         # block i landed; S_i issued, committed
                hl.wait_group(0)                               # this thread's part landed
                hl.fence_proxy_async()                         # ... and is visible to wgmma
                hl.syncthreads()                               # the warp group's; buffer i + 1 free
                sc = hl.zeros((BM, BN), f32)
                hl.wgmma_fence()
                hl.mma(sq, sk[:, :, g * nbuf + i % nbuf], sc)
                hl.wgmma_commit()
                return sc

            def visible(sc: Any, i: Any, masked: bool) -> Any:   # softcapped, -inf at hidden keys
                if SOFTCAP:
                    sc = hl.tanh(sc * qks) * cap
                if masked:
                    sc = mask_paged(sc, block(i), t, qpos, left, right, BM=BM, BN=BN, CAUSAL=CAUSAL,
                                    WINDOW=WINDOW)
                return sc

            def values(p: Any, i: Any) -> None:                # acc += p V_i (P from registers)
                hl.wgmma_fence()
                hl.mma(p, sv[:, :, g * nbuf + i % nbuf].T, acc)
                hl.wgmma_commit()

            load(block(0), g * nbuf)
            hl.commit_group()
            wgmma_key_loop(sm, acc, [(first(x), first(y), m) for x, y, m in segments], 0, first(hi),
                           scores=scores, visible=visible, values=values, issued=prefetch, mult=mult, dt=dt,
                           rows=BM, keys=BN, overlap=OVERLAP)
            hl.wait_group(0)
            return sm, acc

        def store(sm: Any, acc: Any) -> None:
            vs = None if cache_dtype is None else scalar_rows(v_scale, BM=BM)
            store_paged(sm, acc, o, lse, t, kvh, G, sp, split=split, dt=dt, BM=BM, HEAD_DIM=HEAD_DIM,
                        v_scale=vs)

        hl.copy(q[tok, head, 0:HEAD_DIM], sq)                  # gathered (token, head) rows
        if KSPLIT == 1:
            store(*consume(0))
        else:
            # two consumer warp groups over alternate key blocks; warp group 1 hands its state to
            # warp group 0 through shared memory, which merges the two and stores
            part = hl.shared(f32, (BM, HEAD_DIM))
            part_m = hl.shared(f32, (BM, 1))
            part_l = hl.shared(f32, (BM, 1))
            handed = hl.mbarrier(1)
            hl.mbarrier_init(handed, 0, arrivals=128)
            hl.commit_group()
            hl.wait_group(0)                                   # the Q rows, read by both
            hl.fence_proxy_async()                             # ... through wgmma
            hl.syncthreads()
            with hl.warp_group(1):
                sm1, acc1 = consume(1)
                hl.copy(acc1, part)
                hl.copy(sm1.m, part_m)
                hl.copy(sm1.l, part_l)
                hl.arrive(handed, 0)
            with hl.else_():
                sm0, acc0 = consume(0)
                hl.wait(handed, 0, phase=0)
                acc2 = hl.register(f32, (BM, HEAD_DIM))
                m2 = hl.register(f32, (BM, 1))
                l2 = hl.register(f32, (BM, 1))
                hl.copy(part, acc2)
                hl.copy(part_m, m2)
                hl.copy(part_l, l2)
                sm0.merge(acc0, m2, l2, acc2)
                store(sm0, acc0)

    return paged_attention_sm90


@cache
def attention_varlen_sm90_kernel(dtype: DType, arch: str = "sm_90a") -> Any:
    """The sm_90a varlen (prefill) kernel for ``dtype``, FlashAttention-3's structure: the
    semantics, arguments (the query tiles per sequence ``tiles`` a launch argument) and constants
    ``BM`` / ``BN`` / ``HEAD_DIM`` / ``LEFT`` / ``RIGHT`` / ``SOFTCAP`` of
    ``attention_varlen_kernels.attention_varlen_kernel`` (one block
    per (sequence, query head, tile of ``BM = 128`` query rows); keys bounded by ``[-left,
    right]`` around each row's aligned key ``i + Sk - Sq``), ``SINKS``, plus ``STAGES``.

    Warp group 0 is the producer: with a lowered register budget one thread issues TMA loads
    of the Q tile (on ``qbar``) and of the K and V tiles of every key block the tile sees into
    a ``STAGES``-deep ring (``full[st]`` expects both tiles' bytes; it waits on ``empty[st]``
    before reusing a stage). Warp groups 1 and 2 consume, 64 query rows each, with a raised
    budget: S = Q K^T (wgmma from shared), the online softmax (log2 domain, FMA-folded scale,
    ``exp2_approx``; masks only in the blocks that hold an invisible key), O += P V (P from
    registers, V^T from shared), then release the stage; with ``OVERLAP`` block ``j``'s softmax
    runs beside block ``j - 1``'s P V (the module docstring). TMA reads whole tiles, so a
    sequence's last, partial key block is shifted to end at its last key (keys ``Sk - BN ..
    Sk - 1``, those before ``j * BN`` masked: seen in the previous block; before the first
    sequence TMA zero-fills): K / V rows of other sequences or padding past ``cu_seqlens_k[-1]``
    are never read (their weight would be 0, but 0 * NaN is NaN). Output rows are scattered
    through index tiles (-1 past the sequence: never written). Needs q, k, v with 16-byte
    aligned bases and row strides (TMA)."""
    dt = dtype

    @hl.kernel(threads=384, name=f"attention_varlen_{_tag(arch)}_{dt}")
    def attention_varlen_sm90(q: dt[TQ, H, D].strides(SQT, SQH, 1),  # type: ignore
                              k: dt[TK, KVH, D].strides(SKT, SKH, 1),  # type: ignore
                              v: dt[TK, KVH, D].strides(SVT, SVH, 1),  # type: ignore
                              cu_seqlens_q: i32[B1], cu_seqlens_k: i32[B1],
                              o: dt[TQ, H, D], lse: f32[H, TQ], sinks: f32[NS],  # type: ignore
                              qk_scale: f32, cap: f32, left: i32, right: i32, tiles: i32,
                              SQT: i32, SQH: i32, SKT: i32, SKH: i32, SVT: i32, SVH: i32,
                              *, BM: int = 128, BN: int = 64, HEAD_DIM: int = 128, STAGES: int = 2,
                              LEFT: bool = False, RIGHT: bool = False, SOFTCAP: bool = False,
                              SINKS: bool = False, OVERLAP: bool = True):
        s, h, mt = hl.grid(hl.spatial(cu_seqlens_q.shape[0] - 1, q.shape[1], tiles))
        t = varlen_tile(q, k, cu_seqlens_q, cu_seqlens_k, s, h, mt, BM)     # the block's rows and keys
        kvh, q0, sq_len, k0, sk_len, m0, shift = t
        _, lo, hi, segments = varlen_key_blocks(t, left, right, BM=BM, BN=BN, LEFT=LEFT, RIGHT=RIGHT)

        sw = hl.auto(swizzle="128B")
        sq = hl.shared(dt, (BM, HEAD_DIM), layout=sw)
        sk = hl.shared(dt, (BN, HEAD_DIM, STAGES), layout=sw)
        sv = hl.shared(dt, (BN, HEAD_DIM, STAGES), layout=sw)
        qbar = hl.mbarrier(1)
        hl.mbarrier_init(qbar, 0, arrivals=1)
        # full: the producer's expect_tx arrival; empty: one per consumer warp group
        ring = hl.Ring(STAGES, producers=1, consumers=2)
        hl.syncthreads()

        with hl.warp_group(0):
            hl.setmaxnreg(24, increase=False)
            hl.arrive(qbar, 0, tx_bytes=sq.nbytes, who="one")
            hl.copy(hl.view(q, tile=(BM, 1, HEAD_DIM), origin=(q0 + m0, h, 0))[:, 0, :], sq, mbarrier=qbar[0])
            for j in hl.range(lo, hi):
                st = (j - lo) % STAGES
                ring.acquire(j - lo)
                ring.fill(j - lo, tx_bytes=sk[:, :, 0].nbytes + sv[:, :, 0].nbytes)
                kv = (k0 + hl.minimum(j * BN, sk_len - BN), kvh, 0)   # the last block ends at Sk
                hl.copy(hl.view(k, (BN, 1, HEAD_DIM), kv)[:, 0, :], sk[:, :, st], mbarrier=ring.full[st])
                hl.copy(hl.view(v, (BN, 1, HEAD_DIM), kv)[:, 0, :], sv[:, :, st], mbarrier=ring.full[st])
        with hl.else_():
            hl.setmaxnreg(240, increase=True)
            sm = hl.OnlineSoftmax(BM, sink_rows(sinks, h, BM=BM) if SINKS else None)
            acc = hl.zeros((BM, HEAD_DIM), f32)
            mult = 1.0 if SOFTCAP else qk_scale                # softcapped scores are scaled
            hl.wait(qbar, 0, phase=0)

            def scores(j: Any) -> Any:                         # S_j = Q K_j^T, issued and committed
                ring.wait_full(j - lo)
                sc = hl.zeros((BM, BN), f32)
                hl.wgmma_fence()
                hl.mma(sq, sk[:, :, (j - lo) % STAGES], sc, warps=hl.spatial(2, 1))
                hl.wgmma_commit()
                return sc

            def visible(sc: Any, j: Any, masked: bool) -> Any:  # softcapped, -inf at hidden keys
                if SOFTCAP:
                    sc = hl.tanh(sc * qk_scale) * cap
                if masked:
                    kj = hl.iota((BM, BN), 1) + hl.minimum(j * BN, sk_len - BN)
                    qpos = hl.iota((BM, BN), 0) + (m0 + shift)   # each row's aligned key
                    valid = kj >= j * BN                       # a shifted last block: seen before
                    sc = mask_window(sc, valid, kj, qpos, left, right, LEFT, RIGHT)
                return sc

            def values(p: Any, j: Any) -> None:                # acc += p V_j, issued and committed
                hl.wgmma_fence()
                hl.mma(p, sv[:, :, (j - lo) % STAGES].T, acc, warps=hl.spatial(2, 1))
                hl.wgmma_commit()

            wgmma_key_loop(sm, acc, segments, lo, hi, scores=scores, visible=visible, values=values,
                           retired=lambda j: ring.release((j - lo) % STAGES), mult=mult, dt=dt, rows=BM,
                           keys=BN, overlap=OVERLAP, rescale_first=True)
            r = hl.iota((BM,), 0) + m0
            tok = hl.where(r < sq_len, r + q0, -1)             # past the sequence: no row
            hl.copy(hl.cast(sm.out(acc, reciprocal=True), dt), o[tok, h, 0:HEAD_DIM])
            r2 = hl.iota((BM, 1), 0) + m0
            tok2 = hl.where(r2 < sq_len, r2 + q0, -1)
            hl.copy(sm.lse(), lse[h, tok2])

    return attention_varlen_sm90


def attention_varlen_sm90_consts(head_dim: int, left: bool, right: bool, softcap: bool) -> dict[str, Any]:
    """Constants of ``attention_varlen_sm90_kernel`` for a padded head size ``head_dim``."""
    cfg = VARLEN_SM90_CONFIGS[head_dim]
    if left or softcap:
        cfg = {**cfg, **VARLEN_SM90_HEAVY.get(head_dim, {})}
    return {**cfg, "HEAD_DIM": head_dim, "LEFT": bool(left), "RIGHT": bool(right), "SOFTCAP": bool(softcap)}


def tma_compatible(*tensors: Any) -> bool:
    """TMA can load these (torch) tensors: 16-byte aligned data and strides but the last (1)."""
    return all(t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
               for t in tensors)
