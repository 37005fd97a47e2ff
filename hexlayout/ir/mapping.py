"""Hidet task mappings: which worker (thread, warp, block) does which task of a task grid.

- ``spatial(d0, d1, ...)``: ``d0*d1*...`` workers, one task each; worker ``w`` does the
  task at the row-major coordinate of ``w`` (``spatial(2, 3)``: w -> (w // 3, w % 3)).
- ``repeat(d0, d1, ...)``: one worker does all tasks, in row-major order.
- ``A * B``: the task grid of A, each of whose tasks is a grid of B. Worker
  ``w = wa * B.num_workers + wb``; its tasks are ``ta * B.task_shape + tb`` for the
  tasks ``ta`` of ``wa`` in A and ``tb`` of ``wb`` in B, A's outermost.

``tv_layout()`` gives the CuTe form: a layout ``(worker, task) -> colexicographic index
of the task coordinate`` (``t0 + D0 * t1 + ...``), with worker and task modes ordered so
that index ``w`` / ``i`` enumerate workers / per-worker tasks in the orders above.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hexlayout.layout import Layout, coalesce

__all__ = ["TaskMapping", "spatial", "repeat"]


@dataclass(frozen=True)
class _Factor:
    kind: str                 # "spatial" or "repeat"
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TaskMapping:
    factors: tuple[_Factor, ...]   # outermost first

    @property
    def rank(self) -> int:
        return len(self.factors[0].shape)

    @property
    def task_shape(self) -> tuple[int, ...]:
        out = [1] * self.rank
        for f in self.factors:
            out = [a * b for a, b in zip(out, f.shape)]
        return tuple(out)

    def _extent(self, kind: str) -> int:
        """The product of the extents of the ``kind`` factors."""
        n = 1
        for f in self.factors:
            if f.kind == kind:
                for s in f.shape:
                    n *= s
        return n

    @property
    def num_workers(self) -> int:
        return self._extent("spatial")

    @property
    def tasks_per_worker(self) -> int:
        return self._extent("repeat")

    def __mul__(self, other: TaskMapping) -> TaskMapping:
        if not isinstance(other, TaskMapping):
            return NotImplemented
        if other.rank != self.rank:
            raise ValueError(f"task mapping {self} * {other}: ranks {self.rank} and {other.rank} differ")
        return TaskMapping(self.factors + other.factors)

    def worker_tasks(self, w: int) -> list[tuple[int, ...]]:
        """The task coordinates of worker ``w`` in execution order."""
        if not 0 <= w < self.num_workers:
            raise ValueError(f"task mapping {self}: worker {w} out of range [0, {self.num_workers})")
        return list(self._tasks(w))

    def _tasks(self, w: int) -> Iterator[tuple[int, ...]]:
        # Split the worker index across spatial factors, innermost factor fastest.
        coords: list[tuple[int, ...] | None] = [None] * len(self.factors)
        rest = w
        for i in reversed(range(len(self.factors))):
            f = self.factors[i]
            if f.kind == "spatial":
                n = 1
                for s in f.shape:
                    n *= s
                coords[i] = _row_major(rest % n, f.shape)
                rest //= n

        def rec(i: int, base: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
            if i == len(self.factors):
                yield base
                return
            f = self.factors[i]
            scaled = tuple(b * s for b, s in zip(base, f.shape))
            if f.kind == "spatial":
                c = coords[i]
                assert c is not None
                yield from rec(i + 1, tuple(a + b for a, b in zip(scaled, c)))
            else:
                n = 1
                for s in f.shape:
                    n *= s
                for r in range(n):
                    c = _row_major(r, f.shape)
                    yield from rec(i + 1, tuple(a + b for a, b in zip(scaled, c)))

        yield from rec(0, tuple(0 for _ in range(self.rank)))

    def tv_layout(self, dims: tuple[int, ...] | None = None) -> Layout:
        """``(worker, task) -> t0 + D0*t1 + ...`` over ``task_shape`` (CuTe TV form).

        With ``dims``, the projection onto those task dimensions (index colexicographic
        over them): workers that differ only in the other dimensions get the same tasks
        (stride-0 worker modes) and repeats along the other dimensions are dropped.
        """
        shape = self.task_shape
        keep = tuple(range(self.rank)) if dims is None else tuple(dims)
        for d in keep:
            if not 0 <= d < self.rank:
                raise ValueError(f"task mapping {self}: dimension {d} out of range")
        dim_scale = [0] * self.rank
        scale = 1
        for d in keep:
            dim_scale[d] = scale
            scale *= shape[d]
        inner = [1] * self.rank
        wmodes: list[tuple[int, int]] = []   # (extent, stride), fastest first
        tmodes: list[tuple[int, int]] = []
        for f in reversed(self.factors):
            # row-major digits: the last dimension is fastest
            for d in reversed(range(self.rank)):
                mode = (f.shape[d], inner[d] * dim_scale[d])
                if f.kind == "spatial":
                    wmodes.append(mode)
                elif d in keep:
                    tmodes.append(mode)
            inner = [a * b for a, b in zip(inner, f.shape)]
        wl = _mode(wmodes)
        tl = _mode(tmodes)
        return Layout((wl.shape, tl.shape), (wl.stride, tl.stride))

    def __str__(self) -> str:
        return " * ".join(f"{f.kind}({', '.join(map(str, f.shape))})" for f in self.factors)

    __repr__ = __str__


def _mode(modes: list[tuple[int, int]]) -> Layout:
    """The modes fastest first, coalesced (size-1 modes dropped; ``1:0`` if none remain)."""
    modes = [m for m in modes if m[0] != 1]
    if not modes:
        return Layout(1, 0)
    return coalesce(Layout(tuple(m[0] for m in modes), tuple(m[1] for m in modes)))


def _row_major(i: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(shape):
        out.append(i % s)
        i //= s
    return tuple(reversed(out))


def _check(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
    if not shape:
        raise ValueError(f"{kind}(): needs at least one extent")
    for s in shape:
        if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
            raise ValueError(f"{kind}{shape}: extents must be positive integers")
    return tuple(shape)


def spatial(*shape: int) -> TaskMapping:
    return TaskMapping((_Factor("spatial", _check(shape, "spatial")),))


def repeat(*shape: int) -> TaskMapping:
    return TaskMapping((_Factor("repeat", _check(shape, "repeat")),))
