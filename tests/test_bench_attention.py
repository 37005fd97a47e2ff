"""``benchmarks/bench_attention.py``: ``--dry-run`` runs without a GPU (tiny prefill and decode
shapes on CPU tensors through the emulator, checked against SDPA's math backend) and writes
its JSON, markdown and PNG; the Triton baseline kernel (written after Triton's fused-attention
tutorial) matches the reference in Triton's interpreter."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest
from load_script import load_script

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_attention.py"


def _load():
    return load_script(SCRIPT, "bench_attention_under_test")


def test_dry_run_writes_json_markdown_and_plot(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    bench = _load()
    assert bench.main(["--dry-run", "--out", str(tmp_path), "--dtype", "f16"]) == 0
    files = sorted(tmp_path.iterdir())
    assert [f.suffix for f in files] == [".json", ".md", ".png"]
    res = json.loads(files[0].read_text())
    meta, rows = res["meta"], res["rows"]
    assert meta["dry_run"] and "CPU" in meta["device"] and meta["dtype"] == "f16" and meta["date"]
    assert {"sdpa-flash", "sdpa-cudnn", "triton", "vllm"} <= set(meta["unavailable"])
    pre = [r for r in rows if r["kind"] == "prefill"]
    dec = [r for r in rows if r["kind"] == "decode"]
    assert len(pre) == 1 and len(dec) == 1
    p = pre[0]
    assert (p["seq"], p["D"], p["causal"]) == (64, 64, True)
    for name in ("hexlayout", "sdpa-math"):  # both ran and matched the float32 reference
        assert "error" not in p[name], p[name]
        assert p[name]["max_rel_err"] < 1e-2 and p[name]["tflops"] > 0
    assert p["flops"] == 4 * 1 * 2 * 64 * 64 * 64 / 2
    d = dec[0]["hexlayout"]
    assert "error" not in d, d
    assert d["max_rel_err"] < 1e-2 and d["ms"] > 0
    # K and V of 2 sequences x 40 keys x 2 KV heads x 64 (f16), q and out, the block table
    assert dec[0]["bytes"] == 2 * 2 * 40 * 2 * 64 * 2 + 2 * 2 * 4 * 64 * 2 + 2 * 3 * 4
    assert d["roofline"] == pytest.approx(dec[0]["bytes"] / 1e9 * 1e3 / d["ms"])  # peak 1 GB/s
    md = files[1].read_text()
    assert "## Prefill" in md and "## Decode" in md and meta["device"] in md and "## Errors" not in md
    assert files[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


CHECK_TRITON = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("bench_attention_triton", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
tri = bench.triton_attention(tune=False)
g = torch.Generator().manual_seed(0)
qkv = torch.randn(2, 128, 8, 64, generator=g).half()  # q, k, v: strided views of a fused QKV
q, k, v = qkv[:, :, :4], qkv[:, :, 4:6], qkv[:, :, 6:]
cu = [0, 128, 256]
for causal in (False, True):
    o = tri(q, k, v, causal).reshape(256, 4, 64)
    ref = bench.sdpa_reference(q.reshape(256, 4, 64), k.reshape(256, 2, 64), v.reshape(256, 2, 64),
                               cu, cu, causal)
    assert o.is_contiguous()
    print(causal, bench.max_rel_err(o, ref))
"""


def test_triton_baseline_matches_reference() -> None:
    """The Triton kernel (fixed config) in Triton's interpreter (a fresh process: the
    interpreter is chosen when triton starts), causal and not, GQA 2, q / k / v strided views of
    one tensor, against the script's SDPA reference; without triton, building it is an
    ImportError."""
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("triton") is None:
        with pytest.raises(ImportError):
            _load().triton_attention(tune=False)
        return
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run(
        [sys.executable, "-c", CHECK_TRITON, str(SCRIPT)], env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    errs = {line.split()[0]: float(line.split()[1]) for line in res.stdout.splitlines()}
    assert set(errs) == {"False", "True"} and max(errs.values()) < 2e-3, errs
