"""The fused MoE's pipeline, shared by every weight kind: ``moe_align`` -> gate-up GEMM ->
down GEMM -> the top-k sum, with the two GEMMs given as launchers (``GateUp``, ``Down``) that
each weight kind (bf16 / f16, W4A16 / W8A16, FP8) and split-K provide; and the public entry of a
prepared weight kind (``prepared_fused_moe``: ``fused_moe_wna16``, ``fused_moe_fp8``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError

from ..host.launch import build_for, fresh, lang_dtype, run_kernel, zeroed
from ..host.torch import require_torch
from .align import run_moe_align
from .kernels_sm80 import MoeConfig, moe_config, moe_sum_kernel

__all__ = ["MoeRun", "GateUp", "Down", "run_moe_pipeline", "prepared_fused_moe"]


class MoeRun:
    """What a GEMM launcher of the pipeline gets: the routing after alignment and the config.

    ``x`` [T, H] activations; ``sorted_ids`` / ``expert_ids`` from ``moe_align``; ``topk_w`` the
    flat [T * k] fp32 top-k weights; ``topk`` k; ``cfg`` the tile constants (``BM`` is the
    alignment's block); ``scale_in`` = ``apply_router_weight_on_input``; ``activation``."""

    def __init__(self, x: Any, sorted_ids: Any, expert_ids: Any, topk_w: Any, topk: int, cfg: MoeConfig,
                 scale_in: bool, activation: str) -> None:
        self.x, self.sorted_ids, self.expert_ids, self.topk_w = x, sorted_ids, expert_ids, topk_w
        self.topk, self.cfg, self.scale_in, self.activation = topk, cfg, scale_in, activation


#: ``gate_up(run, inter)`` writes ``inter`` [EM, I]; ``down(run, inter, y)`` writes ``y`` [T * k, H].
GateUp = Callable[[MoeRun, Any], None]


Down = Callable[[MoeRun, Any, Any], None]


def run_moe_pipeline(hidden_states: Any, topk_weights: Any, topk_ids: Any, num_experts: int, inter_size: int,
                     activation: str, apply_router_weight_on_input: bool, expert_map: Any,
                     gate_up: GateUp, down: Down, cfg: MoeConfig | None = None,
                     combine: Callable[[Any], Any] | None = None) -> Any:
    """align -> ``gate_up`` -> ``down`` -> moe_sum on checked arguments; returns ``out`` [T, H].
    ``combine(y)`` (``y`` [T, k, H]), when given, replaces the sum and returns what the pipeline
    returns (a fused epilogue in the sum kernel: it runs for k = 1 too)."""

    t, h = hidden_states.shape
    k = topk_ids.shape[1]
    dev, dt = hidden_states.device, hidden_states.dtype
    if t == 0:
        return fresh((0, h), dt, dev)
    cfg = cfg or moe_config(t * k)
    sorted_ids, expert_ids, _ = run_moe_align(topk_ids, num_experts, cfg["BM"], expert_map)
    run = MoeRun(hidden_states, sorted_ids, expert_ids, topk_weights.reshape(-1), k, cfg,
                 apply_router_weight_on_input, activation)
    inter = fresh((sorted_ids.shape[0], inter_size), dt, dev)
    gate_up(run, inter)
    # slots of remote experts are never written by down: with an expert map they must read 0 (on
    # every device); without one down writes every row
    y = (zeroed if expert_map is not None else fresh)((t * k, h), dt, dev)
    down(run, inter, y)
    if combine is not None:
        return combine(y.view(t, k, h))
    if k == 1:                                               # one row per token: y is the output
        return y
    out = fresh((t, h), dt, dev)
    summ = build_for(moe_sum_kernel(lang_dtype(dt)), dev, {"ROWS": 16, "BH": 64, "TOPK": k})
    run_kernel(summ, (y.view(t, k, h), out), outputs=(1,))
    return out


def prepared_fused_moe(kind: type, op_name: str, preparer: str, doc: str) -> Callable[..., Any]:
    """The public ``fused_moe`` of a prepared weight kind ``kind`` (what ``preparer`` returns),
    named ``op_name``, with ``fused_moe``'s signature: ``w13`` and ``w2`` must both be ``kind``
    and compatible (``w13.mismatch(w2)``: why not, or ``None``); then
    ``torch.ops.hexlayout.<op_name>(hidden_states, *tensors, topk_weights, topk_ids, *constants,
    activation, apply_router_weight_on_input, expert_map, global_num_experts)`` with
    ``tensors, constants = w13.op_args(w2)``, and the keyword tensors ``w13.op_kwargs(w2)``
    when the kind has that method (``WNA16Weights``: act-order permutations). Errors name
    ``hexlayout.<op_name>`` and the argument."""
    label = f"hexlayout.{op_name}"

    def entry(hidden_states: Any, w13: Any, w2: Any, topk_weights: Any, topk_ids: Any, *,
              activation: str = "silu", apply_router_weight_on_input: bool = False, expert_map: Any = None,
              global_num_experts: int | None = None) -> Any:
        require_torch(f"hexlayout.ops.{op_name}")
        import torch

        for name, w in (("w13", w13), ("w2", w2)):
            if not isinstance(w, kind):
                got = type(w).__name__
                if isinstance(w, torch.Tensor):
                    got = f"a {w.dtype} tensor of shape {tuple(w.shape)}"
                raise ArgumentTypeError(label, name, f"must be {preparer}'s {kind.__name__}, got {got}")
        problem = w13.mismatch(w2)
        if problem is not None:
            raise ArgumentError(label, "w2", problem)
        tensors, constants = w13.op_args(w2)
        extra = w13.op_kwargs(w2) if hasattr(w13, "op_kwargs") else {}
        op = getattr(torch.ops.hexlayout, op_name)
        extra = w13.op_kwargs(w2) if hasattr(w13, "op_kwargs") else {}   # e.g. offline layout keys
        return op(hidden_states, *tensors, topk_weights, topk_ids, *constants, activation,
                  apply_router_weight_on_input, expert_map, global_num_experts, **extra)

    entry.__name__ = entry.__qualname__ = op_name
    entry.__doc__ = doc
    return entry
