"""``hexlayout.ops.moe_align``: the routing alignment kernels (count, offsets, rank, scatter) in
the emulator against a numpy reference: random routings with experts that get no slot, every
slot on one expert, an expert map with half the experts remote; buffer sizes from the sizes
only; NVRTC compiles of the four kernels without spills; bad arguments named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hexlayout.ops.moe.align import (
    max_padded_slots,
    moe_align,
    moe_align_count_kernel,
    moe_align_offsets_kernel,
    moe_align_rank_kernel,
    moe_align_scatter_kernel,
)

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def reference(ids: np.ndarray, experts: int, bm: int, emap: np.ndarray | None) -> tuple[list, int]:
    """Per block: (expert, the slots it holds in order); the padded total."""
    flat = ids.reshape(-1)
    local = flat if emap is None else emap[flat]
    blocks = []
    for e in range(experts):
        slots = [int(s) for s in np.nonzero(local == e)[0]]
        for b in range(0, len(slots), bm):
            blocks.append((e, slots[b:b + bm]))
    return blocks, len(blocks) * bm


def check(ids: np.ndarray, experts: int, bm: int, emap: np.ndarray | None = None) -> None:
    s = ids.size
    got = moe_align(torch.from_numpy(ids), num_experts=experts, block_m=bm,
                    expert_map=None if emap is None else torch.from_numpy(emap))
    sorted_ids, expert_ids, post = (x.numpy() for x in got)
    em = max_padded_slots(s, experts, bm)
    assert sorted_ids.shape == (em,) and expert_ids.shape == (em // bm,) and post.shape == (1,)
    blocks, total = reference(ids, experts, bm, emap)
    assert int(post[0]) == total
    for b, (e, slots) in enumerate(blocks):
        assert expert_ids[b] == e
        row = sorted_ids[b * bm:(b + 1) * bm]
        np.testing.assert_array_equal(row[:len(slots)], slots)
        assert (row[len(slots):] == s).all()                      # padding: the out-of-range slot
    assert (expert_ids[len(blocks):] == -1).all()
    assert (sorted_ids[total:] == s).all()


@pytest.mark.parametrize(("t", "k", "experts", "bm"), [(1, 1, 8, 16), (3, 2, 8, 16), (16, 6, 64, 16),
                                                      (100, 2, 8, 32), (37, 8, 8, 64)])
def test_random_routings_match_numpy(t: int, k: int, experts: int, bm: int) -> None:
    rng = np.random.default_rng(t * 100 + k)
    # the last two experts get no slot
    ids = np.stack([rng.permutation(experts - 2)[:k] for _ in range(t)]).astype(np.int32) \
        if k <= experts - 2 else rng.integers(0, experts - 2, (t, k)).astype(np.int32)
    check(ids, experts, bm)


def test_every_slot_on_one_expert() -> None:
    ids = np.full((70, 1), 5, np.int32)              # 70 slots: 5 blocks of 16, the last one ragged
    check(ids, 8, 16)


def test_expert_map_drops_remote_experts() -> None:
    rng = np.random.default_rng(7)
    g, local_e = 16, 8
    emap = np.full(g, -1, np.int32)
    emap[rng.permutation(g)[:local_e]] = rng.permutation(local_e)
    ids = np.stack([rng.permutation(g)[:4] for _ in range(40)]).astype(np.int32)
    check(ids, local_e, 16, emap)
    # every token on a remote expert: no block at all
    remote = int(np.nonzero(emap < 0)[0][0])
    check(np.full((5, 1), remote, np.int32), local_e, 16, emap)


def test_buffers_depend_on_sizes_only() -> None:
    a = moe_align(torch.zeros((4, 2), dtype=torch.int32), num_experts=16, block_m=16)
    b = moe_align(torch.arange(8, dtype=torch.int32).reshape(4, 2), num_experts=16, block_m=16)
    assert [x.shape for x in a] == [x.shape for x in b] == [(128,), (8,), (1,)]
    assert max_padded_slots(8, 64, 16) == 8 + 8 * 15          # min(S, E) experts pad at most BM - 1 each
    assert max_padded_slots(3, 64, 16) == 48                  # 3 + 3 * 15, rounded up to BM


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ArgumentError, match=r"topk_ids.*int32; pass topk_ids\.int\(\)"):
        moe_align(torch.zeros((2, 2), dtype=torch.int64), num_experts=8, block_m=16)
    with pytest.raises(ArgumentTypeError, match="block_m"):
        moe_align(torch.zeros((2, 2), dtype=torch.int32), num_experts=8, block_m=16.0)
    with pytest.raises(ArgumentError, match="num_experts"):
        moe_align(torch.zeros((2, 2), dtype=torch.int32), num_experts=0, block_m=16)


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_alignment_kernels_compile_without_spills(arch: str) -> None:
    from hexlayout.runtime import build

    mapped = {"MAPPED": True}
    for kern, consts in ((moe_align_count_kernel(), mapped), (moe_align_offsets_kernel(), {}),
                         (moe_align_rank_kernel(), mapped), (moe_align_scatter_kernel(), mapped)):
        res = build(kern, arch, **consts).compiled.resources
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, kern
