"""TMA tensor-map parameters (``cuTensorMapEncodeTiled`` arguments) computed without a driver,
checked with ``hexlayout.arch.tma.check_tma``."""

from __future__ import annotations

import pytest

from hexlayout.arch.tma import check_tma
from hexlayout.ir.lowered import TmaDesc
from hexlayout.ir.tile import GlobalParam
from hexlayout.ir.types import bf16, f16, f32, u4
from hexlayout.runtime.tensormap import TensorMapParams, tensormap_params


def _desc(dtype=f16, box=(64, 128), dims=(1, 0), swizzle=128, rank=2, zero=True) -> TmaDesc:
    p = GlobalParam("a", dtype, tuple(f"s{i}" for i in range(rank)), tuple(f"t{i}" for i in range(rank)))
    return TmaDesc("tma_a", p, box, dims, swizzle, zero)


def _check(p: TensorMapParams) -> list[str]:
    """check_tma on the parameters exactly as they go to the driver."""
    strides = [1] + [s // p.elem_bytes for s in p.global_strides]
    return check_tma(8 * p.elem_bytes, p.global_dims, strides, p.box_dims, swizzle=p.swizzle_bytes,
                     global_address=p.global_address, element_strides=p.element_strides)


def test_row_major_gemm_operand(gemm90) -> None:
    desc = gemm90.lowered.tma[0]
    p = tensormap_params(desc, (200, 64), (64, 1), 2, 0x7f0000001000)
    assert p.data_type == "CU_TENSOR_MAP_DATA_TYPE_FLOAT16" and p.rank == 2
    assert p.global_address == 0x7f0000001000
    assert p.global_dims == (64, 200)            # innermost (K) first
    assert p.global_strides == (128,)            # bytes, dimensions >= 1 only
    assert p.box_dims == desc.box == (64, 128)
    assert p.element_strides == (1, 1)
    assert p.interleave == "CU_TENSOR_MAP_INTERLEAVE_NONE"
    assert p.swizzle == "CU_TENSOR_MAP_SWIZZLE_128B" and p.swizzle_bytes == 128
    assert p.l2_promotion == "CU_TENSOR_MAP_L2_PROMOTION_L2_128B"
    assert p.oob_fill == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"
    assert _check(p) == [] and p.problems() == ()


def test_three_modes_in_desc_order() -> None:
    # a (B, N, K) tensor with padded rows, innermost K then B then N as the lowering may list them
    desc = _desc(f32, box=(32, 1, 64), dims=(2, 0, 1), swizzle=128, rank=3)
    p = tensormap_params(desc, (3, 100, 32), (100 * 40, 40, 1), 4, 0x1000)
    assert p.global_dims == (32, 3, 100)
    assert p.global_strides == (100 * 40 * 4, 40 * 4)
    assert p.box_dims == (32, 1, 64)
    assert _check(p) == [] and p.problems() == ()


def test_extent_one_dimensions_get_a_legal_stride() -> None:
    p = tensormap_params(_desc(), (1, 64), (3, 1), 2, 0x1000)       # the row stride is never used
    assert p.global_strides == (16,) and p.problems() == ()


def test_dtypes_swizzles_and_fill() -> None:
    p = tensormap_params(_desc(bf16, box=(32, 64), swizzle=64, zero=False), (64, 64), (64, 1), 2, 0)
    assert p.data_type == "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16" and p.swizzle == "CU_TENSOR_MAP_SWIZZLE_64B"
    assert p.oob_fill == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA"
    p = tensormap_params(_desc(box=(8, 8), swizzle=0), (64, 64), (64, 1), 2, 0, l2_promotion=256)
    assert p.swizzle == "CU_TENSOR_MAP_SWIZZLE_NONE" and p.l2_promotion.endswith("L2_256B")
    with pytest.raises(ValueError, match="has no TMA data type"):
        tensormap_params(_desc(u4), (64, 64), (64, 1), 1, 0)
    with pytest.raises(ValueError, match="4-byte elements given for f16"):
        tensormap_params(_desc(), (64, 64), (64, 1), 4, 0)
    with pytest.raises(ValueError, match="do not fit a rank-1 tensor"):
        tensormap_params(_desc(), (64,), (1,), 2, 0)


@pytest.mark.parametrize(("shape", "strides", "ptr", "desc", "problem"), [
    ((64, 100), (60, 1), 0x1000, _desc(), "global stride of dimension 1 is 120 bytes"),
    ((64, 64), (64, 1), 0x1008, _desc(), "not 16-byte aligned"),
    ((64, 64), (64, 1), 0x1000, _desc(box=(128, 64)), "more than the 128-byte swizzle span"),
    ((64, 64), (64, 1), 0x1000, _desc(box=(64, 512)), "box extent of dimension 1 is 512"),
    ((64, 64), (64, 1), 0x1000, _desc(box=(4, 64), swizzle=0), "inner box row is 8 bytes"),
    ((0, 64), (64, 1), 0x1000, _desc(), "contain 0"),
])
def test_illegal_maps_are_reported(shape, strides, ptr, desc, problem) -> None:
    p = tensormap_params(desc, shape, strides, 2, ptr)
    assert any(problem in s for s in p.problems()), p.problems()


def test_params_are_hashable_and_readdressable() -> None:
    p = tensormap_params(_desc(), (64, 64), (64, 1), 2, 0x1000)
    q = p._replace(global_address=0x2000)
    assert hash(p) != hash(q) and q._replace(global_address=0x1000) == p
