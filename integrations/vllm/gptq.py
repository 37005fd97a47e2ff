"""hexlayout's W4A16 / W8A16 fused MoE for GPTQ checkpoints in vLLM, act-order included.

vLLM 0.32 resolves a GPTQ checkpoint (``quant_method: "gptq"``) to ``auto_gptq`` and rejects
act-order outright: ``AutoGPTQConfig.__init__`` raises "GPTQ group activation ordering
(desc_act=True) is no longer supported" for ``desc_act`` with groups, and its MoE method has
no ``g_idx``. ``register_quantization_config("auto_gptq")`` replaces that entry with
:class:`HexlayoutGPTQConfig`, a subclass of vLLM's ``AutoGPTQConfig`` that accepts ``desc_act``
and returns :class:`HexlayoutGPTQMoEMethod` for symmetric routed experts; every other layer
gets the parent's answer (a linear layer quantized with act-order is a clear error: vLLM has
no kernel for it and hexlayout serves MoE experts only).

The method keeps vLLM's ``create_weights`` (``w13_qweight`` ``[E, H/p, 2I]`` packed along K,
``w13_scales`` ``[E, H/G, 2I]``, ``w13_qzeros`` (unused: symmetric, zero point ``2^(bits-1)``),
``w2_*`` likewise with ``K = I``, ``N = H``) and adds ``w13_g_idx`` ``[E, H]`` / ``w2_g_idx``
``[E, I]`` (int32: the group of each row of K; gate and up share theirs) with their own loader
(and keeps the checkpoint's ``.g_idx`` tensors, which vLLM's weight mapper drops).
``process_weights_after_loading`` prepares both weights once with
``hexlayout.ops.prepare_wna16(..., quant_format="gptq", g_idx=...)``, which applies the K
permutation of act-order offline (as vLLM's Marlin did) and makes the op permute the
activations, and installs :class:`.wna16.HexlayoutWNA16Experts`.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig, AutoGPTQMoEMethod
from vllm.model_executor.utils import set_weight_attrs

from .log import logger
from .moe import moe_unsupported_reason
from .wna16 import PreparedExpertsMethod, install_prepared_experts, register_prepared

__all__ = ["HexlayoutGPTQConfig", "HexlayoutGPTQMoEMethod", "register_gptq"]

GROUP_SIZES = (32, 64, 128, -1)


def gptq_moe_unsupported_reason(config: AutoGPTQConfig, moe: Any) -> str | None:
    """Why hexlayout cannot serve a GPTQ MoE layer, or ``None``."""
    if not config.is_sym:
        return "asymmetric GPTQ (zero points)"
    if config.weight_bits not in (4, 8):
        return f"{config.weight_bits}-bit weights"
    if config.group_size not in GROUP_SIZES:
        return f"group size {config.group_size}"
    if config.desc_act and moe.moe_parallel_config.tp_size > 1:
        # act-order permutes all of K: a rank's slice of w2's K needs every group's scales
        return "act-order (desc_act) with tensor parallelism"
    return moe_unsupported_reason(moe)


def g_idx_loader(layer: RoutedExperts):
    """The loader of ``w13_g_idx`` / ``w2_g_idx``: expert ``expert_id``'s (global id; mapped to
    the local one through the layer's ``expert_map``, skipped when not local) ``g_idx`` ``[K]``
    into row ``expert_id``. ``w1`` (gate) and ``w3`` (up) share their input, so GPTQ orders their
    K alike and they load the same row: a second, different ``g_idx`` is an error."""
    loaded: set[tuple[int, int]] = set()

    def load(param: torch.nn.Parameter, loaded_weight: torch.Tensor, weight_name: str, shard_id: str,
             expert_id: int, return_success: bool = False) -> bool | None:
        expert_map = getattr(layer, "expert_map", None)
        local = expert_id if expert_map is None else int(expert_map[expert_id])
        if local < 0:
            return False if return_success else None
        if tuple(loaded_weight.shape) != tuple(param.data.shape[1:]):
            raise ValueError(
                f"hexlayout GPTQ MoE: {weight_name} has shape {tuple(loaded_weight.shape)}, "
                f"expected {tuple(param.data.shape[1:])} (g_idx: one group per row of K)"
            )
        g_idx = loaded_weight.to(torch.int32)
        key = (id(param), local)
        if key in loaded and not torch.equal(param.data[local], g_idx):
            raise ValueError(
                f"hexlayout GPTQ MoE: {weight_name} (expert {expert_id}): the gate and up projections "
                "have different act-order g_idx; hexlayout's fused gate-up weights take one"
            )
        loaded.add(key)
        param.data[local].copy_(g_idx)
        return True if return_success else None

    return load


class HexlayoutGPTQMoEMethod(PreparedExpertsMethod, AutoGPTQMoEMethod):
    """vLLM's GPTQ MoE weights (``create_weights`` inherited, plus ``g_idx``), prepared by
    hexlayout and computed by :class:`.wna16.HexlayoutWNA16Experts`."""

    PACKED = ("qweight", "scales", "qzeros", "g_idx")

    def __init__(self, quant_config: AutoGPTQConfig, moe: Any) -> None:
        self.init_prepared(moe)
        self.quant_config = quant_config
        self.input_dtype = None
        self.use_marlin = False

    def create_weights(self, layer: RoutedExperts, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs: Any) -> None:
        super().create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition,
                               params_dtype, **extra_weight_attrs)
        for name, k in (("w13_g_idx", hidden_size), ("w2_g_idx", intermediate_size_per_partition)):
            param = torch.nn.Parameter(torch.zeros(num_experts, k, dtype=torch.int32), requires_grad=False)
            layer.register_parameter(name, param)
            set_weight_attrs(param, {"weight_loader": g_idx_loader(layer)})

    def process_weights_after_loading(self, layer: RoutedExperts) -> None:
        from hexlayout.ops import prepare_wna16

        name = getattr(layer, "layer_name", None) or "?"
        biases = [getattr(layer, b) for b in ("w13_bias", "w2_bias") if getattr(layer, b, None) is not None]
        if any(float(b.data.abs().max()) > 0 for b in biases):
            raise ValueError(f"hexlayout GPTQ MoE: {name}: the checkpoint has expert biases, which "
                             "hexlayout's fused_moe does not add")
        cfg = self.quant_config
        w13, w2 = (
            prepare_wna16(
                getattr(layer, f"{w}_qweight").data,
                getattr(layer, f"{w}_scales").data,
                quant_format="gptq",
                bits=cfg.weight_bits,
                group_size=cfg.group_size,
                gate_up=w == "w13",
                **({"g_idx": getattr(layer, f"{w}_g_idx").data} if cfg.desc_act else {}),
            )
            for w in ("w13", "w2")
        )
        install_prepared_experts(self, layer, w13, w2)
        order = ", act-order" if cfg.desc_act else ""
        logger.info("hexlayout: %s: GPTQ int%d%s MoE experts run hexlayout's fused_moe (W%dA16)", name,
                    cfg.weight_bits, order, cfg.weight_bits)


class HexlayoutGPTQConfig(AutoGPTQConfig):
    """vLLM's AutoGPTQ config accepting act-order, whose MoE layers run hexlayout's fused MoE."""

    def __init__(self, weight_bits: int, group_size: int, desc_act: bool, *args: Any, **kwargs: Any) -> None:
        # vLLM's __init__ rejects desc_act with groups: validate the rest with it off.
        super().__init__(weight_bits, group_size, False, *args, **kwargs)
        self.desc_act = bool(desc_act) and group_size != -1  # one group: act-order is a no-op

    def get_checkpoint_weight_mapper(self) -> Any:
        """vLLM's mapper drops every ``.g_idx`` (its kernels take no act-order); with act-order
        the experts' ``g_idx`` are loaded (:func:`g_idx_loader`)."""
        from vllm.model_executor.models.utils import WeightsMapper

        return WeightsMapper() if self.desc_act else super().get_checkpoint_weight_mapper()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        if isinstance(layer, RoutedExperts):
            reason = gptq_moe_unsupported_reason(self, layer.moe_config)
            if reason is None:
                return HexlayoutGPTQMoEMethod(self, layer.moe_config)
            if self.desc_act:
                raise ValueError(f"hexlayout GPTQ: {prefix}: act-order (desc_act) MoE layer that hexlayout "
                                 f"cannot serve ({reason}), and vLLM 0.32 has no act-order kernel")
            logger.info("hexlayout: %s: keeping vLLM's GPTQ MoE (%s)", prefix, reason)
            return super().get_quant_method(layer, prefix)
        method = super().get_quant_method(layer, prefix)
        quantized_linear = isinstance(layer, LinearBase) and type(method).__name__ == "AutoGPTQLinearMethod"
        if self.desc_act and quantized_linear:
            raise ValueError(f"hexlayout GPTQ: {prefix}: a linear layer quantized with act-order (desc_act): "
                             "hexlayout serves act-order GPTQ in MoE experts only and vLLM 0.32 not at all")
        return method


def register_gptq() -> list[str]:
    """Register :class:`HexlayoutGPTQConfig` as vLLM's ``auto_gptq`` quantization (what a
    ``quant_method: "gptq"`` checkpoint resolves to) when hexlayout has ``prepare_wna16``;
    returns what was swapped, for the log."""
    return register_prepared("auto_gptq", HexlayoutGPTQConfig, "prepare_wna16", "auto_gptq (gptq)")
