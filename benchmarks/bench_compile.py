"""Compile latency side by side: a fresh process to a compiled kernel, hexlayout against Triton.

For each case - a matmul and a fused attention, the same tiles for both (``bench_static``'s
``Case``; hexlayout builds the kernels of ``hexlayout.lang.examples`` with
``hexlayout.runtime.build``, which import no torch, as Triton's side imports none; Triton's is
``bench_static.triton_compile``, ``triton.compile`` for a ``GPUTarget``; no GPU needed) - each
round runs four new Python processes, alternating the two compilers so that both see the same
machine load: hexlayout *cold* (an empty ``HEXLAYOUT_CACHE_DIR``), Triton *cold* (an empty
``TRITON_CACHE_DIR``), then hexlayout and Triton again on the caches their cold runs filled
(*hit*). Every process imports, builds and exits; the wall time of the whole process is
measured. Both compilers import their Python modules from bytecode (``PYTHONPYCACHEPREFIX``, a
directory of the run, filled by one unmeasured process per compiler and case), as installed
packages do: where ``PYTHONDONTWRITEBYTECODE`` is set, a checkout of hexlayout has no
``__pycache__`` and each process would compile ~150 modules from source (~0.4 s) while
Triton's installed modules load from theirs (``--source-imports`` measures it that way).
Each round gives the paired ratios hexlayout / Triton (cold and hit); the report gives their
median, min and max over the rounds and the median times.

Targets: cold ratio <= 0.6, hit ratio <= 0.8.

Writes ``benchmarks/results/compile.json`` and ``.md`` (machine, versions, date, load).
Needs Triton (``pip install -e '.[bench]'``).

    python benchmarks/bench_compile.py               # 5 rounds of every case
    python benchmarks/bench_compile.py --runs 3 --only gemm
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

#: name -> the ``bench_static.Case`` arguments (kernel, arch, BM, BN, BK / head dim, stages, warps, ...)
CASES: dict[str, str] = {
    "gemm sm_80 128x128x32 3st 4w": 'Case("gemm", "sm_80", 128, 128, 32, 3, 4)',
    "attention sm_80 hd128 BM128 BN64 8w": 'Case("attention", "sm_80", 128, 64, 128, 2, 8, chunk=(32, 64))',
}
TARGETS = {"cold": 0.6, "hit": 0.8}
#: what the child process runs for each compiler, given ``case`` (a ``bench_static.Case``)
PROGRAMS = {
    "hexlayout": (
        "from hexlayout.runtime import build\n"
        "if case.kernel == 'gemm':\n"
        "    from hexlayout.lang.examples import gemm_sm80\n"
        "    build(gemm_sm80, case.arch, BM=case.BM, BN=case.BN, BK=case.BK, STAGES=case.stages,\n"
        "          WARPS=case.warps)\n"
        "else:\n"
        "    bench_static.hexlayout_build(case)\n"),
    "triton": "bench_static.triton_compile(case, cache=os.environ['TRITON_CACHE_DIR'])\n",
}


def child_code(compiler: str, case: str) -> str:
    """The program of one measured process: import ``bench_static``, build ``case``."""
    return (f"import os, sys\nsys.path.insert(0, {str(HERE)!r})\nimport bench_static\n"
            f"from bench_static import Case\ncase = {case}\n{PROGRAMS[compiler]}")


def run_process(compiler: str, case: str, cache: str, bytecode: str | None = None) -> float:
    """Wall seconds of one fresh process compiling ``case`` with ``compiler`` and ``cache``.
    ``bytecode``: a directory for Python's compiled modules (``PYTHONPYCACHEPREFIX``, and
    ``PYTHONDONTWRITEBYTECODE`` dropped), so that both compilers import their modules from
    bytecode, as an installed package does; ``None`` keeps the caller's environment."""
    env = {**os.environ, "HEXLAYOUT_CACHE_DIR": cache, "TRITON_CACHE_DIR": cache,
           "TRITON_DEFAULT_FP_FUSION": "1"}      # Triton 3.9's default, stated (it warns otherwise)
    if bytecode is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = bytecode
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", child_code(compiler, case)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def rounds(case: str, runs: int, measure: Callable[[str, str, str], float] = run_process
           ) -> list[dict[str, float]]:
    """``runs`` rounds of hexlayout cold, Triton cold, hexlayout hit, Triton hit (in that
    order, each compiler with a cache directory of its own per round)."""
    out = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as hx, tempfile.TemporaryDirectory() as tt:
            r = {"hexlayout_cold": measure("hexlayout", case, hx), "triton_cold": measure("triton", case, tt),
                 "hexlayout_hit": measure("hexlayout", case, hx), "triton_hit": measure("triton", case, tt)}
        out.append(r)
    return out


