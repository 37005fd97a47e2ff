"""Launch configuration: the task mapping of blocks, and thread coordinates.

``pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(M, BM), hl.cdiv(N, BN)))`` assigns the
tasks of a task mapping to thread blocks (Hidet's ``spatial`` / ``repeat`` and ``*``;
extents may be symbolic). It sets ``LaunchConfig.grid`` / ``block_index`` and returns
this block's task coordinates as ``Expr`` over the ``blockIdx`` variables (a single
``Expr`` for a rank-1 mapping, a tuple otherwise; a list of them when the mapping gives
each block several tasks through ``repeat``).

- One ``spatial`` factor of rank <= 3: a multi-dimensional grid, the last task
  dimension on ``blockIdx.x`` (so consecutive blocks take consecutive tasks of the last
  dimension, as in a row-major enumeration); coordinate ``d`` is a ``blockIdx`` ``Var``
  with bounds ``[0, extent)`` (upper bound unknown when the extent is symbolic).
- Otherwise: a 1-D grid of ``num_workers`` blocks; coordinates are computed from
  ``blockIdx.x`` as the task mapping prescribes (e.g. grouped tile orders).

Without ``hl.grid`` the grid is one block. ``hl.thread_index()``, ``hl.warp_index()``,
``hl.lane_index()``, ``hl.warp_group_index()``: ``threadIdx.x`` and ``//32``, ``%32``,
``//128`` of it. ``hl.cdiv(a, b)``: ``ceil(a / b)`` for ints or expressions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexlayout.ir.expr import Expr, ExprLike, as_expr
from hexlayout.ir.mapping import TaskMapping
from hexlayout.ir.mapping import repeat as _repeat
from hexlayout.ir.mapping import spatial as _spatial

from .checks import as_index, begin, static_int

__all__ = ["GridMapping", "spatial", "repeat", "grid", "cdiv", "thread_index", "warp_index", "lane_index",
           "warp_group_index"]


@dataclass(frozen=True)
class GridMapping:
    """A task mapping with possibly symbolic extents (for blocks). Factors outermost first."""

    factors: tuple[tuple[str, tuple[ExprLike, ...]], ...]

    @staticmethod
    def of(m: Any) -> GridMapping:
        if isinstance(m, GridMapping):
            return m
        if isinstance(m, TaskMapping):
            return GridMapping(tuple((f.kind, tuple(f.shape)) for f in m.factors))
        raise TypeError(f"{m!r} is not a task mapping")

    @property
    def rank(self) -> int:
        return len(self.factors[0][1])

    def __mul__(self, other: Any) -> GridMapping:
        o = GridMapping.of(other)
        if o.rank != self.rank:
            raise ValueError(f"task mapping {self} * {o}: ranks {self.rank} and {o.rank} differ")
        return GridMapping(self.factors + o.factors)

    def __rmul__(self, other: Any) -> GridMapping:
        return GridMapping.of(other) * self

    def __str__(self) -> str:
        return " * ".join(f"{k}({', '.join(map(str, s))})" for k, s in self.factors)


def _dims(kind: str, dims: tuple[Any, ...]) -> tuple[ExprLike, ...] | None:
    """Static int tuple -> None (use the IR mapping); else the symbolic extents."""
    if not dims:
        raise ValueError(f"{kind}(): needs at least one extent")
    out: list[ExprLike] = []
    static = True
    for d in dims:
        v = static_int(d)
        if v is not None:
            if v <= 0:
                raise ValueError(f"{kind}{dims}: extents must be positive")
            out.append(v)
        elif isinstance(d, Expr):
            static = False
            out.append(d)
        else:
            raise ValueError(f"{kind}{dims}: {d!r} is not an extent")
    return None if static else tuple(out)


def spatial(*dims: Any) -> TaskMapping | GridMapping:
    """Hidet's ``spatial``: one worker per task, row-major. Symbolic extents give a ``GridMapping``."""
    sym = _dims("spatial", dims)
    return _spatial(*(static_int(d) for d in dims)) if sym is None else GridMapping((("spatial", sym),))


def repeat(*dims: Any) -> TaskMapping | GridMapping:
    """Hidet's ``repeat``: one worker does all tasks, row-major."""
    sym = _dims("repeat", dims)
    return _repeat(*(static_int(d) for d in dims)) if sym is None else GridMapping((("repeat", sym),))


