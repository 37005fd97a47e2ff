"""hexlayout's fused MoE as vLLM's unquantized MoE experts.

``CustomOp.register_oot(HexlayoutUnquantizedFusedMoEMethod, name="UnquantizedFusedMoEMethod")``
makes vLLM build :class:`HexlayoutUnquantizedFusedMoEMethod` wherever it builds its
``UnquantizedFusedMoEMethod`` (bf16 / f16 routed experts). The method keeps vLLM's weights
(``w13_weight`` ``[E, 2I, H]``, gate rows then up rows; ``w2_weight`` ``[E, H, I]``), its router,
its prepare / finalize and its shared experts; only the experts class of the ``FusedMoEKernel``
it builds changes: :class:`HexlayoutExperts`, a ``FusedMoEExpertsModular`` whose ``apply`` is
``hexlayout.ops.fused_moe`` (gathering rows per expert, ``act(gate) * up``, the down projection
and the top-k weights applied in its epilogue, contributions summed), so vLLM's finalize is
``TopKWeightAndReduceNoOP``. Tensor parallelism hands in the local slice of ``I``; expert
parallelism the ``expert_map`` (global id -> local id or -1), both passed through.

Layers hexlayout cannot serve (expert biases, activations other than SiLU / GELU, non-gated
experts, LoRA, batched (DP all-to-all) activations, float32) keep vLLM's experts; each layer
logs which it runs.
"""

from __future__ import annotations

from typing import Any

import torch
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
from vllm.platforms import current_platform

from hexlayout.runtime.capture import prebuilding

from .log import announce, flush, logger
from .trace import record, trace_dir

__all__ = [
    "HexlayoutExperts",
    "HexlayoutUnquantizedFusedMoEMethod",
    "capture_sizes",
    "moe_unsupported_reason",
    "prebuild_experts",
    "register_moe",
    "ACTIVATIONS",
]

#: vLLM's activations hexlayout's MoE computes, by hexlayout's name.
ACTIVATIONS = {MoEActivation.SILU: "silu", MoEActivation.GELU: "gelu"}


def moe_unsupported_reason(moe: Any) -> str | None:
    """Why hexlayout cannot serve a MoE layer of vLLM config ``moe`` (``FusedMoEConfig``), or ``None``."""
    if moe.activation not in ACTIVATIONS:
        return f"activation {moe.activation.value}"
    if not moe.is_act_and_mul:
        return "non-gated experts"
    if moe.has_bias:
        return "expert biases"
    if moe.is_lora_enabled:
        return "LoRA"
    if moe.moe_parallel_config.use_batched_activation_format:
        return "batched (all-to-all) activations"
    if moe.in_dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {moe.in_dtype}"
    return None


def run_fused_moe(
    kernel: str,
    output: torch.Tensor,
    hidden_states: torch.Tensor,
    w13: Any,
    w2: Any,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: MoEActivation,
    global_num_experts: int,
    expert_map: torch.Tensor | None,
    apply_router_weight_on_input: bool,
    shapes: dict[str, int],
) -> None:
    """``output = hexlayout.ops.fused_moe(...)`` for vLLM's experts ``apply``: the top-k weights
    applied by the kernel (ones when vLLM's prepare already scaled the input by them), ids as
    int32; one trace line (``kernel``) when tracing."""
    if isinstance(w13, torch.Tensor):
        from hexlayout.ops import fused_moe
    else:  # prepare_wna16's weights
        from hexlayout.ops.moe.wna16 import fused_moe_wna16 as fused_moe

    weights = torch.ones_like(topk_weights) if apply_router_weight_on_input else topk_weights
    out = fused_moe(
        hidden_states,
        w13,
        w2,
        weights.to(torch.float32),
        topk_ids.to(torch.int32),
        activation=ACTIVATIONS[activation],
        expert_map=None if expert_map is None else expert_map.to(torch.int32),
        global_num_experts=global_num_experts,
    )
    output.copy_(out)
    if trace_dir() is not None and not prebuilding():
        t, k = topk_ids.shape
        shapes = {"tokens": t, "topk": k, "global_experts": global_num_experts, **shapes}
        record(kernel, shapes, hidden_states.dtype)


def capture_sizes() -> list[int]:
    """The token counts vLLM captures CUDA graphs for in this engine (its compilation config's
    ``cudagraph_capture_sizes``); empty where nothing is captured: not CUDA, ``enforce_eager``,
    or ``cudagraph_mode`` NONE."""
    from vllm.config import CUDAGraphMode, get_current_vllm_config

    if not current_platform.is_cuda():
        return []
    cfg = get_current_vllm_config()
    if cfg.model_config is not None and cfg.model_config.enforce_eager:
        return []
    cc = cfg.compilation_config
    if getattr(cc, "cudagraph_mode", None) in (None, CUDAGraphMode.NONE):
        return []
    return sorted(set(cc.cudagraph_capture_sizes or []))


