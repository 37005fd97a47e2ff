"""Mamba-1 layers (``MambaMixer``: Mamba, Jamba, FalconMamba) keep vLLM's kernels, and say so.

A chunked prefill continues each sequence's SSM state from the cache
(``h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t u_t`` from ``h_{-1} = ssm_state[row]``) over sequences
packed along the tokens (``query_start_loc_p``). ``hexlayout.ops.selective_scan`` takes neither
an initial state nor ``cu_seqlens`` yet (batch-major ``[batch, dim, L]`` from zero states), so the
plugin cannot serve Mamba-1 prefill; rather than split one step between two implementations, the
whole layer stays vLLM's.

``MambaMixer.register_oot(HexlayoutMambaMixer)`` makes vLLM build :class:`HexlayoutMambaMixer`
wherever it builds its Mamba-1 layer: the same layer (construction and forward unchanged), which
logs one line per layer naming the reason, as the plugin does for every layer it leaves to vLLM.
"""

from __future__ import annotations

from typing import Any

from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer

from .log import flush, logger
from .pluggable import register_layer

__all__ = ["HexlayoutMambaMixer", "register_mamba1", "MAMBA1_REASON"]

#: Why Mamba-1 layers keep vLLM's kernels (the log line's reason).
MAMBA1_REASON = ("hexlayout's selective_scan has no initial_states / cu_seqlens, so a chunked "
                 "prefill cannot continue a sequence's cached state")


class HexlayoutMambaMixer(MambaMixer):
    """vLLM's ``MambaMixer``, unchanged, logging (once per layer) that it keeps vLLM's kernels."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        flush()
        logger.info("hexlayout: %s: keeping vLLM's Mamba-1 kernels (%s)", getattr(self, "prefix", "?"),
                    MAMBA1_REASON)


def register_mamba1() -> str:
    """Register :class:`HexlayoutMambaMixer` for vLLM's ``MambaMixer``; returns what was swapped,
    for the log."""
    return register_layer(MambaMixer, HexlayoutMambaMixer, " (logs only)")
