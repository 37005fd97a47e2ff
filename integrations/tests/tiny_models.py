"""Tiny MoE checkpoints with real random weights, written as safetensors for vLLM.

Hidden size 128, 2 layers, 2 query heads of 64 (1 KV head: GQA), 4 experts, top-2. Weights are
drawn N(0, 1/fan_in) so every layer keeps the activations' scale (vLLM's dummy weights are
tiny: their tokens do not depend on the kernels); embeddings N(0, 1), the LM head scaled so
logits spread over a few units and greedy tokens are decided by the network, not by ties.
"""

from __future__ import annotations

import json
import pathlib

import torch
from safetensors.torch import save_file

HIDDEN = 128
LAYERS = 2
HEADS = 2
KV_HEADS = 1
HEAD_DIM = 64
EXPERTS = 4
TOP_K = 2
MOE_I = 256
SHARED_I = 128
VOCAB = 512


def _lin(g: torch.Generator, out: int, inp: int, gain: float = 1.0) -> torch.Tensor:
    return torch.randn(out, inp, generator=g) * (gain / inp**0.5)


def _attention(g: torch.Generator, p: str, bias: bool) -> dict[str, torch.Tensor]:
    t = {
        f"{p}.q_proj.weight": _lin(g, HEADS * HEAD_DIM, HIDDEN),
        f"{p}.k_proj.weight": _lin(g, KV_HEADS * HEAD_DIM, HIDDEN),
        f"{p}.v_proj.weight": _lin(g, KV_HEADS * HEAD_DIM, HIDDEN),
        f"{p}.o_proj.weight": _lin(g, HIDDEN, HEADS * HEAD_DIM),
    }
    if bias:
        t[f"{p}.q_proj.bias"] = 0.1 * torch.randn(HEADS * HEAD_DIM, generator=g)
        t[f"{p}.k_proj.bias"] = 0.1 * torch.randn(KV_HEADS * HEAD_DIM, generator=g)
        t[f"{p}.v_proj.bias"] = 0.1 * torch.randn(KV_HEADS * HEAD_DIM, generator=g)
    return t


def _common(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=g),
        "model.norm.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=g),
        "lm_head.weight": _lin(g, VOCAB, HIDDEN, gain=4.0),
    }


def _norms(g: torch.Generator, p: str) -> dict[str, torch.Tensor]:
    return {
        f"{p}.input_layernorm.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=g),
        f"{p}.post_attention_layernorm.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=g),
    }