def cdiv(a: ExprLike, b: ExprLike) -> ExprLike:
    """``ceil(a / b)`` for non-negative ``a`` and positive ``b``."""
    sa, sb = static_int(a), static_int(b)
    if sa is not None and sb is not None:
        return -(-sa // sb)
    return (as_expr(a) + (as_expr(b) - 1)) // b


def _prod(xs: tuple[ExprLike, ...]) -> ExprLike:
    n: ExprLike = 1
    for x in xs:
        n = n * x
    return n


def _row_major(w: ExprLike, shape: tuple[ExprLike, ...]) -> list[ExprLike]:
    out: list[ExprLike] = []
    for s in reversed(shape):
        out.append(w % s)
        w = w // s
    return list(reversed(out))


def grid(mapping: Any) -> Any:
    """Map the tasks of ``mapping`` to thread blocks (see the module docstring)."""
    ctx, loc = begin("grid")
    if ctx.grid is not None:
        raise ctx.error("grid", loc, "hl.grid was already called; a kernel has one launch grid")
    try:
        gm = GridMapping.of(mapping)
    except TypeError:
        raise ctx.error("grid", loc, f"{mapping!r} is not a task mapping (hl.spatial / hl.repeat)") from None
    for kind, shape in gm.factors:
        for s in shape:
            as_index(ctx, "grid", loc, s, f"{kind} extent")
    spatials = [s for k, s in gm.factors if k == "spatial"]
    repeats = [s for k, s in gm.factors if k == "repeat"]
    if any(static_int(s) is None for r in repeats for s in r):
        raise ctx.error("grid", loc, f"{gm}: repeat extents must be static")
    names = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
    if len(gm.factors) == 1 and not repeats and gm.rank <= 3:
        dims = spatials[0]
        gdims = tuple(reversed(dims))
        bvars = []
        for axis, d in enumerate(gdims):
            v = ctx.new_var(names[axis], 0, static_int(d), "block")
            bvars.append(v)
        ctx.grid = gdims
        ctx.block_index = tuple(bvars)
        coords: list[Any] = [tuple(reversed(bvars))]
    else:
        nworkers = _prod(tuple(s for sh in spatials for s in sh))
        bx = ctx.new_var(names[0], 0, static_int(nworkers), "block")
        ctx.grid = (nworkers,)
        ctx.block_index = (bx,)
        coords = _tasks(gm, bx)
    result = [c[0] if len(c) == 1 else tuple(c) for c in coords]
    return result[0] if len(result) == 1 else result


def _tasks(gm: GridMapping, w: ExprLike) -> list[tuple[ExprLike, ...]]:
    """The task coordinates of worker ``w`` (symbolic), in execution order (as ``TaskMapping``)."""
    n = len(gm.factors)
    digit: list[list[ExprLike] | None] = [None] * n
    rest: ExprLike = w
    for i in reversed(range(n)):
        kind, shape = gm.factors[i]
        if kind == "spatial":
            cnt = _prod(shape)
            is_outermost = all(gm.factors[j][0] != "spatial" for j in range(i))
            digit[i] = _row_major(rest if is_outermost else rest % cnt, shape)
            rest = rest // cnt
    out: list[tuple[ExprLike, ...]] = []

    def rec(i: int, base: tuple[ExprLike, ...]) -> None:
        if i == n:
            out.append(base)
            return
        kind, shape = gm.factors[i]
        scaled = tuple(b * s for b, s in zip(base, shape))
        if kind == "spatial":
            d = digit[i]
            assert d is not None
            rec(i + 1, tuple(a + b for a, b in zip(scaled, d)))
        else:
            cnt = static_int(_prod(shape))
            assert cnt is not None
            for r in range(cnt):
                c = _row_major(r, shape)
                rec(i + 1, tuple(a + b for a, b in zip(scaled, c)))

    rec(0, tuple(0 for _ in range(gm.rank)))
    return out


def thread_index() -> Expr:
    """``threadIdx.x`` (bounds ``[0, threads)``)."""
    ctx, _ = begin("thread_index")
    return ctx.thread_var


def warp_index() -> Expr:
    return thread_index() // 32


def lane_index() -> Expr:
    return thread_index() % 32


def warp_group_index() -> Expr:
    return thread_index() // 128
