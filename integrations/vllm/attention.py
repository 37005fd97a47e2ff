"""hexlayout's paged attention as vLLM's CPU attention backend (``CPU_ATTN``).

vLLM's ``CpuPlatform`` always resolves ``AttentionBackendEnum.CPU_ATTN``, so the plugin
overrides that entry (``register_backend``) with :class:`HexlayoutCPUAttentionBackend`, a
``CPUAttentionBackend`` whose impl (:class:`HexlayoutCPUAttentionImpl`) owns the KV cache's
interior:

- the cache vLLM hands a layer is one ``[num_blocks, KVH, block_size, 2*D]`` tensor; hexlayout
  reads it as vLLM's CPU kernels split it, ``view(num_blocks, KVH, 2*block_size, D)`` then K =
  rows ``[:block_size]``, V = rows ``[block_size:]`` (each an ``[NB, KVH, BS, D]`` "HND" view
  with a contiguous head slab);
- ``do_kv_cache_update`` writes the step's keys and values with
  ``torch.ops.hexlayout.reshape_and_cache`` (slot ``s`` = row ``s % BS`` of block ``s // BS``;
  negative slots skipped);
- ``forward`` runs ``torch.ops.hexlayout.paged_attention`` once over the whole batch, prefill
  and decode sequences mixed (``query_start_loc``, ``seq_lens``, ``block_table`` of vLLM's
  metadata; causal bottom-right, a sliding window ``w`` as ``(w - 1, 0)``, softcap), and writes
  ``output[:num_actual_tokens]``; ``attn_metadata is None`` (the profile run) writes nothing.

Attention sinks (gpt-oss) go to the kernels as f32 ``sinks``; an FP8 KV cache
(``kv_cache_dtype`` "fp8", "fp8_e4m3", "fp8_e5m2") is written and read with the layer's
``_k_scale`` / ``_v_scale`` (``fp8(x / scale)`` stored, ``scale * fp8`` read). vLLM's own CPU
kernels read an FP8 cache only on x86 with AVX-512 or AMX, and its metadata builder refuses one
elsewhere; hexlayout's kernels read it on any host and use none of the builder's CPU scheduler
metadata, so there :class:`HexlayoutCPUAttentionMetadataBuilder` builds that metadata as for a
cache in the model's dtype, and a layer hexlayout does not serve raises (vLLM cannot run it).

A layer hexlayout cannot serve (encoder attention, ALiBi, float32, a head size past 256 or not
a multiple of 8 (of 16 with an FP8 cache), a block size other than 32, 64 or 128) keeps vLLM's
CPU kernels for both the cache update and the attention, so the cache's interior always
matches its reader. Each layer logs once which it runs.
"""

from __future__ import annotations

import copy
from typing import Any

import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.*
import torch
from hexlayout.ops.attention.args import KV_CACHE_DTYPES
from vllm.config import get_current_vllm_config
from vllm.utils.torch_utils import is_quantized_kv_cache
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
)

from .cuda_attention import kv_cache_dtype_of, kv_scales, sinks_f32
from .log import flush, logger
from .trace import record_attention, trace_dir

__all__ = [
    "HexlayoutCPUAttentionBackend",
    "HexlayoutCPUAttentionImpl",
    "HexlayoutCPUAttentionMetadataBuilder",
    "split_cpu_kv_cache",
    "vllm_reads_fp8_cache",
    "register_attention",

]

#: Block sizes of vLLM's CPU cache (multiples of 32) that hexlayout's paged attention takes.
BLOCK_SIZES = (32, 64, 128)


def split_cpu_kv_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[NB, KVH, BS, D]`` views of vLLM's CPU cache ``[NB, KVH, BS, 2*D]`` (vLLM's own
    split: the first ``BS*D`` elements of each (block, head) are K, the next V)."""
    nb, kvh, bs, d2 = kv_cache.shape
    both = kv_cache.view(nb, kvh, 2 * bs, d2 // 2)
    return both[:, :, :bs], both[:, :, bs:]


def vllm_reads_fp8_cache() -> bool:
    """Whether vLLM's own CPU attention kernels read an FP8 KV cache on this host (x86 with
    AVX-512 or AMX: vLLM 0.32's ``_get_attn_isa`` condition)."""
    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_supported())


def unsupported_reason(impl: CPUAttentionBackendImpl, dtype: torch.dtype) -> str | None:
    """Why hexlayout cannot serve a layer known at construction, or ``None``."""
    if impl.attn_type != AttentionType.DECODER:
        return f"{impl.attn_type} attention"
    if impl.alibi_slopes is not None:
        return "ALiBi slopes"
    if impl.is_fp8_kv_cache and impl.kv_cache_dtype not in KV_CACHE_DTYPES:
        return f"KV cache dtype {impl.kv_cache_dtype}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dtype} (hexlayout: float16, bfloat16)"
    if impl.head_size > 256 or impl.head_size % 8:
        return f"head size {impl.head_size} (hexlayout: multiples of 8 up to 256)"
    if impl.is_fp8_kv_cache and impl.head_size % 16:
        return f"head size {impl.head_size} with an FP8 KV cache (hexlayout: multiples of 16)"
    return None