def _base_config(arch: str, model_type: str, dtype: str) -> dict:
    return {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": dtype,
        "dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def _mlp(g: torch.Generator, q: str, names: tuple[str, str, str], inter: int) -> dict[str, torch.Tensor]:
    """A gated MLP ``{q}.<gate|up|down>.weight`` named by ``names``: gate, up [inter, H]; down [H, inter]."""
    gate, up, down = names
    return {
        f"{q}.{gate}.weight": _lin(g, inter, HIDDEN),
        f"{q}.{up}.weight": _lin(g, inter, HIDDEN),
        f"{q}.{down}.weight": _lin(g, HIDDEN, inter, gain=2.0),
    }


def _moe_layer(g: torch.Generator, p: str, bias: bool, moe: str, router: str,
               names: tuple[str, str, str]) -> dict[str, torch.Tensor]:
    """Decoder layer ``p``: norms, attention (q/k/v ``bias``), the router ``{p}.{moe}.{router}``
    and the routed experts ``{p}.{moe}.experts.<e>`` (``_mlp`` with ``names``)."""
    t = {**_norms(g, p), **_attention(g, f"{p}.self_attn", bias=bias)}
    t[f"{p}.{moe}.{router}.weight"] = _lin(g, EXPERTS, HIDDEN, gain=2.0)
    for e in range(EXPERTS):
        t.update(_mlp(g, f"{p}.{moe}.experts.{e}", names, MOE_I))
    return t


def mixtral_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Mixtral checkpoint tensors (float32): experts' w1 (gate) / w3 (up) [I, H], w2 [H, I]."""
    g = torch.Generator().manual_seed(seed)
    t = _common(g)
    for i in range(LAYERS):
        t.update(_moe_layer(g, f"model.layers.{i}", False, "block_sparse_moe", "gate", ("w1", "w3", "w2")))
    return t


def mixtral_config(dtype: str = "bfloat16") -> dict:
    cfg = _base_config("MixtralForCausalLM", "mixtral", dtype)
    cfg.update(
        {
            "intermediate_size": MOE_I,
            "num_local_experts": EXPERTS,
            "num_experts_per_tok": TOP_K,
            "sliding_window": None,
            "router_aux_loss_coef": 0.0,
        }
    )
    return cfg


def qwen2_moe_tensors(seed: int = 1) -> dict[str, torch.Tensor]:
    """Qwen2-MoE checkpoint tensors: routed experts, a shared expert and its sigmoid gate,
    q/k/v biases."""
    g = torch.Generator().manual_seed(seed)
    t = _common(g)
    proj = ("gate_proj", "up_proj", "down_proj")
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        t.update(_moe_layer(g, p, True, "mlp", "gate", proj))
        t.update(_mlp(g, f"{p}.mlp.shared_expert", proj, SHARED_I))
        t[f"{p}.mlp.shared_expert_gate.weight"] = _lin(g, 1, HIDDEN)
    return t


def qwen2_moe_config(dtype: str = "bfloat16") -> dict:
    cfg = _base_config("Qwen2MoeForCausalLM", "qwen2_moe", dtype)
    cfg.update(
        {
            "intermediate_size": 4 * HIDDEN,
            "moe_intermediate_size": MOE_I,
            "shared_expert_intermediate_size": SHARED_I,
            "num_experts": EXPERTS,
            "num_experts_per_tok": TOP_K,
            "norm_topk_prob": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "use_sliding_window": False,
            "sliding_window": None,
            "router_aux_loss_coef": 0.0,
        }
    )
    return cfg


def qwen3_moe_tensors(seed: int = 3) -> dict[str, torch.Tensor]:
    """Qwen3-MoE checkpoint tensors: routed experts (no shared expert), per-head RMSNorms of the
    queries and keys (``q_norm`` / ``k_norm`` ``[head_dim]``), no q/k/v biases."""
    g = torch.Generator().manual_seed(seed)
    t = _common(g)
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        t.update(_moe_layer(g, p, False, "mlp", "gate", ("gate_proj", "up_proj", "down_proj")))
        for n in ("q_norm", "k_norm"):
            t[f"{p}.self_attn.{n}.weight"] = 1 + 0.1 * torch.randn(HEAD_DIM, generator=g)
    return t


def qwen3_moe_config(dtype: str = "bfloat16") -> dict:
    cfg = _base_config("Qwen3MoeForCausalLM", "qwen3_moe", dtype)
    cfg.update(
        {
            "intermediate_size": 4 * HIDDEN,
            "moe_intermediate_size": MOE_I,
            "num_experts": EXPERTS,
            "num_experts_per_tok": TOP_K,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "attention_bias": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "router_aux_loss_coef": 0.0,
        }
    )
    return cfg


#: DeepSeek-V3's MLA sizes: vLLM's CPU MLA kernel takes only a latent cache of
#: kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576 per token.
MLA = {
    "q_lora_rank": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 32, "v_head_dim": 64,
}
#: DeepSeek-V3's routing: 8 routed experts in 4 groups, tokens routed to 2 experts within the
#: 2 best groups (sigmoid scores plus ``e_score_correction_bias``), one shared expert.
DSV3_EXPERTS = 8
DSV3_GROUPS = 4
DSV3_TOPK_GROUPS = 2
DSV3_SCALING = 2.5


def _mla(g: torch.Generator, p: str) -> dict[str, torch.Tensor]:
    """MLA attention ``p``: queries through a rank-``q_lora_rank`` bottleneck, keys and values
    from one ``kv_lora_rank`` latent plus a shared rotary key."""
    m = MLA
    qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
    return {
        f"{p}.q_a_proj.weight": _lin(g, m["q_lora_rank"], HIDDEN),
        f"{p}.q_a_layernorm.weight": 1 + 0.1 * torch.randn(m["q_lora_rank"], generator=g),
        f"{p}.q_b_proj.weight": _lin(g, HEADS * qk, m["q_lora_rank"]),
        f"{p}.kv_a_proj_with_mqa.weight": _lin(g, m["kv_lora_rank"] + m["qk_rope_head_dim"], HIDDEN),
        f"{p}.kv_a_layernorm.weight": 1 + 0.1 * torch.randn(m["kv_lora_rank"], generator=g),
        f"{p}.kv_b_proj.weight": _lin(
            g, HEADS * (m["qk_nope_head_dim"] + m["v_head_dim"]), m["kv_lora_rank"]
        ),
        f"{p}.o_proj.weight": _lin(g, HIDDEN, HEADS * m["v_head_dim"]),
    }


def deepseek_v3_tensors(seed: int = 4) -> dict[str, torch.Tensor]:
    """DeepSeek-V3 checkpoint tensors: MLA attention in every layer, a dense MLP in layer 0
    (``first_k_dense_replace = 1``), then routed experts with a sigmoid router and its
    ``e_score_correction_bias``, and a shared expert."""
    g = torch.Generator().manual_seed(seed)
    t = _common(g)
    proj = ("gate_proj", "up_proj", "down_proj")
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        t.update({**_norms(g, p), **_mla(g, f"{p}.self_attn")})
        if i == 0:
            t.update(_mlp(g, f"{p}.mlp", proj, 2 * MOE_I))
            continue
        t[f"{p}.mlp.gate.weight"] = _lin(g, DSV3_EXPERTS, HIDDEN, gain=2.0)
        t[f"{p}.mlp.gate.e_score_correction_bias"] = 0.1 * torch.randn(DSV3_EXPERTS, generator=g)
        for e in range(DSV3_EXPERTS):
            t.update(_mlp(g, f"{p}.mlp.experts.{e}", proj, MOE_I))
        t.update(_mlp(g, f"{p}.mlp.shared_experts", proj, MOE_I))
    return t


def deepseek_v3_config(dtype: str = "bfloat16") -> dict:
    cfg = _base_config("DeepseekV3ForCausalLM", "deepseek_v3", dtype)
    del cfg["head_dim"]
    cfg.update(
        {
            **MLA,
            "num_key_value_heads": HEADS,
            "intermediate_size": 2 * MOE_I,
            "moe_intermediate_size": MOE_I,
            "n_routed_experts": DSV3_EXPERTS,
            "n_shared_experts": 1,
            "num_experts_per_tok": TOP_K,
            "n_group": DSV3_GROUPS,
            "topk_group": DSV3_TOPK_GROUPS,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "norm_topk_prob": True,
            "routed_scaling_factor": DSV3_SCALING,
            "first_k_dense_replace": 1,
            "moe_layer_freq": 1,
            "rope_scaling": None,
            "rope_interleave": True,
            "attention_bias": False,
        }
    )
    return cfg


def write_model(
    path: pathlib.Path, config: dict, tensors: dict[str, torch.Tensor], dtype: torch.dtype
) -> pathlib.Path:
    """``config.json`` and ``model.safetensors`` in ``path``: float32 tensors cast to ``dtype``
    (others, e.g. AWQ's int32 words and f16 scales, as they are)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    out = {k: (v.to(dtype) if v.dtype == torch.float32 else v).contiguous() for k, v in tensors.items()}
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


#: AutoAWQ's nibble order: nibble ``i`` of a packed word holds column ``8w + AWQ_ORDER[i]``.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_GROUP = 32


def awq_pack(q: torch.Tensor) -> torch.Tensor:
    """``[R, N]`` 4-bit values (0..15) packed along N as AutoAWQ's GEMM format does: int32
    ``[R, N/8]``."""
    r, n = q.shape
    cols = q.to(torch.int64).view(r, n // 8, 8)
    word = torch.zeros(r, n // 8, dtype=torch.int64)
    for i, c in enumerate(AWQ_ORDER):
        word |= cols[:, :, c] << (4 * i)
    return (word - ((word >> 31) << 32)).to(torch.int32)  # two's complement into int32


def awq_quantize(w: torch.Tensor, group: int = AWQ_GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit quantization of ``W`` ``[K, N]`` (``y = x @ W``) in groups of ``group``
    rows: ``(q [K, N], zeros [K/G, N], scales [K/G, N])`` with ``W ~ (q - z) * s``. Scales are
    powers of two, so every dequantized weight ``(q - z) * s`` is exact in bf16 and f16."""
    k, n = w.shape
    g = w.view(k // group, group, n)
    lo, hi = g.amin(1), g.amax(1)
    scales = torch.exp2(torch.ceil(torch.log2((hi - lo).clamp_min(1e-8) / 15)))
    zeros = torch.clamp(torch.round(-lo / scales), 0, 15)
    q = torch.clamp(torch.round(g / scales[:, None]) + zeros[:, None], 0, 15).view(k, n)
    return q.to(torch.int32), zeros.to(torch.int32), scales


def awq_dequantize(
    q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group: int = AWQ_GROUP
) -> torch.Tensor:
    """``(q - z) * s`` per group: the ``[K, N]`` weights a quantized checkpoint stands for."""
    k, n = q.shape
    return ((q.view(k // group, group, n) - zeros[:, None]) * scales[:, None]).view(k, n).float()


def awq_experts(
    config: dict, base: dict[str, torch.Tensor], not_convert: list[str]
) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """An AutoAWQ int4 (GEMM packing, group 32, zero points) checkpoint of ``config`` / ``base``
    whose routed experts (``.experts.`` tensors) are quantized (every other module stays bf16:
    ``not_convert`` lists them for ``modules_to_not_convert``), and the same model with the
    experts dequantized: ``(config, awq_tensors, dequantized_tensors)``."""
    awq: dict[str, torch.Tensor] = {}
    deq: dict[str, torch.Tensor] = {}
    for name, t in base.items():
        if ".experts." not in name:
            awq[name] = deq[name] = t
            continue
        stem = name.removesuffix(".weight")
        q, z, s = awq_quantize(t.t().contiguous())  # checkpoint [out, in] -> W [in, out]
        awq[f"{stem}.qweight"] = awq_pack(q)
        awq[f"{stem}.qzeros"] = awq_pack(z)
        awq[f"{stem}.scales"] = s.to(torch.float16)
        deq[name] = awq_dequantize(q, z, s).t().contiguous()
    cfg = {
        **config,
        "quantization_config": {
            "quant_method": "awq",
            "bits": 4,
            "group_size": AWQ_GROUP,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": not_convert,
        },
    }
    return cfg, awq, deq


def awq_mixtral(seed: int = 2) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The AWQ int4 Mixtral-like checkpoint (:func:`awq_experts`; attention and router bf16)."""
    return awq_experts(mixtral_config(), mixtral_tensors(seed), ["self_attn", "block_sparse_moe.gate"])


def awq_deepseek_v3(seed: int = 4) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The AWQ int4 DeepSeek-V3-like checkpoint (:func:`awq_experts`): MLA, the dense layer 0,
    the router and the shared expert bf16, as AWQ DeepSeek-V3 / R1 checkpoints ship."""
    not_convert = ["self_attn", "mlp.gate", "shared_experts", "model.layers.0.mlp"]
    return awq_experts(deepseek_v3_config(), deepseek_v3_tensors(seed), not_convert)
