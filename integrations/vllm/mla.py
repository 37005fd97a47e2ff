"""MLA (multi-head latent attention: DeepSeek-V2 / V3 / R1) through hexlayout's ``mla_decode``.

An MLA layer caches one latent row per token (``kv_lora_rank`` compressed entries plus the
shared rotary key, 512 + 64 for DeepSeek-V3) and decodes through it with absorbed projections;
vLLM resolves an MLA backend for such layers. On vLLM's CPU build the plugin overrides that
backend's entry (``register_backend(AttentionBackendEnum.CPU_MLA, ...)``) with
:class:`HexlayoutCPUMLABackend`, vLLM's CPU MLA backend whose impl writes the latent cache with
``torch.ops.hexlayout.mla_reshape_and_cache`` and runs the decode (MQA over the latent cache)
with ``torch.ops.hexlayout.mla_decode``; the prefill (MHA on the up-projected keys and values)
stays vLLM's. A layer it cannot serve (float32, latent / rope widths the kernel does not take,
several queries per decode request) runs vLLM's CPU MLA and logs why once. The impls serve FP8
latent caches (``kv_cache_dtype`` "fp8" / "fp8_e4m3" / "fp8_e5m2" with the layer's ``_k_scale``:
``mla_reshape_and_cache`` / ``mla_decode`` with ``kv_cache_dtype`` and ``k_scale``); vLLM's CPU
MLA backend declares only "auto", so on the CPU build vLLM never hands it an FP8 MLA layer. On
CUDA the plugin registers :class:`~.cuda_mla.HexlayoutCUDAMLABackend` as the ``HEXLAYOUT_MLA``
backend (:mod:`.cuda_mla`, selected with ``attention_backend="HEXLAYOUT_MLA"``); the two share
:func:`hexlayout_decode` and :func:`write_latent_cache`.

``MultiHeadLatentAttentionWrapper.register_oot(HexlayoutMLAWrapper)`` (vLLM's out-of-tree
registration of pluggable layers) makes vLLM build :class:`HexlayoutMLAWrapper` wherever it builds
its MLA layer: the same layer, which logs one line per process, when the first MLA layer is
built, naming the layer and the backend that runs its attention.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.mla import MultiHeadLatentAttentionWrapper
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend, CPUMLAImpl

from .log import flush, logger
from .pluggable import register_layer
from .trace import record, trace_dir

__all__ = ["HexlayoutMLAWrapper", "HexlayoutCPUMLABackend", "HexlayoutCPUMLAImpl", "register_mla",
           "register_cpu_mla", "hexlayout_decode", "write_latent_cache", "mla_unsupported_reason"]

#: Whether this process logged its MLA line.
_logged = False


def mla_backend_name(layer: MultiHeadLatentAttentionWrapper) -> str:
    """The name of the attention backend vLLM chose for an MLA layer (``?`` if it has none yet)."""
    backend = getattr(getattr(layer, "mla_attn", None), "attn_backend", None)
    return backend.get_name() if backend is not None else "?"


def mla_unsupported_reason(impl: Any) -> str | None:
    """Why hexlayout's ``mla_decode`` cannot serve an MLA layer (a vLLM MLA impl: its cache
    dtype, latent and rope widths), or ``None``."""
    from hexlayout.ops.attention.mla import LATENTS, ROPES

    if impl.kv_cache_dtype not in SERVED_CACHE_DTYPES:
        return f"KV cache dtype {impl.kv_cache_dtype}"
    if impl.kv_lora_rank not in LATENTS or impl.qk_rope_head_dim not in ROPES:
        return f"latent {impl.kv_lora_rank} + rope {impl.qk_rope_head_dim} (hexlayout: {LATENTS} + {ROPES})"
    return None


def cache_dtype_and_scale(impl: Any, layer: Any, k_scale: Any = None) -> tuple[str, Any]:
    """The ``kv_cache_dtype`` and ``k_scale`` hexlayout's MLA ops take for a layer: ("auto",
    None) for a cache in the model's dtype; an FP8 cache's vLLM string and scale (``k_scale``, or
    the layer's ``_k_scale``: a one-element f32 tensor on the device)."""
    if impl.kv_cache_dtype in ("auto", "float16", "bfloat16"):
        return "auto", None
    return impl.kv_cache_dtype, k_scale if k_scale is not None else layer._k_scale


HALVES = (torch.float16, torch.bfloat16)
#: vLLM's ``kv_cache_dtype`` strings hexlayout's MLA serves: the model's dtype, FP8 (one scale).
SERVED_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
#: The wrapper's reason when the layer's backend is none of hexlayout's.
NOT_SELECTED = "hexlayout's MLA backends: CPU_MLA on the CPU build, HEXLAYOUT_MLA on CUDA when selected"


def hexlayout_decode(impl: Any, q: Any, kv_c_and_k_pe_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     seq_lens: torch.Tensor, block_table: torch.Tensor,
                     layer: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode requests' MQA over the latent cache by ``torch.ops.hexlayout.mla_decode``, one
    query per request: ``out[b, h] = sum_j softmax_j(scale * q[b, h] . kv_j) kv_j[:rank]`` over
    the ``seq_lens[b]`` cached rows ``kv_j`` of request ``b`` (read through ``block_table[b]``;
    an FP8 cache's rows times the layer's ``_k_scale``), ``[B, H, kv_lora_rank]``, and its
    log-sum-exp ``[B, H]`` (f32). ``q`` is ``[B, H, rank + rope]`` or vLLM's ``(q_nope, q_pe)``
    pair. No host synchronization: ``max_seqlen_k`` is the block table's capacity, an upper
    bound; the trace (which reads the lengths) is skipped while a CUDA graph is captured."""
    from hexlayout.runtime.capture import capturing

    if isinstance(q, tuple):
        q = torch.cat(q, dim=-1)
    bound = block_table.shape[1] * kv_c_and_k_pe_cache.shape[1]
    cache_dtype, k_scale = cache_dtype_and_scale(impl, layer)
    cache = kv_c_and_k_pe_cache if cache_dtype == "auto" else kv_c_and_k_pe_cache.view(torch.uint8)
    out, lse = torch.ops.hexlayout.mla_decode(q, cache, cu_seqlens_q, seq_lens.to(torch.int32),
                                              block_table.to(torch.int32), 1, bound, impl.scale,
                                              impl.kv_lora_rank, cache_dtype, k_scale)
    if trace_dir() is not None and not capturing():
        shapes = {"num_seqs": seq_lens.shape[0], "num_heads": q.shape[1], "kv_lora_rank": impl.kv_lora_rank,
                  "rope": impl.qk_rope_head_dim, "max_seqlen_k": int(seq_lens.max())}
        record("mla_decode", shapes, q.dtype)
    return out, lse.transpose(0, 1)


def write_latent_cache(impl: Any, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                       slot_mapping: torch.Tensor, k_scale: Any = None) -> bool:
    """The step's latents ``kv_c_normed [T, rank]`` and rope keys ``k_pe [T, 1, rope]`` into the
    cache rows ``slot_mapping [T]`` (``mla_reshape_and_cache``; negative slots write nothing; an
    FP8 cache gets ``fp8(x / k_scale)``); False (nothing written) where hexlayout does not serve
    the layer or these dtypes."""
    if impl.hexlayout_reason is not None or kv_cache.numel() == 0 or kv_c_normed.dtype not in HALVES:
        return False
    cache_dtype, scale = cache_dtype_and_scale(impl, None, k_scale)
    if cache_dtype == "auto" and kv_cache.dtype != kv_c_normed.dtype:
        return False
    cache = kv_cache if cache_dtype == "auto" else kv_cache.view(torch.uint8)
    n = slot_mapping.shape[0]
    torch.ops.hexlayout.mla_reshape_and_cache(kv_c_normed[:n], k_pe.reshape(k_pe.shape[0], -1)[:n],
                                              cache, slot_mapping.to(torch.int64), cache_dtype, scale)
    return True


class HexlayoutCPUMLAImpl(CPUMLAImpl):
    """vLLM's CPU MLA impl whose latent-cache write and decode are hexlayout's kernels
    (``mla_reshape_and_cache``, ``mla_decode``); prefill and everything else is vLLM's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hexlayout_reason = mla_unsupported_reason(self)

    def forward_mqa(self, q: Any, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: Any,
                    layer: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``out [B, H, kv_lora_rank]`` of the decode requests (one query each), by
        :func:`hexlayout_decode`; no LSE (``can_return_lse_for_decode`` is False)."""
        dec = attn_metadata.decode
        b = dec.seq_lens.shape[0]
        first = q[0] if isinstance(q, tuple) else q
        if self.hexlayout_reason is not None or first.dtype not in HALVES or first.shape[0] != b:
            return super().forward_mqa(q, kv_c_and_k_pe_cache, attn_metadata, layer)
        cu = torch.arange(b + 1, dtype=torch.int32, device=dec.seq_lens.device)
        out, _ = hexlayout_decode(self, q, kv_c_and_k_pe_cache, cu, dec.seq_lens, dec.block_table, layer)
        return out, None

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor) -> None:
        """The step's latents and rope keys into the cache (:func:`write_latent_cache`)."""
        if not write_latent_cache(self, kv_c_normed, k_pe, kv_cache, slot_mapping, k_scale):
            super().do_kv_cache_update(kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)


class HexlayoutCPUMLABackend(CPUMLABackend):
    """vLLM's CPU MLA backend with :class:`HexlayoutCPUMLAImpl`."""

    @staticmethod
    def get_impl_cls() -> type[HexlayoutCPUMLAImpl]:
        return HexlayoutCPUMLAImpl


def register_cpu_mla() -> str:
    """Override vLLM's ``CPU_MLA`` entry with :class:`HexlayoutCPUMLABackend`; returns what was
    swapped, for the log."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    path = f"{HexlayoutCPUMLABackend.__module__}.{HexlayoutCPUMLABackend.__qualname__}"
    register_backend(AttentionBackendEnum.CPU_MLA, path)
    return f"attention backend CPU_MLA -> {path}"


class HexlayoutMLAWrapper(MultiHeadLatentAttentionWrapper):
    """vLLM's MLA layer, unchanged, logging (once per process) which attention runs it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        global _logged
        if not _logged:
            _logged = True
            flush()
            impl = getattr(getattr(self, "mla_attn", None), "impl", None)
            name = getattr(self, "prefix", "?")
            if hasattr(impl, "hexlayout_reason") and impl.hexlayout_reason is None:
                logger.info("hexlayout: %s: MLA attention runs hexlayout's mla_decode (%s backend)", name,
                            mla_backend_name(self))
            else:
                why = getattr(impl, "hexlayout_reason", None) or NOT_SELECTED
                logger.info("hexlayout: %s: MLA attention keeps vLLM's %s backend (%s)", name,
                            mla_backend_name(self), why)


def register_mla() -> str:
    """Register :class:`HexlayoutMLAWrapper` for vLLM's MLA layer (once per process:
    :func:`.pluggable.register_layer`); returns what was swapped, for the log."""
    return register_layer(MultiHeadLatentAttentionWrapper, HexlayoutMLAWrapper, " (logs only)")
