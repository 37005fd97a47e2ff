"""The GPTQ act-order and MXFP4 checkpoints of :mod:`tiny_formats` decode, by their formats'
definitions, to exactly the dequantized checkpoints the float64 reference runs."""

from __future__ import annotations

import torch
from tiny_formats import E2M1, GPTQ_GROUP, gptq_act_order_qwen3_moe, mxfp4_qwen3_moe


def _nibbles(words: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 words' eight nibbles (nibble ``j`` = bits ``4j .. 4j+3``), expanded along ``dim``."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    parts = torch.stack([(w >> (4 * j)) & 0xF for j in range(8)], dim=dim + 1)
    shape = list(words.shape)
    shape[dim] *= 8
    return parts.reshape(shape)


def test_gptq_act_order_checkpoint_decodes_to_its_dequantized_weights() -> None:
    cfg, quant, deq = gptq_act_order_qwen3_moe()
    assert cfg["quantization_config"]["desc_act"] is True
    stems = [k.removesuffix(".qweight") for k in quant if k.endswith(".qweight")]
    assert len(stems) == 2 * 4 * 3  # layers x experts x (gate, up, down)
    for stem in stems:
        q = _nibbles(quant[f"{stem}.qweight"], 0)  # [K, N]
        g_idx = quant[f"{stem}.g_idx"].long()
        k = q.shape[0]
        # act-order: every group has GPTQ_GROUP rows, and they are not K's consecutive rows
        assert torch.equal(torch.bincount(g_idx), torch.full((k // GPTQ_GROUP,), GPTQ_GROUP))
        assert not torch.equal(g_idx, torch.arange(k) // GPTQ_GROUP)
        assert torch.all(_nibbles(quant[f"{stem}.qzeros"], 1) == 7)  # GPTQ stores zero - 1
        w = (q - 8) * quant[f"{stem}.scales"].double()[g_idx]
        assert torch.equal(w.t(), deq[f"{stem}.weight"].double())
        assert deq[f"{stem}.weight"].abs().max() > 0
    for stem in (s for s in stems if s.endswith("gate_proj")):  # gate and up share their input's order
        assert torch.equal(quant[f"{stem}.g_idx"], quant[f"{stem[:-9]}up_proj.g_idx"])


def test_mxfp4_checkpoint_decodes_to_its_dequantized_weights() -> None:
    cfg, quant, deq = mxfp4_qwen3_moe()
    assert cfg["quantization_config"] == {"quant_method": "mxfp4"}
    names = [k for k in quant if ".experts." in k and k.endswith(".weight")]
    assert len(names) == 2 * 4 * 3
    for name in names:
        packed, scales = quant[name], quant[f"{name}_scale"]
        assert packed.dtype == scales.dtype == torch.uint8
        n, half = packed.shape
        codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, 2 * half).long()  # even k low
        value = E2M1.double()[codes & 7] * (1 - 2 * (codes >> 3)).double()
        w = value * torch.exp2(scales.double() - 127).repeat_interleave(32, dim=1)
        assert torch.equal(w, deq[name].double())
        # the format's range is used: some block reaches e2m1's largest magnitude, 6
        assert torch.any((codes & 7) == 7)
