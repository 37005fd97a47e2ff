"""Running the tiny models through vLLM from the tests: :func:`run_models` runs :mod:`vllm_run`
in a fresh process with a given environment and returns its results, pid, output and trace."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tiny_formats  # noqa: E402
import tiny_gpt_oss  # noqa: E402
import tiny_mamba  # noqa: E402
import tiny_models  # noqa: E402

#: The checkpoints the tests write: name -> (config, tensors) builder.
CHECKPOINTS = {
    "mixtral": lambda: (tiny_models.mixtral_config(), tiny_models.mixtral_tensors()),
    "qwen2_moe": lambda: (tiny_models.qwen2_moe_config(), tiny_models.qwen2_moe_tensors()),
    "mixtral_awq": lambda: tiny_models.awq_mixtral()[:2],
    "mixtral_awq_dequantized": lambda: (tiny_models.mixtral_config(), tiny_models.awq_mixtral()[2]),
    "qwen3_moe": lambda: (tiny_models.qwen3_moe_config(), tiny_models.qwen3_moe_tensors()),
    "deepseek_v3_awq": lambda: tiny_models.awq_deepseek_v3()[:2],
    "deepseek_v3_awq_dequantized": lambda: (
        tiny_models.deepseek_v3_config(), tiny_models.awq_deepseek_v3()[2]
    ),
    "qwen3_moe_gptq_act_order": lambda: tiny_formats.gptq_act_order_qwen3_moe()[:2],
    "qwen3_moe_gptq_act_order_dequantized": lambda: (
        tiny_models.qwen3_moe_config(), tiny_formats.gptq_act_order_qwen3_moe()[2]
    ),
    "qwen3_moe_mxfp4": lambda: tiny_formats.mxfp4_qwen3_moe()[:2],
    "qwen3_moe_mxfp4_dequantized": lambda: (
        tiny_models.qwen3_moe_config(), tiny_formats.mxfp4_qwen3_moe()[2]
    ),
    "mamba1": lambda: (tiny_mamba.mamba1_config(), tiny_mamba.mamba1_tensors()),
    "gpt_oss": lambda: (tiny_gpt_oss.gpt_oss_config(), tiny_gpt_oss.gpt_oss_tensors()),
    "mixtral_fp8_kv": lambda: (tiny_models.mixtral_config(), tiny_models.mixtral_tensors()),
    "mamba2": lambda: (tiny_mamba.mamba2_config(), tiny_mamba.mamba2_tensors()),
    "nemotron_h": lambda: (tiny_mamba.nemotron_h_config(), tiny_mamba.nemotron_h_tensors()),
}
#: The models every end-to-end test runs with the plugin on, each with the checkpoint its
#: plugin-off reference runs (the same one, but for quantized models: the dequantized weights).
MODELS = {
    "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "mixtral_awq": "mixtral_awq_dequantized",
    "qwen3_moe": "qwen3_moe",
    "deepseek_v3_awq": "deepseek_v3_awq_dequantized",
    "gpt_oss": "gpt_oss",
    "mixtral_fp8_kv": "mixtral_fp8_kv",
}
#: A checkpoint's own ``LLM`` arguments (``vllm_run.LLM_ARGS_FILE`` beside it): the Mixtral copy
#: runs with an FP8 (E4M3, unit scales) KV cache in the same processes as the other models.
LLM_ARGS = {"mixtral_fp8_kv": {"kv_cache_dtype": "fp8"}}
#: Models of ``MODELS`` the plugin-off run leaves out, with the reason: vLLM 0.32's CPU attention
#: reads an FP8 cache only on x86 with AVX-512 or AMX (``_get_attn_isa`` raises elsewhere, as on
#: this AVX2 host), so the FP8 run is checked against float64 with the cache's FP8 rounding of K
#: and V modelled (``float64_reference.load``), on every host alike.
PLUGIN_ON_ONLY = {"mixtral_fp8_kv": "vLLM's CPU attention reads an FP8 KV cache only with AVX-512 or AMX"}
#: Models whose runs are checked against vLLM's own run (plugin off) instead of the float64
#: reference: vLLM 0.32's CPU MLA (CPU_MLA decode, CPU_SDPA_MLA prefill) is nats away from
#: transformers' DeepSeek-V3 in float64 on these checkpoints, even with one dense layer and no
#: experts, so the float64 reference does not describe any vLLM run of them.
VLLM_REFERENCED = {"deepseek_v3_awq"}
#: The GPTQ act-order and MXFP4 models (``test_vllm_formats``, plugin on only: vLLM cannot run
#: them on the CPU), each with its dequantized checkpoint for the float64 reference.
FORMAT_MODELS = {
    "qwen3_moe_gptq_act_order": "qwen3_moe_gptq_act_order_dequantized",
    "qwen3_moe_mxfp4": "qwen3_moe_mxfp4_dequantized",
}
#: The Mamba models (``test_vllm_mamba``, plugin off and on), each its own reference checkpoint.
MAMBA_MODELS = {"mamba1": "mamba1", "mamba2": "mamba2", "nemotron_h": "nemotron_h"}
#: Mamba models vLLM's CPU build cannot run with its own kernels (plugin on only): Mamba-1's
#: prefill calls ``torch.ops._C.selective_scan_fwd``, which the CPU build does not have.
MAMBA_PLUGIN_ONLY = {"mamba1"}
#: Mamba models checked against vLLM's own run instead of the float64 reference: vLLM's
#: ``Mamba2ForCausalLM`` (its own kernels and hexlayout's alike) is 4-10 nats away from
#: transformers' in float64 on this checkpoint, whose 2 groups vLLM's gated RMS norm normalizes
#: each (as mamba_ssm does) and transformers' ``MambaRMSNormGated`` over the whole intermediate
#: size, so the float64 reference does not describe any vLLM run of it; NemotronH (1 group, the
#: two norms agree) is within 0.11 of float64.
MAMBA_VLLM_REFERENCED = {"mamba2"}
#: Every model's float64 reference checkpoint.
REFERENCES = {**MODELS, **FORMAT_MODELS, **MAMBA_MODELS}


@dataclass
class Run:
    """One :mod:`vllm_run` process: results per model name, its pid, its output, trace lines."""

    results: dict[str, list[dict]]
    pid: int
    output: str
    trace: list[dict]


def base_env() -> dict[str, str]:
    """The environment of every vLLM run: offline, no usage stats, no hexlayout variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEXLAYOUT_VLLM", "HEXLAYOUT_EMULATE"))}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    return env


def run_models(
    tmp: pathlib.Path, models: dict[str, pathlib.Path], env: dict[str, str], inproc: bool = True
) -> Run:
    """Run ``models`` through vLLM in a new process with ``env`` (on top of :func:`base_env`)."""
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "results.json"
    trace = tmp / "trace"
    full = {**base_env(), **env, "HEXLAYOUT_VLLM_TRACE": str(trace)}
    if inproc:
        full["HEXLAYOUT_VLLM_INPROC"] = "1"
    cmd = [sys.executable, str(HERE / "vllm_run.py"), str(out), *[str(p) for p in models.values()]]
    proc = subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"vLLM run failed ({' '.join(cmd)}):\n{output[-20000:]}"
    by_dir = json.loads(out.read_text())
    results = {name: by_dir[str(path)] for name, path in models.items()}
    lines = []
    if trace.is_dir():
        for f in sorted(trace.iterdir()):
            lines += [json.loads(x) for x in f.read_text().splitlines()]
    return Run(results, proc.pid, output, lines)
