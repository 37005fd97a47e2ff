"""hexlayout's mixed-type (W4A16 / W8A16) fused MoE as vLLM experts, shared by the plugin's
quantized MoE methods (AWQ :mod:`.awq`, GPTQ :mod:`.gptq`, MXFP4 :mod:`.mxfp4`).

Each method keeps vLLM's ``create_weights`` and loader, prepares the loaded weights once
(``hexlayout.ops.prepare_wna16`` / ``prepare_mxfp4``: :class:`WNA16Weights` for ``w13`` and
``w2``) and builds the layer's ``FusedMoEKernel`` itself with :func:`install_prepared_experts`:
vLLM's prepare / finalize and :class:`HexlayoutWNA16Experts`, whose ``apply`` runs
``hexlayout.ops.fused_moe`` on the prepared weights. vLLM's WNA16 kernel factory accepts only its
in-tree experts, so the plugin never constructs vLLM's quantized MoE methods (on a CPU without
AMX their ``__init__`` raises: no WNA16 MoE backend). Activations enter unquantized
(``FusedMoEQuantConfig.make()``): the prepared weights hold their own dequantization constants.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.all2all_utils import maybe_make_prepare_finalize
from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig
from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEKernel

from .moe import HexlayoutExperts, prebuild_experts

__all__ = ["HexlayoutWNA16Experts", "PreparedExpertsMethod", "install_prepared_experts"]


class HexlayoutWNA16Experts(HexlayoutExperts):
    """vLLM's modular MoE experts computed by ``hexlayout.ops.fused_moe`` on prepared weights
    (``prepared``, set by :func:`install_prepared_experts`; the packed tensors vLLM hands to
    ``apply`` give only their shapes): ``apply`` is the parent's, with these weights."""

    prepared: tuple[Any, Any] | None = None

    def expert_weights(self, hidden_states: torch.Tensor | None, w1: torch.Tensor,
                       w2: torch.Tensor) -> tuple[str, Any, Any, dict[str, int]]:
        """``("moe_w<bits>a16", w13, w2, shapes)``: the prepared weights (vLLM's packed ``w1`` /
        ``w2`` give only the local expert count)."""
        assert self.prepared is not None, "hexlayout quantized MoE: weights were not prepared"
        w13, w2p = self.prepared
        shapes = {
            "local_experts": int(w1.shape[0]),
            "hidden": int(w2p.size_n),
            "intermediate": int(w13.size_n // 2),
            "group_size": int(w13.group_size),
        }
        return f"moe_w{int(w13.bits)}a16", w13, w2p, shapes


def install_prepared_experts(method: Any, layer: RoutedExperts, w13: Any, w2: Any) -> None:
    """Give ``method`` (a vLLM ``FusedMoEMethodBase``) the ``FusedMoEKernel`` that runs ``layer``
    on the prepared weights ``w13`` / ``w2``: vLLM's prepare / finalize for the layer's routing
    tables, :class:`HexlayoutWNA16Experts` holding the weights. The layer's ``w13_weight`` /
    ``w2_weight`` (which vLLM's modular kernel reads, for shapes only) are set to its packed
    ``w13_qweight`` / ``w2_qweight`` where it has no ``w13_weight`` of its own."""
    if not hasattr(layer, "w13_weight"):
        layer.w13_weight = layer.w13_qweight
        layer.w2_weight = layer.w2_qweight
    method.moe_quant_config = method.get_fused_moe_quant_config(layer)
    prepare_finalize = maybe_make_prepare_finalize(
        moe=method.moe,
        quant_config=method.moe_quant_config,
        routing_tables=layer._expert_routing_tables(),
        allow_new_interface=True,
        use_monolithic=False,
    )
    experts = HexlayoutWNA16Experts(moe_config=method.moe, quant_config=method.moe_quant_config)
    experts.prepared = (w13, w2)
    method.moe_kernel = FusedMoEKernel(prepare_finalize, experts)
    prebuild_experts(experts, layer)


class PreparedExpertsMethod:
    """Mixin of the plugin's quantized MoE methods: activations enter unquantized (the
    prepared weights hold their own dequantization constants)."""

    def get_fused_moe_quant_config(self, layer: RoutedExperts) -> FusedMoEQuantConfig:
        return FusedMoEQuantConfig.make()
