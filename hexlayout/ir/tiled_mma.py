"""A tiled mma: one mma atom repeated over a block tile by a task mapping of warps.

``TiledMma(atom, warps, k_tiles)`` covers an ``M x N x K`` tile with
``M = AM * atom_m``, ``N = AN * atom_n``, ``K = k_tiles * atom_k`` where ``warps`` is a
task mapping over the ``AM x AN`` grid of atom tiles whose workers are the atom's
thread groups (warps for mma.sync, warp groups for wgmma). Thread ``t`` of the block is
lane ``t % atom_threads`` of worker ``t // atom_threads``.

Its TV layouts (thread mode first, index colexicographic over the operand tile):

- ``c_tv``: ``((atom_t, W), (atom_v, R)) -> m + M*n`` where ``(w, r)`` is the worker and
  its ``r``-th task ``(am, an)`` and the atom value ``(atom_t, atom_v)`` lands at
  ``(am*atom_m + m_a, an*atom_n + n_a)``.
- ``a_tv``: ``((atom_t, W), (atom_v, k_tiles, R_m)) -> m + M*k`` (``k_inner``, the default;
  ``(atom_v, R_m, k_tiles)`` otherwise; workers that differ
  only along N hold the same values: stride-0 worker modes).
- ``b_tv``: ``((atom_t, W), (atom_v, k_tiles, R_n)) -> n + N*k``.

So the fragment of instance ``(r, k)`` is a contiguous run of ``atom_v`` values of each
operand: C values ``[Vc*r, Vc*(r+1))``, A values ``[Va*(k + k_tiles*r_m), ...)``, B values
``[Vb*(k + k_tiles*r_n), ...)``. The k-step is the inner value mode of A and B so that a
C tile of one mma, cast, can be the A operand of the next without moving values (the C
values of the n-repeats of one row block run in the same order as the A values of its
k-steps: FlashAttention's P @ V).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexlayout.layout import Layout, composition
from hexlayout.memo import memoized

from .mapping import TaskMapping

__all__ = ["TiledMma", "MmaInstance"]


@dataclass(frozen=True)
class MmaInstance:
    """One atom issue of a worker: task ``r`` (C fragment), its ``r_m``/``r_n``, k-step ``k``."""

    r: int
    r_m: int
    r_n: int
    k: int


def _join(a: Layout, b: Layout) -> Layout:
    """The rank-2 layout (a, b) with each side kept as one mode."""
    return Layout((a.shape, b.shape), (a.stride, b.stride))


def _cat(*modes: Layout) -> Layout:
    return Layout(tuple(m.shape for m in modes), tuple(m.stride for m in modes))


@dataclass(frozen=True)
class TiledMma:
    atom: Any           # hexlayout.arch.MmaAtom
    warps: TaskMapping  # over the (AM, AN) grid of atom tiles
    k_tiles: int = 1
    k_inner: bool = True   # A/B value order (atom_v, k, R) if True, else (atom_v, R, k)

    def __post_init__(self) -> None:
        if self.warps.rank != 2:
            raise ValueError(f"TiledMma: the warp mapping {self.warps} must be 2-D over (M, N) atom tiles")
        if self.k_tiles < 1:
            raise ValueError(f"TiledMma: k_tiles must be positive, got {self.k_tiles}")

    # --- shapes --------------------------------------------------------------------
    @property
    def atom_threads(self) -> int:
        return self.atom.num_threads

    @property
    def threads(self) -> int:
        return self.atom_threads * self.warps.num_workers

    @property
    def tile_mnk(self) -> tuple[int, int, int]:
        am, an = self.warps.task_shape
        m, n, k = self.atom.shape_mnk
        return am * m, an * n, self.k_tiles * k

    # --- TV layouts ----------------------------------------------------------------
    def c_tv(self) -> Layout:
        return _c_tv(self)

    def _c_tv(self) -> Layout:
        m_a, n_a, _ = self.atom.shape_mnk
        big_m, _, _ = self.tile_mnk
        am, an = self.warps.task_shape
        atom = composition(Layout((m_a, n_a), (1, big_m)), self.atom.c_layout)
        tasks = composition(Layout((am, an), (m_a, big_m * n_a)), self.warps.tv_layout())
        return _join(_cat(atom[0], tasks[0]), _cat(atom[1], tasks[1]))

    def _operand_tv(self, atom_layout: Layout, extent: int, dim: int, big: int) -> Layout:
        """TV of an (X, K) operand: X = M (dim 0) or N (dim 1); ``big`` = X extent of the tile."""
        _, _, k_a = self.atom.shape_mnk
        grid = self.warps.task_shape[dim]
        atom = composition(Layout((extent, k_a), (1, big)), atom_layout)
        tasks = composition(Layout(grid, extent), self.warps.tv_layout(dims=(dim,)))
        ktiles = Layout(self.k_tiles, big * k_a)
        if self.k_inner:
            return _join(_cat(atom[0], tasks[0]), _cat(atom[1], ktiles, tasks[1]))
        return _join(_cat(atom[0], tasks[0]), _cat(atom[1], tasks[1], ktiles))

    def a_start(self, inst: MmaInstance) -> int:
        """First A value of issue ``inst`` (in units of the atom's A values)."""
        return inst.k + self.k_tiles * inst.r_m if self.k_inner else inst.r_m + self.tasks_m * inst.k

    def b_start(self, inst: MmaInstance) -> int:
        return inst.k + self.k_tiles * inst.r_n if self.k_inner else inst.r_n + self.tasks_n * inst.k

    def a_tv(self) -> Layout:
        if getattr(self.atom, "a_source", "rmem") != "rmem":
            raise ValueError(f"TiledMma: {self.atom.name} reads A from shared memory; it has no A registers")
        return _operand_tv(self, 0)

    def b_tv(self) -> Layout:
        if getattr(self.atom, "b_source", "rmem") != "rmem":
            raise ValueError(f"TiledMma: {self.atom.name} reads B from shared memory; it has no B registers")
        return _operand_tv(self, 1)

    # --- instances -----------------------------------------------------------------
    def _repeat_digits(self) -> list[tuple[int, int]]:
        """(extent, dim) of each repeat digit of the task index, fastest first."""
        out = []
        for f in reversed(self.warps.factors):
            if f.kind == "repeat":
                for d in reversed(range(2)):
                    if f.shape[d] != 1:
                        out.append((f.shape[d], d))
        return out

    def instances(self) -> list[MmaInstance]:
        """Every atom issue of one worker, k-step outermost (the same list for all workers)."""
        digits = self._repeat_digits()
        per = self.warps.tasks_per_worker
        out = []
        for k in range(self.k_tiles):
            for r in range(per):
                rest = r
                rm = rn = 0
                sm = sn = 1
                for ext, d in digits:
                    digit = rest % ext
                    rest //= ext
                    if d == 0:
                        rm += digit * sm
                        sm *= ext
                    else:
                        rn += digit * sn
                        sn *= ext
                out.append(MmaInstance(r, rm, rn, k))
        return out

    def _tasks(self, mode: int) -> int:
        """The repeats along ``mode`` (0: M, 1: N): the product of its repeat digits."""
        n = 1
        for ext, d in self._repeat_digits():
            if d == mode:
                n *= ext
        return n

    @property
    def tasks_m(self) -> int:
        return self._tasks(0)

    @property
    def tasks_n(self) -> int:
        return self._tasks(1)

    def __str__(self) -> str:
        m, n, k = self.tile_mnk
        from hexlayout.arch import atom_spec

        order = "" if self.k_inner else ", k outer"
        return f"TiledMma({atom_spec(self.atom)} x [{self.warps}] x k{self.k_tiles}{order} -> {m}x{n}x{k})"


@memoized(maxsize=1024)
def _c_tv(mma: TiledMma) -> Layout:
    """``mma.c_tv()`` (a pure function of the frozen ``mma``; a synthesis asks for it once per
    candidate and per lowered op)."""
    return mma._c_tv()


@memoized(maxsize=2048)
def _operand_tv(mma: TiledMma, dim: int) -> Layout:
    """The TV layout of operand A (``dim`` 0) or B (``dim`` 1) of ``mma`` (memoized like ``_c_tv``)."""
    atom_layout = mma.atom.a_layout if dim == 0 else mma.atom.b_layout
    return mma._operand_tv(atom_layout, mma.atom.shape_mnk[dim], dim, mma.tile_mnk[dim])
