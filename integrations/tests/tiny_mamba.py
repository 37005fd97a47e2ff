"""Tiny Mamba checkpoints with real random weights, written like :mod:`tiny_models`' ones.

- ``mamba1``: ``MambaForCausalLM`` (Mamba-1), hidden 64, 2 layers, d_inner 128, d_state 16,
  conv width 4, dt rank 4;
- ``mamba2``: ``Mamba2ForCausalLM``, hidden 64, 2 Mamba-2 layers of 8 heads of 16 (d_inner 128),
  2 groups, d_state 16, conv width 4, chunk size 8 (prompts of 3-21 tokens span several chunks);
- ``nemotron_h``: ``NemotronHForCausalLM``, the hybrid: pattern ``M*-`` (a Mamba-2 layer, an
  attention layer of 2 query heads / 1 KV head of 64, a squared-ReLU MLP), the same Mamba-2 sizes
  with 1 group.

Weights are drawn so every layer keeps the activations' scale (``A = -exp(A_log)`` in
[-2, -0.5], ``dt_bias`` so softplus(dt) is about 0.1-1): greedy tokens depend on the scan, the
convolution and the states carried across prefill chunks and decode steps.
"""

from __future__ import annotations

import torch
from tiny_models import VOCAB, _lin

HIDDEN = 64
HEADS = 8
HEAD_DIM = 16
D_STATE = 16
CONV = 4
CHUNK = 8
INNER = HEADS * HEAD_DIM


def _mixer(g: torch.Generator, p: str, groups: int) -> dict[str, torch.Tensor]:
    """One Mamba-2 mixer's tensors (``in_proj`` = [z, x, B, C, dt])."""
    conv_dim = INNER + 2 * groups * D_STATE
    return {
        f"{p}.in_proj.weight": _lin(g, 2 * INNER + 2 * groups * D_STATE + HEADS, HIDDEN),
        f"{p}.conv1d.weight": torch.randn(conv_dim, 1, CONV, generator=g) * 0.5,
        f"{p}.conv1d.bias": 0.1 * torch.randn(conv_dim, generator=g),
        f"{p}.A_log": torch.empty(HEADS).uniform_(-0.7, 0.7, generator=g),
        f"{p}.D": 1 + 0.1 * torch.randn(HEADS, generator=g),
        f"{p}.dt_bias": torch.empty(HEADS).uniform_(-2.0, 0.5, generator=g),
        f"{p}.norm.weight": 1 + 0.1 * torch.randn(INNER, generator=g),
        f"{p}.out_proj.weight": _lin(g, HIDDEN, INNER),
    }


def _embeddings(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "backbone.embeddings.weight": torch.randn(VOCAB, HIDDEN, generator=g),
        "backbone.norm_f.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=g),
        "lm_head.weight": _lin(g, VOCAB, HIDDEN, gain=4.0),
    }


def mamba2_tensors(seed: int = 5) -> dict[str, torch.Tensor]:
    """``Mamba2ForCausalLM``'s tensors (HF names: ``backbone.layers.{i}.mixer.*``)."""
    g = torch.Generator().manual_seed(seed)
    t = _embeddings(g)
    for i in range(2):
        p = f"backbone.layers.{i}"
        t[f"{p}.norm.weight"] = 1 + 0.1 * torch.randn(HIDDEN, generator=g)
        t.update(_mixer(g, f"{p}.mixer", groups=2))
    return t


