"""Shared-memory bank model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexlayout.arch import bank_conflicts, ldmatrix_bank_conflicts
from hexlayout.layout import ComposedLayout, Layout, Swizzle


def _brute(addr: list[int], width: int) -> int:
    """Reference: per phase, max over banks of the number of distinct words."""
    per = {1: 32, 2: 32, 4: 32, 8: 16, 16: 8}[width]
    total = 0
    for p in range(0, 32, per):
        words: dict[int, set[int]] = {}
        for a in addr[p:p + per]:
            if a < 0:
                continue
            for w in range(max(1, width // 4)):
                word = a // 4 + w
                words.setdefault(word % 32, set()).add(word)
        total += max((len(s) for s in words.values()), default=0)
    return total


def test_basic_patterns() -> None:
    lanes = np.arange(32)
    assert bank_conflicts(lanes * 4, 4).wavefronts == 1
    assert bank_conflicts(lanes * 0, 4).wavefronts == 1            # broadcast
    r = bank_conflicts(lanes * 128, 4)                              # same bank, 32 words
    assert (r.wavefronts, r.min_wavefronts, r.conflicts) == (32, 1, 31)
    assert bank_conflicts(lanes * 8, 4).wavefronts == 2             # stride 2 words: 2-way
    assert bank_conflicts(lanes * 2, 2).wavefronts == 1             # 16-bit, two lanes per word
    assert bank_conflicts(lanes, 1).wavefronts == 1
    r = bank_conflicts(lanes * 8, 8)
    assert (r.wavefronts, r.conflicts) == (2, 0)                    # two half-warp phases
    r = bank_conflicts(lanes * 16, 16)
    assert (r.wavefronts, r.conflicts) == (4, 0)                    # four quarter-warp phases
    r = bank_conflicts(lanes * 32, 16)                              # 2-way within each phase
    assert (r.wavefronts, r.conflicts) == (8, 4)


def test_inactive_lanes() -> None:
    addr = np.arange(32) * 128
    addr[1:] = -1
    assert bank_conflicts(addr, 4).wavefronts == 1
    r = bank_conflicts(np.arange(32) * 16, 16, active=np.arange(32) < 8)
    assert (r.wavefronts, r.min_wavefronts) == (1, 1)
    r = bank_conflicts([0, 128, 256], 4)
    assert (r.wavefronts, r.conflicts) == (3, 2)
    assert bank_conflicts(np.full(32, -1), 4).wavefronts == 0


def test_errors() -> None:
    with pytest.raises(ValueError, match="width"):
        bank_conflicts(np.arange(32), 3)
    with pytest.raises(ValueError, match="aligned"):
        bank_conflicts(np.arange(32) * 16 + 4, 16)


def test_batched() -> None:
    batch = np.stack([np.arange(32) * 4, np.arange(32) * 128, np.zeros(32, dtype=np.int64)])
    r = bank_conflicts(batch, 4)
    assert list(r.wavefronts) == [1, 32, 1] and list(r.conflicts) == [0, 31, 0]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16]), st.lists(st.integers(-1, 300), min_size=32, max_size=32))
def test_matches_brute_force(width: int, slots: list[int]) -> None:
    addr = [s * width if s >= 0 else -1 for s in slots]
    assert bank_conflicts(addr, width).wavefronts == _brute(addr, width)


def test_ldmatrix_swizzle_fact() -> None:
    """REFERENCE.md: an (8,64):(64,1) fp16 tile read by ldmatrix rows is 8-way conflicted;
    Swizzle<3,3,3> makes it conflict-free."""
    plain = Layout((8, 64), (64, 1))
    swz = ComposedLayout(Swizzle(3, 3, 3), 0, plain)
    for layout, want in ((plain, 8), (swz, 1)):
        for chunk0 in range(0, 8, 4):
            # x4: matrix j = 16-byte column chunk chunk0+j, lanes 8j+r give row r of it
            rows = [int(layout((r, 8 * (chunk0 + j)))) * 2 for j in range(4) for r in range(8)]
            rep = ldmatrix_bank_conflicts(rows, 4)
            assert rep.wavefronts == 4 * want
            assert rep.conflicts == 4 * (want - 1)
    # x1 only looks at lanes 0-7
    rows = [int(plain((r, 0))) * 2 for r in range(8)] + [0] * 24
    assert ldmatrix_bank_conflicts(rows, 1).wavefronts == 8