def prebuild_experts(experts: Any, layer: Any, sizes: list[int] | None = None) -> list[int]:
    """Build (and load on the GPU) every kernel ``experts`` (:class:`HexlayoutExperts`) runs for
    ``layer`` (a vLLM ``RoutedExperts``: MoE config, global expert count, expert map) at each
    token count of ``sizes`` (default :func:`capture_sizes`), launching none
    (``hexlayout.runtime.prebuild``), so a CUDA-graph capture of those sizes builds nothing.
    The kernels' configs depend on the sizes only, never on the routing, so zero ids stand for
    any. Returns the sizes warmed."""
    from hexlayout.runtime import prebuild

    sizes = capture_sizes() if sizes is None else sizes
    kernel, w13, w2, shapes = experts.expert_weights(None, layer.w13_weight, layer.w2_weight)
    moe = layer.moe_config
    device = layer.w13_weight.device
    k = moe.experts_per_token
    with prebuild():
        for t in sizes:
            x = torch.empty(t, shapes["hidden"], dtype=moe.in_dtype, device=device)
            ids = torch.zeros(t, k, dtype=torch.int32, device=device)
            weights = torch.zeros(t, k, dtype=torch.float32, device=device)
            run_fused_moe(kernel, torch.empty_like(x), x, w13, w2, weights, ids, moe.activation,
                          layer.global_num_experts, layer.expert_map, False, shapes)
    return list(sizes)


class HexlayoutExperts(mk.FusedMoEExpertsModular):
    """vLLM's modular MoE experts computed by ``hexlayout.ops.fused_moe`` (bf16 / f16 weights)."""

    @staticmethod
    def activation_format() -> mk.FusedMoEActivationFormat:
        return mk.FusedMoEActivationFormat.Standard

    @staticmethod
    def _supports_current_device() -> bool:
        return current_platform.is_cpu() or current_platform.is_cuda()

    @staticmethod
    def _supports_no_act_and_mul() -> bool:
        return False

    @staticmethod
    def _supports_quant_scheme(weight_key: Any, activation_key: Any) -> bool:
        return (weight_key, activation_key) == (None, None)

    @staticmethod
    def _supports_activation(activation: MoEActivation) -> bool:
        return activation in ACTIVATIONS

    @staticmethod
    def _supports_parallel_config(moe_parallel_config: Any) -> bool:
        return not moe_parallel_config.use_batched_activation_format

    def workspace_shapes(
        self,
        M: int,
        N: int,
        K: int,
        topk: int,
        global_num_experts: int,
        local_num_experts: int,
        expert_tokens_meta: Any,
        activation: MoEActivation,
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        # The op allocates its own intermediates; the output is [M, K] (tokens, hidden).
        return (0,), (0,), (M, K)

    def finalize_weight_and_reduce_impl(self) -> mk.TopKWeightAndReduce:
        return TopKWeightAndReduceNoOP()

    def apply(
        self,
        output: torch.Tensor,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        activation: MoEActivation,
        global_num_experts: int,
        expert_map: torch.Tensor | None,
        a1q_scale: torch.Tensor | None,
        a2_scale: torch.Tensor | None,
        workspace13: torch.Tensor,
        workspace2: torch.Tensor,
        expert_tokens_meta: Any,
        apply_router_weight_on_input: bool,
    ) -> None:
        kernel, w13, w2, shapes = self.expert_weights(hidden_states, w1, w2)
        run_fused_moe(
            kernel,
            output,
            hidden_states,
            w13,
            w2,
            topk_weights,
            topk_ids,
            activation,
            global_num_experts,
            expert_map,
            apply_router_weight_on_input,
            shapes,
        )

    def expert_weights(self, hidden_states: torch.Tensor | None, w1: torch.Tensor,
                       w2: torch.Tensor) -> tuple[str, Any, Any, dict[str, int]]:
        """``(kernel, w13, w2, shapes)`` for ``apply`` (and :func:`prebuild_experts`, with no
        ``hidden_states``): the trace name, the weights ``hexlayout.ops.fused_moe`` takes (here
        vLLM's ``w1`` [E, 2I, H] and ``w2``) and the layer's sizes (``hidden`` among them).
        Subclasses holding prepared weights override it."""
        e, n2, h = w1.shape
        return "moe", w1, w2, {"local_experts": e, "hidden": h, "intermediate": n2 // 2}


class HexlayoutUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    """vLLM's unquantized MoE method building its kernel with :class:`HexlayoutExperts` (weights,
    loading, routing, prepare / finalize and shared experts are vLLM's)."""

    def __init__(self, moe: Any) -> None:
        super().__init__(moe)
        flush()
        self.hexlayout_reason = moe_unsupported_reason(moe)
        if self.hexlayout_reason is None:
            self.experts_cls = HexlayoutExperts

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        super().process_weights_after_loading(layer)
        name = getattr(layer, "layer_name", None) or getattr(layer, "prefix", "?")
        if self.hexlayout_reason is None:
            warmed = prebuild_experts(self.moe_kernel.fused_experts, layer)
            logger.info("hexlayout: %s: MoE experts run hexlayout's fused_moe%s", name,
                        f" (built for {len(warmed)} CUDA-graph sizes)" if warmed else "")
        else:
            logger.info("hexlayout: %s: keeping vLLM's MoE experts (%s)", name, self.hexlayout_reason)


def register_moe() -> list[str]:
    """Register hexlayout's unquantized MoE method with vLLM (``fused_moe``) when this hexlayout
    has the op (the AWQ int4 experts: ``awq.register_awq``); returns what was swapped, for the
    log."""
    import hexlayout.ops

    swapped = []
    if hasattr(hexlayout.ops, "fused_moe"):
        CustomOp.register_oot(HexlayoutUnquantizedFusedMoEMethod, name="UnquantizedFusedMoEMethod")
        swapped.append(f"UnquantizedFusedMoEMethod -> {__name__}.HexlayoutUnquantizedFusedMoEMethod")
    else:
        announce("hexlayout: this hexlayout has no fused_moe op; keeping vLLM's unquantized MoE")
    return swapped