def _mamba_config(arch: str, model_type: str, dtype: str) -> dict:
    return {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "state_size": D_STATE,
        "ssm_state_size": D_STATE,
        "conv_kernel": CONV,
        "expand": INNER // HIDDEN,
        "chunk_size": CHUNK,
        "use_bias": False,
        "use_conv_bias": True,
        "layer_norm_epsilon": 1e-5,
        "rms_norm": True,
        "residual_in_fp32": False,
        "tie_word_embeddings": False,
        "time_step_limit": [0.0, float("inf")],
        "torch_dtype": dtype,
        "dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def mamba2_config(dtype: str = "bfloat16") -> dict:
    """The tiny ``Mamba2ForCausalLM`` config (2 groups)."""
    cfg = _mamba_config("Mamba2ForCausalLM", "mamba2", dtype)
    cfg.update({"num_hidden_layers": 2, "num_heads": HEADS, "head_dim": HEAD_DIM, "n_groups": 2,
                "hidden_act": "silu"})
    return cfg


ATTN_HEADS = 2
ATTN_KV_HEADS = 1
ATTN_HEAD_DIM = 64
MLP_I = 128
PATTERN = "M*-"


def nemotron_h_tensors(seed: int = 6) -> dict[str, torch.Tensor]:
    """``NemotronHForCausalLM``'s tensors for :data:`PATTERN` (one ``norm`` and one ``mixer``
    per layer: Mamba-2, attention or MLP)."""
    g = torch.Generator().manual_seed(seed)
    t = _embeddings(g)
    for i, kind in enumerate(PATTERN):
        p = f"backbone.layers.{i}"
        t[f"{p}.norm.weight"] = 1 + 0.1 * torch.randn(HIDDEN, generator=g)
        if kind == "M":
            t.update(_mixer(g, f"{p}.mixer", groups=1))
        elif kind == "*":
            t[f"{p}.mixer.q_proj.weight"] = _lin(g, ATTN_HEADS * ATTN_HEAD_DIM, HIDDEN)
            t[f"{p}.mixer.k_proj.weight"] = _lin(g, ATTN_KV_HEADS * ATTN_HEAD_DIM, HIDDEN)
            t[f"{p}.mixer.v_proj.weight"] = _lin(g, ATTN_KV_HEADS * ATTN_HEAD_DIM, HIDDEN)
            t[f"{p}.mixer.o_proj.weight"] = _lin(g, HIDDEN, ATTN_HEADS * ATTN_HEAD_DIM)
        else:
            t[f"{p}.mixer.up_proj.weight"] = _lin(g, MLP_I, HIDDEN)
            t[f"{p}.mixer.down_proj.weight"] = _lin(g, HIDDEN, MLP_I)
    return t


def nemotron_h_config(dtype: str = "bfloat16") -> dict:
    """The tiny ``NemotronHForCausalLM`` config (pattern :data:`PATTERN`, 1 group)."""
    cfg = _mamba_config("NemotronHForCausalLM", "nemotron_h", dtype)
    kinds = {"M": "mamba", "*": "attention", "-": "mlp"}
    cfg.update({
        "num_hidden_layers": len(PATTERN),
        "hybrid_override_pattern": PATTERN,
        "layers_block_type": [kinds[c] for c in PATTERN],
        "mamba_num_heads": HEADS,
        "mamba_head_dim": HEAD_DIM,
        "n_groups": 1,
        "mamba_hidden_act": "silu",
        "num_attention_heads": ATTN_HEADS,
        "num_key_value_heads": ATTN_KV_HEADS,
        "head_dim": ATTN_HEAD_DIM,
        "attention_bias": False,
        "intermediate_size": MLP_I,
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "max_position_embeddings": 1024,
        "mamba_ssm_cache_dtype": "float32",
    })
    return cfg


DT_RANK = 4


def mamba1_tensors(seed: int = 7) -> dict[str, torch.Tensor]:
    """``MambaForCausalLM``'s tensors (HF names: ``backbone.layers.{i}.mixer.*``: ``in_proj`` =
    [x, z], ``x_proj`` = [dt, B, C], ``A_log`` [d_inner, N])."""
    g = torch.Generator().manual_seed(seed)
    t = _embeddings(g)
    for i in range(2):
        p = f"backbone.layers.{i}"
        t[f"{p}.norm.weight"] = 1 + 0.1 * torch.randn(HIDDEN, generator=g)
        m = f"{p}.mixer"
        t.update({
            f"{m}.in_proj.weight": _lin(g, 2 * INNER, HIDDEN),
            f"{m}.conv1d.weight": torch.randn(INNER, 1, CONV, generator=g) * 0.5,
            f"{m}.conv1d.bias": 0.1 * torch.randn(INNER, generator=g),
            f"{m}.x_proj.weight": _lin(g, DT_RANK + 2 * D_STATE, INNER),
            f"{m}.dt_proj.weight": _lin(g, INNER, DT_RANK),
            f"{m}.dt_proj.bias": torch.empty(INNER).uniform_(-2.0, 0.5, generator=g),
            f"{m}.A_log": torch.empty(INNER, D_STATE).uniform_(-0.7, 0.7, generator=g),
            f"{m}.D": 1 + 0.1 * torch.randn(INNER, generator=g),
            f"{m}.out_proj.weight": _lin(g, HIDDEN, INNER),
        })
    return t


def mamba1_config(dtype: str = "bfloat16") -> dict:
    """The tiny ``MambaForCausalLM`` config (Mamba-1)."""
    cfg = _mamba_config("MambaForCausalLM", "mamba", dtype)
    cfg.update({"num_hidden_layers": 2, "intermediate_size": INNER, "time_step_rank": DT_RANK,
                "hidden_act": "silu", "time_step_scale": 1.0, "time_step_min": 0.001,
                "time_step_max": 0.1, "time_step_init_scheme": "random", "time_step_floor": 1e-4,
                "use_mambapy": False})
    for key in ("chunk_size", "time_step_limit", "ssm_state_size"):
        cfg.pop(key)
    return cfg
