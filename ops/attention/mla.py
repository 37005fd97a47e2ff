"""``hexlayout.ops.mla_decode``: multi-head latent attention (DeepSeek-V2/V3/R1) over a paged
latent cache, with the absorbed query.

``mla_decode(q, kv_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q, max_seqlen_k, *,
softmax_scale=None, kv_lora_rank=512, return_lse=False, kv_cache_dtype="auto", k_scale=None)``:

- ``q`` ``[total_q, H, kv_lora_rank + rope]`` f16 / bf16: per head the absorbed query
  (``W_UK^T q_nope``, ``kv_lora_rank`` wide) followed by the rope part ``q_pe``;
- ``kv_cache`` ``[num_blocks, block_size, kv_lora_rank + rope]`` (or vLLM's ``[num_blocks,
  block_size, 1, kv_lora_rank + rope]``), q's dtype: row ``j`` of a sequence is ``[c_j, k_pe_j]``
  (the compressed latent and the rope key), at block ``block_table[s, j // block_size]``;
- ``kv_cache_dtype`` "auto" (the cache in q's dtype) or vLLM's FP8 strings ("fp8" / "fp8_e4m3":
  E4M3, "fp8_e5m2"): the cache (uint8 as vLLM allocates it, or the ``torch.float8_*`` dtype, rows
  16-byte aligned) holds ``fp8(row / k_scale)`` (``mla_reshape_and_cache`` with the same
  arguments writes it) and row ``j`` reads as ``k_scale * kv_cache[...]``; ``k_scale`` a
  one-element float32 tensor on the device (vLLM's per-layer ``_k_scale``: no host
  synchronization), a number, or None (1.0);
- ``cu_seqlens_q`` ``[B+1]``, ``seqused_k`` ``[B]``, ``block_table`` ``[B, max_blocks]`` int32 as
  for ``paged_attention`` (decode: one query per sequence; several, e.g. speculative tokens,
  are causal bottom-right aligned);

``out[i, h] = sum_j softmax_j(scale * q[i, h] . kv_j) c_j`` (``[total_q, H, kv_lora_rank]``,
q's dtype; the values are the latents, which the caller projects with ``W_UV``), ``lse[h, i]``
the log-sum-exp (f32). ``scale`` defaults to ``1 / sqrt(kv_lora_rank + rope)``; DeepSeek passes
its own (``1 / sqrt(qk_nope + qk_rope)``, with its YaRN factor). Returns ``out`` or ``(out, lse)``.
One kernel (mma.sync) serves sm_80, sm_89 and sm_90a; ``max_seqlen_q`` sizes the grid.
"""

from __future__ import annotations

from typing import Any

import hexlayout.lang as hl
from hexlayout.runtime.args import INT32_MAX, ArgumentError

from ..host.checks import (
    check_dtype,
    check_index_tensors,
    check_one_device,
    check_rows,
    check_tensors,
    int_arg,
    rows_fit,
)
from ..host.launch import build_for, content_checks, lang_dtype, rows_input, run_kernel
from ..host.torch import require_torch
from .args import (
    _check_paged_contents,
    check_attention_options,
    check_cu_seqlens,
    check_kv_cache_dtype,
    check_kv_scale,
    fp8_format,
)
from .launch_args import attention_outputs, fp8_cache_view, scale_arg, score_scales
from .mla_kernels import mla_decode_kernel

__all__ = ["mla_decode", "run_mla_decode", "check_mla_decode", "mla_decode_consts"]

OP = "hexlayout.mla_decode"
#: Latent widths the kernel takes (multiples of its 128-column chunks) and rope widths.
LATENTS = (128, 256, 512)
ROPES = (16, 32, 64)


def latent_cache(kv_cache: Any) -> Any:
    """The cache as ``[NB, BS, D]`` (vLLM's ``[NB, BS, 1, D]`` viewed without its head mode)."""
    return kv_cache[:, :, 0, :] if kv_cache.dim() == 4 else kv_cache


