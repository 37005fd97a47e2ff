"""``hexlayout.ops.reshape_and_cache``: new K/V rows written into a paged KV cache.

``reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *, kv_layout="NHD",
kv_cache_dtype="auto", k_scale=None, v_scale=None)`` does, for every token ``t`` with ``slot =
slot_mapping[t] >= 0``::

    key_cache[slot // block_size, slot % block_size, :, :] = key[t]      # NHD: [NB, BS, KVH, D]
    value_cache[slot // block_size, slot % block_size, :, :] = value[t]

FP8 caches (vLLM's ``reshape_and_cache_flash``): ``kv_cache_dtype`` ``"fp8"`` / ``"fp8_e4m3"``
(E4M3) or ``"fp8_e5m2"`` stores ``fp8(key[t] / k_scale)`` and ``fp8(value[t] / v_scale)``,
rounded to nearest even and saturated to the format's largest finite value (448 / 57344; NaN
stays NaN), in caches of ``torch.uint8`` (as vLLM allocates them) or the format's
``torch.float8_*`` dtype; ``k_scale`` / ``v_scale`` are one-element float32 tensors (vLLM's
per-layer ``_k_scale`` / ``_v_scale``, read by the kernel: no host synchronization), numbers, or
None (1.0). Example::

    kc = torch.zeros(4, 16, 2, 64, dtype=torch.uint8)      # [NB, BS, KVH, D] E4M3 bytes
    vc = torch.zeros_like(kc)
    reshape_and_cache(key, value, kc, vc, slots, kv_cache_dtype="fp8", k_scale=torch.tensor([0.5]))

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
from hexlayout.lang import f32, i32, i64

from ..attention.args import fp8_format, head_dim_tile
from ..host.launch import lang_dtype
from ..host.torch import require_torch
from .args import check_reshape_and_cache

__all__ = [
    "reshape_and_cache",
    "reshape_and_cache_kernel",
    "reshape_and_cache_consts",
    "run_reshape_and_cache",
]

T, KVH, D, NB, BS, NSC = hl.dims("T KVH D NB BS NSC")
SKT, SKH, SVT, SVH = hl.dims("SKT SKH SVT SVH")  # strides of key / value
SKB, SKS, SKC, SVB, SVS, SVC = hl.dims("SKB SKS SKC SVB SVS SVC")  # strides of the caches


@cache
def reshape_and_cache_kernel(dtype: DType, cache_dtype: DType | None = None) -> Any:
    """The scatter kernel for ``dtype`` (f16 / bf16) into caches of ``cache_dtype`` (None: ``dtype``;
    ``e4m3`` / ``e5m2``: each row divided by its scale, ``k_scale[0]`` / ``v_scale[0]``, in f32 and
    converted with saturation); constants ``HEAD_DIM`` (the head size padded to 64 / 128 / 256),
    ``BLOCK`` (the cache's block size), ``ROWS`` tokens per block."""
    dt = dtype
    cdt = cache_dtype or dtype

    @hl.kernel(threads=128, name=f"reshape_and_cache_{dt}")
    def reshape_and_cache_k(
        key: dt[T, KVH, D].strides(SKT, SKH, 1),  # type: ignore
        value: dt[T, KVH, D].strides(SVT, SVH, 1),  # type: ignore
        key_cache: cdt[NB, BS, KVH, D].strides(SKB, SKS, SKC, 1),  # type: ignore
        value_cache: cdt[NB, BS, KVH, D].strides(SVB, SVS, SVC, 1),  # type: ignore
        slot_mapping: i64[T],
        k_scale: f32[NSC],
        v_scale: f32[NSC],
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
        for src, dst, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
            x = hl.register(dt, (ROWS, HEAD_DIM))
            hl.copy(src[t0 : t0 + ROWS, h, 0:HEAD_DIM], x)
            if cache_dtype is not None:                 # fp8(x / scale), saturated
                sc = hl.register(f32, (ROWS, 1))
                hl.copy(scale[hl.iota((ROWS, 1), 0) * 0], sc)
                x = hl.cast(hl.cast(x, f32) / sc, cdt)
            hl.copy(x, dst[blk, off, h, 0:HEAD_DIM])   # scattered rows

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
    key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, *, kv_layout: str = "NHD",
    kv_cache_dtype: str = "auto", k_scale: Any = None, v_scale: Any = None,
) -> None:
    """Write ``key[t]`` / ``value[t]`` to slot ``slot_mapping[t]`` of the caches (see the module
    docstring; FP8 caches: ``fp8(x / scale)``); negative slots are skipped. Updates the caches in
    place, returns ``None``."""
    require_torch("hexlayout.ops.reshape_and_cache")
    args = (key, value, key_cache, value_cache, slot_mapping, kv_layout, kv_cache_dtype, k_scale, v_scale)
    check_reshape_and_cache(*args)
    run_reshape_and_cache(*args)


def run_reshape_and_cache(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, kv_layout: str,
    kv_cache_dtype: str = "auto", k_scale: Any = None, v_scale: Any = None,
) -> None:
    """``reshape_and_cache`` on arguments ``check_reshape_and_cache`` accepted (``key`` /
    ``value`` read in place, or from contiguous copies when 16-byte row vectors cannot; FP8
    caches as their ``torch.float8_*`` views)."""
    from ..attention.launch_args import fp8_cache_view, scale_arg
    from ..host.launch import build_for, rows_input, run_kernel

    key, value = rows_input(key), rows_input(value)
    t = key.shape[0]
    if t == 0:
        return
    fmt = fp8_format(kv_cache_dtype)
    kc, vc = _nhd(key_cache, kv_layout), _nhd(value_cache, kv_layout)
    kc8, vc8 = fp8_cache_view(kc, fmt), fp8_cache_view(vc, fmt)
    consts = reshape_and_cache_consts(key.shape[2], kc.shape[1])
    kernel = reshape_and_cache_kernel(lang_dtype(key.dtype), getattr(hl, fmt) if fmt else None)
    bld = build_for(kernel, key.device, consts)
    ks, vs = scale_arg(k_scale, key.device), scale_arg(v_scale, key.device)
    run_kernel(bld, (key, value, kc8, vc8, slot_mapping, ks, vs), outputs=(2, 3), strides=(0, 1, 2, 3))
