"""Routing alignment of a mixture of experts, as two kernels in the tile language.

``moe_align(topk_ids, *, num_experts, block_m, expert_map=None)`` sorts the ``S = T * k``
token slots (slot ``s = t * k + j`` is token ``t``'s ``j``-th choice) by the local expert they
go to, every expert's list padded to a multiple of the GEMM's row block ``BM``:

    local(s)   = topk_ids.flat[s]                   without an expert map
               = expert_map[topk_ids.flat[s]]       with one (-1: the expert is remote, the slot is dropped)
    count[e]   = #{s : local(s) = e},   padded[e] = ceil(count[e] / BM) * BM
    offset[e]  = sum_{e' < e} padded[e']
    sorted_ids[offset[e] + r] = the r-th slot (in slot order) with local(s) = e, for r < count[e]
    sorted_ids[i] = S (an out-of-range slot: padding) everywhere else
    expert_ids[b] = e for offset[e] <= b * BM < offset[e] + padded[e], else -1 (no block)
    num_tokens_post_padded = sum_e padded[e]

so block ``b`` of ``BM`` sorted slots belongs to one expert (vLLM's ``moe_align_block_size``
semantics, with a deterministic order inside an expert). Experts without a slot get no block.
Buffers are sized from ``S``, ``E`` and ``BM`` only (``max_padded_slots``), never from the
routing: no host synchronization, so the call can be captured in a CUDA graph.

The kernels (index tiles of gathers and scatters must be computable per thread from loads,
iota and integer math, never from a reduction, hence the round trips through global memory):

- ``moe_align_count`` (a block per 8 local experts): fills ``sorted_ids`` with ``S`` and
  ``expert_ids`` with -1 (each block its share), then counts its experts' slots, 128 per step,
  into ``counts``.
- ``moe_align_offsets`` (block ``e``): ``starts[e] = offset[e]`` and ``ends[e]`` as sums of
  masked count tiles (no scan), the padded total into ``num_tokens_post_padded``.
- ``moe_align_rank`` (a block per 8 experts ``e0 + u``): ``expert_ids`` of their blocks (from
  the scalar loads ``starts[e]``, ``ends[e]``), and ``rank[s]`` = the slot's position among its
  expert's slots: per step of 64 slots an mma ``L @ hit^T`` (``L`` strictly lower triangular,
  ``hit[u, j] = (local(j) == e0 + u)``, f16 0/1 in, f32 out: exact) gives the exclusive prefix
  of the 8 experts at once, plus the running count of the earlier steps (``1 @ hit^T``).
- ``moe_align_scatter`` (a block per 128 slots): ``sorted_ids[starts[local(s)] + rank[s]] = s``.

Every rank block reads all ``S`` slots: ``O(E / 8 * S)`` loads and ``E / 8 * S / 64`` pairs of
``64 x 64 x 8`` mmas in all, small for decode (``S <= 64``: one step per block).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.lang import f16, f32, i32

from ..host.torch import require_torch

__all__ = [
    "moe_align",
    "moe_align_count_kernel",
    "moe_align_offsets_kernel",
    "moe_align_rank_kernel",
    "moe_align_scatter_kernel",
    "max_padded_slots",
    "align_buffers",
    "run_moe_align",
    "STEP",
    "RANK_STEP",
]

S, G, E, EM, NB, ONE = hl.dims("S G E EM NB ONE")

#: Slots per step of the count and scatter kernels (``C``).
STEP = 128
#: Slots per step of the rank kernel (its ``C x C`` triangular mma operand).
RANK_STEP = 64


def max_padded_slots(num_slots: int, num_experts: int, block_m: int) -> int:
    """Length of ``sorted_ids``: ``S + min(S, E) * (BM - 1)`` rounded up to ``BM`` (at most
    ``min(S, E)`` experts get slots, each wasting at most ``BM - 1`` padding rows); at least
    ``BM``. Depends on the sizes only (capture-safe)."""
    n = num_slots + min(num_slots, num_experts) * (block_m - 1)
    return max(block_m, -(-n // block_m) * block_m)


def _local(ids: Any, expert_map: Any, pos: Any, mapped: bool) -> Any:
    """The local expert of the slots ``pos`` (an index tile; -1 for slots past the end and for
    remote experts)."""
    n = ids.shape[0]
    g = hl.register(i32, pos.shape)
    hl.copy(ids[hl.where(pos < n, pos, -1)], g)
    if not mapped:
        return hl.where(pos < n, g, -1)
    m = hl.register(i32, pos.shape)
    ok = (pos < n) & (g >= 0) & (g < expert_map.shape[0])
    hl.copy(expert_map[hl.where(ok, g, -1)], m)
    return hl.where(ok, m, -1)


@cache
def moe_align_count_kernel() -> Any:
    """``counts[e] = #{s : local(s) = e}`` (a block per 8 experts); ``sorted_ids[:] = S``
    (padding), ``expert_ids[:] = -1``. Constants: ``C`` slots per step, ``MAPPED``
    (``expert_map`` is read; else it is a dummy)."""

    @hl.kernel(threads=128, name="moe_align_count")
    def moe_align_count(
        ids: i32[S],
        expert_map: i32[G],
        counts: i32[E],
        sorted_ids: i32[EM],
        expert_ids: i32[NB],
        *,
        C: int = STEP,
        MAPPED: bool = False,
    ):
        g = hl.grid(hl.spatial(hl.cdiv(counts.shape[0], 8)))  # experts 8 g .. 8 g + 7
        ng, ne, n, em = hl.cdiv(counts.shape[0], 8), counts.shape[0], ids.shape[0], sorted_ids.shape[0]
        lane = hl.iota((C,), 0)
        for j in hl.range(hl.cdiv(hl.cdiv(em, C) - g, ng)):  # chunks g, g + ng, ... of sorted_ids
            p = lane + (j * ng + g) * C
            hl.copy(hl.zeros((C,), i32) + n, sorted_ids[hl.where(p < em, p, -1)])
            hl.copy(hl.zeros((C,), i32) - 1, expert_ids[hl.where(p < expert_ids.shape[0], p, -1)])
        mine = hl.iota((8, C), 0) + g * 8  # row u counts expert 8 g + u
        acc = hl.zeros((8, C), i32)
        for c in hl.range(hl.cdiv(n, C)):
            acc += hl.cast(_local(ids, expert_map, hl.iota((8, C), 1) + c * C, MAPPED).eq(mine), i32)
        e = hl.iota((8, 1), 0) + g * 8
        hl.copy(hl.sum(acc, 1), counts[hl.where(e < ne, e, -1)])

    return moe_align_count


@cache
def moe_align_offsets_kernel() -> Any:
    """``starts[e] = offset[e]``, ``ends[e] = offset[e] + padded[e]``, ``num_post[0] = sum_e
    padded[e]`` (block 0). Constants: ``BM``, ``EP`` (a power of two >= E: the count tile)."""

    @hl.kernel(threads=128, name="moe_align_offsets")
    def moe_align_offsets(
        counts: i32[E], starts: i32[E], ends: i32[E], num_post: i32[ONE], *, BM: int = 16, EP: int = 128
    ):
        e = hl.grid(hl.spatial(counts.shape[0]))
        ne = counts.shape[0]
        ex = hl.iota((1, EP), 1)
        cnt = hl.register(i32, (1, EP))
        hl.copy(counts[hl.where(ex < ne, ex, -1)], cnt)
        padded = hl.where(ex < ne, (cnt + (BM - 1)) // BM * BM, 0)
        off = hl.sum(hl.where(ex < e, padded, 0), 1)  # (1, 1): this expert's first row
        one = hl.iota((1, 1), 0)
        hl.copy(off, starts[one + e])
        hl.copy(off + hl.sum(hl.where(ex.eq(e), padded, 0), 1), ends[one + e])
        with hl.if_(e.eq(0)):
            hl.copy(hl.sum(padded, 1), num_post[one])

    return moe_align_offsets


@cache
def moe_align_rank_kernel() -> Any:
    """``rank[s] = #{s' < s : local(s') = e}`` for expert ``e``'s slots; ``expert_ids[b] = e`` for
    its blocks (``starts[e] / BM <= b < ends[e] / BM``). One thread block per 8 experts ``e0 + n``
    (the mma's 8 columns). Constants: ``C``, ``BM``, ``MAPPED``."""

    @hl.kernel(threads=128, name="moe_align_rank")
    def moe_align_rank(
        ids: i32[S],
        expert_map: i32[G],
        starts: i32[E],
        ends: i32[E],
        rank: i32[S],
        expert_ids: i32[NB],
        *,
        C: int = 64,
        BM: int = 16,
        MAPPED: bool = False,
    ):
        e0 = hl.grid(hl.spatial(hl.cdiv(starts.shape[0], 8))) * 8
        n = ids.shape[0]
        for u in range(8):  # the blocks of expert e0 + u (none past E: its loads read 0)
            b0, b1 = starts[e0 + u] // BM, ends[e0 + u] // BM
            for j in hl.range(hl.cdiv(b1 - b0, C)):
                b = hl.iota((C,), 0) + b0 + j * C
                hl.copy(hl.zeros((C,), i32) + (e0 + u), expert_ids[hl.where(b < b1, b, -1)])
        lower = hl.cast(hl.iota((C, C), 1) < hl.iota((C, C), 0), f16)  # L[i, j] = (j < i)
        ones = hl.full((C, C), 1.0, f16)
        run = hl.zeros((C, 8), f32)  # run[i, u]: slots of e0 + u in earlier steps
        for c in hl.range(hl.cdiv(n, C)):
            # hit[u, j] = (local(slot j) == e0 + u), an mma B operand; before = L @ hit^T: the
            # exclusive prefix of each expert, exact in f32; run += 1 @ hit^T for the next steps
            local = _local(ids, expert_map, hl.iota((8, C), 1) + c * C, MAPPED)
            hit = hl.cast(local.eq(hl.iota((8, C), 0) + e0), f16)
            before = hl.zeros((C, 8), f32)
            hl.mma(lower, hit, before)
            before += run
            hl.mma(ones, hit, run)
            slot = hl.iota((C, 8), 0) + c * C  # column u of slot i is stored when local(i) = e0 + u
            mine = _local(ids, expert_map, slot, MAPPED).eq(hl.iota((C, 8), 1) + e0)
            hl.copy(hl.cast(before, i32), rank[hl.where(mine, slot, -1)])

    return moe_align_rank


@cache
def moe_align_scatter_kernel() -> Any:
    """``sorted_ids[starts[local(s)] + rank[s]] = s`` for every slot with a local expert.
    Constants: ``C``, ``MAPPED``."""

    @hl.kernel(threads=128, name="moe_align_scatter")
    def moe_align_scatter(
        ids: i32[S],
        expert_map: i32[G],
        rank: i32[S],
        starts: i32[E],
        sorted_ids: i32[EM],
        *,
        C: int = STEP,
        MAPPED: bool = False,
    ):
        c = hl.grid(hl.spatial(hl.cdiv(ids.shape[0], C)))
        slot = hl.iota((C,), 0) + c * C
        loc = _local(ids, expert_map, slot, MAPPED)
        r, s0 = hl.register(i32, (C,)), hl.register(i32, (C,))
        hl.copy(rank[slot], r)
        hl.copy(starts[loc], s0)
        hl.copy(slot, sorted_ids[hl.where(loc >= 0, s0 + r, -1)])

    return moe_align_scatter


def align_buffers(num_slots: int, num_experts: int, block_m: int, device: Any) -> dict[str, Any]:
    """The int32 buffers of the alignment, sized from the slot count, the expert count and
    ``BM`` only (``host.launch.fresh``: the kernels write every element read later; on the CPU
    they start as int32's most negative value):
    ``sorted_ids`` [``max_padded_slots``], ``expert_ids`` [that / BM], ``num_post`` [1] and the
    workspaces ``counts``, ``starts``, ``ends`` [E] and ``rank`` [S]."""
    import torch

    from ..host.launch import fresh

    em = max_padded_slots(num_slots, num_experts, block_m)
    sizes = {
        "sorted_ids": em,
        "expert_ids": em // block_m,
        "num_post": 1,
        "counts": num_experts,
        "starts": num_experts,
        "ends": num_experts,
        "rank": max(num_slots, 1),
    }
    return {k: fresh(n, torch.int32, device) for k, n in sizes.items()}


def _pow2(n: int) -> int:
    p = 128
    while p < n:
        p *= 2
    return p


def run_moe_align(
    topk_ids: Any, num_experts: int, block_m: int, expert_map: Any = None
) -> tuple[Any, Any, Any]:
    """``moe_align`` on checked arguments (``topk_ids`` contiguous int32 ``[T, k]``, ``expert_map``
    int32 ``[G]`` or None): ``(sorted_ids, expert_ids, num_tokens_post_padded)``. Three kernel
    launches, nothing else but the allocations."""
    from ..host.launch import build_for, run_kernel

    ids = topk_ids.reshape(-1)
    bufs = align_buffers(ids.shape[0], num_experts, block_m, ids.device)
    sorted_ids, expert_ids, post = bufs["sorted_ids"], bufs["expert_ids"], bufs["num_post"]
    if ids.shape[0] == 0:
        sorted_ids.fill_(0)
        expert_ids.fill_(-1)
        post.fill_(0)
        return sorted_ids, expert_ids, post
    emap = ids if expert_map is None else expert_map
    mapped = expert_map is not None
    consts = {"C": STEP, "MAPPED": mapped}
    ep = {"BM": block_m, "EP": _pow2(num_experts)}
    counts, starts, ends, rank = bufs["counts"], bufs["starts"], bufs["ends"], bufs["rank"]
    run_kernel(
        build_for(moe_align_count_kernel(), ids.device, consts),
        (ids, emap, counts, sorted_ids, expert_ids),
        outputs=(2, 3, 4),
    )
    run_kernel(
        build_for(moe_align_offsets_kernel(), ids.device, ep), (counts, starts, ends, post), outputs=(1, 2, 3)
    )
    run_kernel(
        build_for(moe_align_rank_kernel(), ids.device, {"C": RANK_STEP, "BM": block_m, "MAPPED": mapped}),
        (ids, emap, starts, ends, rank, expert_ids),
        outputs=(4, 5),
    )
    run_kernel(
        build_for(moe_align_scatter_kernel(), ids.device, consts),
        (ids, emap, rank, starts, sorted_ids),
        outputs=(4,),
    )
    return sorted_ids, expert_ids, post


def moe_align(
    topk_ids: Any, *, num_experts: int, block_m: int, expert_map: Any = None
) -> tuple[Any, Any, Any]:
    """Sort the token slots of ``topk_ids`` (``[T, k]`` int32, global expert ids) by local expert
    in blocks of ``block_m`` (see the module docstring). ``num_experts`` is the number of local
    experts ``E``; ``expert_map`` (int32, one entry per global expert) maps a global id to a
    local one or -1. Returns ``(sorted_ids, expert_ids, num_tokens_post_padded)`` int32 tensors
    of lengths ``max_padded_slots(T * k, E, block_m)``, that divided by ``block_m``, and 1."""
    require_torch("hexlayout.ops.moe_align")
    from .args import check_moe_align

    check_moe_align(topk_ids, num_experts, block_m, expert_map)
    return run_moe_align(topk_ids.contiguous(), num_experts, block_m, expert_map)
