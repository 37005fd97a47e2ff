"""TMA tensor maps: the ``cuTensorMapEncodeTiled`` parameters of a ``TmaDesc`` for one
launch, and the driver call that encodes them.

``tensormap_params(desc, shape, strides, elem_bytes, ptr)`` is pure: from the global
tensor's shape and strides (elements, in the parameter's mode order) and its data pointer
it computes what the driver takes - data type, rank, global address, global dimensions
(innermost first, in ``desc.dims`` order), global strides in **bytes** of dimensions
``1..rank-1``, box dimensions (``desc.box``), element strides (all 1), interleave none,
the swizzle mode of ``desc.swizzle_bytes``, L2 promotion and the out-of-bounds fill
(``oob_fill_zero``: zeros, else NaN). ``TensorMapParams.problems()`` checks them with
``hexlayout.arch.tma.check_tma``. Dimensions of extent 1 are never stepped over, so their
byte stride is free: it is rounded up to a legal multiple of 16 bytes.

``encode_tensor_map(params)`` calls the driver (GPU machines only) and returns the
128-byte ``CUtensorMap`` that the kernel takes by value as a ``__grid_constant__``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from hexlayout.arch.tma import check_tma
from hexlayout.ir.lowered import TmaDesc

__all__ = ["TensorMapParams", "tensormap_params", "encode_tensor_map", "tensor_map_bytes",
           "TMA_DATA_TYPES", "TENSOR_MAP_BYTES", "L2_PROMOTIONS"]

#: Size of a ``CUtensorMap`` (it is 64-byte aligned).
TENSOR_MAP_BYTES = 128

#: hexlayout dtype name -> ``CUtensorMapDataType`` member name. 8-bit floats travel as bytes.
TMA_DATA_TYPES: dict[str, str] = {
    "f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
    "bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
    "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
    "tf32": "CU_TENSOR_MAP_DATA_TYPE_TFLOAT32",
    "f64": "CU_TENSOR_MAP_DATA_TYPE_FLOAT64",
    "s32": "CU_TENSOR_MAP_DATA_TYPE_INT32",
    "u32": "CU_TENSOR_MAP_DATA_TYPE_UINT32",
    "s64": "CU_TENSOR_MAP_DATA_TYPE_INT64",
    "b16": "CU_TENSOR_MAP_DATA_TYPE_UINT16",
    "s8": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    "u8": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    "e4m3": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    "e5m2": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
}

_SWIZZLES = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
             64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}
#: L2 promotion in bytes -> ``CUtensorMapL2promotion`` member name.
L2_PROMOTIONS = {0: "CU_TENSOR_MAP_L2_PROMOTION_NONE", 64: "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
       128: "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", 256: "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"}


class TensorMapParams(NamedTuple):
    """The arguments of ``cuTensorMapEncodeTiled`` (enum members by name; dims innermost first).

    A named tuple: hashable (the launcher caches encoded maps by it) and cheap to re-address
    with ``params._replace(global_address=...)``.
    """

    name: str                          # the TmaDesc (kernel argument) name
    param: str                         # the global tensor parameter
    data_type: str                     # CUtensorMapDataType member
    elem_bytes: int
    rank: int
    global_address: int
    global_dims: tuple[int, ...]       # elements, innermost first
    global_strides: tuple[int, ...]    # bytes, dimensions 1 .. rank-1
    box_dims: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: str
    swizzle: str
    swizzle_bytes: int
    l2_promotion: str
    oob_fill: str

    def problems(self) -> tuple[str, ...]:
        """What makes these parameters illegal (``check_tma`` plus zero extents); empty when legal."""
        return _problems(self)


@lru_cache(maxsize=4096)
def _problems(p: TensorMapParams) -> tuple[str, ...]:
    out: list[str] = []
    if any(d == 0 for d in p.global_dims):
        out.append(f"global dimensions {p.global_dims} contain 0 (a tensor map needs extents >= 1)")
    eb = p.elem_bytes
    strides_el = [1] + [s // eb for s in p.global_strides]
    dims = [max(d, 1) for d in p.global_dims]
    out += check_tma(8 * eb, dims, strides_el, p.box_dims, swizzle=p.swizzle_bytes,
                     global_address=p.global_address, element_strides=p.element_strides)
    return tuple(out)


def tensormap_params(desc: TmaDesc, shape: Sequence[int], strides: Sequence[int], elem_bytes: int,
                     ptr: int, *, l2_promotion: int = 128) -> TensorMapParams:
    """``cuTensorMapEncodeTiled`` parameters for ``desc`` over a tensor of ``shape`` / ``strides``
    (elements, the parameter's own mode order) at address ``ptr``.

    Raises ``ValueError`` when the element width or a mode index does not fit; legality of the
    resulting map is reported by ``TensorMapParams.problems()`` rather than raised.
    """
    dt = desc.param.dtype
    try:
        data_type = TMA_DATA_TYPES[dt.name]
    except KeyError:
        raise ValueError(f"tensor map {desc.name}: element type {dt} has no TMA data type") from None
    if dt.bits != 8 * elem_bytes:
        raise ValueError(f"tensor map {desc.name}: {elem_bytes}-byte elements given for {dt}")
    rank = len(desc.dims)
    if len(desc.box) != rank or any(not 0 <= m < len(shape) for m in desc.dims):
        raise ValueError(f"tensor map {desc.name}: box {desc.box} / dims {desc.dims} do not fit a "
                         f"rank-{len(shape)} tensor")
    dims = tuple(int(shape[m]) for m in desc.dims)
    gstrides = []
    for m in desc.dims[1:]:
        sb = int(strides[m]) * elem_bytes
        if int(shape[m]) == 1:           # never stepped over: any legal stride will do
            sb = max(16, -(-sb // 16) * 16)
        gstrides.append(sb)
    if desc.swizzle_bytes not in _SWIZZLES:
        raise ValueError(f"tensor map {desc.name}: swizzle {desc.swizzle_bytes} B is not 0, 32, 64 or 128")
    oob = "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE" if desc.oob_fill_zero or not dt.is_float \
        else "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA"
    return TensorMapParams(
        name=desc.name, param=desc.param.name, data_type=data_type, elem_bytes=elem_bytes, rank=rank,
        global_address=int(ptr), global_dims=dims, global_strides=tuple(gstrides),
        box_dims=tuple(int(b) for b in desc.box), element_strides=(1,) * rank,
        interleave="CU_TENSOR_MAP_INTERLEAVE_NONE", swizzle=_SWIZZLES[desc.swizzle_bytes],
        swizzle_bytes=desc.swizzle_bytes, l2_promotion=L2_PROMOTIONS[l2_promotion], oob_fill=oob)


def encode_tensor_map(p: TensorMapParams) -> Any:
    """Encode ``p`` with the driver's ``cuTensorMapEncodeTiled``; returns a ``CUtensorMap``.

    Needs a CUDA driver (GPU machines); raises ``RuntimeError`` with the driver's error name.
    """
    from cuda.bindings import driver as drv

    err, tmap = drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, p.data_type), p.rank, p.global_address,
        [drv.cuuint64_t(d) for d in p.global_dims],
        [drv.cuuint64_t(s) for s in p.global_strides],
        [drv.cuuint32_t(b) for b in p.box_dims],
        [drv.cuuint32_t(e) for e in p.element_strides],
        getattr(drv.CUtensorMapInterleave, p.interleave),
        getattr(drv.CUtensorMapSwizzle, p.swizzle),
        getattr(drv.CUtensorMapL2promotion, p.l2_promotion),
        getattr(drv.CUtensorMapFloatOOBfill, p.oob_fill),
    )
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed for tensor map {p.name} of {p.param!r}: "
                           f"{err.name}; parameters {p}")
    return tmap


def tensor_map_bytes(tmap: Any) -> bytes:
    """The 128 bytes of an encoded ``CUtensorMap`` (what the kernel receives by value)."""
    return ctypes.string_at(int(tmap.getPtr()), TENSOR_MAP_BYTES)
