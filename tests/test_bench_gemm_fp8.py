"""``benchmarks/bench_gemm_fp8.py --dry-run``: the dense FP8 GEMM benchmark runs without a GPU (a
tiny shape on CPU tensors through the emulator) and writes its JSON and markdown; the hexlayout
variants (general and UE8M0 scales) ran and matched the script's float32 reference, and the
peers that need a GPU or a library not installed here are listed as unavailable."""

from __future__ import annotations

import json
import pathlib

import pytest
from load_script import load_script

pytest.importorskip("torch")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gemm_fp8.py"


def test_dry_run_writes_json_and_markdown(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    bench = load_script(SCRIPT, "bench_gemm_fp8_under_test")
    rc = bench.main(["--dry-run", "--out", str(tmp_path), "--tokens", "3",
                     "--variants", "hexlayout", "hexlayout-ue8m0", "cublas-fp8-rowwise"])
    assert rc == 0
    files = sorted(tmp_path.iterdir())
    assert [f.suffix for f in files] == [".json", ".md"]
    res = json.loads(files[0].read_text())
    (row,) = res["rows"]
    assert (row["M"], row["N"], row["K"]) == (3, 192, 400)
    for v in ("hexlayout", "hexlayout-ue8m0"):
        assert "error" not in row[v] and row[v]["max_rel_err"] < 1e-2 and row[v]["ms"] > 0, row[v]
    assert "cublas-fp8-rowwise" in res["meta"]["unavailable"] and "cublas-fp8-rowwise" not in row
    assert "| tiny | 3 | 192 | 400 |" in files[1].read_text()
