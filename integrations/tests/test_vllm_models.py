"""Tiny MoE models end to end in vLLM's CPU build, plugin off vs on (kernels in the emulator).

The models have real random weights (``tiny_models``), so greedy tokens depend on every kernel
(each run is checked against the float64 teacher-forced reference along its own tokens,
:mod:`agreement`): a Mixtral-like bf16 model, a Qwen2-MoE-like one with a shared expert (and
q/k/v biases), a Qwen3-MoE-like one (per-head q/k norms), and AutoAWQ int4 Mixtral-like and
DeepSeek-V3-like ones whose reference (plugin off) is the same model with its experts
dequantized to bf16 (exactly: power-of-two scales), so vLLM's own AWQ MoE kernels, which need
AMX on the CPU, are not involved. DeepSeek-V3's MLA decode runs hexlayout's ``mla_decode`` with
the plugin on (its prefill stays vLLM's; block size 16, no chunked prefill: vLLM's CPU platform
forces both for MLA), and its runs are checked against vLLM's own run (``VLLM_REFERENCED``).
A gpt-oss-like model (:mod:`tiny_gpt_oss`: attention sinks, a sliding window of 8 on layer 0,
YaRN rope, biased swigluoai experts) runs hexlayout's attention with sinks and the window, and
vLLM's experts (the plugin's MoE falls back: activation swigluoai, logged).
A copy of the Mixtral model runs with ``kv_cache_dtype="fp8"`` (its ``LLM_ARGS``) in the same
processes, plugin on only (``PLUGIN_ON_ONLY``: vLLM's CPU attention needs AVX-512 or AMX for an
FP8 cache), against float64 with K and V rounded to E4M3 as its cache stores them, within
``FP8_LOGPROB_TOL``.
Both runs use one vLLM configuration: chunked prefill with a 16-token budget over four prompts
of 3-21 tokens, so steps mix prefill chunks and decodes; block size 32.
"""

from __future__ import annotations

import pytest
from agreement import FP8_LOGPROB_TOL, LOGPROB_TOL, check, check_runs
from vllm_harness import LLM_ARGS, MODELS, PLUGIN_ON_ONLY, VLLM_REFERENCED, Run, run_models

#: (model, run) pairs checked against float64: both runs of each model, the plugin-on run only
#: of ``PLUGIN_ON_ONLY`` models.
FLOAT64_CHECKS = [
    (name, which)
    for which in ("hexlayout", "vllm")
    for name in sorted(set(MODELS) - VLLM_REFERENCED)
    if which == "hexlayout" or name not in PLUGIN_ON_ONLY
]


@pytest.mark.parametrize(("name", "which"), FLOAT64_CHECKS)
def test_tokens_and_logprobs_match_float64(name: str, which: str, reference: Run, hexlayout_run: Run,
                                           float64) -> None:
    """Each run against the float64 teacher-forced reference along its own tokens; vLLM's own
    kernels (plugin off) pass the same check, which calibrates its tolerances. A model with an
    FP8 KV cache: against float64 with the same rounding, within ``FP8_LOGPROB_TOL``."""
    run = hexlayout_run if which == "hexlayout" else reference
    fp8 = LLM_ARGS.get(name, {}).get("kv_cache_dtype", "auto") != "auto"
    tol = FP8_LOGPROB_TOL if fp8 else LOGPROB_TOL
    report = check(run.results[name], float64(name, run.results[name]), tol)
    print(f"{name} ({which}): {report.summary()}")
    assert not report.problems, f"{name} ({which}): {report.summary()}\n" + "\n".join(report.problems)


@pytest.mark.parametrize("name", sorted(VLLM_REFERENCED))
def test_tokens_and_logprobs_match_vllms_own_kernels(name: str, reference: Run, hexlayout_run: Run) -> None:
    """DeepSeek-V3 (MLA, grouped top-k routing with ``e_score_correction_bias``,
    ``routed_scaling_factor``, a shared expert, a dense first layer; AWQ int4 experts): the
    plugin's run against vLLM's own run of the same weights dequantized (:func:`check_runs`):
    the experts and the MLA decode (and its latent-cache writes) differ between them."""
    report = check_runs(hexlayout_run.results[name], reference.results[name])
    print(f"{name} (hexlayout vs vLLM's own): {report.summary()}")
    assert not report.problems, f"{name}: {report.summary()}\n" + "\n".join(report.problems)


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
    want = {"attention_prefill", "attention_decode", "moe", "moe_w4a16", "moe_prepare", "mla_decode"}
    assert kernels == want, kernels
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
        elif row["kernel"] == "mla_decode":  # DeepSeek-V3's latent 512 + rope 64 (tiny_models.MLA)
            s = row["shapes"]
            assert (s["kv_lora_rank"], s["rope"]) == (512, 64) and s["num_seqs"] >= 1, s
        elif row["kernel"] != "moe_prepare":  # (test_prepared_experts_release_the_checkpoint_weights)
            s = row["shapes"]
            # 4 experts (Mixtral, Qwen2-MoE, Qwen3-MoE) or 8 (DeepSeek-V3), top-2 of them
            assert (s["topk"], s["hidden"], s["intermediate"]) == (2, 128, 256), s
            assert s["global_experts"] == s["local_experts"] in (4, 8) and s["tokens"] >= 1, s
            if row["kernel"] == "moe_w4a16":
                assert s["group_size"] == 32
    # DeepSeek-V3's AWQ experts (8 of them) ran hexlayout's W4A16 MoE
    assert any(r["kernel"] == "moe_w4a16" and r["shapes"]["global_experts"] == 8
               for r in hexlayout_run.trace)
    check_attention_features(hexlayout_run.trace)
    # Some step ran prefill chunks and decodes together (one kernel call, one line per part).
    mixed = [
        (a, b)
        for a, b in zip(hexlayout_run.trace, hexlayout_run.trace[1:])
        if {a["kernel"], b["kernel"]} == {"attention_prefill", "attention_decode"}
    ]
    assert mixed