def check_latent_cache_dtype(op: str, kv_cache: Any, dtype: Any, kv_cache_dtype: Any, k_scale: Any) -> None:
    """The latent cache's dtype one ``kv_cache_dtype`` allows for inputs of ``dtype`` (FP8:
    uint8 / float8 with 16-byte rows), ``k_scale`` one f32 element on its device or a number."""
    allowed = check_kv_cache_dtype(op, kv_cache_dtype, dtype)
    if kv_cache.dtype not in allowed:
        raise ArgumentError(op, "kv_cache", f"is {kv_cache.dtype}, expected {' or '.join(map(str, allowed))} "
                                            f"(kv_cache_dtype {kv_cache_dtype!r}, inputs {dtype})")
    check_kv_scale(op, "k_scale", k_scale, kv_cache.device)
    cache = latent_cache(kv_cache)
    if cache.element_size() == 1 and any(st % 16 for st in (*cache.stride()[:-1], cache.shape[-1])):
        raise ArgumentError(op, "kv_cache", f"is an FP8 cache of shape {tuple(kv_cache.shape)} and strides "
                                            f"{tuple(kv_cache.stride())}: 16-byte rows need rows and strides "
                                            "multiples of 16")


def check_mla_decode(q: Any, kv_cache: Any, cu_seqlens_q: Any, seqused_k: Any, block_table: Any,
                     max_seqlen_q: Any, max_seqlen_k: Any, softmax_scale: Any = None,
                     kv_lora_rank: Any = 512, kv_cache_dtype: Any = "auto",
                     k_scale: Any = None) -> tuple[int, int, int, int]:
    """The arguments of ``mla_decode``; raises naming the argument. Returns ``(B, H, rank,
    rope)``."""
    import torch

    tensors = [("q", q, 3), ("cu_seqlens_q", cu_seqlens_q, 1), ("seqused_k", seqused_k, 1),
               ("block_table", block_table, 2)]
    check_tensors(OP, tensors)
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() not in (3, 4) or (
            kv_cache.dim() == 4 and kv_cache.shape[2] != 1):
        got = tuple(kv_cache.shape) if isinstance(kv_cache, torch.Tensor) else type(kv_cache).__name__
        raise ArgumentError(OP, "kv_cache", "must be [num_blocks, block_size, D] or [num_blocks, block_size, "
                                            f"1, D], got {got}")
    max_q, max_k = check_attention_options(OP, max_seqlen_q, max_seqlen_k, softmax_scale, True, (-1, -1), 0.0)
    rank = int_arg(OP, "kv_lora_rank", kv_lora_rank)
    check_dtype(OP, "q", q)
    check_one_device(OP, [*tensors, ("kv_cache", kv_cache, kv_cache.dim())])
    check_index_tensors(OP, [(name, t) for name, t, _ in tensors[1:]], torch.int32)
    check_latent_cache_dtype(OP, kv_cache, q.dtype, kv_cache_dtype, k_scale)
    tq, h, d = q.shape
    cache = latent_cache(kv_cache)
    nb, bs, dc = cache.shape
    if dc != d:
        raise ArgumentError(OP, "kv_cache", f"rows are {dc} wide, q's heads {d}")
    if rank not in LATENTS or d - rank not in ROPES:
        raise ArgumentError(OP, "kv_lora_rank", f"is {rank} with rows of {d}: the kernel takes a latent of "
                                                f"{LATENTS} and a rope part of {ROPES} elements")
    if not rows_fit(cache):  # (by its storage offset under fake tensors, as the launch checks the pointer)
        raise ArgumentError(OP, "kv_cache", "needs contiguous rows at 16-byte aligned strides and start, got "
                                            f"strides {tuple(kv_cache.stride())}, offset "
                                            f"{kv_cache.storage_offset()}")
    check_rows(OP, "q", q, copied=True)
    b = seqused_k.shape[0]
    if cu_seqlens_q.shape[0] != b + 1:
        raise ArgumentError(OP, "cu_seqlens_q", f"has {cu_seqlens_q.shape[0]} entries, expected B + 1 = "
                                                f"{b + 1} (seqused_k has B = {b})")
    if block_table.shape[0] != b:
        raise ArgumentError(OP, "block_table", f"has {block_table.shape[0]} rows, expected B = {b}")
    if tq * h > INT32_MAX:
        raise ArgumentError(OP, "q", f"has {tq} x {h} rows; the kernel indexes with 32-bit int")
    if content_checks(cu_seqlens_q):
        check_cu_seqlens(OP, "cu_seqlens_q", cu_seqlens_q, "max_seqlen_q", max_q, "q", tq, "queries")
        _check_paged_contents(OP, seqused_k, block_table, max_k, bs, nb)
    return b, h, rank, d - rank


