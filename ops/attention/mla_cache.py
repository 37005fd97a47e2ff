"""``hexlayout.ops.mla_reshape_and_cache``: a step's latents and rope keys written into MLA's
paged latent cache (vLLM's ``concat_and_cache_mla``).

``mla_reshape_and_cache(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="auto", k_scale=None)``
does, for every token ``t`` with ``slot = slot_mapping[t] >= 0``::

    kv_cache[slot // block_size, slot % block_size, :rank] = kv_c[t]     # [T, rank]
    kv_cache[slot // block_size, slot % block_size, rank:] = k_pe[t]     # [T, rope]

``kv_cache`` is ``[NB, BS, rank + rope]`` or vLLM's ``[NB, BS, 1, rank + rope]``, in the inputs'
dtype (f16 / bf16); a negative slot writes nothing. An FP8 cache (``kv_cache_dtype`` "fp8" /
"fp8_e4m3" / "fp8_e5m2", uint8 or float8, vLLM's ``concat_and_cache_mla``) stores
``fp8(x / k_scale)`` (in f32, converted with saturation) for both parts, which ``mla_decode``
with the same arguments reads back as ``k_scale * fp8``. The kernel scatters ``ROWS`` tokens per
thread block through the computed (block, offset) index tile, as ``reshape_and_cache`` does.
"""

from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32, i64
from hexlayout.runtime.args import ArgumentError

from ..host.checks import check_dtype, check_index_tensors, check_one_device, check_tensors
from ..host.launch import build_for, lang_dtype, rows_input, run_kernel
from ..host.torch import require_torch
from .args import fp8_format
from .launch_args import fp8_cache_view, scale_arg
from .mla import LATENTS, ROPES, check_latent_cache_dtype, latent_cache

__all__ = ["mla_reshape_and_cache", "mla_cache_kernel", "check_mla_reshape_and_cache",
           "run_mla_reshape_and_cache"]

OP = "hexlayout.mla_reshape_and_cache"
T, R, P, NB, BS, DQ, NSC = hl.dims("T R P NB BS DQ NSC")
SCT, SPT, SKB, SKS = hl.dims("SCT SPT SKB SKS")


