"""The global sector model: distinct 32-byte sectors of a warp-wide request."""

from __future__ import annotations

import numpy as np

from hexlayout.arch.sectors import global_sectors


def test_coalesced_and_strided_requests() -> None:
    assert global_sectors(np.arange(32) * 16, 16) == 16           # 512 contiguous bytes
    assert global_sectors(np.arange(32) * 4, 4) == 4
    assert global_sectors(np.zeros(32, np.int64), 4) == 1          # one word broadcast
    assert global_sectors(np.arange(32) * 1000, 2) == 32           # one sector per lane


def test_straddling_accesses_and_inactive_lanes() -> None:
    assert global_sectors([30, -1, -1], 4) == 2                    # bytes 30..33: two sectors
    assert global_sectors([-1] * 32, 16) == 0


def test_batches_of_requests() -> None:
    a = np.stack([np.arange(32) * 2, np.arange(32) * 64])
    assert global_sectors(a, 2).tolist() == [2, 32]