class HexlayoutCPUAttentionImpl(CPUAttentionBackendImpl):
    """vLLM's CPU attention impl with hexlayout's ``reshape_and_cache`` and ``paged_attention``
    (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        flush()
        self.hexlayout_reason = unsupported_reason(self, get_current_vllm_config().model_config.dtype)
        self._hexlayout_checked = False

    def _hexlayout(self, layer: Any, kv_cache: torch.Tensor) -> bool:
        """Whether this layer runs hexlayout's kernels (decided, and logged, on its first call:
        the block size comes with the cache)."""
        if not self._hexlayout_checked:
            self._hexlayout_checked = True
            bs = kv_cache.shape[2]
            if self.hexlayout_reason is None and bs not in BLOCK_SIZES:
                self.hexlayout_reason = f"block size {bs} (hexlayout: {', '.join(map(str, BLOCK_SIZES))})"
            name = getattr(layer, "layer_name", "?")
            if self.hexlayout_reason is not None and self.is_fp8_kv_cache and not vllm_reads_fp8_cache():
                raise NotImplementedError(
                    f"hexlayout attention: {name}: kv_cache_dtype {self.kv_cache_dtype!r} with "
                    f"{self.hexlayout_reason}: hexlayout cannot serve this layer and vLLM's CPU "
                    "attention reads an FP8 cache only on x86 with AVX-512 or AMX"
                )
            if self.hexlayout_reason is None:
                logger.info("hexlayout: %s: attention runs hexlayout's paged_attention", name)
            else:
                logger.info("hexlayout: %s: keeping vLLM's CPU attention (%s)", name, self.hexlayout_reason)
        return self.hexlayout_reason is None

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        if not self._hexlayout(layer, kv_cache):
            return super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        n = min(key.shape[0], slot_mapping.shape[0])
        kc, vc = split_cpu_kv_cache(kv_cache)
        torch.ops.hexlayout.reshape_and_cache(
            key[:n], value[:n], kc, vc, slot_mapping[:n], "HND", kv_cache_dtype_of(self),
            *kv_scales(self, layer),
        )

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if (
            attn_metadata is None
            or output_scale is not None
            or output_block_scale is not None
            or not self._hexlayout(layer, kv_cache)
        ):
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
            )
        if attn_metadata.dynamic_causal is not None:
            raise NotImplementedError(
                "hexlayout attention: per-request causal masks (dynamic_causal) are not supported; "
                "run with HEXLAYOUT_VLLM=moe to keep vLLM's attention"
            )
        n = attn_metadata.num_actual_tokens
        kc, vc = split_cpu_kv_cache(kv_cache)
        window = (self.sliding_window - 1, 0) if self.sliding_window > 0 else (-1, -1)
        out, _ = torch.ops.hexlayout.paged_attention(
            query[:n],
            kc,
            vc,
            attn_metadata.query_start_loc,
            attn_metadata.seq_lens,
            attn_metadata.block_table,
            attn_metadata.max_query_len,
            attn_metadata.max_seq_len,
            self.scale,
            bool(attn_metadata.causal),
            list(window),
            float(self.logits_soft_cap),
            "HND",
            0,
            sinks_f32(self),
            kv_cache_dtype_of(self),
            *kv_scales(self, layer),
        )
        output[:n].copy_(out)
        if trace_dir() is not None:
            features = {"sinks": int(self.sinks is not None), "window": window[0],
                        "kv_cache_dtype": kv_cache_dtype_of(self)}
            trace_attention(query[:n], kc, attn_metadata, features)
        return output


def trace_attention(query: torch.Tensor, key_cache: torch.Tensor, md: Any,
                    features: dict[str, Any] | None = None) -> None:
    """One trace line per part of the batch the call ran (:func:`.trace.record_attention`), with
    the call's ``features``: ``sinks`` (1 with gpt-oss's per-head sinks), ``window`` (the left
    window ``w - 1`` of a sliding window ``w``, -1 for none) and ``kv_cache_dtype``."""
    record_attention(query, key_cache.shape[1], key_cache.shape[2], md, features)


class HexlayoutCPUAttentionMetadataBuilder(CPUAttentionMetadataBuilder):
    """vLLM's CPU attention metadata builder; with an FP8 KV cache on a host where vLLM's CPU
    kernels cannot read one (:func:`vllm_reads_fp8_cache` false), its ISA choice and scheduler
    metadata are made as for a cache in the model's dtype ("auto"): hexlayout's
    ``paged_attention`` reads only ``query_start_loc``, ``seq_lens``, ``block_table`` and the
    lengths, which do not depend on the cache's dtype."""

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: Any) -> None:
        if not is_quantized_kv_cache(vllm_config.cache_config.cache_dtype) or vllm_reads_fp8_cache():
            super().__init__(kv_cache_spec, layer_names, vllm_config, device)
            return
        cache = copy.copy(vllm_config.cache_config)
        cache.cache_dtype = "auto"
        config = copy.copy(vllm_config)
        config.cache_config = cache
        super().__init__(kv_cache_spec, layer_names, config, device)
        self.vllm_config = vllm_config


class HexlayoutCPUAttentionBackend(CPUAttentionBackend):
    """vLLM's CPU attention backend with :class:`HexlayoutCPUAttentionImpl` and
    :class:`HexlayoutCPUAttentionMetadataBuilder` (same metadata, cache shape and name)."""

    @staticmethod
    def get_impl_cls() -> type[HexlayoutCPUAttentionImpl]:
        return HexlayoutCPUAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[HexlayoutCPUAttentionMetadataBuilder]:
        return HexlayoutCPUAttentionMetadataBuilder


def register_attention() -> str:
    """Override vLLM's ``CPU_ATTN`` entry with :class:`HexlayoutCPUAttentionBackend`; returns
    what was swapped, for the log."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    path = f"{HexlayoutCPUAttentionBackend.__module__}.{HexlayoutCPUAttentionBackend.__qualname__}"
    register_backend(AttentionBackendEnum.CPU_ATTN, path)
    return f"attention backend CPU_ATTN -> {path}"
