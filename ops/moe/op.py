"""``hexlayout.ops.fused_moe``: the fused mixture-of-experts layer (vLLM's semantics).

``fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, *, activation="silu",
apply_router_weight_on_input=False, expert_map=None, global_num_experts=None)``::

    out[t] = sum_j topk_weights[t, j] * w2[e] @ (act(w13[e, :I] @ x_t) * (w13[e, I:] @ x_t)),
             e = local(topk_ids[t, j]),  terms with a remote expert (expert_map -> -1) skipped

``hidden_states`` [T, H] f16 / bf16; ``w13`` [E, 2I, H] (gate rows, then up rows) and ``w2``
[E, H, I] of the same dtype; ``topk_weights`` [T, k] fp32; ``topk_ids`` [T, k] int32 global
expert ids; ``act`` SiLU or exact (erf) GELU. ``apply_router_weight_on_input=True`` (k = 1)
scales ``x_t`` by the weight instead of the output. ``expert_map`` [global_num_experts] int32
maps a global id to a local expert or -1. Returns a new [T, H] tensor of the activations' dtype.

The pipeline (``run_moe_pipeline``), four launches of alignment kernels and three GEMM /
combine kernels, no torch op in between but allocations, no host synchronization:

    moe_align(topk_ids) -> sorted_ids, expert_ids      (ops/moe_align.py, blocks of BM slots)
    gate_up: inter[p] = act(gate) * up                 (one row per sorted position)
    down:    y[s] = w_s * inter[p] @ w2[e]^T           (one row per token slot)
    moe_sum: out[t] = sum_j y[t * k + j]              (k = 1: y is out, no launch)

Quantized weights plug in by swapping the two GEMM launches: ``fused_moe`` dispatches on
``w13``'s type (``_prepared_runner``) — a ``torch.Tensor`` goes to
``torch.ops.hexlayout.fused_moe``, ``WNA16Weights`` to ``fused_moe_wna16``, ``Fp8MoEWeights``
to ``fused_moe_fp8`` (each calls its torch op), any other container with a ``fused_moe_fn``
attribute to that function; their op implementations may call ``run_moe_pipeline`` with their
own ``gate_up`` / ``down`` launchers (``MoeRun`` carries the aligned routing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..host.launch import build_for, lang_dtype, run_kernel
from ..host.torch import require_torch
from .args import check_fused_moe
from .fp8 import Fp8MoEWeights, fused_moe_fp8
from .kernels_sm80 import (
    moe_down_config,
    moe_down_kernel,
    moe_gate_up_kernel,
)
from .kernels_sm90 import is_sm90, moe_sm90_config, run_down_sm90, run_gate_up_sm90
from .pipeline import Down, GateUp, MoeRun, run_moe_pipeline
from .wna16 import WNA16Weights, fused_moe_wna16

__all__ = ["fused_moe", "run_fused_moe"]


def _gate_up(w13: Any, row_scales: tuple = ()) -> GateUp:
    def launch(run: MoeRun, inter: Any) -> None:
        if is_sm90(run.x.device) and not row_scales:         # wgmma kernels (ops/moe_kernels_sm90.py)
            run_gate_up_sm90(w13, run, inter)
            return
        consts = {**run.cfg, "TOPK": run.topk, "SCALE_IN": run.scale_in}
        kernel = moe_gate_up_kernel(lang_dtype(run.x.dtype), run.activation, row_scales)
        bld = build_for(kernel, run.x.device, consts)
        run_kernel(bld, (run.x, w13, run.sorted_ids, run.expert_ids, run.topk_w, inter), outputs=(5,))

    return launch


def _down(w2: Any) -> Down:
    def launch(run: MoeRun, inter: Any, y: Any) -> None:
        if is_sm90(run.x.device):
            run_down_sm90(w2, run, inter, y)
            return
        consts = {**moe_down_config(run.cfg), "SCALE_IN": run.scale_in}
        bld = build_for(moe_down_kernel(lang_dtype(run.x.dtype)), run.x.device, consts)
        run_kernel(bld, (inter, w2, run.sorted_ids, run.expert_ids, run.topk_w, y), outputs=(5,))

    return launch


def run_fused_moe(hidden_states: Any, w13: Any, w2: Any, topk_weights: Any, topk_ids: Any,
                  activation: str = "silu", apply_router_weight_on_input: bool = False,
                  expert_map: Any = None, global_num_experts: Any = None, *, row_scales: tuple = (),
                  combine: Any = None) -> Any:
    """``fused_moe`` with bf16 / f16 weights on checked arguments; each grouped GEMM splits K
    when its decode grid is too small for the SMs (``ops/moe_splitk.py``). Fusion's hooks:
    ``row_scales`` (``fusion_prologue.RowScale``) scale ``hidden_states``' rows in the gate-up
    kernel (the mma.sync kernel, unsplit, on every architecture); ``combine`` replaces the top-k
    sum (``run_moe_pipeline``)."""
    from .splitk import splitk_down, splitk_gate_up

    e, i = w13.shape[0], w13.shape[1] // 2
    cfg = moe_sm90_config(topk_ids.numel(), e) if is_sm90(hidden_states.device) and not row_scales else None
    gate_up = _gate_up(w13, row_scales) if row_scales else splitk_gate_up(w13, _gate_up(w13))
    return run_moe_pipeline(hidden_states, topk_weights, topk_ids, e, i, activation,
                            apply_router_weight_on_input, expert_map, gate_up,
                            splitk_down(w2, _down(w2)), cfg=cfg, combine=combine)


def _prepared_runner(w13: Any) -> Callable[..., Any]:
    """The fused MoE of a prepared weight container: ``WNA16Weights`` (``prepare_wna16``) ->
    ``fused_moe_wna16``, ``Fp8MoEWeights`` (``prepare_fp8``) -> ``fused_moe_fp8``; any other
    object with a ``fused_moe_fn`` attribute -> that function (same signature as ``fused_moe``)."""
    from hexlayout.runtime.args import ArgumentTypeError

    if isinstance(w13, WNA16Weights):
        return fused_moe_wna16
    if isinstance(w13, Fp8MoEWeights):
        return fused_moe_fp8
    fn = getattr(w13, "fused_moe_fn", None)
    if fn is None:
        raise ArgumentTypeError("hexlayout.fused_moe", "w13", f"expected a bf16 / f16 tensor or the weights "
                                f"prepare_wna16 / prepare_fp8 return, got {type(w13).__name__}")
    return fn


def fused_moe(hidden_states: Any, w13: Any, w2: Any, topk_weights: Any, topk_ids: Any, *,
              activation: str = "silu", apply_router_weight_on_input: bool = False, expert_map: Any = None,
              global_num_experts: int | None = None) -> Any:
    """The fused MoE layer (see the module docstring). ``w13`` / ``w2``: bf16 / f16 tensors
    (``torch.ops.hexlayout.fused_moe``), or the objects ``prepare_wna16`` / ``prepare_fp8``
    return (their ``fused_moe`` method, which runs their torch op)."""
    require_torch("hexlayout.ops.fused_moe")
    import torch

    if not isinstance(w13, torch.Tensor):
        fn = _prepared_runner(w13)
        return fn(hidden_states, w13, w2, topk_weights, topk_ids, activation=activation,
                  apply_router_weight_on_input=apply_router_weight_on_input, expert_map=expert_map,
                  global_num_experts=global_num_experts)
    check_fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, activation, apply_router_weight_on_input,
                    expert_map, global_num_experts)
    return torch.ops.hexlayout.fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, activation,
                                         apply_router_weight_on_input, expert_map, global_num_experts)
