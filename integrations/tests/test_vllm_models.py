"""Tiny MoE models end to end in vLLM's CPU build, plugin off vs on (kernels in the emulator).

The models have real random weights (``tiny_models``), so greedy tokens depend on every kernel
(each run is checked against the float64 teacher-forced reference along its own tokens,
:mod:`agreement`): a Mixtral-like bf16 model, a Qwen2-MoE-like one with a shared expert (and
q/k/v biases), and an AutoAWQ int4 Mixtral-like one whose reference (plugin off) is the same
model with its experts dequantized to bf16 (exactly: power-of-two scales), so vLLM's own AWQ
MoE kernels, which need AMX on the CPU, are not involved. Both runs use one vLLM
configuration: chunked prefill with a 16-token budget over four prompts of 3-21 tokens, so
steps mix prefill chunks and decodes; block size 32.
"""

from __future__ import annotations

import pytest
from agreement import check
from vllm_harness import MODELS, Run, run_models


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("which", ["hexlayout", "vllm"])
def test_tokens_and_logprobs_match_float64(name: str, which: str, reference: Run, hexlayout_run: Run,
                                           float64) -> None:
    """Each run against the float64 teacher-forced reference along its own tokens; vLLM's own
    kernels (plugin off) pass the same check, which calibrates its tolerances."""
    run = hexlayout_run if which == "hexlayout" else reference
    report = check(run.results[name], float64(name, run.results[name]))
    print(f"{name} ({which}): {report.summary()}")
    assert not report.problems, f"{name} ({which}): {report.summary()}\n" + "\n".join(report.problems)


def test_a_planted_wrong_kernel_fails_the_check(models, tmp_path_factory: pytest.TempPathFactory,
                                               float64) -> None:
    """The check is not hollow: with paged attention reading each cache block's K and V halves
    swapped (``planted.py``; the cache itself is written correctly), the same model and
    prompts fail it."""
    env = {"HEXLAYOUT_EMULATE": "1", "HEXLAYOUT_VLLM_PLANT": "swap_kv"}
    run = run_models(tmp_path_factory.mktemp("planted"), {"qwen2_moe": models["qwen2_moe"]}, env)
    assert "planted wrong kernel: swap_kv" in run.output
    report = check(run.results["qwen2_moe"], float64("qwen2_moe", run.results["qwen2_moe"]))
    print(f"qwen2_moe (planted swap_kv): {report.summary()}")
    assert any("float64" in p for p in report.problems), report.summary()
    assert report.max_diff > 1.0, report.summary()      # whole nats, not bf16 noise


def test_trace_shows_the_kernels_in_the_worker(hexlayout_run: Run) -> None:
    kernels = {row["kernel"] for row in hexlayout_run.trace}
    assert kernels == {"attention_prefill", "attention_decode", "moe", "moe_w4a16"}, kernels
    # The engine ran in the runner process (in-process engine, uni executor): it is the worker.
    assert {row["pid"] for row in hexlayout_run.trace} == {hexlayout_run.pid}
    for row in hexlayout_run.trace:
        assert set(row) == {"pid", "kernel", "shapes", "dtype"} and row["dtype"] == "bfloat16"
        if row["kernel"].startswith("attention"):
            s = row["shapes"]
            assert (s["num_heads"], s["num_kv_heads"], s["head_size"], s["block_size"]) == (2, 1, 64, 32)
            if row["kernel"] == "attention_decode":
                assert s["num_tokens"] == s["num_seqs"]
            else:
                assert s["num_tokens"] > s["num_seqs"] or s["max_seqlen_k"] > 1
        else:
            s = row["shapes"]
            assert (s["topk"], s["global_experts"], s["local_experts"], s["hidden"]) == (2, 4, 4, 128)
            assert s["intermediate"] == 256 and s["tokens"] >= 1
            if row["kernel"] == "moe_w4a16":
                assert s["group_size"] == 32
    # Some step ran prefill chunks and decodes together (one kernel call, one line per part).
    mixed = [
        (a, b)
        for a, b in zip(hexlayout_run.trace, hexlayout_run.trace[1:])
        if {a["kernel"], b["kernel"]} == {"attention_prefill", "attention_decode"}
    ]
    assert mixed


def test_plugin_logs_what_it_swapped(hexlayout_run: Run, reference: Run) -> None:
    out = hexlayout_run.output
    swapped = [x for x in out.splitlines() if "hexlayout (emulate): swapped " in x]
    assert len(swapped) == 1, out[-20000:]  # once per process
    for what in (
        "attention backend CPU_ATTN -> hexlayout.integrations.vllm.attention.HexlayoutCPUAttentionBackend",
        "UnquantizedFusedMoEMethod -> hexlayout.integrations.vllm.moe.HexlayoutUnquantizedFusedMoEMethod",
        "quantization awq -> hexlayout.integrations.vllm.awq.HexlayoutAWQConfig",
    ):
        assert what in swapped[0]
    for i in (0, 1):
        layer = f"hexlayout: model.layers.{i}"
        assert f"{layer}.self_attn.attn: attention runs hexlayout's paged_attention" in out
        assert f"{layer}.block_sparse_moe.experts: MoE experts run hexlayout's fused_moe" in out  # Mixtral
        assert f"{layer}.mlp.experts: MoE experts run hexlayout's fused_moe" in out  # Qwen2-MoE
        awq = "AWQ int4 MoE experts run hexlayout's fused_moe (W4A16)"
        assert f"{layer}.block_sparse_moe.experts: {awq}" in out
    # Plugin off: no line, no trace, nothing swapped.
    assert "hexlayout" not in reference.output.replace("hexlayout/", "")
    assert reference.trace == []
