"""``benchmarks/bench_mamba.py``: ``--dry-run`` runs without a GPU (tiny Mamba-1 / Mamba-2
shapes on CPU tensors through the emulator, each op checked against the script's float64
sequential recurrences) and writes its JSON, markdown and PNG; the peers (mamba_ssm,
causal_conv1d, vLLM) are reported unavailable here."""

from __future__ import annotations

import json
import pathlib

import pytest
from load_script import load_script

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_mamba.py"


def _load():
    return load_script(SCRIPT, "bench_mamba_under_test")


def test_dry_run_writes_json_markdown_and_plot(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    bench = _load()
    assert bench.main(["--dry-run", "--out", str(tmp_path), "--dtype", "f16"]) == 0
    files = sorted(tmp_path.iterdir())
    assert [f.suffix for f in files] == [".json", ".md", ".png"]
    res = json.loads(files[0].read_text())
    meta, rows = res["meta"], res["rows"]
    assert meta["dry_run"] and "CPU" in meta["device"] and meta["dtype"] == "f16" and meta["date"]
    assert meta["peak_gbps"] == 1.0 and meta["torch"] == torch.__version__
    assert {"mamba_ssm", "causal_conv1d", "vllm"} <= set(meta["unavailable"])
    assert meta["targets"] == {
        "selective_scan_roofline_batch_ge_8": 0.8,
        "state_update_roofline_batch_ge_8": 0.8,
    }
    kinds = [(r["kind"], r.get("form")) for r in rows]
    assert kinds == [
        ("selective_scan", None),
        ("state_update", "mamba1"),
        ("state_update", "mamba2"),
        ("ssd_scan", None),
        ("causal_conv1d", None),
        ("conv1d_update", None),
    ]
    for r in rows:  # only hexlayout ran, matched the float64 recurrence, and was timed
        assert {k for k, v in r.items() if isinstance(v, dict)} == {"hexlayout"}, r
        h = r["hexlayout"]
        assert "error" not in h, (r["kind"], h)
        assert h["max_rel_err"] < 5e-3 and h["ms"] > 0, (r["kind"], h)
        assert h["roofline"] == pytest.approx(r["bytes"] / 1e9 * 1e3 / h["ms"])  # peak 1 GB/s
    scan = rows[0]
    assert (scan["batch"], scan["seqlen"], scan["dim"], scan["N"], scan["G"]) == (2, 24, 8, 4, 2)
    # u, delta, z, out [2, 8, 24] f16; B, C [2, 2, 4, 24] f16; A [8, 4], D, delta_bias [8] f32
    assert scan["bytes"] == 4 * 2 * 8 * 24 * 2 + 2 * 2 * 2 * 4 * 24 * 2 + (8 * 4 + 2 * 8) * 4
    m2 = rows[2]
    # the state rows [2, 4, 4, 4] f32 read and written; x, y [2, 4, 4], dt [2, 4], B, C [2, 2, 4]
    # f16; A, D, dt_bias [4] f32
    assert m2["bytes"] == 2 * 2 * 64 * 4 + (2 * 32 + 8 + 2 * 16) * 2 + 3 * 4 * 4
    assert rows[3]["chunk"] == 8 and rows[3]["seqlen"] == 20  # a chunk that does not divide L
    md = files[1].read_text()
    for kind in ("selective_scan", "state_update", "ssd_scan", "causal_conv1d", "conv1d_update"):
        assert f"## {kind}" in md
    assert meta["device"] in md and "## Errors" not in md and ">= 80 % of HBM bandwidth" in md
    assert files[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_references_are_the_recurrence() -> None:
    """The script's float64 references against the recurrences written out by hand on a tiny
    case: the Mamba-1 scan's first two steps and a causal convolution's first output."""
    bench = _load()
    g = torch.Generator().manual_seed(0)
    u, delta, z = (torch.randn(1, 2, 2, generator=g) for _ in range(3))
    A, B, C = (
        -torch.rand(2, 3, generator=g),
        torch.randn(1, 3, 2, generator=g),
        torch.randn(1, 3, 2, generator=g),
    )
    D, bias = torch.rand(2, generator=g), torch.rand(2, generator=g)
    out = bench.ref_selective_scan(u, delta, A, B, C, D, z, bias)
    d = torch.nn.functional.softplus((delta + bias[:, None]).double())[0]
    u0, z0, A0 = u[0].double(), z[0].double(), A.double()
    h0 = d[:, 0, None] * B[0, :, 0].double() * u0[:, 0, None]
    h1 = torch.exp(d[:, 1, None] * A0) * h0 + d[:, 1, None] * B[0, :, 1].double() * u0[:, 1, None]
    for t, h in ((0, h0), (1, h1)):
        y = (h * C[0, :, t].double()).sum(-1) + D.double() * u0[:, t]
        assert torch.allclose(out[0, :, t], y * torch.nn.functional.silu(z0[:, t]))
    x, w, b = torch.randn(1, 2, 3, generator=g), torch.randn(2, 4, generator=g), torch.randn(2, generator=g)
    conv = bench.ref_conv1d(x, w, b)
    assert torch.allclose(conv[0, :, 0], torch.nn.functional.silu((b + w[:, 3] * x[0, :, 0]).double()))


def test_full_size_path_checks_a_slice(monkeypatch) -> None:
    """The non-dry path compares each implementation on a slice of the problem (batch row 0, the
    first channels / heads of group 0): run here on CPU tensors through the emulator with the
    layer sizes shrunk, every op's slice matches the float64 reference."""
    import argparse

    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    bench = _load()
    monkeypatch.setattr(bench, "REF_DIM", 2)
    monkeypatch.setattr(bench, "M1", {"N": 4, "G": 2, "decode_dim": 8})
    monkeypatch.setattr(bench, "M2", {"H": 4, "P": 2, "G": 2, "N": 4, "width": 3, "chunk": 4})
    args = argparse.Namespace(dry_run=False, warmup=0, iters=1)
    f16 = torch.float16
    rows = [
        bench.scan_row(2, 8, 6, 4, 2, f16, "cpu", {}, args, None),
        bench.state_row(1, 2, f16, "cpu", {}, args, None),
        bench.state_row(2, 2, f16, "cpu", {}, args, None),
        bench.ssd_row(2, 6, f16, "cpu", {}, args, None),
        bench.conv_row(2, 6, f16, "cpu", {}, args, None),
        bench.conv_update_row(2, f16, "cpu", {}, args, None),
    ]
    for r in rows:
        h = r["hexlayout"]
        assert "error" not in h, (r["kind"], h)
        assert h["max_rel_err"] < 5e-3 and "roofline" not in h, (r["kind"], h)  # no peak: no roofline
