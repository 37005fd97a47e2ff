"""``run``: execute a lowered kernel on the CPU, block after block."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping
from typing import Any

from hexlayout.ir.expr import evaluate
from hexlayout.ir.lowered import LoweredKernel

from .errors import ArgumentError
from .machine import Machine, Options
from .mbarrier import land_all
from .memory import bind_arguments
from .report import EmulatorReport
from .scheduler import run_block
from .wgmma import retire_all

__all__ = ["run", "grid_of"]


def grid_of(kernel: LoweredKernel, args: Mapping[str, Any]) -> tuple[int, ...]:
    """The launch grid with the scalar arguments substituted."""
    _, scalars = bind_arguments(kernel, {k: v for k, v in args.items()})
    return tuple(int(evaluate(g, scalars)) for g in kernel.grid)


def _blocks(grid: tuple[int, ...], blocks: Iterable[Any] | None) -> list[tuple[int, ...]]:
    if blocks is None:
        # block index 0 varies fastest, like blockIdx.x
        return [tuple(reversed(b)) for b in itertools.product(*(range(g) for g in reversed(grid)))]
    out = []
    for b in blocks:
        t = (int(b),) if not isinstance(b, (tuple, list)) else tuple(int(v) for v in b)
        t = t + (0,) * (len(grid) - len(t))
        out.append(t)
    return out


def run(
    kernel: LoweredKernel,
    args: Mapping[str, Any],
    blocks: Iterable[Any] | None = None,
    *,
    check_races: bool = True,
    count: bool = True,
    poison: int = 0xFF,
) -> EmulatorReport:
    """Run ``kernel`` with ``args`` (tensor parameters: numpy arrays of the parameter's dtype,
    written in place; scalar parameters: ints) on ``blocks`` (default: the whole grid; a
    block is an int or a tuple of block indices), one block after the other.

    ``check_races``: happens-before race detection on shared memory; ``count``: bank
    wavefront and global sector counters; ``poison``: the byte fresh registers and shared
    memory start with (0xFF: NaN / -1). Raises an ``EmulationError`` subclass on the first
    error; returns the ``EmulatorReport``.
    """
    t0 = time.perf_counter()
    tensors, scalars = bind_arguments(kernel, args)
    grid = tuple(int(evaluate(g, scalars)) for g in kernel.grid)
    if len(kernel.block_index) > len(grid):
        raise ArgumentError(
            f"{len(kernel.block_index)} block indices but a {len(grid)}-d grid", kernel=kernel.name
        )
    report = EmulatorReport(kernel.name)
    opts = Options(check_races=check_races, count=count, poison=poison)
    for b in _blocks(grid, blocks):
        if any(not 0 <= v < g for v, g in zip(b, grid)):
            raise ArgumentError(f"block {b} is outside the grid {grid}", kernel=kernel.name)
        m = Machine(kernel, tensors, scalars, b, report, opts)
        run_block(m)
        land_all(m)
        retire_all(m)
        report.blocks.append(b)
    report.seconds = time.perf_counter() - t0
    return report
