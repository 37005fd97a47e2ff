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
    """Hidet's ``spatial`` task mapping: one worker per task, tasks in row-major order.

    ``spatial(d0, ..., dr)`` has ``d0 * ... * dr`` workers over a task grid of shape
    ``(d0, ..., dr)``; worker ``w`` takes the task whose row-major index is ``w``.
    Composition ``f * g`` (both of rank r) tiles the task grid: worker tasks of ``f``
    scaled by ``g``'s task shape plus those of ``g``, i.e. ``task = t_f * shape_g + t_g``.
    With ``hl.grid`` it assigns tasks to thread blocks; with ``hl.mma(warps=...)`` atom
    tiles to warps.

    Args:
        *dims (int | Expr): positive extents, one per task dimension; symbolic extents
            (``hl.cdiv(M, BM)``) are allowed for ``hl.grid``.

    Returns:
        TaskMapping | GridMapping: a ``TaskMapping`` when every extent is static, else a
        ``GridMapping`` (symbolic extents, for ``hl.grid`` only).

    Raises:
        ValueError: no extent, a non-positive extent, or an extent that is neither an int
            nor an ``Expr``.

    Example:
        >>> m = hl.spatial(2, 3)
        >>> m.num_workers, m.worker_tasks(4)
        (6, [(1, 1)])
        >>> (hl.spatial(2, 3) * hl.spatial(1, 2)).worker_tasks(4)
        [(0, 4)]
    """
    sym = _dims("spatial", dims)
    return _spatial(*(static_int(d) for d in dims)) if sym is None else GridMapping((("spatial", sym),))


def repeat(*dims: Any) -> TaskMapping | GridMapping:
    """Hidet's ``repeat`` task mapping: one worker does every task, in row-major order.

    ``repeat(d0, ..., dr)`` has one worker and ``d0 * ... * dr`` tasks. Composed with
    ``spatial`` it gives each worker several tasks: in ``hl.repeat(2, 1) * hl.spatial(2, 3)``
    each of the 6 workers takes 2 tasks of a (4, 3) task grid.

    Args:
        *dims (int | Expr): positive extents, one per task dimension (static for ``hl.grid``).

    Returns:
        TaskMapping | GridMapping: a ``TaskMapping`` when every extent is static, else a
        ``GridMapping``.

    Raises:
        ValueError: no extent, a non-positive extent, or an extent that is neither an int
            nor an ``Expr``.

    Example:
        >>> m = hl.repeat(2, 1) * hl.spatial(2, 3)
        >>> m.num_workers, m.task_shape, m.worker_tasks(4)
        (6, (4, 3), [(1, 1), (3, 1)])
    """
    sym = _dims("repeat", dims)
    return _repeat(*(static_int(d) for d in dims)) if sym is None else GridMapping((("repeat", sym),))


def cdiv(a: ExprLike, b: ExprLike) -> ExprLike:
    """Ceiling division: ``ceil(a / b)`` for ``a >= 0`` and ``b > 0``.

    Static operands give an int; otherwise the ``Expr`` ``(a + b - 1) // b``.

    Args:
        a (int | Expr): the dividend, non-negative.
        b (int | Expr): the divisor, positive.

    Returns:
        int | Expr: ``ceil(a / b)``.

    Raises:
        TypeError: an operand is neither an int nor an ``Expr``.

    Example:
        >>> hl.cdiv(10, 4), hl.cdiv(8, 4)
        (3, 2)
    """
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
    """Assign the tasks of a task mapping to thread blocks; returns this block's task.

    - One ``spatial`` factor of rank <= 3: a multi-dimensional launch grid with the last
      task dimension on ``blockIdx.x``, so consecutive blocks take consecutive tasks of
      the last dimension (row-major). Coordinate ``d`` is a ``blockIdx`` variable with
      bounds ``[0, extent)``.
    - Any other mapping (products, ``repeat``, rank > 3): a 1-D grid of ``num_workers``
      blocks; the coordinates are computed from ``blockIdx.x`` as the mapping prescribes
      (e.g. grouped tile orders for L2 reuse).

    A kernel calls ``hl.grid`` at most once; without it the grid is one block.

    Args:
        mapping (TaskMapping | GridMapping): ``hl.spatial`` / ``hl.repeat`` or a product;
            extents may be symbolic (``hl.cdiv(M, BM)``); ``repeat`` extents must be static.

    Returns:
        Expr | tuple[Expr, ...] | list: the task coordinates of this block: one ``Expr``
        for a rank-1 mapping, a tuple for higher ranks, a list of those when the mapping
        gives each block several tasks (``repeat``).

    Raises:
        KernelError: called outside a kernel trace or twice in one kernel; ``mapping`` is
            not a task mapping; an extent is not an index; a ``repeat`` extent is symbolic.

    Example:
        One block per 128x128 tile of C::

            @hl.kernel(threads=128)
            def tiles(c: hl.f32["M", "N"]):
                M, N = c.shape
                pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(M, 128), hl.cdiv(N, 128)))
                acc = hl.zeros((128, 128), hl.f32)
                hl.copy(acc, c.tile((128, 128), (pid_m * 128, pid_n * 128)))

            tk = tiles.trace()
            assert len(tk.launch.grid) == 2
    """
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
    """The thread's index in the block: ``threadIdx.x``, in ``[0, threads)``.

    Returns:
        Expr: the ``threadIdx.x`` variable (bounds ``[0, threads)``).

    Raises:
        KernelError: called outside a kernel trace.

    Example:
        Let thread 0 alone initialize a barrier::

            @hl.kernel(threads=128)
            def first():
                bars = hl.mbarrier(1)
                with hl.if_(hl.thread_index().eq(0)):
                    hl.mbarrier_init(bars, 0, 1)

            first.trace()
    """
    ctx, _ = begin("thread_index")
    return ctx.thread_var


