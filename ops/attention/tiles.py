"""The index arithmetic of a thread block's tile that the attention kernels share across
architectures (the sm_80 mma.sync kernels and the sm_90a wgmma kernels): which query rows the
block owns, which key blocks those rows see, and the mask of a key block.

These run inside a kernel while it is traced: each ``hl`` operation is recorded at the kernel
line that calls the helper (``hexlayout.lang.source``), as if it were written there.

Notation (per sequence ``s``): ``Sq`` queries, ``Sk`` keys; query ``i`` (0-based within its
sequence) is aligned with key ``i + shift``, ``shift = Sk - Sq`` (bottom-right alignment, as in
FlashAttention); with a window ``(left, right)`` it sees the keys ``i + shift - left <= j <= i +
shift + right``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import hexlayout.lang as hl
from hexlayout.ir.expr import select

__all__ = ["NEG_INF", "VarlenTile", "varlen_tile", "varlen_key_blocks", "mask_window", "PagedTile",
           "paged_tile", "mask_paged", "store_paged", "sink_rows", "scalar_rows", "copy_cache_rows",
           "copy_cache_pages", "mma_sums", "LOG2E"]

NEG_INF = float("-inf")
LOG2E = 1.4426950408889634


class VarlenTile(NamedTuple):
    """One varlen thread block's place: query head ``h`` and its KV head ``kvh``, the sequence's
    first query row ``q0`` and count ``sq_len``, first key row ``k0`` and count ``sk_len``, the
    tile's first query ``m0`` (within the sequence) and ``shift = sk_len - sq_len``."""

    kvh: Any
    q0: Any
    sq_len: Any
    k0: Any
    sk_len: Any
    m0: Any
    shift: Any


def varlen_tile(q: Any, k: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, s: Any, h: Any, mt: Any,
                BM: int) -> VarlenTile:
    """The place of the block owning query tile ``mt`` of head ``h`` of sequence ``s`` (rows
    ``cu_seqlens_q[s] + mt * BM ..``): ``kvh = h // (H / KVH)``, ``q0 = cu_seqlens_q[s]``,
    ``sq_len = cu_seqlens_q[s + 1] - q0``, ``k0`` / ``sk_len`` likewise from ``cu_seqlens_k``,
    ``m0 = mt * BM``, ``shift = sk_len - sq_len``."""
    kvh = h // (q.shape[1] // k.shape[1])
    q0 = cu_seqlens_q[s]
    sq_len = cu_seqlens_q[s + 1] - q0
    k0 = cu_seqlens_k[s]
    sk_len = cu_seqlens_k[s + 1] - k0
    m0 = mt * BM
    shift = sk_len - sq_len
    return VarlenTile(kvh, q0, sq_len, k0, sk_len, m0, shift)


