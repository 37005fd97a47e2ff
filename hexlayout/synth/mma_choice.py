"""Candidate mma atoms and warp arrangements for an ``mma`` op.

For ``c[M,N] += a[M,K] @ b[N,K]^T`` run by ``T`` threads on architecture ``arch``:

- atoms: the architecture's mma atoms whose A/B/C types match the operands and whose
  operand sources match their scopes (mma.sync: both in registers; wgmma: B in shared
  memory, A in shared memory (SS) or registers (RS)); for wgmma the N of the atom ranges
  over multiples of 8 that divide the worker's share of N;
- arrangements: ``spatial(wm, wn) * repeat(rm, rn)`` (each worker a contiguous block of
  atom tiles) and ``repeat(rm, rn) * spatial(wm, wn)`` (interleaved), for every
  ``wm * wn = T / atom_threads`` with ``wm | M/atom_m`` and ``wn | N/atom_n``.

Each arrangement comes with the two value orders of the A / B register fragments (k-step
inner, the default, which lets an accumulator feed the next mma as its A operand; and
k-step outer). Candidates are ordered by a load-balance heuristic: the per-worker
operand traffic ``(M/wm + N/wn) * K`` first, then warps along M before N (row reductions stay inside a
warp), contiguous before interleaved, larger wgmma N first.

On sm_100a an mma with a shared operand gets ``tcgen05.mma`` (``umma_choice``: the accumulator
in tensor memory; B shared, A shared or a register tile written into tensor memory).
"""

from __future__ import annotations

from functools import lru_cache

from hexlayout.arch import get_atom, list_atoms
from hexlayout.ir.mapping import TaskMapping, repeat, spatial
from hexlayout.ir.tile import Mma
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.ir.tiled_umma import TiledUmma
from hexlayout.ir.types import Scope

from .umma_choice import umma_candidates

__all__ = ["mma_candidates"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _atoms(op: Mma, arch: str) -> list:
    a, b, c = op.a.type, op.b.type, op.c.type
    if op.atom is not None:
        return [get_atom(op.atom)]
    out = []
    types = f"{c.dtype.cute}{a.dtype.cute}{b.dtype.cute}"
    for name in _mma_names(arch, types):
        at = get_atom(name)
        if (at.a_dtype.name, at.b_dtype.name, at.c_dtype.name) != (a.dtype.name, b.dtype.name, c.dtype.name):
            continue
        a_smem, b_smem = a.scope == Scope.SHARED, b.scope == Scope.SHARED
        if at.kind == "mma.sync":
            if a_smem or b_smem:
                continue
        else:
            if not b_smem or (at.a_source == "smem") != a_smem:
                continue
            if at.a_major != "K" or at.b_major != "K":
                continue
            # MN-major shared operands: the same instruction with other descriptor majors
            a_majors = ("K", "MN") if at.a_source == "smem" else ("K",)
            for am in a_majors:
                for bm in ("K", "MN"):
                    if (am, bm) == ("K", "K"):
                        out.append(at)
                        continue
                    try:
                        opts = {"b_major": bm} if at.a_source != "smem" else {"a_major": am, "b_major": bm}
                        out.append(get_atom(at.name, **opts))
                    except ValueError:
                        continue
            continue
        out.append(at)
    return out


_PREFIXES = {"sm_80": ("SM80_",), "sm_89": ("SM80_", "SM89_"), "sm_90a": ("SM80_", "SM89_", "SM90_"),
             "sm_100a": ("SM80_", "SM89_")}      # its register-operand mmas (shared: tcgen05, umma_choice)


@lru_cache(maxsize=64)
def _mma_names(arch: str, types: str) -> tuple[str, ...]:
    """Names of ``arch``'s mma atoms whose type token (``D A B``, e.g. ``F32F16F16``) is
    ``types``, filtered by name before any atom is built."""
    prefixes = _PREFIXES.get(arch, ())
    out = []
    for name in list_atoms():
        if not name.startswith(prefixes) or f"_{types}" not in name:
            continue
        at = get_atom(name)
        if at.kind in ("mma.sync", "wgmma") and arch in at.archs:
            out.append(name)
    return tuple(out)


def mma_candidates(op: Mma, arch: str, threads: int, other_columns: int = 0,
                   a_sets: int = 1) -> list[TiledMma] | list[TiledUmma]:
    """Every legal TiledMma for ``op`` run by ``threads`` threads, best first; on sm_100a, an
    mma with a shared operand gets the tcgen05 tilings of ``umma_choice`` (``TiledUmma``; a
    register A through tensor memory or shared memory, the kernel's other accumulators taking
    ``other_columns`` TMEM columns; a register A in TMEM taking ``a_sets`` sets of columns, one
    per execution in flight at its store plus one), one on register operands the mma.sync atoms (sm_100a runs
    every sm_80 instruction)."""
    if arch == "sm_100a" and (op.a.type.scope == Scope.SHARED or op.b.type.scope == Scope.SHARED):
        return umma_candidates(op, threads, other_columns, a_sets)
    if op.scale_a is not None:       # block scales: the block-scaled tcgen05.mma of sm_100a only
        return []
    m, k = op.a.type.shape
    n = op.b.type.shape[0]
    scored: list[tuple[tuple, TiledMma]] = []
    for at in _atoms(op, arch):
        am, an, ak = at.shape_mnk
        if m % am or n % an or k % ak or threads % at.num_threads:
            continue
        workers = threads // at.num_threads
        maps: list[tuple[int, TaskMapping]] = []
        if op.warps is not None:
            w = op.warps
            if w.task_shape != (m // am, n // an):
                if w.num_workers == workers and (m // am) % w.task_shape[0] == 0 \
                        and (n // an) % w.task_shape[1] == 0:
                    w = w * repeat((m // am) // w.task_shape[0], (n // an) // w.task_shape[1])
                else:
                    continue
            if w.num_workers != workers or w.task_shape != (m // am, n // an):
                continue
            maps.append((0, w))
        else:
            for wm in _divisors(workers):
                wn = workers // wm
                if (m // am) % wm or (n // an) % wn:
                    continue
                rm, rn = (m // am) // wm, (n // an) // wn
                maps.append((0, spatial(wm, wn) * repeat(rm, rn)))
                if rm * rn > 1:
                    maps.append((1, repeat(rm, rn) * spatial(wm, wn)))
        for order, w in maps:
            per_m = m // _spatial_extent(w, 0)
            per_n = n // _spatial_extent(w, 1)
            majors = (at.a_major != "K") + (at.b_major != "K")
            score = ((per_m + per_n) * k, -_spatial_extent(w, 0), order, -an, at.name, majors)
            scored.append((score + (0,), TiledMma(at, w, k // ak)))
            if k // ak > 1 and w.tasks_per_worker > 1 and at.a_source == "rmem":
                # the other order of the A / B register values (k-step outer)
                scored.append((score + (1,), TiledMma(at, w, k // ak, k_inner=False)))
    scored.sort(key=lambda x: x[0])
    return [t for _, t in scored]


def _spatial_extent(w: TaskMapping, dim: int) -> int:
    n = 1
    for f in w.factors:
        if f.kind == "spatial":
            n *= f.shape[dim]
    return n
