"""hexlayout's W4A16 fused MoE for AWQ checkpoints in vLLM.

``register_quantization_config("awq")`` replaces vLLM's ``awq`` entry with
:class:`HexlayoutAWQConfig`, a subclass of vLLM's ``AutoAWQConfig`` whose ``get_quant_method``
returns :class:`HexlayoutAWQMoEMethod` for ``RoutedExperts`` layers (every other layer: the
parent's answer, so AWQ linear layers keep vLLM's kernels). The method keeps vLLM's
``create_weights`` (``w13_qweight`` ``[E, H, 2I/8]``, ``w13_qzeros`` ``[E, H/G, 2I/8]``,
``w13_scales`` ``[E, H/G, 2I]``, ``w2_*`` likewise with ``K = I``, ``N = H``; AutoAWQ's nibble
order) and vLLM's loader; ``process_weights_after_loading`` re-lays them out once with
``hexlayout.ops.prepare_wna16(..., quant_format="awq", bits=4, group_size=G)`` and builds the
layer's ``FusedMoEKernel`` itself (:func:`.wna16.install_prepared_experts`):
vLLM's WNA16 kernel factory accepts only its in-tree experts, and vLLM's own AWQ MoE method is
never constructed (on a CPU without AMX its ``__init__`` raises: no WNA16 MoE backend).

Layers hexlayout cannot serve (no zero points, a group size other than 32, 64, 128 or -1,
expert biases, activations other than SiLU / GELU, batched all-to-all activations) get vLLM's
method. Classes are at module level: vLLM pickles the quantization config to its engine
processes.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig, AutoAWQMoEMethod
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

from .log import logger
from .moe import moe_unsupported_reason
from .wna16 import (
    HexlayoutWNA16Experts,
    PreparedExpertsMethod,
    install_prepared_experts,
    register_prepared,
)

__all__ = ["HexlayoutAWQConfig", "HexlayoutAWQMoEMethod", "HexlayoutWNA16Experts", "register_awq"]
# HexlayoutWNA16Experts lives in .wna16 (shared with GPTQ and MXFP4); importable from here too.

GROUP_SIZES = (32, 64, 128, -1)


def awq_moe_unsupported_reason(config: AutoAWQConfig, moe: Any) -> str | None:
    """Why hexlayout cannot serve an AWQ MoE layer, or ``None``."""
    if not config.zero_point:
        return "AWQ without zero points"
    if config.group_size not in GROUP_SIZES:
        return f"group size {config.group_size}"
    return moe_unsupported_reason(moe)


class HexlayoutAWQMoEMethod(PreparedExpertsMethod, AutoAWQMoEMethod):
    """vLLM's AWQ MoE weights (``create_weights`` inherited), prepared by hexlayout and computed
    by :class:`HexlayoutWNA16Experts`."""

    def __init__(self, quant_config: AutoAWQConfig, moe: Any) -> None:
        self.init_prepared(moe)
        self.quant_config = quant_config
        self.input_dtype = None
        self.use_marlin = False

    def process_weights_after_loading(self, layer: RoutedExperts) -> None:
        from hexlayout.ops import prepare_wna16

        g = self.quant_config.group_size
        w13, w2 = (
            prepare_wna16(
                getattr(layer, f"{w}_qweight").data,
                getattr(layer, f"{w}_scales").data,
                getattr(layer, f"{w}_qzeros").data,
                quant_format="awq",
                bits=4,
                group_size=g,
                gate_up=w == "w13",
            )
            for w in ("w13", "w2")
        )
        install_prepared_experts(self, layer, w13, w2)
        name = getattr(layer, "layer_name", None) or "?"
        logger.info("hexlayout: %s: AWQ int4 MoE experts run hexlayout's fused_moe (W4A16)", name)


class HexlayoutAWQConfig(AutoAWQConfig):
    """vLLM's AutoAWQ config whose MoE layers run hexlayout's W4A16 fused MoE."""

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        if isinstance(layer, RoutedExperts) and not is_layer_skipped(
            prefix, getattr(self, "modules_to_not_convert", []), match_mode="substring"
        ):
            reason = awq_moe_unsupported_reason(self, layer.moe_config)
            if reason is None:
                return HexlayoutAWQMoEMethod(self, layer.moe_config)
            logger.info("hexlayout: %s: keeping vLLM's AWQ MoE (%s)", prefix, reason)
        return super().get_quant_method(layer, prefix)


def register_awq() -> list[str]:
    """Register :class:`HexlayoutAWQConfig` as vLLM's ``awq`` quantization when hexlayout has
    ``prepare_wna16``; returns what was swapped, for the log."""
    return register_prepared("awq", HexlayoutAWQConfig, "prepare_wna16")
