"""``benchmarks/bench_moe.py``'s vLLM peers against the installed vLLM's real signatures: the
Marlin call (``fused_marlin_moe`` with quant type ``uint4b8``, weights repacked by
``gptq_marlin_moe_repack``, scales permuted by vLLM's ``marlin_moe_permute_scales``) and the
Triton W4A16 / FP8 quant configs. vLLM's CPU build has no Marlin or Triton kernels, so the calls
are bound, not run (the GPU benchmark runs them)."""

from __future__ import annotations

import importlib.util
import inspect
import pathlib

import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_moe.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_moe_peers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _problem(bench):
    e, k, h, inter, t = 4, 2, 256, 128, 3
    p = bench.make_problem(e, k, h, inter, t, torch.bfloat16, "cpu")
    return p, (bench.quant_gptq4(p["w13"]), bench.quant_gptq4(p["w2"])), h, inter


def test_marlin_call_binds_to_vllms_fused_marlin_moe() -> None:
    from vllm import _custom_ops as vops
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_moe_permute_scales
    from vllm.scalar_type import scalar_types

    bench = _bench()
    p, gptq, h, inter = _problem(bench)
    repack_sig = inspect.signature(vops.gptq_marlin_moe_repack)
    calls = []

    def repack(*a, **kw):  # vLLM's own signature; its CUDA kernel is not in the CPU build
        bound = repack_sig.bind(*a, **kw)
        calls.append(bound.arguments)
        arg = bound.arguments
        size_k, size_n, bits = arg["size_k"], arg["size_n"], arg["num_bits"]
        return torch.empty(a[0].shape[0], size_k // 16, size_n * bits // 2, dtype=torch.int32)

    args, kw = bench.marlin_args(gptq, p["x"], p["tw"], p["ids"], h, inter, fused_marlin_moe, repack,
                                 marlin_moe_permute_scales, scalar_types.uint4b8.id)
    bound = inspect.signature(fused_marlin_moe).bind(*args, **kw)
    assert bound.arguments["quant_type_id"] == scalar_types.uint4b8.id is not None
    assert bound.arguments["topk_ids"] is p["ids"] and bound.arguments["topk_weights"] is p["tw"]
    assert [(c["size_k"], c["size_n"], c["num_bits"]) for c in calls] == [(h, 2 * inter, 4), (inter, h, 4)]
    # the scales went through vLLM's Marlin permutation: same values, another order
    s13 = gptq[0][1]
    w1s = bound.arguments["w1_scale"]
    assert w1s.shape == s13.shape and not torch.equal(w1s, s13)
    assert torch.equal(w1s.flatten().sort().values, s13.flatten().sort().values)


def test_triton_quant_configs_build_with_vllms_helpers() -> None:
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts  # the CPU build exports a stub

    bench = _bench()
    p, gptq, h, inter = _problem(bench)
    seen = {}

    def fake_experts(x, w1, w2, tw, ids, quant_config=None):  # the installed signature's parameters
        seen["cfg"], seen["w1"] = quant_config, w1
        return x

    assert "quant_config" in inspect.signature(fused_experts).parameters
    bench.triton_w4a16(fake_experts, gptq, p["x"], p["tw"], p["ids"])()
    cfg = seen["cfg"]
    assert cfg.use_int4_w4a16 and cfg.block_shape == [0, bench.GROUP]
    assert seen["w1"].dtype == torch.uint8 and seen["w1"].shape == (4, 2 * inter, h // 2)
    bench.triton_fp8(fake_experts, (bench.quant_fp8(p["w13"]), bench.quant_fp8(p["w2"])),
                     p["x"], p["tw"], p["ids"])()
    assert seen["cfg"].use_fp8_w8a8 and seen["cfg"].block_shape == [bench.FP8_BLOCK, bench.FP8_BLOCK]
