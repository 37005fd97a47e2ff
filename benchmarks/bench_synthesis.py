"""Synthesis time of the example kernels (a CPU benchmark: no GPU involved).

    python benchmarks/bench_synthesis.py                 # 7 runs per case, results/synthesis.*
    python benchmarks/bench_synthesis.py --runs 15 --profile gemm_sm80

For each case (GEMM sm_80, GEMM sm_90a, FlashAttention forward sm_80 causal and not, at the
kernels' default constants) it reports the median of ``--runs`` runs of

- ``synth``: ``synthesize(tile_kernel, arch)`` on an already traced kernel (trace excluded);
- ``trace+synth``: ``kernel.trace(**consts)`` and ``synthesize`` (trace included);

each in a fresh state: before every run the trace cache of the kernel, the memo of
``hexlayout.runtime.build`` and every ``functools`` cache in ``hexlayout.synth``,
``hexlayout.arch``, ``hexlayout.ir``, ``hexlayout.layout`` and ``hexlayout.lang`` are
cleared (``synthesize`` deep-copies the traced kernel itself, so the input is never
modified). ``warm`` is the median with those caches kept (what a second synthesis in one
process costs), and ``first in process`` the synthesis time of a brand-new Python process
(imports excluded). Targets: 0.5 s per GEMM, 2 s per attention kernel.

Writes ``benchmarks/results/synthesis.json`` and ``.md`` (with CPU model, Python and
package versions, git commit and date). ``--profile CASE`` prints a cProfile summary of one
cold run of that case instead.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {"gemm": 0.5, "attention": 2.0}
CACHED_PACKAGES = ("hexlayout.synth", "hexlayout.arch", "hexlayout.ir", "hexlayout.layout", "hexlayout.lang")


@dataclass
class Case:
    """One benchmarked kernel: ``kernel()`` returns the ``hl.kernel``; ``target`` in seconds."""

    name: str
    arch: str
    kernel: Callable[[], Any]
    consts: dict[str, Any] = field(default_factory=dict)
    target: float = 0.5
    description: str = ""


def _gemm_sm80() -> Any:
    from hexlayout.lang.examples.gemm_sm80 import gemm_sm80

    return gemm_sm80


def _gemm_sm90() -> Any:
    from hexlayout.lang.examples.gemm_sm90 import gemm_sm90

    return gemm_sm90


def _attention() -> Any:
    from hexlayout.lang.examples.flash_attention import flash_attention_fwd

    return flash_attention_fwd


CASES = [
    Case("gemm_sm80", "sm_80", _gemm_sm80, {}, TARGETS["gemm"],
         "multistage cp.async GEMM, 128x128x32 tile, 3 stages, 4 warps"),
    Case("gemm_sm90a", "sm_90a", _gemm_sm90, {}, TARGETS["gemm"],
         "warp-specialized TMA + wgmma GEMM, 128x256x64 tile, 4 stages, 3 warp groups"),
    Case("attention_sm80", "sm_80", _attention, {"CAUSAL": False}, TARGETS["attention"],
         "FlashAttention-2 forward, BM=128 BN=32 HEAD_DIM=128, 8 warps"),
    Case("attention_causal_sm80", "sm_80", _attention, {"CAUSAL": True}, TARGETS["attention"],
         "FlashAttention-2 forward, causal, BM=128 BN=32 HEAD_DIM=128, 8 warps"),
]


def clear_caches(kernel: Any = None) -> int:
    """Clear every memo cache synthesis could reuse; returns how many caches were cleared."""
    n = 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(CACHED_PACKAGES):
            continue
        for obj in list(vars(mod).values()):
            if isinstance(obj, functools._lru_cache_wrapper):  # type: ignore[attr-defined]
                obj.cache_clear()
                n += 1
    try:
        from hexlayout.runtime.build import clear_builds

        clear_builds()
    except ImportError:  # pragma: no cover - runtime missing
        pass
    cache = getattr(kernel, "_cache", None)
    if isinstance(cache, dict):
        cache.clear()
        n += 1
    return n


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(case: Case, runs: int) -> dict[str, Any]:
    """Median (and min / max) of ``runs`` cold runs with and without tracing, and warm runs."""
    from hexlayout.synth.solve import synthesize

    kernel = case.kernel()
    clear_caches(kernel)
    tk = kernel.trace(**case.consts)
    synthesize(tk, case.arch)            # one untimed run: imports, lazily built tables
    synth, total, trace, warm = [], [], [], []
    for _ in range(runs):
        clear_caches(kernel)
        synth.append(_time(lambda: synthesize(tk, case.arch)))
    for _ in range(runs):
        clear_caches(kernel)
        t0 = time.perf_counter()
        traced = kernel.trace(**case.consts)
        t1 = time.perf_counter()
        synthesize(traced, case.arch)
        t2 = time.perf_counter()
        trace.append(t1 - t0)
        total.append(t2 - t0)
    for _ in range(runs):
        warm.append(_time(lambda: synthesize(tk, case.arch)))
    return {
        "synth_median_s": statistics.median(synth), "synth_min_s": min(synth), "synth_max_s": max(synth),
        "trace_median_s": statistics.median(trace),
        "trace_synth_median_s": statistics.median(total), "trace_synth_min_s": min(total),
        "trace_synth_max_s": max(total),
        "warm_synth_median_s": statistics.median(warm),
        "runs": runs,
    }


def first_in_process(case: Case) -> float | None:
    """Synthesis time in a new Python process (imports and tracing excluded)."""
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "import bench_synthesis as b\n"
        "from hexlayout.synth.solve import synthesize\n"
        f"case = [c for c in b.CASES if c.name == {case.name!r}][0]\n"
        "tk = case.kernel().trace(**case.consts)\n"
        "t = time.perf_counter(); synthesize(tk, case.arch); print(time.perf_counter() - t)\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             check=True)
        return float(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


def machine_info() -> dict[str, Any]:
    """CPU model, cores, Python, package versions, git commit, date."""
    from importlib import metadata

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in ("hexlayout", "numpy", "python-constraint", "z3-solver"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "hexlayout"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(),
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "versions": versions, "git_commit": commit, "hexlayout_tree_dirty": dirty,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
    }


def markdown(results: dict[str, Any]) -> str:
    """The results as a markdown table with the machine description."""
    m = results["machine"]
    lines = [
        f"# Synthesis time ({m['date'][:10]})",
        "",
        f"CPU {m['cpu']} ({m['cores']} cores), Python {m['python']} ({m['platform']}); "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v) + f"; git {m['git_commit']}"
        + (" (uncommitted changes under hexlayout/)" if m.get("hexlayout_tree_dirty") else "")
        + (f"; load average {m['load_average'][0]:.2f} at the end" if m.get("load_average") else "") + ".",
        "",
        f"Median of {results['runs']} runs, each in a fresh state (trace cache, build memo and "
        "functools caches of hexlayout.synth/arch/ir/layout/lang cleared). *synth*: "
        "`synthesize(tile_kernel, arch)` of a traced kernel; *trace + synth*: tracing included; "
        "*warm*: caches kept; *new process*: the first synthesis in a new Python process "
        "(imports excluded).",
        "",
        "| case | arch | synth (s) | synth min (s) | trace + synth (s) | warm (s) | new process (s) "
        "| target (s) | met |",
        "|---|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in results["cases"]:
        fp = r.get("first_in_process_s")
        lines.append(
            f"| {r['name']} | {r['arch']} | {r['synth_median_s']:.3f} | {r['synth_min_s']:.3f} | "
            f"{r['trace_synth_median_s']:.3f} | "
            f"{r['warm_synth_median_s']:.3f} | {'-' if fp is None else f'{fp:.3f}'} | {r['target_s']:.1f} | "
            f"{'yes' if r['met'] else '**no**'} |")
    lines += ["", "Cases:", ""]
    lines += [f"- `{r['name']}`: {r['description']} (constants {r['constants'] or 'default'})"
              for r in results["cases"]]
    return "\n".join(lines) + "\n"


def profile(case: Case, top: int = 25) -> None:
    """Print a cProfile summary (cumulative and own time) of one cold synthesis of ``case``."""
    import cProfile
    import pstats

    from hexlayout.synth.solve import synthesize

    kernel = case.kernel()
    tk = kernel.trace(**case.consts)
    synthesize(tk, case.arch)
    clear_caches(kernel)
    prof = cProfile.Profile()
    prof.enable()
    synthesize(tk, case.arch)
    prof.disable()
    stats = pstats.Stats(prof).strip_dirs()
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; write JSON and markdown results; exit 1 if a target is missed."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7, help="runs per case and mode (default 7)")
    ap.add_argument("--cases", nargs="*", choices=[c.name for c in CASES], help="only these cases")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="results directory (default benchmarks/results)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--no-subprocess", action="store_true", help="skip the new-process measurement")
    ap.add_argument("--profile", choices=[c.name for c in CASES], help="profile one case and exit")
    args = ap.parse_args(argv)
    if args.profile:
        profile(next(c for c in CASES if c.name == args.profile))
        return 0
    cases = [c for c in CASES if not args.cases or c.name in args.cases]
    rows = []
    for case in cases:
        r = measure(case, args.runs)
        r["first_in_process_s"] = None if args.no_subprocess else first_in_process(case)
        r.update(name=case.name, arch=case.arch, constants=case.consts, description=case.description,
                 target_s=case.target, met=r["synth_median_s"] <= case.target)
        rows.append(r)
        print(f"{case.name:24s} {case.arch:7s} synth {r['synth_median_s']:.3f} s  trace+synth "
              f"{r['trace_synth_median_s']:.3f} s  warm {r['warm_synth_median_s']:.3f} s  "
              f"target {case.target:.1f} s  {'ok' if r['met'] else 'MISSED'}", flush=True)
    results = {"benchmark": "synthesis", "runs": args.runs, "machine": machine_info(), "cases": rows}
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / "synthesis"
        stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
        stem.with_suffix(".md").write_text(markdown(results))
        print(f"wrote {stem}.json and {stem}.md")
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
