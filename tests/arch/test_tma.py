"""check_tma: legal and illegal TMA tensor maps and boxes."""

from __future__ import annotations

import pytest

from hexlayout.arch import check_tma


def test_good_boxes() -> None:
    # fp16 [M=4096, K=4096] row-major, box 64 (K, 128 B) x 128 rows, 128-byte swizzle
    assert check_tma(16, (4096, 4096), (1, 4096), (64, 128), swizzle=128, smem_address=2048) == []
    assert check_tma(16, (4096, 4096), (1, 4096), (32, 64), swizzle=64, smem_address=512) == []
    assert check_tma(8, (100, 7, 3), (1, 112, 784), (16, 7, 1)) == []
    assert check_tma(32, (1000,), (1,), (256,)) == []
    assert check_tma(16, (8, 8, 8, 8, 8), (1, 8, 64, 512, 4096), (8, 8, 8, 8, 8)) == []


G64 = dict(global_shape=(64, 64), global_strides=(1, 64))


@pytest.mark.parametrize("kwargs,needle", [
    (dict(**G64, box_shape=(300, 8)), "box extent of dimension 0 is 300"),
    (dict(**G64, box_shape=(4, 8)), "not a multiple of 16 bytes"),
    (dict(global_shape=(64, 64), global_strides=(1, 60), box_shape=(64, 8)),
     "stride of dimension 1 is 120 bytes"),
    (dict(global_shape=(64, 64), global_strides=(64, 1), box_shape=(64, 8)), "must be contiguous"),
    (dict(**G64, box_shape=(64, 8), global_address=8), "16-byte aligned"),
    (dict(global_shape=(128, 64), global_strides=(1, 128), box_shape=(128, 8), swizzle=128),
     "256 bytes, more than the 128-byte swizzle span"),
    (dict(**G64, box_shape=(64, 8), swizzle=128, smem_address=512),
     "not aligned to 1024 bytes"),
    (dict(**G64, box_shape=(16, 8), swizzle=32, smem_address=128),
     "not aligned to 256 bytes"),
    (dict(**G64, box_shape=(64, 8), smem_address=64), "aligned to 128"),
    (dict(**G64, box_shape=(64, 8), swizzle=16), "swizzle 16 B"),
    (dict(global_shape=(2,) * 6, global_strides=(1, 16, 32, 64, 128, 256), box_shape=(8,) * 6), "rank 6"),
    (dict(**G64, box_shape=(64, 0)), "dimension 1 is 0"),
    (dict(**G64, box_shape=(64, 8), element_strides=(1, 9)),
     "element stride of dimension 1 is 9"),
    (dict(global_shape=(64, 2**33), global_strides=(1, 64), box_shape=(64, 8)), "not in [1, 2^32]"),
    (dict(**G64, box_shape=(64,)), "differ in rank"),
])
def test_bad_boxes(kwargs: dict, needle: str) -> None:
    problems = check_tma(16, **kwargs)
    assert problems, kwargs
    assert any(needle in p for p in problems), problems


def test_several_problems_reported() -> None:
    problems = check_tma(16, (64, 64), (1, 60), (300, 8), swizzle=64, global_address=4, smem_address=100)
    assert len(problems) >= 4


def test_bad_element_width() -> None:
    assert "element width 12 bits" in check_tma(12, (64,), (1,), (64,))[0]
