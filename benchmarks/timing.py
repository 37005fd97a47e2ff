"""Timing shared by the benchmark scripts: the median of ``iters`` runs of ``fn`` in milliseconds.

On CUDA each run is bracketed by CUDA events after ``warmup`` runs, with a 256 MiB buffer
zeroed before each run so no operand stays in L2; on the CPU (the scripts' ``--dry-run``) it
is wall-clock time by ``time.perf_counter``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["time_ms", "run_benchmark"]


def time_ms(fn: Callable[[], Any], warmup: int, iters: int, cuda: bool) -> float:
    if not cuda:
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)
    import torch  # pragma: no cover - GPU only

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_benchmark(name: str, args: Any, run: Callable[[Any], Any], write_results: Callable[[Any, Any], Any],
                  emulate_arch: str | None = None) -> int:
    """A benchmark script's ``main`` after parsing: with ``--dry-run`` the emulator
    (``HEXLAYOUT_EMULATE=1``, ``HEXLAYOUT_EMULATE_ARCH`` defaulting to ``emulate_arch``), no
    warm-up and one timed run; else a CUDA GPU, or exit status 2 naming the script. Runs
    ``run(args)``, prints the paths ``write_results(res, args.out)`` wrote, returns 0."""
    if args.dry_run:
        os.environ["HEXLAYOUT_EMULATE"] = "1"
        if emulate_arch is not None:
            os.environ.setdefault("HEXLAYOUT_EMULATE_ARCH", emulate_arch)
        args.warmup, args.iters = 0, 1
    else:  # pragma: no cover - GPU only
        import torch

        if not torch.cuda.is_available():
            print(f"{name}: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
            return 2
    res = run(args)
    for p in write_results(res, args.out):
        print(p)
    return 0
