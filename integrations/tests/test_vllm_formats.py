"""The formats users load besides AWQ, end to end in vLLM's CPU build with the plugin on: a GPTQ
int4 act-order (``desc_act``, ``g_idx``) and an MXFP4 Qwen3-MoE-like model (:mod:`tiny_formats`),
their experts served by hexlayout's W4A16 fused MoE in the emulator (weights prepared by
``prepare_wna16(..., g_idx=...)`` and ``prepare_mxfp4``), both in one vLLM process.

Each run is checked against the float64 teacher-forced reference of its dequantized checkpoint
(:mod:`agreement`). There is no plugin-off run to calibrate against: vLLM 0.32 cannot load
either model on the CPU with its own kernels (measured with ``HEXLAYOUT_VLLM=0``): the GPTQ one
fails building its config ("GPTQ group activation ordering (desc_act=True) is no longer
supported", on any platform; vLLM's weight mapper also drops every ``.g_idx``), the MXFP4 one
when building its experts ("No MXFP4 MoE backend supports the deployment configuration").

Needs hexlayout.ops' ``prepare_wna16(..., g_idx=)`` and ``prepare_mxfp4`` (engineer B, issue
23 item 4).
"""

from __future__ import annotations

import pytest
from agreement import check
from test_vllm_models import check_prepared
from vllm_harness import FORMAT_MODELS, Run, run_models


@pytest.fixture(scope="module")
def formats_run(models, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Both models with the plugin on (``HEXLAYOUT_EMULATE=1``), in one process."""
    return run_models(tmp_path_factory.mktemp("formats"), {n: models[n] for n in FORMAT_MODELS},
                      {"HEXLAYOUT_EMULATE": "1"})


@pytest.mark.parametrize("name", sorted(FORMAT_MODELS))
def test_tokens_and_logprobs_match_float64(name: str, formats_run: Run, float64) -> None:
    report = check(formats_run.results[name], float64(name, formats_run.results[name]))
    print(f"{name} (hexlayout): {report.summary()}")
    assert not report.problems, f"{name}: {report.summary()}\n" + "\n".join(report.problems)


def test_hexlayout_served_both_formats(formats_run: Run) -> None:
    out = formats_run.output
    swapped = [x for x in out.splitlines() if "hexlayout (emulate): swapped " in x]
    assert len(swapped) == 1, out[-20000:]
    plugin = "hexlayout.integrations.vllm"
    assert f"quantization auto_gptq (gptq) -> {plugin}.gptq.HexlayoutGPTQConfig" in swapped[0]
    assert f"quantization mxfp4 -> {plugin}.mxfp4.HexlayoutMxfp4Config" in swapped[0]
    for i in (0, 1):
        layer = f"hexlayout: model.layers.{i}.mlp.experts"
        assert f"{layer}: GPTQ int4, act-order MoE experts run hexlayout's fused_moe (W4A16)" in out
        assert f"{layer}: MXFP4 MoE experts run hexlayout's fused_moe (W4A16)" in out
    check_prepared(formats_run.trace, 2 * 2)  # the checkpoints' packed parameters released
    moe = [r for r in formats_run.trace if r["kernel"].startswith("moe") and r["kernel"] != "moe_prepare"]
    assert {r["kernel"] for r in moe} == {"moe_w4a16"}, moe
    for r in moe:
        s = r["shapes"]
        assert (s["topk"], s["global_experts"], s["hidden"], s["intermediate"], s["group_size"]) == (
            2, 4, 128, 256, 32), s
    # both models ran: 2 MoE layers each, every step
    assert len(moe) >= 2 * 2 * 8, len(moe)
