"""``run_ptx``: execute a PTX entry on the CPU, every thread of every block.

Scheduling: the blocks of a batch run together, threads numbered block-major. Each thread
has a program counter; each step runs the instruction at the smallest PC among the threads
that can run, for every thread at that PC (guard predicate applied), vectorized with numpy.
Threads that branched apart therefore run separately and meet again at the first common
PC (the lowest-PC-first policy reconverges structured control flow at its join point), and
warp collectives check that their warp is converged.

``bar.sync a{, b}`` / ``barrier.sync``: a thread waits until ``b`` threads (default: every
thread of its block that has not exited) have arrived at barrier ``a`` of its block
(``bar.arrive`` counts without waiting). When no thread can run and some wait, that is a
deadlock: ``PtxDeadlockError`` names the barrier, the PTX and CUDA lines and the counts.
A run that exceeds ``max_steps`` instruction steps raises too (a loop that never ends).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from . import alu, bulk, clocks, mbarrier, memops, tcgen05, warp, wgmma  # noqa: F401  (register the instruction handlers)
from .alu import HANDLERS, _reg
from .cluster import cluster_barrier, release_clusters
from .errors import PtxDeadlockError, PtxError
from .machine import BARRIER, CONVERGE, EXITED, RUN, WAIT, GlobalRegion, Machine
from .mbarrier import describe_waits, land_all, mbarrier_waits, try_wait
from .memops import CpAsyncQueue
from .parse import Imm, Instruction, Module, Sym, parse_ptx
from .srcmap import SourceMap

__all__ = ["run_ptx", "handled", "PtxRunReport"]

_NOOPS = {
    "membar",
    "fence",
    "prefetch",
    "prefetchu",
    "pmevent",
    "nanosleep",
    "griddepcontrol",
    "discard",
    "applypriority",
    "createpolicy",
}


class PtxRunReport:
    """What a run did: ``steps`` (instruction steps), ``executed`` (thread-instructions),
    ``opcodes`` (opcode -> thread-instructions), ``blocks`` run, ``seconds``."""

    def __init__(self, kernel: str) -> None:
        self.kernel = kernel
        self.steps = 0
        self.executed = 0
        self.opcodes: dict[str, int] = {}
        self.blocks: list[tuple[int, int, int]] = []
        self.seconds = 0.0


def handled(opcode: str) -> bool:
    """Whether the executor implements ``opcode`` (its first component; forms it does not
    implement raise ``UnsupportedInstructionError`` when executed)."""
    base = opcode.split(".")[0]
    if base == "cp":
        return opcode.startswith(("cp.async.", "cp.reduce.async.bulk.tensor"))
    return base in HANDLERS or base in _NOOPS or base in _CONTROL


# --- control flow and barriers -------------------------------------------------------------------


def _bra(m: Machine, ins: Instruction, idx: Any) -> bool:
    target = ins.operands[0]
    if not isinstance(target, Sym) or target.name not in m.entry.labels:
        raise PtxError(
            f"branch target {target!r} is not a label of the entry", kernel=m.kernel, site=m.site()
        )
    m.pc[idx] = m.entry.labels[target.name]
    return True


def _exit(m: Machine, ins: Instruction, idx: Any) -> bool:
    m.state[idx] = EXITED
    m.pc[idx] = len(m.entry.body)
    for b in np.unique(m.blk[idx]):
        _release(m, int(b))
    release_clusters(m)
    return True


def _bar(m: Machine, ins: Instruction, idx: Any) -> bool:
    parts = ins.parts
    if "warp" in parts:  # bar.warp.sync membermask: a convergence check
        from .warp import warps_of

        mask = m.uniform(ins.operands[0], idx, "bar.warp.sync membermask")
        warps_of(
            m,
            idx,
            ins.opcode,
            np.broadcast_to(
                ((mask >> np.arange(32)) & 1) == 1, (len(np.unique(m.warp[np.arange(m.T)[idx]])), 32)
            ),
        )
        clocks.join_warps(m, np.arange(m.T)[idx])
        return False
    if "red" in parts:
        raise m.unsupported()
    if "cluster" in parts:
        return cluster_barrier(m, ins, idx)
    bid = m.uniform(ins.operands[0], idx, "barrier id") if ins.operands else 0
    count = m.uniform(ins.operands[1], idx, "barrier thread count") if len(ins.operands) > 1 else None
    arrive = "arrive" in parts
    threads = np.arange(m.T)[idx]
    for b in np.unique(m.blk[threads]):
        mine = threads[m.blk[threads] == b]
        key = (int(b), bid)
        st = m.barriers.setdefault(key, {"arrived": 0, "count": count, "ins": ins, "waiting": []})
        if st["count"] is not None and count is not None and st["count"] != count:
            raise PtxError(
                f"barrier {bid} is used with thread counts {st['count']} and {count} at once",
                kernel=m.kernel,
                site=m.site(),
            )
        st["count"] = count if count is not None else st["count"]
        st["arrived"] += len(mine)
        st["clock"] = clocks.release(m, mine, st.get("clock"))
        st["ins"] = ins
        if not arrive:
            st["waiting"].append(mine)
            m.state[mine] = BARRIER
        _release(m, int(b))
    m.pc[idx] += 1
    return True


def _release(m: Machine, b: int) -> None:
    """Open every barrier of block ``b`` whose expected arrivals are all in."""
    live = int(np.count_nonzero((m.blk == b) & (m.state != EXITED)))
    for (bb, bid), st in list(m.barriers.items()):
        if bb != b:
            continue
        need = st["count"] if st["count"] is not None else live
        if st["arrived"] >= need and st["arrived"] > 0:
            for w in st["waiting"]:
                m.state[w] = np.where(m.state[w] == BARRIER, RUN, m.state[w])
                clocks.acquire(m, w, st.get("clock"))
            del m.barriers[(bb, bid)]
            if m.races is not None:
                m.races.epoch[b] += 1


def _trap(m: Machine, ins: Instruction, idx: Any) -> bool:
    t = int(np.arange(m.T)[idx][0])
    raise PtxError("trap executed", **m.where(t))


_CONTROL: dict[str, Callable[[Machine, Instruction, Any], bool]] = {
    "bra": _bra,
    "ret": _exit,
    "exit": _exit,
    "bar": _bar,
    "barrier": _bar,
    "trap": _trap,
}


# --- convergence at collectives -----------------------------------------------------------------

#: collectives of a warp (``.sync``: every lane of ``membermask``; ``.aligned``: every lane)
_WARP_COLLECTIVES = {"shfl", "vote", "ldmatrix", "stmatrix", "mma", "elect", "redux", "match"}
#: collectives of a warpgroup (all 128 threads)
_GROUP_COLLECTIVES = {"wgmma", "setmaxnreg"}


def _collective_need(m: Machine, ins: Instruction, at: np.ndarray) -> np.ndarray | None:
    """The threads that must execute collective ``ins`` together with threads ``at``: the
    live lanes of their warps (of ``membermask`` when it is an immediate), or of their
    warpgroups; None for an instruction that is not a collective."""
    base = ins.parts[0]
    if base in _GROUP_COLLECTIVES:
        wg = m.blk * ((m.ntid + 127) // 128) + m.tid // 128
        return np.nonzero(np.isin(wg, np.unique(wg[at])) & (m.state != EXITED))[0]
    if base not in _WARP_COLLECTIVES and not (base == "bar" and "warp" in ins.parts) and not (
        base == "tcgen05" and "aligned" in ins.parts
    ):
        return None
    need = np.isin(m.warp, np.unique(m.warp[at])) & (m.state != EXITED)
    mask = ins.operands[-1] if ins.operands and base in ("shfl", "vote", "bar", "elect") else None
    if isinstance(mask, Imm) and isinstance(mask.value, int):
        need &= ((int(mask.value) >> m.lane) & 1) == 1
    return np.nonzero(need)[0]


def _gather_lanes(m: Machine, ins: Instruction, pc: int, at: np.ndarray) -> np.ndarray | None:
    """Threads ``at`` reached collective ``ins`` at ``pc``: the threads that run it now, or None
    when lanes it needs are still on their way there (the arrived ones wait, ``CONVERGE``, as a
    GPU's convergence barrier makes them)."""
    need = _collective_need(m, ins, at)
    if need is None:
        return at
    here = (m.pc[need] == pc) & ((m.state[need] == RUN) | (m.state[need] == CONVERGE))
    if here.all():
        m.state[need] = RUN
        return need
    m.state[at] = CONVERGE
    return None


# --- the run loop --------------------------------------------------------------------------------


def _step_all(m: Machine, report: PtxRunReport, max_steps: int) -> None:
    body = m.entry.body
    n = len(body)
    while True:
        runnable = m.state == RUN
        if not runnable.any():
            if (m.state == EXITED).all():
                return
            land_all(m)           # TMA copies in flight land as late as possible: now
            release_clusters(m)
            if (m.state == RUN).any():
                continue
            if (m.state == CONVERGE).any():
                _diverged(m)
            if (m.state == WAIT).any() and not (m.state == BARRIER).any():
                raise describe_waits(m)  # type: ignore[misc]
            _deadlock(m)
        pcs = m.pc[runnable]
        pc = int(pcs.min())
        if pc >= n:
            m.state[runnable & (m.pc >= n)] = EXITED
            for b in range(m.nb):
                _release(m, b)
            continue
        at = np.nonzero(runnable & (m.pc == pc))[0]
        ins = body[pc]
        m.ins = ins
        if ins.parts[0] in _COLLECTIVE_BASES:
            got = _gather_lanes(m, ins, pc, at)
            if got is None:
                continue
            at = got
        m.steps += 1
        report.steps += 1
        if report.steps > max_steps:
            raise PtxError(
                f"more than {max_steps} instruction steps: a loop that never ends?", **m.where(int(at[0]))
            )
        exe = at
        if ins.guard is not None:
            g = np.asarray(m.read(ins.guard, "pred", at), dtype=bool)
            exe = at[g]
        base = ins.opcode.split(".", 1)[0]
        report.executed += len(exe)
        report.opcodes[ins.opcode] = report.opcodes.get(ins.opcode, 0) + len(exe)
        ctl = _CONTROL.get(base)
        if base == "mbarrier" and ins.parts[1] in ("try_wait", "test_wait"):
            ctl = try_wait
        if ctl is not None:
            if len(exe):
                idx = slice(None) if len(exe) == m.T else exe
                jumped = ctl(m, ins, idx)
            else:
                jumped = False
            if len(exe) < len(at) or not jumped:
                rest = np.setdiff1d(at, exe, assume_unique=True) if jumped else at
                m.pc[rest] += 1
            continue
        if len(exe):
            fn = HANDLERS.get(base)
            if fn is None:
                if base in _NOOPS:
                    m.pc[at] += 1
                    continue
                raise m.unsupported()
            fn(m, ins, slice(None) if len(exe) == m.T else exe)
        m.pc[at] += 1


_COLLECTIVE_BASES = _WARP_COLLECTIVES | _GROUP_COLLECTIVES | {"bar", "tcgen05"}


def _diverged(m: Machine) -> None:
    """Threads wait at a collective for lanes that can no longer reach it: run it with the
    lanes there, so its handler names the missing ones (``PtxDivergenceError``)."""
    t = int(np.nonzero(m.state == CONVERGE)[0][0])
    pc = int(m.pc[t])
    m.ins = ins = m.entry.body[pc]
    at = np.nonzero((m.state == CONVERGE) & (m.pc == pc))[0]
    from .warp import warps_of
    from .wgmma import warpgroups

    if ins.parts[0] in _GROUP_COLLECTIVES:
        warpgroups(m, at, ins.opcode)
    warps_of(m, at, ins.opcode)
    raise PtxError(f"threads wait at {ins.opcode} for lanes that never reach it", **m.where(t))


def _deadlock(m: Machine) -> None:
    waits = []
    for (b, bid), st in sorted(m.barriers.items()):
        live = int(np.count_nonzero((m.blk == b) & (m.state != EXITED)))
        need = st["count"] if st["count"] is not None else live
        waits.append((b, bid, st["arrived"], need, st["ins"]))
    b, bid, arrived, need, ins = waits[0]
    t = int(np.nonzero((m.blk == b) & (m.state == BARRIER))[0][0])
    m.ins = ins
    raise PtxDeadlockError(
        f"threads wait at barrier {bid} ({ins.opcode}) where {arrived} of the {need} expected "
        f"threads arrived, and no other thread can run{mbarrier_waits(m)}",
        **m.where(t),
    )


def _grid_blocks(grid: tuple[int, int, int], blocks: Iterable[Any] | None,
                 cluster: tuple[int, int, int] = (1, 1, 1)) -> list[list[tuple[int, int, int]]]:
    """The blocks to run, grouped by cluster (each group: the whole cluster of a block asked for)."""
    if blocks is None:
        todo = [(x, y, z) for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0]))]
    else:
        todo = []
        for b in blocks:
            t = (int(b),) if not isinstance(b, (tuple, list)) else tuple(int(v) for v in b)
            todo.append(tuple((t + (0, 0, 0))[:3]))  # type: ignore[arg-type]
    groups: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    for b in todo:
        c = tuple(b[i] // cluster[i] for i in range(3))
        if c not in groups:
            groups[c] = [(c[0] * cluster[0] + x, c[1] * cluster[1] + y, c[2] * cluster[2] + z)  # type: ignore[misc]
                         for z, y, x in itertools.product(*(range(d) for d in reversed(cluster)))]
    return list(groups.values())


@functools.lru_cache(maxsize=32)
def _parsed(ptx: str) -> Module:
    """``parse_ptx`` memoized per PTX text (a module is not modified by running it)."""
    return parse_ptx(ptx)


def run_ptx(
    ptx: str | Module,
    params: list[Any],
    regions: list[GlobalRegion],
    grid: tuple[int, ...],
    block: tuple[int, ...] | int,
    *,
    dynamic_smem: int = 0,
    entry: str | None = None,
    cuda_source: str = "",
    blocks: Iterable[Any] | None = None,
    max_threads: int = 4096,
    max_steps: int = 2_000_000,
    kernel: str = "",
    check_races: bool = True,
    cluster: tuple[int, ...] | None = None,
) -> PtxRunReport:
    """Run ``entry`` of ``ptx`` on ``grid`` blocks of ``block`` threads.

    ``params``: one value per ``.param`` (ints and floats packed as the parameter's type,
    ``bytes`` as they are; a tensor's value is its data pointer, which must lie in one of
    ``regions``). ``regions``: the tensors (``GlobalRegion``: name, host base address, bytes,
    in-bounds extent), written in place. ``dynamic_smem``: bytes of the ``extern .shared``
    window. ``cuda_source``: the CUDA text NVRTC compiled (names CUDA and kernel source
    lines in errors). ``blocks``: only these blocks. Blocks run in batches of at most
    ``max_threads`` threads. ``check_races``: shared-memory race detection (``SharedRaces``).
    Raises a ``PtxError`` subclass on the first error.
    """
    import time

    t0 = time.perf_counter()
    module = ptx if isinstance(ptx, Module) else _parsed(ptx)
    ent = module.entry(entry)
    g = tuple((tuple(int(x) for x in grid) + (1, 1, 1))[:3])
    blk = (
        (int(block), 1, 1)
        if isinstance(block, int)
        else tuple((tuple(int(x) for x in block) + (1, 1, 1))[:3])
    )
    srcmap = SourceMap(cuda_source)
    report = PtxRunReport(kernel or ent.name)
    cl = tuple((tuple(int(x) for x in (cluster or ent.cluster or (1, 1, 1))) + (1, 1, 1))[:3])
    if any(g[i] % cl[i] for i in range(3)):
        raise PtxError(f"grid {g} is not a whole number of {cl} clusters", kernel=kernel or ent.name)
    groups = _grid_blocks(g, blocks, cl)  # type: ignore[arg-type]
    nthr = blk[0] * blk[1] * blk[2]
    per = max(1, max_threads // max(nthr * len(groups[0]) if groups else 1, 1))
    for i in range(0, len(groups), per):
        batch = [b for grp in groups[i : i + per] for b in grp]
        m = Machine(module, ent, params, regions, g, blk, batch, dynamic_smem, srcmap, kernel,  # type: ignore[arg-type]
                    check_races, cl)  # type: ignore[arg-type]
        m.cpasync = CpAsyncQueue(m.T)  # type: ignore[attr-defined]
        m.barriers = {}  # type: ignore[attr-defined]
        m.waiting_on = np.full(m.T, -1, dtype=np.int64)  # type: ignore[attr-defined]
        m.clocks = clocks.make(m)  # type: ignore[attr-defined]
        _step_all(m, report, max_steps)
        tcgen05.check_exit(m)
        report.blocks.extend(batch)
    report.seconds = time.perf_counter() - t0
    return report


_ = _reg