def mla_decode_consts(heads: int, rank: int, rope: int, block_size: int, max_seqlen_q: int) -> dict[str, Any]:
    """16 rows (token, head) and 32 keys per step on 4 warps (one n8 column block of S per warp;
    the 16 x rank f32 accumulator: ``rank / 8`` registers a thread); the grid's row tiles from
    ``max_seqlen_q * heads``."""
    bm = 16
    return {"BM": bm, "BN": 32, "LATENT": rank, "ROPE": rope, "DCH": 128, "BLOCK": block_size, "WARPS": 4,
            "TILES": max(1, -(-max_seqlen_q * heads // bm))}


def mla_decode(q: Any, kv_cache: Any, cu_seqlens_q: Any, seqused_k: Any, block_table: Any, max_seqlen_q: int,
               max_seqlen_k: int, *, softmax_scale: float | None = None, kv_lora_rank: int = 512,
               return_lse: bool = False, kv_cache_dtype: str = "auto", k_scale: Any = None) -> Any:
    """MLA decode over the paged latent cache (see the module docstring): ``out`` or
    ``(out, lse)``, ``out[i, h] = sum_j softmax_j(scale * q[i, h] . kv_j) kv_j[:kv_lora_rank]``.

    Example (an FP8 E4M3 cache written and read with one scale)::

        mla_reshape_and_cache(kv_c, k_pe, cache_u8, slots, kv_cache_dtype="fp8", k_scale=s)
        out = mla_decode(q, cache_u8, cu, seq_lens, block_table, 1, max_k, kv_cache_dtype="fp8", k_scale=s)
    """
    require_torch("hexlayout.ops.mla_decode")
    import torch

    args = (q, kv_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q, max_seqlen_k, softmax_scale,
            kv_lora_rank, kv_cache_dtype, k_scale)
    check_mla_decode(*args)
    out, lse = torch.ops.hexlayout.mla_decode(*args)
    return (out, lse) if return_lse else out


def run_mla_decode(q: Any, kv_cache: Any, cu_seqlens_q: Any, seqused_k: Any, block_table: Any,
                   max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float | None = None,
                   kv_lora_rank: int = 512, kv_cache_dtype: str = "auto",
                   k_scale: Any = None) -> tuple[Any, Any]:
    """``mla_decode`` on checked arguments, in the op schema's order: ``(out, lse)``."""
    q = rows_input(q)
    tq, h, d = q.shape
    cache = latent_cache(kv_cache)
    rank = int(kv_lora_rank)
    out, lse = attention_outputs(q[..., :rank], None, None)
    b = seqused_k.shape[0]
    if b == 0 or tq == 0:
        return out, lse
    qk_scale, _ = score_scales(softmax_scale, 0.0, d)
    consts = mla_decode_consts(h, rank, d - rank, cache.shape[1], int(max_seqlen_q))
    fmt = fp8_format(kv_cache_dtype)
    kernel = mla_decode_kernel(lang_dtype(q.dtype), getattr(hl, fmt) if fmt else None)
    bld = build_for(kernel, q.device, consts)
    args = (q, fp8_cache_view(cache, fmt), cu_seqlens_q, seqused_k, block_table, out, lse,
            scale_arg(k_scale, q.device), qk_scale)
    run_kernel(bld, args, outputs=(5, 6), strides=(0, 1, 4))
    return out, lse
