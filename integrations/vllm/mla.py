"""MLA (multi-head latent attention: DeepSeek-V2 / V3 / R1) keeps vLLM's attention, and says so.

hexlayout's paged attention reads a cache of per-head keys and values; an MLA layer caches one
latent row per token instead (``kv_lora_rank`` compressed entries plus the shared rotary key,
512 + 64 for DeepSeek-V3) and attends through it with absorbed projections, so vLLM resolves
its own MLA backend for such layers (``CPU_MLA`` on the CPU build), never the backend the
plugin registers. Without a word from the plugin a user would not know which attention ran.

``MultiHeadLatentAttentionWrapper.register_oot(HexlayoutMLAWrapper)`` (vLLM's out-of-tree
registration of pluggable layers) makes vLLM build :class:`HexlayoutMLAWrapper` wherever it builds
its MLA layer: the same layer (nothing of its construction or forward changes), which logs one
line per process, when the first MLA layer is built, naming the layer and vLLM's backend.
"""

from __future__ import annotations

from typing import Any

from vllm.model_executor.layers.mla import MultiHeadLatentAttentionWrapper

from .log import flush, logger

__all__ = ["HexlayoutMLAWrapper", "register_mla"]

#: Whether this process logged its MLA line / registered the wrapper.
_logged = False
_registered = False


def mla_backend_name(layer: MultiHeadLatentAttentionWrapper) -> str:
    """The name of the attention backend vLLM chose for an MLA layer (``?`` if it has none yet)."""
    backend = getattr(getattr(layer, "mla_attn", None), "attn_backend", None)
    return backend.get_name() if backend is not None else "?"


class HexlayoutMLAWrapper(MultiHeadLatentAttentionWrapper):
    """vLLM's MLA layer, unchanged, logging (once per process) that it keeps vLLM's attention."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        global _logged
        if not _logged:
            _logged = True
            flush()
            logger.info(
                "hexlayout: %s: MLA attention keeps vLLM's %s backend (hexlayout's paged_attention "
                "takes per-head keys and values, not MLA's latent cache)",
                getattr(self, "prefix", "?"),
                mla_backend_name(self),
            )


def register_mla() -> str:
    """Register :class:`HexlayoutMLAWrapper` for vLLM's MLA layer (once per process: vLLM's
    registry refuses a second registration); returns what was swapped, for the log."""
    global _registered
    if not _registered:
        MultiHeadLatentAttentionWrapper.register_oot(HexlayoutMLAWrapper)
        _registered = True
    return f"MultiHeadLatentAttentionWrapper -> {__name__}.HexlayoutMLAWrapper (logs only)"
