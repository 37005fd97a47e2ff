"""``hexlayout.ops.reshape_and_cache``: new K/V rows written into a paged KV cache.

``reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *, kv_layout="NHD")``
does, for every token ``t`` with ``slot = slot_mapping[t] >= 0``::

    key_cache[slot // block_size, slot % block_size, :, :] = key[t]      # NHD: [NB, BS, KVH, D]
    value_cache[slot // block_size, slot % block_size, :, :] = value[t]

(``kv_layout="HND"``: caches ``[NB, KVH, BS, D]``, written at ``[blk, :, off, :]``). A negative
slot writes nothing (vLLM's padding tokens). ``key`` / ``value`` are ``[T, KVH, D]`` and the
caches may be any strided views whose last dimension is contiguous (vLLM's CPU build hands
one ``[NB, KVH, BS, 2·D]`` tensor per layer: its two halves ``[..., :D]`` and ``[..., D:]``
are the K and V caches in the HND layout).

The kernel (``reshape_and_cache_kernel``) is a scatter written in the language: each thread
block loads ``ROWS`` tokens of one KV head and their slots, computes ``(block, offset)`` in
registers and copies the rows into the caches through that computed index tile (an index of
-1 writes nothing). Both layouts are one kernel: the HND cache is passed as its
``[NB, BS, KVH, D]`` permuted view, so only the strides differ.

CUDA tensors launch the compiled kernel; CPU tensors run it in the emulator under
``HEXLAYOUT_EMULATE=1`` (the emulator takes C-contiguous arrays, so the CPU path runs the
kernel on contiguous copies of strided inputs and copies the caches back).
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import i32, i64

from ..attention.args import head_dim_tile
from ..host.launch import lang_dtype
from ..host.torch import require_torch
from .args import check_reshape_and_cache

__all__ = [
    "reshape_and_cache",
    "reshape_and_cache_kernel",
    "reshape_and_cache_consts",
    "run_reshape_and_cache",
]

T, KVH, D, NB, BS = hl.dims("T KVH D NB BS")
SKT, SKH, SVT, SVH = hl.dims("SKT SKH SVT SVH")  # strides of key / value
SKB, SKS, SKC, SVB, SVS, SVC = hl.dims("SKB SKS SKC SVB SVS SVC")  # strides of the caches


@cache
def reshape_and_cache_kernel(dtype: DType) -> Any:
    """The scatter kernel for ``dtype`` (f16 / bf16); constants ``HEAD_DIM`` (the head size
    padded to 64 / 128 / 256), ``BLOCK`` (the cache's block size), ``ROWS`` tokens per block."""
    dt = dtype

    @hl.kernel(threads=128, name=f"reshape_and_cache_{dt}")
    def reshape_and_cache_k(
        key: dt[T, KVH, D].strides(SKT, SKH, 1),  # type: ignore
        value: dt[T, KVH, D].strides(SVT, SVH, 1),  # type: ignore
        key_cache: dt[NB, BS, KVH, D].strides(SKB, SKS, SKC, 1),  # type: ignore
        value_cache: dt[NB, BS, KVH, D].strides(SVB, SVS, SVC, 1),  # type: ignore
        slot_mapping: i64[T],
        SKT: i32,
        SKH: i32,
        SVT: i32,
        SVH: i32,
        SKB: i32,
        SKS: i32,
        SKC: i32,
        SVB: i32,
        SVS: i32,
        SVC: i32,
        *,
        ROWS: int = 16,
        HEAD_DIM: int = 128,
        BLOCK: int = 16,
    ):
        tb, h = hl.grid(hl.spatial(hl.cdiv(key.shape[0], ROWS), key.shape[1]))
        t0 = tb * ROWS
        slots = hl.register(i64, (ROWS,))
        hl.copy(slot_mapping[t0 : t0 + ROWS], slots)  # past T: the view's extent skips them
        blk = hl.where(slots < 0, -1, slots // BLOCK)  # negative slot: index -1 writes nothing
        off = slots % BLOCK
        rk = hl.register(dt, (ROWS, HEAD_DIM))
        hl.copy(key[t0 : t0 + ROWS, h, 0:HEAD_DIM], rk)
        hl.copy(rk, key_cache[blk, off, h, 0:HEAD_DIM])  # scattered rows
        rv = hl.register(dt, (ROWS, HEAD_DIM))
        hl.copy(value[t0 : t0 + ROWS, h, 0:HEAD_DIM], rv)
        hl.copy(rv, value_cache[blk, off, h, 0:HEAD_DIM])

    return reshape_and_cache_k


def reshape_and_cache_consts(head_size: int, block_size: int) -> dict[str, int]:
    """The kernel's constants for a head size and block size: ``ROWS`` tokens per thread block
    so each thread holds 8-16 elements per tensor (no spills: 40-56 registers)."""
    hd = head_dim_tile(head_size)
    return {"HEAD_DIM": hd, "BLOCK": block_size, "ROWS": max(8, 1024 // hd)}


def _nhd(cache_: Any, kv_layout: str) -> Any:
    """The cache as its ``[NB, BS, KVH, D]`` view."""
    return cache_ if kv_layout == "NHD" else cache_.transpose(1, 2)


def reshape_and_cache(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, *, kv_layout: str = "NHD"
) -> None:
    """Write ``key[t]`` / ``value[t]`` to slot ``slot_mapping[t]`` of the caches (see the module
    docstring); negative slots are skipped. Updates the caches in place, returns ``None``."""
    require_torch("hexlayout.ops.reshape_and_cache")
    check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_layout)
    run_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_layout)


def run_reshape_and_cache(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, kv_layout: str
) -> None:
    """``reshape_and_cache`` on arguments ``check_reshape_and_cache`` accepted (``key`` /
    ``value`` read in place, or from contiguous copies when 16-byte row vectors cannot)."""
    from ..host.launch import build_for, rows_input, run_kernel

    key, value = rows_input(key), rows_input(value)
    t = key.shape[0]
    if t == 0:
        return
    kc, vc = _nhd(key_cache, kv_layout), _nhd(value_cache, kv_layout)
    consts = reshape_and_cache_consts(key.shape[2], kc.shape[1])
    bld = build_for(reshape_and_cache_kernel(lang_dtype(key.dtype)), key.device, consts)
    run_kernel(bld, (key, value, kc, vc, slot_mapping), outputs=(2, 3), strides=(0, 1, 2, 3))
