"""``register()`` inside vLLM: the entry point, idempotence, ``HEXLAYOUT_VLLM`` selections, the
CPU-without-emulator path (logs one line, leaves vLLM's kernels) and bad values.

Each case runs in a fresh process (vLLM's registries are per process); the cases run
concurrently.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from vllm_harness import base_env

PROBE = r"""
import json, logging, sys
# vLLM installs its handlers when an engine starts; stand in for them: the plugin logs through
# the "vllm.hexlayout" logger, a child of vLLM's.
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s [%(name)s] %(message)s")
from vllm.plugins import load_general_plugins
load_general_plugins()            # vLLM's own loader finds the entry point
import hexlayout.integrations.vllm as plugin
plugin.register()                 # again, directly: nothing more happens
plugin.register()
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.quantization import get_quantization_config
from vllm.v1.attention.backends.registry import AttentionBackendEnum
awq = get_quantization_config("awq")
gptq = get_quantization_config("auto_gptq")
mxfp4 = get_quantization_config("mxfp4")
print("PROBE " + json.dumps({
    "state": plugin.registered(),
    "cpu_attn": AttentionBackendEnum.CPU_ATTN.get_path(),
    "cpu_mla": AttentionBackendEnum.CPU_MLA.get_path(),
    "oot": {k: f"{v.__module__}.{v.__qualname__}" for k, v in op_registry_oot.items()},
    "awq": f"{awq.__module__}.{awq.__qualname__}",
    "gptq": f"{gptq.__module__}.{gptq.__qualname__}",
    "mxfp4": f"{mxfp4.__module__}.{mxfp4.__qualname__}",
}))
"""

VLLM_CPU_ATTN = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
HEX_CPU_ATTN = "hexlayout.integrations.vllm.attention.HexlayoutCPUAttentionBackend"
VLLM_CPU_MLA = "vllm.v1.attention.backends.mla.cpu_mla.CPUMLABackend"
HEX_CPU_MLA = "hexlayout.integrations.vllm.mla.HexlayoutCPUMLABackend"
VLLM_AWQ = "vllm.model_executor.layers.quantization.auto_awq.AutoAWQConfig"
HEX_AWQ = "hexlayout.integrations.vllm.awq.HexlayoutAWQConfig"
HEX_MOE = {"UnquantizedFusedMoEMethod": "hexlayout.integrations.vllm.moe.HexlayoutUnquantizedFusedMoEMethod"}
#: MLA layers: the plugin's subclass logs which attention runs them.
HEX_MLA = {"MultiHeadLatentAttentionWrapper": "hexlayout.integrations.vllm.mla.HexlayoutMLAWrapper"}
#: Mamba-2 layers run hexlayout's ops; Mamba-1 layers keep vLLM's kernels (the subclass logs why).
HEX_MAMBA = {"MambaMixer2": "hexlayout.integrations.vllm.mamba.HexlayoutMambaMixer2",
             "MambaMixer": "hexlayout.integrations.vllm.mamba1.HexlayoutMambaMixer"}
VLLM_GPTQ = "vllm.model_executor.layers.quantization.auto_gptq.AutoGPTQConfig"
HEX_GPTQ = "hexlayout.integrations.vllm.gptq.HexlayoutGPTQConfig"
VLLM_MXFP4 = "vllm.model_executor.layers.quantization.mxfp4.Mxfp4Config"
HEX_MXFP4 = "hexlayout.integrations.vllm.mxfp4.HexlayoutMxfp4Config"
UNTOUCHED = {"state": [], "cpu_attn": VLLM_CPU_ATTN, "cpu_mla": VLLM_CPU_MLA, "oot": {}, "awq": VLLM_AWQ,
             "gptq": VLLM_GPTQ, "mxfp4": VLLM_MXFP4}

CASES = {
    "all": {"HEXLAYOUT_EMULATE": "1"},
    "all_explicit": {"HEXLAYOUT_EMULATE": "1", "HEXLAYOUT_VLLM": "all"},
    "attention": {"HEXLAYOUT_EMULATE": "1", "HEXLAYOUT_VLLM": "attention"},
    "moe": {"HEXLAYOUT_EMULATE": "1", "HEXLAYOUT_VLLM": "moe"},
    "mamba": {"HEXLAYOUT_EMULATE": "1", "HEXLAYOUT_VLLM": "mamba"},
    "off": {"HEXLAYOUT_EMULATE": "1", "HEXLAYOUT_VLLM": "0"},
    "cpu_no_emulate": {"HEXLAYOUT_VLLM": "1"},
    "bad": {"HEXLAYOUT_EMULATE": "1", "HEXLAYOUT_VLLM": "moe,flash"},
}


@pytest.fixture(scope="module")
def probes() -> dict[str, tuple[int, str, dict | None]]:
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", PROBE],
            env={**base_env(), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, env in CASES.items()
    }
    out = {}
    for name, p in procs.items():
        text, _ = p.communicate(timeout=600)
        rows = [json.loads(x[6:]) for x in text.splitlines() if x.startswith("PROBE ")]
        out[name] = (p.returncode, text, rows[0] if rows else None)
    return out


def hex_lines(text: str) -> list[str]:
    """The plugin's log lines (the probe's format: level, [logger], message)."""
    return [x for x in text.splitlines() if x.startswith(("INFO [vllm.hexlayout]", "WARNING [vllm.hex"))]


def test_register_swaps_everything_once(probes: dict) -> None:
    for case in ("all", "all_explicit"):
        rc, text, row = probes[case]
        assert rc == 0, text
        oot = {**HEX_MOE, **HEX_MLA, **HEX_MAMBA}
        assert (row["cpu_attn"], row["oot"], row["awq"]) == (HEX_CPU_ATTN, oot, HEX_AWQ)
        assert (row["gptq"], row["mxfp4"]) == (HEX_GPTQ, HEX_MXFP4)  # mxfp4: hexlayout has prepare_mxfp4
        assert row["cpu_mla"] == HEX_CPU_MLA
        assert len(row["state"]) == 9
        swapped = [x for x in hex_lines(text) if "swapped" in x]
        assert len(swapped) == 1, text  # three calls, one registration


def test_selection_attention_only(probes: dict) -> None:
    rc, text, row = probes["attention"]
    assert rc == 0, text
    got = (row["cpu_attn"], row["cpu_mla"], row["oot"], row["awq"], row["gptq"])
    assert got == (HEX_CPU_ATTN, HEX_CPU_MLA, HEX_MLA, VLLM_AWQ, VLLM_GPTQ)


def test_selection_moe_only_keeps_vllm_attention(probes: dict) -> None:
    rc, text, row = probes["moe"]
    assert rc == 0, text
    got = (row["cpu_attn"], row["cpu_mla"], row["oot"], row["awq"], row["gptq"])
    assert got == (VLLM_CPU_ATTN, VLLM_CPU_MLA, HEX_MOE, HEX_AWQ, HEX_GPTQ)
    assert not any("attention" in s for s in row["state"])


def test_selection_mamba_only(probes: dict) -> None:
    rc, text, row = probes["mamba"]
    assert rc == 0, text
    got = (row["cpu_attn"], row["oot"], row["awq"], row["gptq"])
    assert got == (VLLM_CPU_ATTN, HEX_MAMBA, VLLM_AWQ, VLLM_GPTQ)
    plugin = "hexlayout.integrations.vllm"
    assert row["state"] == [f"MambaMixer2 -> {plugin}.mamba.HexlayoutMambaMixer2",
                            f"MambaMixer -> {plugin}.mamba1.HexlayoutMambaMixer"]


def test_off_does_nothing(probes: dict) -> None:
    rc, text, row = probes["off"]
    assert rc == 0, text
    assert row == UNTOUCHED
    assert hex_lines(text) == []


def test_cpu_without_emulator_logs_one_line_and_keeps_vllm_kernels(probes: dict) -> None:
    rc, text, row = probes["cpu_no_emulate"]
    assert rc == 0, text
    assert row == UNTOUCHED
    lines = hex_lines(text)
    assert len(lines) == 1, text
    assert lines[0].startswith("WARNING") and "HEXLAYOUT_EMULATE=1" in lines[0]
    assert "keeping vLLM's CPU kernels" in lines[0]


def test_bad_value_is_a_clear_error(probes: dict) -> None:
    rc, text, row = probes["bad"]
    assert rc != 0 and row is None
    assert "PluginConfigError: HEXLAYOUT_VLLM='moe,flash': unknown kernel 'flash'" in text