def cluster_rank() -> Expr:
    """The block's rank in its thread-block cluster (``%cluster_ctarank``).

    Clusters tile the launch grid in ``blockIdx`` order: with ``@hl.kernel(cluster=(cx, cy,
    cz))`` the blocks with ``blockIdx // (cx, cy, cz)`` equal form one cluster, and the rank
    is ``bx % cx + cx * (by % cy + cy * (bz % cz))`` - the value the hardware register holds,
    computed from the block index so that synthesis, code generation and the emulator see an
    ordinary index expression. A cluster-relative task mapping uses it to give the CTAs of a
    cluster tiles that share an operand (``hl.copy(..., multicast=)``). Call ``hl.grid`` first.

    Returns:
        Expr: the rank, in ``[0, cx * cy * cz)``.

    Raises:
        KernelError: called outside a kernel trace, before ``hl.grid``, or in a kernel
            without ``cluster=``.

    Example:
        Two CTAs per cluster take the two halves of an M-pair of tiles::

            @hl.kernel(threads=128, cluster=(2, 1, 1))
            def pairs(c: hl.f32["M", "N"]):
                M, N = c.shape
                pid = hl.grid(hl.spatial(2 * hl.cdiv(M, 256)))
                m0 = (pid // 2) * 256 + hl.cluster_rank() * 128

            pairs.trace()
    """
    ctx, loc = begin("cluster_rank")
    if not ctx.cluster:
        raise ctx.error("cluster_rank", loc, "the kernel has no cluster: declare "
                        "@hl.kernel(cluster=(2, 1, 1))")
    if not ctx.block_index:
        raise ctx.error("cluster_rank", loc, "call hl.grid first: the rank is taken from the block index")
    rank: ExprLike = 0
    scale = 1
    for v, c in zip(ctx.block_index, ctx.cluster):
        if int(c) > 1:
            rank = rank + (v % int(c)) * scale
        scale *= int(c)
    return as_expr(rank)


def warp_index() -> Expr:
    """The warp's index in the block: ``threadIdx.x // 32``.

    Returns:
        Expr: ``threadIdx.x // 32``, in ``[0, threads / 32)``.

    Raises:
        KernelError: called outside a kernel trace.

    Example:
        A branch taken by warp 0 only::

            @hl.kernel(threads=128)
            def warp0():
                with hl.if_(hl.warp_index().eq(0)):
                    hl.syncthreads()

            warp0.trace()
    """
    return thread_index() // 32


def lane_index() -> Expr:
    """The thread's lane in its warp: ``threadIdx.x % 32``.

    Returns:
        Expr: ``threadIdx.x % 32``, in ``[0, 32)``.

    Raises:
        KernelError: called outside a kernel trace.

    Example:
        A branch taken by the first lane of every warp::

            @hl.kernel(threads=64)
            def lane0():
                with hl.if_(hl.lane_index().eq(0)):
                    hl.syncthreads()

            lane0.trace()
    """
    return thread_index() % 32


def warp_group_index() -> Expr:
    """The warp group's index in the block: ``threadIdx.x // 128``.

    ``hl.warp_group(i)`` branches on it for warp specialization.

    Returns:
        Expr: ``threadIdx.x // 128``, in ``[0, threads / 128)``.

    Raises:
        KernelError: called outside a kernel trace.

    Example:
        A branch of warp group 1 written by hand::

            @hl.kernel(threads=256)
            def producer():
                with hl.if_(hl.warp_group_index().eq(1)):
                    hl.setmaxnreg(40, increase=False)

            producer.trace()
    """
    return thread_index() // 128
