"""``run``: execute a lowered kernel on the CPU, block after block (cluster after cluster).

A kernel launched in thread-block clusters (``LoweredKernel.cluster``) runs a cluster at a
time: its CTAs (the blocks with equal ``blockIdx // cluster``, ranked x fastest) run together
(``scheduler.run_cluster``), so multicast TMA loads and remote mbarrier arrives reach the
peers. The grid must be a multiple of the cluster shape; asking for some ``blocks`` runs the
whole clusters that hold them.

Before anything runs, the arguments are checked as the GPU launcher checks them: every
scalar is a number of its parameter's kind (a float parameter takes a real number, not a
string such as ``'0.5'``, ``None`` or a bool; an integer parameter an integer), and every
tensor's base address is aligned to the widest global access the kernel makes on it (a
16-byte ``cp.async`` / ``ld.global.v4`` needs a 16-byte aligned base, TMA a 16-byte aligned
global address) - the emulator addresses tensors from their first element, so without this
check a view 2 bytes off alignment would run here and fault on a GPU.
"""

from __future__ import annotations

import itertools
import numbers
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from hexlayout.ir.expr import evaluate
from hexlayout.ir.lowered import (
    CpAsync,
    LdGlobal,
    LoweredKernel,
    StGlobal,
    TmaLoad,
    TmaStore,
    walk_instrs,
)
from hexlayout.ir.tile import ScalarParam

from .errors import ArgumentError
from .machine import Machine, Options
from .mbarrier import land_all
from .memory import bind_arguments
from .report import EmulatorReport
from .scheduler import run_cluster
from .tmem import check_exit as check_tmem_exit
from .wgmma import retire_all

__all__ = ["run", "grid_of", "check_scalars", "check_alignment", "global_access_widths"]


def grid_of(kernel: LoweredKernel, args: Mapping[str, Any]) -> tuple[int, ...]:
    """The launch grid with the scalar arguments substituted."""
    check_scalars(kernel, args)
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


