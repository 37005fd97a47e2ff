"""The float64 teacher-forced reference of a run: the checkpoint's exact logprobs along the run's
own tokens, and how close each step came to a different expert routing.

A run (``vllm_run``) gives, per sequence, the greedy tokens ``t_1 .. t_n`` after the prompt ``p``
and the top logprobs at each step. :func:`teacher_forced` evaluates the same checkpoint with
transformers in float64 (its bf16 weights are exact in float64) on ``p + t_1 .. t_{n-1}`` in one
forward pass and returns, at every step ``i``:

- the float64 log-softmax over the vocabulary given ``p + t_1 .. t_{i-1}``: what step ``i`` of
  any correct run approximates, whatever its kernels;
- the routing margin: over the MoE layers, the smallest gap between the ``k``-th and the
  ``(k+1)``-th largest router logit at that position (``k`` experts per token). Top-k routing
  is discontinuous: where the margin is within the run's bf16 noise, a correct bf16 run may
  pick the other expert and its logits leave the float64 ones by whole nats. DeepSeek-V3's
  grouped routing (sigmoid scores plus a correction bias, best groups first) has its own
  margin (:func:`_grouped_margins`), read from its routers by forward hooks.

A run with an FP8 KV cache (``kv_cache_dtype`` "fp8" / "fp8_e4m3" / "fp8_e5m2", unit scales:
vLLM's default ``k_scale = v_scale = 1``) attends over keys and values rounded to FP8: ``load``
with that ``kv_cache_dtype`` rounds the rotated keys and the values to it (``fp8(k)``,
``fp8(v)``, back to float64) before float64 attention, so the reference is the model the run
computes (the rounding alone moves the tiny Mixtral's top-5 logprobs by up to 0.34 nats).

The reference depends on neither the host's vector ISA (vLLM's CPU kernels choose their bf16
paths by ISA, and with them their near ties) nor on another run's tokens: the context is the
run's own.
"""

from __future__ import annotations

import math
import pathlib
import sys
from dataclasses import dataclass

import torch


@dataclass
class Reference:
    """Per step of one sequence: float64 logprobs ``[n, vocab]`` and routing margins ``[n]``."""

    logprobs: torch.Tensor
    margins: torch.Tensor


#: vLLM's FP8 ``kv_cache_dtype`` strings -> the torch dtype its cache holds.
FP8_KV = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _fp8_kv_attention(fp8: torch.dtype):
    """A transformers attention function: the model's own eager attention over ``fp8``-rounded
    keys and values (``x -> float64(fp8(x))``; unit scales)."""

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  *args, **kwargs):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, key.to(fp8).to(key.dtype), value.to(fp8).to(value.dtype), *args, **kwargs)

    return attention


def load(model_dir: pathlib.Path | str, kv_cache_dtype: str = "auto") -> torch.nn.Module:
    """The checkpoint as a float64 transformers model (eager attention and experts); with an
    FP8 ``kv_cache_dtype`` (:data:`FP8_KV`) its attention reads FP8-rounded keys and values."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    attn = "eager"
    if kv_cache_dtype != "auto":  # eager attention and its masks under a name of its own
        attn = f"hexlayout_{kv_cache_dtype}_kv"
        AttentionInterface.register(attn, _fp8_kv_attention(FP8_KV[kv_cache_dtype]))
        AttentionMaskInterface.register(attn, eager_mask)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float64, attn_implementation=attn, experts_implementation="eager"
    )
    return model.eval()


def _margins(router_logits: tuple[torch.Tensor, ...] | None, positions: int, top_k: int) -> torch.Tensor:
    """Per position, the smallest ``k``-th minus ``(k+1)``-th router logit over the layers."""
    if not router_logits:
        return torch.full((positions,), math.inf, dtype=torch.float64)
    per_layer = []
    for layer in router_logits:
        lg = layer.reshape(positions, -1).to(torch.float64).sort(-1, descending=True).values
        per_layer.append(lg[:, top_k - 1] - lg[:, top_k])
    return torch.stack(per_layer).min(0).values


def _grouped_margins(scores: torch.Tensor, bias: torch.Tensor, groups: int, topk_groups: int,
                     top_k: int) -> torch.Tensor:
    """Per position, the routing margin of DeepSeek-V3's grouped top-k (``noaux_tc``): experts
    are chosen by ``s = sigmoid(logit) + e_score_correction_bias`` among the ``topk_groups``
    groups with the largest sum of their two best ``s``; the margin is the smaller of the gap
    between the ``topk_groups``-th and next group score and the gap between the ``top_k``-th
    and next ``s`` within the chosen groups."""
    s = scores.to(torch.float64) + bias.to(torch.float64)
    per_group = s.view(s.shape[0], groups, -1)
    group_scores = per_group.topk(2, dim=-1).values.sum(-1).sort(-1, descending=True).values
    if topk_groups < groups:
        group_gap = group_scores[:, topk_groups - 1] - group_scores[:, topk_groups]
    else:  # every group is chosen
        group_gap = torch.full_like(group_scores[:, 0], torch.inf)
    chosen = per_group.topk(2, dim=-1).values.sum(-1).topk(topk_groups, dim=-1).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, chosen, True)
    s = s.masked_fill(~mask.repeat_interleave(per_group.shape[-1], dim=1), -torch.inf)
    top = s.sort(-1, descending=True).values
    return torch.minimum(group_gap, top[:, top_k - 1] - top[:, top_k])


def _grouped_router_margins(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor | None:
    """The routing margins (:func:`_grouped_margins`) of a model whose routers carry an
    ``e_score_correction_bias`` (DeepSeek-V3), taken from its routers' logits by forward hooks
    during one forward pass; ``None`` for other models."""
    routers = [m for m in model.modules()
               if hasattr(m, "e_score_correction_bias") and hasattr(m, "num_group")]
    if not routers:
        return None
    margins: list[torch.Tensor] = []

    def hook(router: torch.nn.Module, _inputs: tuple, out: tuple) -> None:
        margins.append(
            _grouped_margins(out[0].sigmoid(), router.e_score_correction_bias, router.num_group,
                             router.topk_group, router.top_k)
        )

    handles = [r.register_forward_hook(hook) for r in routers]
    try:
        model(input_ids=ids)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(margins).min(0).values


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, prompts: list[list[int]], results: list[dict]) -> list[Reference]:
    """Per sequence, the float64 logprobs and routing margins of steps ``1 .. n`` given the
    prompt and the run's own earlier tokens (``results``: the run's ``{"tokens", "logprobs"}``)."""
    top_k = getattr(model.config, "num_experts_per_tok", 0)
    out = []
    for prompt, r in zip(prompts, results):
        ids = torch.tensor([prompt + list(r["tokens"])[:-1]], dtype=torch.long)
        grouped = _grouped_router_margins(model, ids)
        res = model(input_ids=ids, output_router_logits=bool(top_k) and grouped is None)
        lp = torch.log_softmax(res.logits[0].to(torch.float64), dim=-1)
        if grouped is not None:
            margins = grouped
        else:
            margins = _margins(getattr(res, "router_logits", None) if top_k else None, ids.shape[1], top_k)
        first = len(prompt) - 1
        out.append(Reference(lp[first:], margins[first:]))
    return out