@cache
def mla_cache_kernel(dtype: DType, cache_dtype: DType | None = None) -> Any:
    """The scatter for ``dtype`` into a cache of ``cache_dtype`` (None: ``dtype``; e4m3 / e5m2:
    ``fp8(x / k_scale[0])``); constants ``LATENT``, ``ROPE``, ``BLOCK`` (the cache's block size),
    ``ROWS`` tokens per thread block."""
    dt = dtype
    cdt = cache_dtype or dtype

    def stored(x: Any, scale: Any, rows: int) -> Any:
        """``x`` as the cache holds it: itself, or ``fp8(x / scale[0])`` (saturated; the scale
        loaded into a rows x 1 tile of its own, laid out for ``x``)."""
        if cache_dtype is None:
            return x
        sc = hl.register(f32, (rows, 1))
        hl.copy(scale[hl.iota((rows, 1), 0) * 0], sc)
        return hl.cast(hl.cast(x, f32) / sc, cdt)

    @hl.kernel(threads=128, name=f"mla_reshape_and_cache_{dt}")
    def mla_cache(kv_c: dt[T, R].strides(SCT, 1), k_pe: dt[T, P].strides(SPT, 1),  # type: ignore
                  kv_cache: cdt[NB, BS, DQ].strides(SKB, SKS, 1), slot_mapping: i64[T],  # type: ignore
                  k_scale: f32[NSC], SCT: i32, SPT: i32, SKB: i32, SKS: i32,
                  *, ROWS: int = 8, LATENT: int = 512, ROPE: int = 64, BLOCK: int = 64):
        t0 = hl.grid(hl.spatial(hl.cdiv(kv_c.shape[0], ROWS))) * ROWS
        slots = hl.register(i64, (ROWS,))
        hl.copy(slot_mapping[t0:t0 + ROWS], slots)            # past T: the view's extent skips them
        blk = hl.where(slots < 0, -1, slots // BLOCK)          # negative slot: index -1 writes nothing
        off = slots % BLOCK
        rc = hl.register(dt, (ROWS, LATENT))
        hl.copy(kv_c[t0:t0 + ROWS, 0:LATENT], rc)
        hl.copy(stored(rc, k_scale, ROWS), kv_cache[blk, off, 0:LATENT])
        rp = hl.register(dt, (ROWS, ROPE))
        hl.copy(k_pe[t0:t0 + ROWS, 0:ROPE], rp)
        hl.copy(stored(rp, k_scale, ROWS), kv_cache[blk, off, LATENT:LATENT + ROPE])

    return mla_cache


def check_mla_reshape_and_cache(kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any,
                                kv_cache_dtype: Any = "auto", k_scale: Any = None) -> None:
    """The arguments of ``mla_reshape_and_cache``; raises naming the argument."""
    import torch

    tensors = [("kv_c", kv_c, 2), ("k_pe", k_pe, 2), ("slot_mapping", slot_mapping, 1)]
    check_tensors(OP, tensors)
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() not in (3, 4) or (
            kv_cache.dim() == 4 and kv_cache.shape[2] != 1):
        got = tuple(kv_cache.shape) if isinstance(kv_cache, torch.Tensor) else type(kv_cache).__name__
        raise ArgumentError(OP, "kv_cache", f"must be [NB, BS, D] or [NB, BS, 1, D], got {got}")
    check_dtype(OP, "kv_c", kv_c)
    check_one_device(OP, [*tensors, ("kv_cache", kv_cache, kv_cache.dim())])
    check_index_tensors(OP, [("slot_mapping", slot_mapping)], torch.int64)
    t, rank = kv_c.shape
    if k_pe.dtype != kv_c.dtype:
        raise ArgumentError(OP, "k_pe", f"is {k_pe.dtype}, kv_c {kv_c.dtype}")
    check_latent_cache_dtype(OP, kv_cache, kv_c.dtype, kv_cache_dtype, k_scale)
    for name, x in (("k_pe", k_pe), ("slot_mapping", slot_mapping)):
        if x.shape[0] != t:
            raise ArgumentError(OP, name, f"has {x.shape[0]} rows, kv_c {t}")
    rope = k_pe.shape[1]
    cache_ = latent_cache(kv_cache)
    if cache_.shape[2] != rank + rope:
        raise ArgumentError(OP, "kv_cache", f"rows are {cache_.shape[2]} wide, kv_c + k_pe {rank + rope}")
    if rank not in LATENTS or rope not in ROPES:
        raise ArgumentError(OP, "kv_c", f"is {rank} wide with k_pe {rope}: the kernel takes latents of "
                                        f"{LATENTS} and rope keys of {ROPES} elements")
    if cache_.stride(-1) != 1:
        raise ArgumentError(OP, "kv_cache", f"needs contiguous rows, got strides {tuple(kv_cache.stride())}")


def mla_reshape_and_cache(kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any, *,
                          kv_cache_dtype: str = "auto", k_scale: Any = None) -> None:
    """Write ``[kv_c[t], k_pe[t]]`` to slot ``slot_mapping[t]`` of ``kv_cache`` (see the module
    docstring; FP8 caches: ``fp8(x / k_scale)``); negative slots are skipped. Updates the cache in
    place, returns ``None``."""
    require_torch("hexlayout.ops.mla_reshape_and_cache")
    args = (kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)
    check_mla_reshape_and_cache(*args)
    run_mla_reshape_and_cache(*args)


def run_mla_reshape_and_cache(kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any,
                              kv_cache_dtype: str = "auto", k_scale: Any = None) -> None:
    """``mla_reshape_and_cache`` on checked arguments."""
    kv_c, k_pe = rows_input(kv_c), rows_input(k_pe)
    if kv_c.shape[0] == 0:
        return
    cache_ = latent_cache(kv_cache)
    consts = {"ROWS": 8, "LATENT": kv_c.shape[1], "ROPE": k_pe.shape[1], "BLOCK": cache_.shape[1]}
    fmt = fp8_format(kv_cache_dtype)
    bld = build_for(mla_cache_kernel(lang_dtype(kv_c.dtype), getattr(hl, fmt) if fmt else None), kv_c.device,
                    consts)
    run_kernel(bld, (kv_c, k_pe, fp8_cache_view(cache_, fmt), slot_mapping, scale_arg(k_scale, kv_c.device)),
               outputs=(2,), strides=(0, 1, 2))
