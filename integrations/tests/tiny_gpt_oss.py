"""A tiny gpt-oss checkpoint (``GptOssForCausalLM``) with real random weights, for vLLM's stage.

The sizes of :mod:`tiny_models` (hidden 128, 2 layers, 2 query heads of 64, 1 KV head, 4
experts, top-2, vocabulary 512) with what makes gpt-oss itself:

- **attention sinks**: one learned logit ``s_h`` per query head that joins the softmax
  denominator, ``p_ij = exp(l_ij) / (exp(s_h) + sum_j exp(l_ij))`` (the sink takes probability
  mass and gives no value); q/k/v/o projections with biases;
- **a sliding window on alternate layers**: layer 0 attends to its last :data:`WINDOW` keys
  (``i - W < j <= i``), layer 1 to all (vLLM applies ``sliding_window`` to even layers,
  transformers' ``layer_types`` says the same); the stage's prompts (3-21 tokens, 8 generated)
  run past the window;
- **YaRN rope** with the parameters gpt-oss's HF config has (factor 32 over 4096 positions,
  ``beta_fast`` 32, ``beta_slow`` 1, no truncation, theta 150000);
- **MoE with biases and the clamped SwiGLU** ("swigluoai"): a router ``x W_r^T + b_r`` (softmax
  over the top-2 logits), experts ``gate_up_proj [E, H, 2I]`` with gate and up interleaved
  along the last dimension (``gate = gu[..., ::2]``, ``up = gu[..., 1::2]``), their biases, and
  ``down_proj [E, I, H]``: ``y = ((clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g)) W_d + b_d`` with
  ``g = min(gate, 7)``.

Weights are bf16 (written by :func:`tiny_models.write_model`), no quantization.

>>> cfg, t = gpt_oss_config(), gpt_oss_tensors()
>>> cfg["layer_types"], t["model.layers.0.self_attn.sinks"].shape
(['sliding_attention', 'full_attention'], torch.Size([2]))
"""

from __future__ import annotations

import tiny_models as tm
import torch

#: The sliding window of layer 0 (keys ``i - WINDOW < j <= i``): shorter than every prompt but one.
WINDOW = 8
#: gpt-oss's YaRN rope parameters as its HF config has them.
ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def _experts(g: torch.Generator, p: str) -> dict[str, torch.Tensor]:
    """Router and experts of MoE block ``p`` in the HF layout (see the module docstring)."""
    e, h, i = tm.EXPERTS, tm.HIDDEN, tm.MOE_I
    return {
        f"{p}.router.weight": tm._lin(g, e, h, gain=2.0),
        f"{p}.router.bias": 0.1 * torch.randn(e, generator=g),
        f"{p}.experts.gate_up_proj": torch.randn(e, h, 2 * i, generator=g) / h**0.5,
        f"{p}.experts.gate_up_proj_bias": 0.1 * torch.randn(e, 2 * i, generator=g),
        f"{p}.experts.down_proj": torch.randn(e, i, h, generator=g) * (2.0 / i**0.5),
        f"{p}.experts.down_proj_bias": 0.1 * torch.randn(e, h, generator=g),
    }


def gpt_oss_tensors(seed: int = 5) -> dict[str, torch.Tensor]:
    """gpt-oss checkpoint tensors (float32): attention with biases and per-head ``sinks``
    (N(0, 1): some heads give the sink most of the mass, some little), the MoE of
    :func:`_experts`."""
    g = torch.Generator().manual_seed(seed)
    t = tm._common(g)
    for i in range(tm.LAYERS):
        p = f"model.layers.{i}"
        t.update({**tm._norms(g, p), **tm._attention(g, f"{p}.self_attn", bias=True)})
        t[f"{p}.self_attn.o_proj.bias"] = 0.1 * torch.randn(tm.HIDDEN, generator=g)
        t[f"{p}.self_attn.sinks"] = torch.randn(tm.HEADS, generator=g)
        t.update(_experts(g, f"{p}.mlp"))
    return t


def gpt_oss_config(dtype: str = "bfloat16") -> dict:
    """The HF ``GptOssConfig`` of the tiny checkpoint (sizes of :mod:`tiny_models`)."""
    cfg = tm._base_config("GptOssForCausalLM", "gpt_oss", dtype)
    del cfg["rope_theta"]
    cfg.update(
        {
            "intermediate_size": tm.MOE_I,
            "num_local_experts": tm.EXPERTS,
            "num_experts_per_tok": tm.TOP_K,
            "sliding_window": WINDOW,
            "layer_types": [("full_attention", "sliding_attention")[i % 2 == 0] for i in range(tm.LAYERS)],
            "max_position_embeddings": 131072,
            "rope_parameters": dict(ROPE),
            "attention_bias": True,
            "swiglu_alpha": 1.702,
            "swiglu_limit": 7.0,
            "router_aux_loss_coef": 0.0,
            "output_router_logits": False,
        }
    )
    return cfg
