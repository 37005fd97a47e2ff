"""``benchmarks/bench_static.py``'s serving kernels: the cases are traced from the ops' own launch
code (``serving_cases``), so they hold every kernel factory of the MoE / attention / KV-cache
modules in ``ops/`` and every tile config the ops' choosers pick; one MoE case compiles (NVRTC,
sm_80) to a main loop of HMMA without spills; ``--only`` writes the report of the selected
kernels only (markdown + JSON)."""

from __future__ import annotations

import ast
import inspect
import json
import pathlib

import pytest
from load_script import load_script

pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_static.py"
OPS = ROOT / "ops"


def _load():
    return load_script(SCRIPT, "bench_static_under_test")


@pytest.fixture(scope="module")
def bench():
    return _load()


@pytest.fixture(scope="module")
def cases(bench):
    return bench.serving_cases()


def _kernel_factories() -> set[tuple[str, str]]:
    """``(module, factory)`` of every kernel factory in the ``moe``, ``attention`` and ``kv_cache``
    op packages: a top-level function holding an ``@hl.kernel``-decorated definition."""
    out = set()
    for path in sorted(p for pkg in ("moe", "attention", "kv_cache") for p in (OPS / pkg).glob("*.py")):
        if path.stem == "sdpa_anchor":      # the fusion backend's anchor, not a serving kernel
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            inner = [d for n in ast.walk(node) if isinstance(n, ast.FunctionDef) and n is not node
                     for d in n.decorator_list]
            if any("hl.kernel" in ast.unparse(d) for d in inner):
                out.add((f"hexlayout.ops.{path.parent.name}.{path.stem}", node.name))
    return out


def test_cases_hold_every_moe_attention_and_kv_cache_kernel(bench, cases) -> None:
    factories = _kernel_factories()
    # the scan itself finds the known families (a broken scan must not pass vacuously)
    for known in [("moe.kernels_sm80", "moe_gate_up_kernel"), ("moe.kernels_sm80", "moe_down_kernel"),
                  ("moe.kernels_sm80", "moe_sum_kernel"), ("moe.align", "moe_align_rank_kernel"),
                  ("moe.wna16_kernels_sm80", "moe_wna16_gate_up_kernel"),
                  ("moe.fp8_kernels_sm89", "moe_fp8_quant_kernel"),
                  ("moe.fp8_kernels_sm90", "moe_fp8_down_sm90_kernel"),
                  ("attention.kernels_sm90", "paged_attention_sm90_kernel"),
                  ("attention.kernels_sm90", "attention_varlen_sm90_kernel"),
                  ("attention.varlen_kernels_sm80", "attention_varlen_kernel"),
                  ("attention.paged_kernels_sm80", "paged_attention_combine_kernel"),
                  ("kv_cache.op", "reshape_and_cache_kernel")]:
        assert (f"hexlayout.ops.{known[0]}", known[1]) in factories, known
    traced = {(c.module, c.factory) for c in cases}
    assert factories <= traced, sorted(factories - traced)
    assert {c.family for c in cases} == set(bench.SERVING)
    # one case per build: architecture, kernel and constants
    keys = [(c.arch, c.name, c.consts) for c in cases]
    assert len(keys) == len(set(keys))
    assert all(c.problems for c in cases)


def test_cases_hold_every_config_the_moe_choosers_pick(cases) -> None:
    from hexlayout.ops.moe.fp8 import fp8_block_m
    from hexlayout.ops.moe.kernels_sm80 import moe_config, moe_down_config
    from hexlayout.ops.moe.wna16 import wna16_config

    def consts(arch: str, factory: str) -> list[dict]:
        return [dict(c.consts) for c in cases if c.arch == arch and c.factory == factory]

    gate_up, down = consts("sm_80", "moe_gate_up_kernel"), consts("sm_80", "moe_down_kernel")
    for slots in (1, 128, 129, 2048, 2049, 32768):
        cfg = moe_config(slots)
        assert any(all(c[k] == v for k, v in cfg.items()) for c in gate_up), (slots, cfg)
        dcfg = moe_down_config(cfg)
        assert any(all(c[k] == v for k, v in dcfg.items()) for c in down), (slots, dcfg)
    assert {c["BM"] for c in gate_up} == {16, 32, 64}
    wna = consts("sm_80", "moe_wna16_gate_up_kernel")
    for slots, e in ((2, 8), (8192, 8)):
        for group in (32, 128):
            cfg = wna16_config(slots, e, 4096, group)
            assert any(all(c[k] == v for k, v in cfg.items()) for c in wna), (slots, group, cfg)
    per_arch = "arch" in inspect.signature(fp8_block_m).parameters
    for arch in ("sm_89", "sm_90a"):
        want = {fp8_block_m(s, 8, **({"arch": arch} if per_arch else {})) for s in (1, 512, 4096)}
        got = {dict(c.consts)["BM"] for c in cases
               if c.arch == arch and c.factory.startswith("moe_fp8_gate_up")}
        assert len(want) == 3 and want <= got, (arch, want, got)


@pytest.mark.nvrtc
def test_one_moe_case_compiles_to_hmma_without_spills(bench, cases) -> None:
    case = next(c for c in cases if c.arch == "sm_80" and c.factory == "moe_gate_up_kernel"
                and dict(c.consts)["BM"] == 16)
    d = bench.serving_stats(case)
    assert d["kernel"].startswith("moe_gate_up") and d["arch"] == "sm_80"
    assert not d["spills"] and d["spill_stores"] == 0 and d["local_memory_instructions"] == 0, d
    assert d["counts"].get("HMMA", 0) > 0 or any(k.startswith("HMMA") for k in d["counts"]), d["counts"]
    lp = d["main_loop"]
    assert lp is not None and lp["mma"] > 0 and lp["mma_opcode"].startswith("HMMA"), lp
    assert lp["non_mma"] == lp["instructions"] - lp["mma"] - lp["padding"] > 0
    assert lp["non_mma_per_ktile"] == pytest.approx(lp["non_mma"] / lp["k_tiles"])
    assert lp["non_mma_per_mma"] == pytest.approx(lp["non_mma"] / lp["mma"])


@pytest.mark.nvrtc
def test_only_writes_the_selected_kernels(bench, tmp_path) -> None:
    assert bench.main(["--only", "moe_sum", "--arch", "sm_80", "--out", str(tmp_path), "--tag", "t"]) == 0
    files = sorted(tmp_path.iterdir())
    assert [f.suffix for f in files] == [".json", ".md"]
    rows = json.loads(files[0].read_text())["rows"]
    assert rows and all(r["serving"] and r["arch"] == "sm_80" for r in rows)
    assert {r["kernel"] for r in rows} == {"moe_sum_bf16", "moe_sum_f16"}
    bf16 = [r for r in rows if r["kernel"] == "moe_sum_bf16"]
    assert {r["case"]["consts"]["TOPK"] for r in bf16} == {2, 8}     # Mixtral k = 2, DeepSeek-V3 k = 8
    assert all(r["hexlayout"]["main_loop"] is None and not r["hexlayout"]["spills"] for r in rows)
    md = files[1].read_text()
    assert "## Serving kernels" in md and md.count("| sm_80 |") == len(rows)
    assert "target (issue 10)" not in md                             # no GEMM / attention table