def check_attention_features(trace: list[dict]) -> None:
    """hexlayout's attention ran, prefill and decode, with gpt-oss's sinks and its sliding window
    of 8 (left window 7: layer 0) and without it (layer 1), and with the FP8 cache (the Mixtral
    copy: no sinks, no window); every other call plain (no sinks, no window, a bf16 cache)."""
    features = {}
    for row in trace:
        if row["kernel"].startswith("attention"):
            s = row["shapes"]
            key = (s["sinks"], s["window"], s["kv_cache_dtype"])
            features.setdefault(key, set()).add(row["kernel"])
    both = {"attention_prefill", "attention_decode"}
    assert features == {(1, 7, "auto"): both, (1, -1, "auto"): both, (0, -1, "fp8"): both,
                        (0, -1, "auto"): both}, features


#: The prepared experts' parameter bytes over the checkpoint's (what vLLM holds with the plugin
#: off), at most: the packed tensors are released, the re-laid weights take their bytes, GPTQ's
#: act-order permutation its g_idx's; AWQ's zero points are held a byte each beside the scales
#: (4-bit in the checkpoint: (1/2 + 3/32) / (1/2 + 2.5/32) = 1.027x at group 32) and MXFP4's e8m0
#: scales as the checkpoint's bytes (1.00x); the kernels convert both once per group.
PREPARED_BYTES = {"awq": 1.03, "gptq": 1.0, "mxfp4": 1.0}


def check_prepared(trace: list[dict], layers: int) -> None:
    """``layers`` ``moe_prepare`` trace lines, each within :data:`PREPARED_BYTES`."""
    prepared = [r["shapes"] for r in trace if r["kernel"] == "moe_prepare"]
    assert len(prepared) == layers, prepared
    for s in prepared:
        assert 0 < s["bytes_after"] <= PREPARED_BYTES[s["quant_format"]] * s["bytes_before"], s


def test_prepared_experts_release_the_checkpoint_weights(hexlayout_run: Run) -> None:
    """Each AWQ expert layer's parameters after preparation (the prepared tensors replace vLLM's
    packed ones; distinct storages counted once) against the checkpoint's packed parameters: the
    expert memory no longer doubles."""
    check_prepared(hexlayout_run.trace, 2 + 1)  # AWQ Mixtral: 2 MoE layers; DeepSeek-V3: 1 (layer 0 dense)


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
    # DeepSeek-V3: layer 0 is dense (first_k_dense_replace = 1), layer 1's AWQ experts are
    # hexlayout's, and its MLA decode hexlayout's mla_decode, in one line per process
    assert f"hexlayout: model.layers.1.mlp.experts: {awq}" in out
    assert "hexlayout: model.layers.0.mlp.experts: AWQ" not in out
    # gpt-oss: hexlayout's attention (sinks, sliding window), vLLM's experts (swigluoai, biases)
    for i in (0, 1):
        assert f"hexlayout: model.layers.{i}.attn.attn: attention runs hexlayout's paged_attention" in out
        keep = f"hexlayout: model.layers.{i}.mlp.experts: keeping vLLM's MoE experts (activation swigluoai)"
        assert keep in out
    mla = [x for x in out.splitlines() if "MLA attention runs hexlayout's mla_decode" in x]
    assert len(mla) == 1 and "model.layers.0.self_attn" in mla[0] and "CPU_MLA backend" in mla[0], mla
    assert "attention backend CPU_MLA -> hexlayout.integrations.vllm.mla.HexlayoutCPUMLABackend" in swapped[0]
    mla_swap = "MultiHeadLatentAttentionWrapper -> hexlayout.integrations.vllm.mla.HexlayoutMLAWrapper"
    assert mla_swap in swapped[0]
    # Plugin off: no line, no trace, nothing swapped.
    assert "hexlayout" not in reference.output.replace("hexlayout/", "")
    assert reference.trace == []
