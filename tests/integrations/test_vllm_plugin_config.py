"""The vLLM plugin's pure parts, without vLLM: ``HEXLAYOUT_VLLM`` parsing, the device decision,
the trace file format. (The plugin inside vLLM is tested by ``test_vllm_stage.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hexlayout.integrations.vllm.config import (
    KERNELS,
    PluginConfigError,
    device_decision,
    selected_kernels,
)
from hexlayout.integrations.vllm.trace import TRACE_KERNELS, record, trace_path


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, {"moe", "attention", "mamba"}),
        ("", {"moe", "attention", "mamba"}),
        ("1", {"moe", "attention", "mamba"}),
        ("all", {"moe", "attention", "mamba"}),
        (" ALL ", {"moe", "attention", "mamba"}),
        ("0", set()),
        ("moe", {"moe"}),
        ("attention", {"attention"}),
        ("moe,attention", {"moe", "attention"}),
        (" Attention , moe ", {"moe", "attention"}),
        ("mamba", {"mamba"}),
    ],
)
def test_hexlayout_vllm_values(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: set[str]
) -> None:
    if value is None:
        monkeypatch.delenv("HEXLAYOUT_VLLM", raising=False)
    else:
        monkeypatch.setenv("HEXLAYOUT_VLLM", value)
    assert selected_kernels() == expected
    assert set(KERNELS) == {"moe", "attention", "mamba"}


@pytest.mark.parametrize("value", ["moe,gemm", "2", "off", "moe,,attention", "yes"])
def test_hexlayout_vllm_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HEXLAYOUT_VLLM", value)
    with pytest.raises(PluginConfigError, match="HEXLAYOUT_VLLM") as err:
        selected_kernels()
    assert isinstance(err.value, ValueError)


def test_device_decision() -> None:
    on_cpu = device_decision("cpu", emulate="1")
    assert on_cpu.run and on_cpu.mode == "emulate"
    off = device_decision("cpu", emulate="")
    assert not off.run and "HEXLAYOUT_EMULATE=1" in off.reason and "keeping vLLM's CPU kernels" in off.reason
    assert not device_decision("cpu", emulate="true").run  # hexlayout's switch is exactly "1"
    for cap in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0)):
        d = device_decision("cuda", cap)
        assert d.run and d.mode == "cuda"
    for cap in ((7, 5), (10, 3), (12, 0), None):
        d = device_decision("cuda", cap)
        assert not d.run and "compute capability" in d.reason
    assert not device_decision("rocm").run


def test_trace_lines(tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEXLAYOUT_VLLM_TRACE", raising=False)
    record("moe", {"tokens": 3}, "torch.bfloat16")  # tracing off: no file anywhere
    monkeypatch.setenv("HEXLAYOUT_VLLM_TRACE", str(tmp_path / "t"))
    record("attention_decode", {"num_seqs": 2, "head_size": 64}, "torch.bfloat16")
    record("moe_w4a16", {"tokens": 5, "experts": 4}, "float16")
    path = trace_path(str(tmp_path / "t"))
    assert os.path.basename(path) == f"hexlayout-vllm.{os.getpid()}.jsonl"
    lines = [json.loads(x) for x in open(path).read().splitlines()]
    assert lines == [
        {"pid": os.getpid(), "kernel": "attention_decode", "shapes": {"num_seqs": 2, "head_size": 64},
         "dtype": "bfloat16"},
        {"pid": os.getpid(), "kernel": "moe_w4a16", "shapes": {"tokens": 5, "experts": 4},
         "dtype": "float16"},
    ]
    assert set(TRACE_KERNELS) == {"moe", "moe_w4a16", "moe_w8a16", "moe_prepare", "attention_prefill",
                                  "attention_decode", "mla_decode", "mamba_prefill", "mamba_decode", "conv1d"}
    with pytest.raises(ValueError, match="unknown kernel"):
        record("gemm", {}, "bfloat16")


def test_trace_files_are_per_process(tmp_path: pytest.TempPathFactory) -> None:
    code = (
        "from hexlayout.integrations.vllm.trace import record\n"
        "record('attention_prefill', {'num_tokens': 7}, 'torch.float16')\n"
    )
    env = {**os.environ, "HEXLAYOUT_VLLM_TRACE": str(tmp_path)}
    pids = set()
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    for f in sorted(tmp_path.iterdir()):
        (line,) = f.read_text().splitlines()
        row = json.loads(line)
        assert f.name == f"hexlayout-vllm.{row['pid']}.jsonl"
        assert row["kernel"] == "attention_prefill" and row["dtype"] == "float16"
        pids.add(row["pid"])
    assert len(pids) == 2


def test_plugin_package_is_torch_and_vllm_free_until_register() -> None:
    code = (
        "import sys, hexlayout.integrations.vllm as p\n"
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules), p.registered())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["[]", "None"]