def warm_bytecode(case: str, bytecode: str) -> None:
    """One unmeasured process per compiler on a throwaway cache: fills ``bytecode`` with the
    compiled modules of everything both programs import (the two compilers alike)."""
    for compiler in PROGRAMS:
        with tempfile.TemporaryDirectory() as cache:
            run_process(compiler, case, cache, bytecode)


def summarize(name: str, rs: list[dict[str, float]]) -> dict[str, Any]:
    """Medians of the times and median / min / max of the paired ratios of ``rs``."""
    row: dict[str, Any] = {"case": name, "runs": len(rs)}
    for key in ("hexlayout_cold", "triton_cold", "hexlayout_hit", "triton_hit"):
        row[f"{key}_median_s"] = statistics.median(r[key] for r in rs)
    for mode, target in TARGETS.items():
        ratios = [r[f"hexlayout_{mode}"] / r[f"triton_{mode}"] for r in rs]
        row[f"{mode}_ratio"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        row[f"{mode}_target"] = target
        row[f"{mode}_met"] = statistics.median(ratios) <= target
    return row


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("triton", "torch"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = "not installed"
    return out


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The report: one row per case, times and paired ratios against the targets."""
    lines = [f"# Compile latency, hexlayout vs Triton ({meta['date']})", "",
             f"{meta['machine']}, {meta['cpus']} CPUs, Python {meta['versions']['python']}, Triton "
             f"{meta['versions']['triton']}; load average {meta['load_before']:.1f} before, "
             f"{meta['load_after']:.1f} after; modules imported from {meta.get('imports', 'source')}. "
             "A fresh process each: *cold* with an empty cache, *hit* "
             "with the cache its cold run filled; the two compilers alternate within each round, and each "
             "ratio is hexlayout / Triton of one round. Targets: cold <= 0.6, hit <= 0.8.", "",
             "| case | rounds | hexlayout cold (s) | Triton cold (s) | cold ratio median [min, max] | "
             "hexlayout hit (s) | Triton hit (s) | hit ratio median [min, max] |",
             "|---|---:|---:|---:|---|---:|---:|---|"]

    def ratio(r: dict[str, Any], mode: str) -> str:
        q = r[f"{mode}_ratio"]
        ok = "met" if r[f"{mode}_met"] else "missed"
        return f"{q['median']:.2f} [{q['min']:.2f}, {q['max']:.2f}] ({ok})"

    for r in rows:
        lines.append(f"| {r['case']} | {r['runs']} | {r['hexlayout_cold_median_s']:.2f} | "
                     f"{r['triton_cold_median_s']:.2f} | {ratio(r, 'cold')} | "
                     f"{r['hexlayout_hit_median_s']:.2f} | {r['triton_hit_median_s']:.2f} | "
                     f"{ratio(r, 'hit')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="rounds per case")
    ap.add_argument("--only", default="", help="cases whose name contains this")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    ap.add_argument("--source-imports", action="store_true",
                    help="keep the environment's bytecode setting (with PYTHONDONTWRITEBYTECODE set and no "
                         "__pycache__ in a checkout, hexlayout's modules are compiled from source in every "
                         "process, Triton's installed ones are not); by default both import from bytecode "
                         "warmed before the rounds")
    ns = ap.parse_args(argv)
    try:
        import triton  # noqa: F401
    except ImportError:
        print("bench_compile: Triton is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as bytecode:
        for name, case in CASES.items():
            if ns.only and ns.only not in name:
                continue
            measure = run_process
            if not ns.source_imports:
                warm_bytecode(case, bytecode)
                measure = functools.partial(run_process, bytecode=bytecode)
            rows.append(summarize(name, rounds(case, ns.runs, measure)))
            print(json.dumps(rows[-1]), flush=True)
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.platform(), "cpus": os.cpu_count(), "versions": _versions(),
            "load_before": load_before, "load_after": os.getloadavg()[0], "runs": ns.runs,
            "imports": "source (environment as is)" if ns.source_imports else "bytecode (warmed)"}
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "compile.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (ns.out / "compile.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
