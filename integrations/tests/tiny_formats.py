"""Tiny quantized checkpoints in the formats users load besides AWQ: GPTQ with act-order
(``desc_act``, ``g_idx``) and MXFP4 (OCP microscaling, as gpt-oss ships its experts), both on
the Qwen3-MoE architecture (:mod:`tiny_models`), experts quantized, every other module bf16.

Each builder returns ``(config, quantized_tensors, dequantized_tensors)``: the dequantized
checkpoint is the same model with its experts' weights exactly as the quantized ones stand for
(power-of-two scales: exact in bf16), the float64 reference's checkpoint.
"""

from __future__ import annotations

import torch
from tiny_models import qwen3_moe_config, qwen3_moe_tensors

GPTQ_GROUP = 32
MXFP4_BLOCK = 32
#: e2m1 magnitudes by code (bit 3 is the sign).
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _int32(word: torch.Tensor) -> torch.Tensor:
    """int64 words holding 32 bits, as two's complement int32."""
    return (word - ((word >> 31) << 32)).to(torch.int32)


def gptq_act_order_quantize(w: torch.Tensor, perm: torch.Tensor, group: int = GPTQ_GROUP
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Symmetric 4-bit GPTQ with act-order of ``W`` ``[K, N]`` (``y = x @ W``): the rows of K
    are visited in the order ``perm`` (GPTQ's: by decreasing activation) and grouped ``group``
    at a time in that order, so row ``perm[j]`` has ``g_idx = j // group``. Returns
    ``(q [K, N] in 0..15, scales [K/G, N], g_idx [K] int32)`` with ``W ~ (q - 8) * s[g_idx]``;
    the scales are powers of two."""
    k, n = w.shape
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = torch.arange(k, dtype=torch.int32) // group
    amax = w.abs()[perm].view(k // group, group, n).amax(1)  # group j: rows perm[jG .. jG+G-1]
    scales = torch.exp2(torch.ceil(torch.log2(amax.clamp_min(1e-8) / 7)))
    q = torch.clamp(torch.round(w / scales[g_idx.long()]) + 8, 0, 15)
    return q.to(torch.int32), scales, g_idx


def gptq_pack(q: torch.Tensor) -> torch.Tensor:
    """``[K, N]`` 4-bit values packed along K as GPTQ stores them: int32 ``[K/8, N]``, nibble
    ``j`` of word ``i`` holding row ``8i + j``."""
    k, n = q.shape
    rows = q.to(torch.int64).view(k // 8, 8, n)
    word = torch.zeros(k // 8, n, dtype=torch.int64)
    for j in range(8):
        word |= rows[:, j] << (4 * j)
    return _int32(word)


def gptq_act_order_qwen3_moe(seed: int = 5) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A GPTQ int4, group 32, symmetric, act-order (``desc_act: true``) Qwen3-MoE-like
    checkpoint: per expert projection ``qweight`` ``[K/8, N]``, ``qzeros`` ``[K/G, N/8]`` (GPTQ's
    stored ``zero - 1 = 7``), f16 ``scales`` ``[K/G, N]`` and ``g_idx`` ``[K]``. Each expert's
    K order is random; its gate and up projections, which share their input, share it."""
    g = torch.Generator().manual_seed(seed)
    orders: dict[str, torch.Tensor] = {}
    quant: dict[str, torch.Tensor] = {}
    deq: dict[str, torch.Tensor] = {}
    for name, t in qwen3_moe_tensors(seed).items():
        if ".experts." not in name:
            quant[name] = deq[name] = t
            continue
        stem = name.removesuffix(".weight")
        w = t.t().contiguous()  # checkpoint [out, in] -> W [in, out]
        shared = stem.rsplit(".", 1)[0] + (".down" if stem.endswith("down_proj") else ".gate_up")
        perm = orders.setdefault(shared, torch.randperm(w.shape[0], generator=g))
        q, s, g_idx = gptq_act_order_quantize(w, perm)
        quant[f"{stem}.qweight"] = gptq_pack(q)
        sevens = torch.full((s.shape[0], s.shape[1] // 8), 0x77777777, dtype=torch.int64)
        quant[f"{stem}.qzeros"] = _int32(sevens)
        quant[f"{stem}.scales"] = s.to(torch.float16)
        quant[f"{stem}.g_idx"] = g_idx
        deq[name] = ((q - 8) * s[g_idx.long()]).t().contiguous()
    cfg = {
        **qwen3_moe_config(),
        "quantization_config": {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": GPTQ_GROUP,
            "desc_act": True,
            "sym": True,
            "checkpoint_format": "gptq",
            "lm_head": False,
        },
    }
    return cfg, quant, deq


def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXFP4 of a checkpoint weight ``[N, K]`` (``[out, in]``): per block of 32 along K, the
    e8m0 scale ``2^e`` with ``e = ceil(log2(max|w| / 6))`` and each value's nearest e2m1.
    Returns ``(weight uint8 [N, K/2] (even k in the low nibble), scales uint8 [N, K/32] (e + 127),
    dequantized [N, K])``."""
    n, k = w.shape
    blocks = w.view(n, k // MXFP4_BLOCK, MXFP4_BLOCK)
    e = torch.ceil(torch.log2(blocks.abs().amax(-1).clamp_min(1e-8) / 6))
    x = blocks / torch.exp2(e)[..., None]
    code = (x.abs()[..., None] - E2M1).abs().argmin(-1)  # nearest magnitude
    deq = (E2M1[code] * torch.sign(x) * torch.exp2(e)[..., None]).view(n, k)
    code = (code | ((x < 0).to(torch.int64) << 3)).view(n, k)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return packed, (e + 127).to(torch.uint8), deq


def mxfp4_qwen3_moe(seed: int = 7) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """An MXFP4 Qwen3-MoE-like checkpoint (``quant_method: "mxfp4"``): per expert projection
    ``weight`` uint8 ``[N, K/2]`` and ``weight_scale`` uint8 e8m0 ``[N, K/32]``."""
    quant: dict[str, torch.Tensor] = {}
    deq: dict[str, torch.Tensor] = {}
    for name, t in qwen3_moe_tensors(seed).items():
        if ".experts." not in name:
            quant[name] = deq[name] = t
            continue
        packed, scales, d = mxfp4_quantize(t)
        quant[name] = packed
        quant[f"{name}_scale"] = scales
        deq[name] = d
    return {**qwen3_moe_config(), "quantization_config": {"quant_method": "mxfp4"}}, quant, deq
