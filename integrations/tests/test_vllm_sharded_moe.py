"""The plugin's MoE path on sharded shapes, directly (no engine): ``run_fused_moe``, which
``HexlayoutExperts`` / ``HexlayoutWNA16Experts`` call with what vLLM hands them, against a float64
reference. Expert parallelism: 2 of 4 experts local, ``expert_map`` global -> local or -1 (the
remote experts' contributions skipped); tensor parallelism: the local slice of I; vLLM's
``apply_router_weight_on_input`` (k = 1: the input already scaled, so the kernel applies no
weight). Kernels in the emulator."""

from __future__ import annotations

import pytest
import torch
from hexlayout.integrations.vllm.moe import run_fused_moe
from hexlayout.ops import prepare_wna16
from tiny_models import awq_dequantize, awq_pack, awq_quantize
from vllm.model_executor.layers.fused_moe.activation import MoEActivation

T, H, E, K = 7, 128, 4, 2


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv("HEXLAYOUT_VLLM_TRACE", raising=False)


def reference(x, w13, w2, tw, ids, expert_map) -> torch.Tensor:
    """``sum_j tw[t,j] w2[e] (silu(w13[e,:I] x) * (w13[e,I:] x))`` over local experts, float64."""
    x, w13, w2 = x.double(), w13.double(), w2.double()
    i = w13.shape[1] // 2
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(expert_map[ids[t, j]]) if expert_map is not None else int(ids[t, j])
            if e >= 0:
                h = w13[e] @ x[t]
                out[t] += float(tw[t, j]) * (w2[e] @ (torch.nn.functional.silu(h[:i]) * h[i:]))
    return out


def routing(g: torch.Generator, k: int = K) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    tw = torch.rand(T, k, generator=g).softmax(-1)
    return tw, ids


def check(out: torch.Tensor, ref: torch.Tensor) -> None:
    err = (out.double() - ref).abs().max().item()
    assert err <= 2e-2 * ref.abs().max().item(), err  # bf16 output and intermediate


@pytest.mark.parametrize("local", [[0, 1, 2, 3], [2, 0]])
def test_bf16_experts_sharded(local: list[int]) -> None:
    g = torch.Generator().manual_seed(len(local))
    i_local = 64  # a TP shard of I = 256 over 4 ranks
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    w13 = (torch.randn(len(local), 2 * i_local, H, generator=g) / H**0.5).to(torch.bfloat16)
    w2 = (torch.randn(len(local), H, i_local, generator=g) / i_local**0.5).to(torch.bfloat16)
    tw, ids = routing(g)
    expert_map = None
    if len(local) < E:
        expert_map = torch.full((E,), -1, dtype=torch.int32)
        expert_map[torch.tensor(local)] = torch.arange(len(local), dtype=torch.int32)
    out = torch.empty(T, H, dtype=torch.bfloat16)
    shapes = {"local_experts": len(local), "hidden": H, "intermediate": i_local}
    run_fused_moe("moe", out, x, w13, w2, tw, ids, MoEActivation.SILU, E, expert_map, False, shapes)
    ref = reference(x, w13, w2, tw, ids, expert_map)
    check(out, ref)
    if expert_map is not None:  # a token routed only to remote experts gets exactly 0
        only_remote = [t for t in range(T) if bool((expert_map[ids[t].long()] < 0).all())]
        for t in only_remote:
            assert out[t].abs().max() == 0


def test_router_weight_on_input_applies_no_weight() -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    w13 = (torch.randn(E, 128, H, generator=g) / H**0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, 64, generator=g) / 8).to(torch.bfloat16)
    tw, ids = routing(g, k=1)
    scaled = (x.float() * tw).to(torch.bfloat16)  # vLLM's prepare did this
    out = torch.empty(T, H, dtype=torch.bfloat16)
    shapes = {"local_experts": E, "hidden": H, "intermediate": 64}
    run_fused_moe("moe", out, scaled, w13, w2, tw, ids, MoEActivation.SILU, E, None, True, shapes)
    check(out, reference(scaled, w13, w2, torch.ones_like(tw), ids, None))


@pytest.mark.parametrize("arch", ["sm_80", "sm_100a"])
def test_awq_experts_with_expert_map(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """The W4A16 path, on the mma.sync kernels and on the sm_100a tcgen05 ones (the weights
    prepared for, and the op run on, ``HEXLAYOUT_EMULATE_ARCH``)."""
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    g = torch.Generator().manual_seed(3)
    local, i_local = [1, 3], 64
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    # W [K, N] per local expert, quantized as AutoAWQ stores them (group 32).
    w13_f = torch.randn(len(local), H, 2 * i_local, generator=g) / H**0.5
    w2_f = torch.randn(len(local), i_local, H, generator=g) / i_local**0.5
    packed = {}
    deq = {}
    for name, w in (("w13", w13_f), ("w2", w2_f)):
        quant = [awq_quantize(we) for we in w]  # (q, zeros, scales) per expert
        packed[name] = prepare_wna16(
            torch.stack([awq_pack(q) for q, _, _ in quant]),
            torch.stack([s for _, _, s in quant]).to(torch.bfloat16),
            torch.stack([awq_pack(z) for _, z, _ in quant]),
            quant_format="awq",
            bits=4,
            group_size=32,
        )
        deq[name] = torch.stack([awq_dequantize(*r) for r in quant])
    expert_map = torch.tensor([-1, 0, -1, 1], dtype=torch.int32)
    tw, ids = routing(g)
    out = torch.empty(T, H, dtype=torch.bfloat16)
    shapes = {"local_experts": 2, "hidden": H, "intermediate": i_local, "group_size": 32}
    w13, w2 = packed["w13"], packed["w2"]
    run_fused_moe("moe_w4a16", out, x, w13, w2, tw, ids, MoEActivation.SILU, E, expert_map, False, shapes)
    # The dequantized weights in vLLM's orientation: w13 [E, 2I, H], w2 [E, H, I].
    check(out, reference(x, deq["w13"].transpose(1, 2), deq["w2"].transpose(1, 2), tw, ids, expert_map))
