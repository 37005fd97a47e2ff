"""``benchmarks/bench_compile.py``: the rounds alternate the two compilers, each with its own
cache directory reused from cold to hit; ratios are paired per round; the report states the
targets; the hexlayout child program compiles the case for real (NVRTC) and a second process
on the same cache is a hit (no new cache entry), importing from the bytecode directory it
is given; the bytecode is warmed for both compilers alike. Triton itself is not needed here."""

from __future__ import annotations

import pathlib

import pytest
from load_script import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_compile.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT, "bench_compile_under_test")


def test_rounds_alternate_the_compilers_and_reuse_each_cache(bench) -> None:
    calls = []
    times = iter([2.0, 1.0, 0.5, 0.4, 3.0, 1.0, 0.3, 0.6])

    def fake(compiler: str, case: str, cache: str) -> float:
        calls.append((compiler, cache))
        return next(times)

    rs = bench.rounds("Case('gemm', 'sm_80', 128, 128, 32, 3, 4)", 2, measure=fake)
    assert [c for c, _ in calls] == ["hexlayout", "triton"] * 4
    for r in range(2):                       # cold then hit on the same directory, per compiler
        hx_cold, tt_cold, hx_hit, tt_hit = (d for _, d in calls[4 * r:4 * r + 4])
        assert hx_cold == hx_hit and tt_cold == tt_hit and hx_cold != tt_cold
    assert calls[0][1] != calls[4][1]        # a fresh cache each round
    row = bench.summarize("gemm", rs)
    assert row["cold_ratio"]["median"] == pytest.approx((2.0 + 3.0) / 2)     # 2/1 and 3/1
    assert row["hit_ratio"]["min"] == pytest.approx(0.3 / 0.6)
    assert row["hit_ratio"]["max"] == pytest.approx(0.5 / 0.4)
    assert not row["cold_met"] and row["cold_target"] == 0.6
    meta = {"date": "d", "machine": "m", "cpus": 2, "versions": {"python": "3", "triton": "t"},
            "load_before": 1.0, "load_after": 1.0}
    md = bench.markdown([row], meta)
    assert "cold <= 0.6, hit <= 0.8" in md and "(missed)" in md


def test_hexlayout_child_compiles_then_hits_its_cache(bench, tmp_path: pathlib.Path) -> None:
    case = bench.CASES["gemm sm_80 128x128x32 3st 4w"]
    bench.run_process("hexlayout", case, str(tmp_path))
    entries = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert entries, "the cold run persisted nothing"
    bytecode = tmp_path.parent / f"{tmp_path.name}-bytecode"
    bench.run_process("hexlayout", case, str(tmp_path), str(bytecode))
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == entries
    # the hit imported from (and wrote) bytecode in its own directory, not in the cache
    assert any(p.parent.parts[-2:] == ("hexlayout", "runtime") for p in bytecode.rglob("build.*.pyc"))


def test_bytecode_is_warmed_for_both_compilers(bench, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(bench, "run_process", lambda *a: calls.append(a) or 0.0)
    bench.warm_bytecode("Case('gemm', 'sm_80', 128, 128, 32, 3, 4)", "/tmp/bc")
    assert sorted(c[0] for c in calls) == ["hexlayout", "triton"]
    assert all(c[3] == "/tmp/bc" and c[2] != "/tmp/bc" for c in calls)


def test_triton_child_program_names_its_cache(bench) -> None:
    code = bench.child_code("triton", bench.CASES["attention sm_80 hd128 BM128 BN64 8w"])
    assert "triton_compile(case, cache=os.environ['TRITON_CACHE_DIR'])" in code
    compile(code, "<child>", "exec")
