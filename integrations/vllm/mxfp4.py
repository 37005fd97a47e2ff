"""hexlayout's W4A16 fused MoE for MXFP4 (OCP microscaling) experts in vLLM.

A checkpoint with ``quant_method: "mxfp4"`` whose model is not gpt-oss resolves to vLLM's
``mxfp4`` (``Mxfp4Config``); ``register_quantization_config("mxfp4")`` replaces it with
:class:`HexlayoutMxfp4Config`, whose routed experts get :class:`HexlayoutMxfp4MoEMethod`: vLLM's
``create_weights`` and loader (``w13_weight`` uint8 ``[E, 2I, H/2]``, two e2m1 values a byte,
even k in the low nibble; ``w13_weight_scale`` uint8 e8m0 ``[E, 2I, H/32]``, one power of two
per 32 along K; ``w2_*`` likewise with ``K = I``, ``N = H``), prepared once by
``hexlayout.ops.prepare_mxfp4(weight, scales, dtype=...)`` and computed as W4A16 by
:class:`.wna16.HexlayoutWNA16Experts`. Its ``__init__`` is not vLLM's (which selects a vLLM
MXFP4 backend; the CPU build has none for these experts).

gpt-oss checkpoints (``model_type: "gpt_oss"``) resolve to vLLM's ``gpt_oss_mxfp4`` and keep it:
their experts add biases and use the clamped SwiGLU (``swigluoai``), which hexlayout's
``fused_moe`` does not compute. Layers hexlayout cannot serve (see
:func:`.moe.moe_unsupported_reason`) keep vLLM's method.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4Config, Mxfp4MoEMethod

from .log import logger
from .moe import moe_unsupported_reason
from .wna16 import PreparedExpertsMethod, install_prepared_experts, register_prepared

__all__ = ["HexlayoutMxfp4Config", "HexlayoutMxfp4MoEMethod", "register_mxfp4"]


class HexlayoutMxfp4MoEMethod(PreparedExpertsMethod, Mxfp4MoEMethod):
    """vLLM's MXFP4 MoE weights (``create_weights`` inherited), prepared by hexlayout and
    computed by :class:`.wna16.HexlayoutWNA16Experts`."""

    PACKED = ("weight", "weight_scale", None, None)

    def __init__(self, moe: Any) -> None:
        self.init_prepared(moe)
        self.weight_dtype = "mxfp4"
        self.mxfp4_backend = None  # no vLLM backend: no padding, no permuted output
        self.moe_kernel = None

    def maybe_roundup_sizes(self, hidden_size: int, intermediate_size_per_partition: int,
                            act_dtype: torch.dtype, moe_parallel_config: Any) -> tuple[int, int]:
        # the sizes as they are (vLLM's backends pad them for their kernels' tiles)
        return FusedMoEMethodBase.maybe_roundup_sizes(
            self, hidden_size, intermediate_size_per_partition, act_dtype, moe_parallel_config
        )

    def process_weights_after_loading(self, layer: RoutedExperts) -> None:
        from hexlayout.ops import prepare_mxfp4

        dtype = self.moe.in_dtype
        w13, w2 = (
            prepare_mxfp4(getattr(layer, f"{w}_weight").data, getattr(layer, f"{w}_weight_scale").data,
                          dtype=dtype, gate_up=w == "w13")
            for w in ("w13", "w2")
        )
        install_prepared_experts(self, layer, w13, w2)
        name = getattr(layer, "layer_name", None) or "?"
        logger.info("hexlayout: %s: MXFP4 MoE experts run hexlayout's fused_moe (W4A16)", name)


class HexlayoutMxfp4Config(Mxfp4Config):
    """vLLM's MXFP4 config whose MoE layers run hexlayout's W4A16 fused MoE."""

    def _make_moe_method(self, moe: Any) -> FusedMoEMethodBase:
        reason = moe_unsupported_reason(moe)
        if reason is None:
            return HexlayoutMxfp4MoEMethod(moe)
        logger.info("hexlayout: keeping vLLM's MXFP4 MoE (%s)", reason)
        return super()._make_moe_method(moe)


def register_mxfp4() -> list[str]:
    """Register :class:`HexlayoutMxfp4Config` as vLLM's ``mxfp4`` quantization when hexlayout has
    ``prepare_mxfp4``; returns what was swapped, for the log."""
    return register_prepared("mxfp4", HexlayoutMxfp4Config, "prepare_mxfp4")