def varlen_key_blocks(t: VarlenTile, left: Any, right: Any, *, BM: int, BN: int, LEFT: bool,
                      RIGHT: bool) -> tuple[Any, Any, Any, tuple[tuple[Any, Any, bool], ...]]:
    """The key blocks (of ``BN`` keys) the rows ``m0 .. min(m0 + BM, Sq) - 1`` of tile ``t`` see,
    with a left bound only when ``LEFT``, a right bound only when ``RIGHT`` (causal is ``right =
    0``). Returns ``(k_end, lo, hi, segments)``:

    - ``k_end``: one past the last key any row sees (0 for a tile past the queries), i.e.
      ``min(Sk, last + right + 1)``, ``last = min(m0 + BM, Sq) - 1 + shift`` the last row's
      aligned key;
    - ``[lo, hi)``: the blocks some row sees, ``hi = ceil(k_end / BN)``, ``lo = (m0 + shift -
      left) // BN`` (clamped to ``[0, hi]``);
    - ``segments``: ``(start, stop, masked)`` runs covering ``[lo, hi)`` in order; the unmasked
      run ``[u_lo, u_hi)`` holds the blocks every row sees whole: ``u_hi = min(Sk, m0 + shift +
      right + 1) // BN`` (the first row's end), ``u_lo = ceil((last - left) / BN)`` (the last
      row's start), clamped into ``[lo, hi]``."""
    k_end = select(t.m0 < t.sq_len, t.sk_len, 0)               # a tile past the queries: none
    last = hl.minimum(t.m0 + BM, t.sq_len) - 1 + t.shift       # the last row's aligned key
    full = t.sk_len
    if RIGHT:
        k_end = hl.maximum(hl.minimum(k_end, last + right + 1), 0)
        full = hl.minimum(t.sk_len, t.m0 + t.shift + right + 1)  # keys the first row sees
    hi = hl.cdiv(k_end, BN)
    lo = hl.minimum(hl.maximum(t.m0 + t.shift - left, 0) // BN, hi) if LEFT else 0
    u_hi = hl.minimum(hl.maximum(full // BN, lo), hi)
    if LEFT:
        u_lo = hl.minimum(hl.maximum(hl.cdiv(hl.maximum(last - left, 0), BN), lo), u_hi)
        return k_end, lo, hi, ((lo, u_lo, True), (u_lo, u_hi, False), (u_hi, hi, True))
    return k_end, lo, hi, ((lo, u_hi, False), (u_hi, hi, True))


def mask_window(sc: Any, valid: Any, kj: Any, qpos: Any, left: Any, right: Any, LEFT: bool,
                RIGHT: bool) -> Any:
    """The scores ``sc`` with ``-inf`` where a key is not visible: key ``kj`` visible from the
    row aligned with key ``qpos`` where ``valid`` holds and ``qpos - left <= kj`` (when
    ``LEFT``) and ``kj <= qpos + right`` (when ``RIGHT``)."""
    if LEFT:
        valid = valid & (kj >= qpos - left)
    if RIGHT:
        valid = valid & (kj <= qpos + right)
    return hl.where(valid, sc, NEG_INF)


class PagedTile(NamedTuple):
    """One paged-attention thread block's rows (row ``r`` = query token ``r // G``, query head
    ``kvh * G + r % G`` of the KV head's group of ``G``): the sequence's first query row ``q0``
    and count ``sq_len``, its key count ``n``, the tile's first row ``m0``, the row tiles
    ``tok`` / ``head`` (``tok`` -1 past the sequence), ``shift = n - sq_len`` and ``n_end``, one
    past the last key a row of the tile sees (causal: the last row's aligned key + 1)."""

    q0: Any
    sq_len: Any
    n: Any
    m0: Any
    tok: Any
    head: Any
    shift: Any
    n_end: Any


def paged_tile(cu_seqlens_q: Any, seqused_k: Any, s: Any, kvh: Any, mt: Any, G: Any, *, BM: int,
               CAUSAL: bool) -> PagedTile:
    """The rows ``mt * BM ..`` of sequence ``s`` and KV head ``kvh``: ``q0 = cu_seqlens_q[s]``,
    ``sq_len = cu_seqlens_q[s + 1] - q0``, ``n = seqused_k[s]``, ``tok = r // G + q0`` where
    ``r < sq_len * G`` (else -1), ``head = r % G + kvh * G``, ``n_end = min(n, (m0 + BM - 1) //
    G + shift + 1)`` when ``CAUSAL`` (else ``n``)."""
    q0 = cu_seqlens_q[s]
    sq_len = cu_seqlens_q[s + 1] - q0
    n = seqused_k[s]
    m0 = mt * BM
    r = hl.iota((BM,), 0) + m0                             # this block's rows
    tok = hl.where(r < sq_len * G, r // G + q0, -1)        # past the sequence: no row
    head = r % G + kvh * G
    shift = n - sq_len                                     # bottom-right alignment
    n_end = hl.minimum(n, (m0 + BM - 1) // G + shift + 1) if CAUSAL else n
    return PagedTile(q0, sq_len, n, m0, tok, head, shift, n_end)


def mask_paged(sc: Any, j: Any, t: PagedTile, qpos: Any, left: Any, right: Any, *, BM: int, BN: int,
               CAUSAL: bool, WINDOW: bool, key0: Any = None) -> Any:
    """The scores ``sc`` of key block ``j`` (keys ``kj = j * BN ..``, or ``key0 ..`` when given: a
    chunk of a block) with ``-inf`` where a key is not visible from the row aligned with key
    ``qpos``: visible when ``kj < n``, ``kj <= qpos`` (``CAUSAL``) and ``qpos - left <= kj <=
    qpos + right`` (``WINDOW``)."""
    kj = hl.iota((BM, BN), 1) + (j * BN if key0 is None else key0)
    valid = kj < t.n
    if CAUSAL:
        valid = valid & (kj <= qpos)
    return mask_window(sc, valid, kj, qpos, left, right, WINDOW, WINDOW)


def mma_sums(dt: Any) -> Any:
    """``hl.OnlineSoftmax``'s ``sums`` for P in ``dt``: row sums by an MMA against ones for f16
    (P rounded to 11 significant bits: the LSE within 2^-11 of the f32 sum's), None (f32 sums
    by reduction) for bf16, whose 8-bit P would move the LSE by up to 2^-8 (over the tests'
    1e-3)."""
    return dt if dt == hl.f16 else None


def sink_rows(sinks: Any, heads: Any, *, BM: int, sp: Any = 0) -> Any:
    """The rows' attention sinks in the log2 domain (``hl.OnlineSoftmax``'s ``sink``): ``sinks[
    heads] * log2(e)`` (``heads`` a ``BM`` x 1 tile of query heads, or one head for every row);
    in split ``sp > 0`` of split-KV ``-inf`` (no sink): the sink joins the denominator once."""
    if not isinstance(heads, hl.Tile):
        heads = hl.iota((BM, 1), 0) * 0 + heads
    x = hl.register(hl.f32, (BM, 1))
    hl.copy(sinks[heads], x)
    x = x * LOG2E
    if isinstance(sp, int) and sp == 0:
        return x
    return hl.where(hl.iota((BM, 1), 0) * 0 + sp < 1, x, NEG_INF)


def scalar_rows(x: Any, *, BM: int) -> Any:
    """``x[0]`` (a one-element f32 tensor, e.g. an FP8 cache's scale) in every row of a ``BM`` x 1
    f32 register tile."""
    r = hl.register(hl.f32, (BM, 1))
    hl.copy(x[hl.iota((BM, 1), 0) * 0], r)
    return r


def copy_cache_rows(cache: Any, page: Any, row: Any, kvh: Any, dst: Any, *, rows: int, HEAD_DIM: int,
                    dt: Any, fp8: Any = None) -> None:
    """``dst`` (shared, ``rows`` x ``HEAD_DIM`` of ``dt``) = the cache rows ``cache[page, row, kvh,
    :]`` (page -1: no row): a cp.async gather, or for an FP8 cache (``fp8`` its element type)
    loads into registers converted to ``dt`` (exact: every E4M3 / E5M2 value is an f16 and a bf16)
    and stored; the cache's scale is applied by the caller (to the scores and the output)."""
    if fp8 is None:
        hl.copy(cache[page, row, kvh, 0:HEAD_DIM], dst)
        return
    x = hl.register(fp8, (rows, HEAD_DIM))
    hl.copy(cache[page, row, kvh, 0:HEAD_DIM], x, other=0.0)    # page -1 (no row): 0
    hl.copy(hl.cast(x, dt), dst)


def copy_cache_pages(k_cache: Any, v_cache: Any, sk: Any, sv: Any, block_table: Any, s: Any, j: Any,
                     kvh: Any, *, BN: int, BLOCK: int, HEAD_DIM: int) -> None:
    """``sk`` / ``sv`` = the keys ``j * BN .. (j + 1) * BN - 1`` of sequence ``s`` (all below its
    length: no bound checks needed) read page by page: ``w = min(BN, BLOCK)`` rows at a time,
    rows ``r0 .. r0 + w`` (``r0 = key % BLOCK``) of page ``block_table[s, key // BLOCK]`` (one
    scalar load per page, the same in every thread) as a plain window of the cache, so a row's
    address is the page's base plus a per-thread offset that does not change across blocks
    (a gather would compute and bound-check each row's page, row and head). Not for FP8 caches
    (their rows are converted in registers: ``copy_cache_rows``)."""
    w = min(BN, BLOCK)
    for i in range(BN // w):
        key0 = j * BN + i * w
        page = block_table[s, key0 // BLOCK]
        r0 = 0 if BLOCK <= BN else key0 % BLOCK
        for cache, dst in ((k_cache, sk), (v_cache, sv)):
            hl.copy(cache[page, r0:r0 + w, kvh, 0:HEAD_DIM], dst[i * w:(i + 1) * w, :])


def store_paged(sm: Any, acc: Any, o: Any, lse: Any, t: PagedTile, kvh: Any, G: Any, sp: Any, *,
                split: bool, dt: Any, BM: int, HEAD_DIM: int, v_scale: Any = None) -> None:
    """Scatter the tile's rows: ``o[tok, head] = sm.out(acc)`` (in ``dt``; times ``v_scale``, an
    FP8 value cache's scale as a rows x 1 tile, when given) and ``lse[head, tok] = sm.lse()``;
    with ``split`` the f32 partials of split ``sp``, ``o[sp, tok, head]`` and ``lse[sp, head,
    tok]``. Rows past the sequence (token -1) are not written."""
    r2 = hl.iota((BM, 1), 0) + t.m0                        # the rows again, as a column
    tok2 = hl.where(r2 < t.sq_len * G, r2 // G + t.q0, -1)
    head2 = r2 % G + kvh * G
    out = sm.out(acc) if v_scale is None else sm.out(acc) * v_scale
    if split:
        hl.copy(out, o[sp, t.tok, t.head, 0:HEAD_DIM])
        hl.copy(sm.lse(), lse[sp, head2, tok2])
    else:
        hl.copy(hl.cast(out, dt), o[t.tok, t.head, 0:HEAD_DIM])
        hl.copy(sm.lse(), lse[head2, tok2])
