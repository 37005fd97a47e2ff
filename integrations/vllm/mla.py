"""MLA (multi-head latent attention: DeepSeek-V2 / V3 / R1) through hexlayout's ``mla_decode``.

An MLA layer caches one latent row per token (``kv_lora_rank`` compressed entries plus the
shared rotary key, 512 + 64 for DeepSeek-V3) and decodes through it with absorbed projections;
vLLM resolves an MLA backend for such layers. On vLLM's CPU build the plugin overrides that
backend's entry (``register_backend(AttentionBackendEnum.CPU_MLA, ...)``) with
:class:`HexlayoutCPUMLABackend`, vLLM's CPU MLA backend whose impl writes the latent cache with
``torch.ops.hexlayout.mla_reshape_and_cache`` and runs the decode (MQA over the latent cache)
with ``torch.ops.hexlayout.mla_decode``; the prefill (MHA on the up-projected keys and values)
stays vLLM's. A layer it cannot serve (an fp8 cache, float32, latent / rope widths the kernel
does not take, several queries per decode request) runs vLLM's CPU MLA and logs why once. On
CUDA vLLM's own MLA backends (FlashMLA, Triton MLA, ...) run: the plugin registers none there.

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
from .trace import record, trace_dir

__all__ = ["HexlayoutMLAWrapper", "HexlayoutCPUMLABackend", "HexlayoutCPUMLAImpl", "register_mla",
           "register_cpu_mla"]

#: Whether this process logged its MLA line / registered the wrapper.
_logged = False
_registered = False


def mla_backend_name(layer: MultiHeadLatentAttentionWrapper) -> str:
    """The name of the attention backend vLLM chose for an MLA layer (``?`` if it has none yet)."""
    backend = getattr(getattr(layer, "mla_attn", None), "attn_backend", None)
    return backend.get_name() if backend is not None else "?"


def mla_unsupported_reason(impl: CPUMLAImpl) -> str | None:
    """Why hexlayout's ``mla_decode`` cannot serve an MLA layer (vLLM's CPU MLA impl), or ``None``."""
    from hexlayout.ops.attention.mla import LATENTS, ROPES

    if impl.kv_cache_dtype not in ("auto", "float16", "bfloat16"):
        return f"KV cache dtype {impl.kv_cache_dtype}"
    if impl.kv_lora_rank not in LATENTS or impl.qk_rope_head_dim not in ROPES:
        return f"latent {impl.kv_lora_rank} + rope {impl.qk_rope_head_dim} (hexlayout: {LATENTS} + {ROPES})"
    return None


class HexlayoutCPUMLAImpl(CPUMLAImpl):
    """vLLM's CPU MLA impl whose latent-cache write and decode are hexlayout's kernels
    (``mla_reshape_and_cache``, ``mla_decode``); prefill and everything else is vLLM's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hexlayout_reason = mla_unsupported_reason(self)

    def forward_mqa(self, q: Any, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: Any,
                    layer: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``out [B, H, kv_lora_rank]`` of the decode requests (one query each), by
        ``torch.ops.hexlayout.mla_decode``; no LSE (``can_return_lse_for_decode`` is False)."""
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        dec = attn_metadata.decode
        b = dec.seq_lens.shape[0]
        halves = (torch.float16, torch.bfloat16)
        if self.hexlayout_reason is not None or q.dtype not in halves or q.shape[0] != b:
            return super().forward_mqa(q, kv_c_and_k_pe_cache, attn_metadata, layer)
        block_table = dec.block_table.to(torch.int32)
        seq_lens = dec.seq_lens.to(torch.int32)
        cu = torch.arange(b + 1, dtype=torch.int32, device=q.device)
        bound = block_table.shape[1] * kv_c_and_k_pe_cache.shape[1]       # no host sync: an upper bound
        out, _ = torch.ops.hexlayout.mla_decode(q, kv_c_and_k_pe_cache, cu, seq_lens, block_table, 1, bound,
                                                self.scale, self.kv_lora_rank)
        if trace_dir() is not None:
            shapes = {"num_seqs": b, "num_heads": q.shape[1], "kv_lora_rank": self.kv_lora_rank,
                      "rope": self.qk_rope_head_dim, "max_seqlen_k": int(seq_lens.max())}
            record("mla_decode", shapes, q.dtype)
        return out, None

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor) -> None:
        """The step's latents and rope keys into the cache (``mla_reshape_and_cache``)."""
        halves = (torch.float16, torch.bfloat16)
        if (self.hexlayout_reason is not None or kv_cache.numel() == 0
                or kv_c_normed.dtype not in halves or kv_cache.dtype != kv_c_normed.dtype):
            super().do_kv_cache_update(kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)
            return
        n = slot_mapping.shape[0]
        torch.ops.hexlayout.mla_reshape_and_cache(kv_c_normed[:n], k_pe.reshape(k_pe.shape[0], -1)[:n],
                                                  kv_cache, slot_mapping.to(torch.int64))


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
            if isinstance(impl, HexlayoutCPUMLAImpl) and impl.hexlayout_reason is None:
                logger.info("hexlayout: %s: MLA attention runs hexlayout's mla_decode (%s backend)", name,
                            mla_backend_name(self))
            else:
                why = getattr(impl, "hexlayout_reason", None) or "hexlayout serves MLA on the CPU build only"
                logger.info("hexlayout: %s: MLA attention keeps vLLM's %s backend (%s)", name,
                            mla_backend_name(self), why)


def register_mla() -> str:
    """Register :class:`HexlayoutMLAWrapper` for vLLM's MLA layer (once per process: vLLM's
    registry refuses a second registration); returns what was swapped, for the log."""
    global _registered
    if not _registered:
        MultiHeadLatentAttentionWrapper.register_oot(HexlayoutMLAWrapper)
        _registered = True
    return f"MultiHeadLatentAttentionWrapper -> {__name__}.HexlayoutMLAWrapper (logs only)"