def _clusters(
    kernel: LoweredKernel, grid: tuple[int, ...], blocks: list[tuple[int, ...]]
) -> list[list[tuple[int, ...]]]:
    """The clusters holding ``blocks`` (each once, in order of first appearance), each as its
    blocks in rank order (x fastest); without a cluster every block alone."""
    full = tuple(int(c) for c in kernel.cluster or ())
    shape = full[: len(grid)] + (1,) * (len(grid) - len(full[: len(grid)]))
    if all(c == 1 for c in full):
        return [[b] for b in blocks]
    if any(c != 1 for c in full[len(grid):]) or any(g % c for g, c in zip(grid, shape)):
        raise ArgumentError(f"the grid {grid} is not a multiple of the cluster {tuple(kernel.cluster or ())}",
                            kernel=kernel.name)
    out: list[list[tuple[int, ...]]] = []
    seen: set[tuple[int, ...]] = set()
    for b in blocks:
        base = tuple(v - v % c for v, c in zip(b, shape))
        if base in seen:
            continue
        seen.add(base)
        ranks = itertools.product(*(range(c) for c in reversed(shape)))
        out.append([tuple(o + r for o, r in zip(base, reversed(rr))) for rr in ranks])
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
    block is an int or a tuple of block indices), one block (or cluster) after the other.

    ``check_races``: happens-before race detection on shared memory; ``count``: bank
    wavefront and global sector counters; ``poison``: the byte fresh registers and shared
    memory start with (0xFF: NaN / -1). Raises an ``EmulationError`` subclass on the first
    error; returns the ``EmulatorReport``.
    """
    t0 = time.perf_counter()
    check_scalars(kernel, args)
    tensors, scalars = bind_arguments(kernel, args)
    check_alignment(kernel, args)
    check_writable(kernel, args)
    grid = tuple(int(evaluate(g, scalars)) for g in kernel.grid)
    if len(kernel.block_index) > len(grid):
        raise ArgumentError(
            f"{len(kernel.block_index)} block indices but a {len(grid)}-d grid", kernel=kernel.name
        )
    report = EmulatorReport(kernel.name)
    opts = Options(check_races=check_races, count=count, poison=poison)
    for cl in _clusters(kernel, grid, _blocks(grid, blocks)):
        for b in cl:
            if any(not 0 <= v < g for v, g in zip(b, grid)):
                raise ArgumentError(f"block {b} is outside the grid {grid}", kernel=kernel.name)
        ms = [Machine(kernel, tensors, scalars, b, report, opts) for b in cl]
        run_cluster(ms)
        for m in ms:
            land_all(m)
            retire_all(m)
            check_tmem_exit(m)
            report.blocks.append(m.block)
    report.seconds = time.perf_counter() - t0
    return report


def check_scalars(kernel: LoweredKernel, args: Mapping[str, Any]) -> None:
    """Refuse, naming the argument, a scalar that is not a number of its parameter's kind
    (float parameters: a real number, not a bool or a string; integer parameters: an integer;
    a numpy 0-d array or scalar counts as its value)."""
    for p in kernel.params:
        if not isinstance(p, ScalarParam) or p.name not in args:
            continue
        v = args[p.name]
        if isinstance(v, np.ndarray):
            if v.size != 1:
                raise ArgumentError(f"argument {p.name!r}: expected a scalar ({p.dtype}), got an array of "
                                    f"shape {v.shape}", kernel=kernel.name, buffer=p.name)
            v = v.item()
        if p.dtype.is_float:
            ok, kind = isinstance(v, numbers.Real) and not isinstance(v, bool), "a real number"
        else:
            ok = isinstance(v, numbers.Integral) and (not isinstance(v, bool) or p.dtype.name == "pred")
            kind = "an integer"
        if not ok:
            raise ArgumentError(f"argument {p.name!r}: expected {kind} ({p.dtype} scalar), got "
                                f"{type(v).__name__} {v!r}", kernel=kernel.name, buffer=p.name)


def check_writable(kernel: LoweredKernel, args: Mapping[str, Any]) -> None:
    """Refuse, naming the argument, a read-only numpy array (``writeable=False``: a view from
    ``np.broadcast_to``, an array after ``setflags(write=False)``) given for a tensor the kernel
    writes."""
    for p in kernel.written_params():
        arr = args.get(p.name)
        if isinstance(arr, np.ndarray) and arr.size > 0 and not arr.flags.writeable:
            raise ArgumentError(f"argument {p.name!r} is read-only (a numpy array with writeable=False, "
                                "e.g. from np.broadcast_to or setflags(write=False)) but the kernel writes "
                                "it: pass a writable array (np.array(x) or x.copy())",
                                kernel=kernel.name, buffer=p.name)


def global_access_widths(kernel: LoweredKernel) -> dict[str, tuple[int, str]]:
    """Per global tensor parameter: the widest access the kernel makes on it, in bytes, and
    the instruction (``ld.global`` / ``st.global`` / ``cp.async`` vector width; TMA: 16)."""
    out: dict[str, tuple[int, str]] = {}

    def note(name: str, nbytes: int, what: str) -> None:
        if nbytes > out.get(name, (0, ""))[0]:
            out[name] = (nbytes, what)

    for ins in walk_instrs(kernel.body):
        if isinstance(ins, LdGlobal):
            note(ins.src.param.name, ins.bits // 8, f"{ins.bits // 8}-byte ld.global")
        elif isinstance(ins, StGlobal):
            note(ins.dst.param.name, ins.bits // 8, f"{ins.bits // 8}-byte st.global")
        elif isinstance(ins, CpAsync):
            note(ins.src.param.name, ins.nbytes, f"{ins.nbytes}-byte cp.async")
        elif isinstance(ins, (TmaLoad, TmaStore)):
            note(ins.desc.param.name, 16, "TMA (16-byte aligned global address)")
    return out


def check_alignment(kernel: LoweredKernel, args: Mapping[str, Any]) -> None:
    """Refuse, naming the argument, a tensor whose base address is not aligned to the widest
    global access the kernel makes on it (the access a GPU would fault on)."""
    for name, (nbytes, what) in global_access_widths(kernel).items():
        arr = args.get(name)
        if not isinstance(arr, np.ndarray) or arr.size == 0 or nbytes <= 1:
            continue
        addr = int(arr.ctypes.data)
        if addr % nbytes:
            raise ArgumentError(f"argument {name!r}: base address {addr:#x} is {addr % nbytes} bytes off "
                                f"{nbytes}-byte alignment, which the kernel's {what} needs (a GPU faults); "
                                "pass a copy (.copy() / .clone()), not a view with an offset",
                                kernel=kernel.name, buffer=name)
