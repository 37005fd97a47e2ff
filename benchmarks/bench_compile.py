"""Fresh process to compiled kernel: import, trace, synthesize, generate, compile (no GPU).

For each kernel, ``--runs`` new Python processes run ``hexlayout.runtime.build(kernel, arch)``:
*cold* with an empty ``HEXLAYOUT_CACHE_DIR`` (everything done), *hit* with the cache the
cold run filled (the persisted build is loaded). Wall time of the whole process, median
and min. Writes ``benchmarks/results/compile_<date>.json`` and ``.md``. The anchors to beat
on this machine (REFERENCE.md): Triton 3.9 matmul 2.5 s, attention 2.8-3.1 s, cache hit
0.6 s; CuTe DSL 4.8.1 GEMM 2.1-2.4 s, FlashAttention-2 5.6 s.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

CASES = {
    "gemm sm_80": ("hexlayout.lang.examples", "gemm_sm80", "sm_80"),
    "gemm sm_90a": ("hexlayout.lang.examples", "gemm_sm90", "sm_90a"),
    "attention sm_80": ("hexlayout.lang.examples", "flash_attention_fwd", "sm_80"),
}
_GEMM = "Triton 2.5 s, CuTe DSL 2.1-2.4 s"
ANCHORS = {"gemm sm_80": _GEMM, "gemm sm_90a": _GEMM, "attention sm_80": "Triton 2.8-3.1 s, CuTe DSL 5.6 s"}


def _once(module: str, attr: str, arch: str, cache: str) -> float:
    code = (f"from hexlayout.runtime import build\nfrom {module} import {attr} as k\n"
            f"build(k, {arch!r})\n")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "HEXLAYOUT_CACHE_DIR": cache})
    return time.perf_counter() - t


def main(runs: int = 5) -> int:
    rows = []
    for name, (module, attr, arch) in CASES.items():
        cold, hit = [], []
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as d:
                cold.append(_once(module, attr, arch, d))
                hit.append(_once(module, attr, arch, d))
        rows.append({"case": name, "cold_median_s": statistics.median(cold), "cold_min_s": min(cold),
                     "hit_median_s": statistics.median(hit), "hit_min_s": min(hit),
                     "anchors": ANCHORS[name]})
        print(json.dumps(rows[-1]), flush=True)
    meta = {"python": platform.python_version(), "machine": platform.platform(), "cpus": os.cpu_count(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "runs": runs,
            "load_average": os.getloadavg()[0]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"compile_{meta['date'][:10]}"
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Fresh process to compiled kernel ({meta['date']})", "",
             f"{meta['machine']}, {meta['cpus']} CPUs, Python {meta['python']}, median of {runs} runs "
             f"(load average {meta['load_average']:.1f}). *cold*: empty cache; *hit*: the persisted "
             "build.", "",
             "| kernel | cold median (s) | cold min (s) | hit median (s) | hit min (s) | anchors (cold) |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['cold_median_s']:.2f} | {r['cold_min_s']:.2f} | "
                     f"{r['hit_median_s']:.2f} | {r['hit_min_s']:.2f} | {r['anchors']} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
