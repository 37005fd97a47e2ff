"""Timing shared by the benchmark scripts: the median of ``iters`` runs of ``fn`` in milliseconds.

On CUDA each run is bracketed by CUDA events after ``warmup`` runs, with a 256 MiB buffer
zeroed before each run so no operand stays in L2; on the CPU (the scripts' ``--dry-run``) it
is wall-clock time by ``time.perf_counter``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["time_ms"]


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
