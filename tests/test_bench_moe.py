"""``benchmarks/bench_moe.py --dry-run``: the MoE benchmark script runs without a GPU (tiny shapes on
CPU tensors through the emulator) and writes its JSON, markdown and PNG; the bf16 variant ran and
was checked against the script's float32 reference, variants that are not built are listed as
unavailable instead of failing the run."""

from __future__ import annotations

import json
import pathlib

import pytest
from load_script import load_script

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_moe.py"


def _load():
    return load_script(SCRIPT, "bench_moe_under_test")


def test_dry_run_writes_json_markdown_and_plot(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    bench = _load()
    rc = bench.main(["--dry-run", "--out", str(tmp_path), "--models", "tiny-mixtral", "--tokens", "3"])
    assert rc == 0
    files = sorted(tmp_path.iterdir())
    assert [f.suffix for f in files] == [".json", ".md", ".png"]
    res = json.loads(files[0].read_text())
    meta, rows = res["meta"], res["rows"]
    assert meta["dry_run"] and meta["peak_gbps"] == 1.0 and "CPU" in meta["device"]
    assert len(rows) == 1 and rows[0]["T"] == 3 and rows[0]["model"] == "tiny-mixtral"
    row = rows[0]
    bf16 = row["hexlayout-bf16"]
    assert "error" not in bf16, bf16
    assert bf16["ms"] > 0 and bf16["max_rel_err"] < 2e-2 and 0 < bf16["roofline"]
    # 4 experts, 3 tokens, k = 2: the bytes are the touched experts' bf16 weights and the activations
    assert bf16["bytes"] == row["experts_touched"] * 3 * 128 * 128 * 2 + 2 * 3 * 128 * 2
    for v in bench.VARIANTS:  # every variant either ran (and matched) or is reported unavailable
        assert (v in row) != (v in meta["unavailable"]), v
        if v in row:
            assert "error" not in row[v] and row[v]["max_rel_err"] < 0.15, (v, row[v])
    assert all(v.startswith("vllm") or v.startswith("hexlayout") for v in meta["unavailable"])
    md = files[1].read_text()
    assert "hexlayout-bf16" in md and "tiny-mixtral" in md and meta["device"] in md
    assert files[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_triton_w4a16_weights_dequantize_like_the_gptq_ones() -> None:
    """The Triton W4A16 peer's repacking (uint8 [E, N, K/2], even k in the low nibble, zero point 8,
    scales [E, N, K/G]) dequantizes to the same weights as the GPTQ checkpoint it came from."""
    import torch

    bench = _load()
    w = torch.randn(3, 64, 256, generator=torch.Generator().manual_seed(5))
    qweight, scales, deq = bench.quant_gptq4(w)
    b, s = bench.int4_w4a16_weights(qweight, scales)
    assert b.dtype == torch.uint8 and b.shape == (3, 64, 128) and s.shape == (3, 64, 2)
    q = torch.stack([b & 15, b >> 4], dim=-1).reshape(3, 64, 256).float()  # [E, N, K]
    back = (q - 8) * s.float().repeat_interleave(bench.GROUP, dim=2)
    torch.testing.assert_close(back, deq, rtol=0, atol=0)
