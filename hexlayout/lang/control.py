"""Control flow: runtime loops and branches, warp specialization.

- ``for k in hl.range(start, stop, step=1, unroll=False)``: a runtime loop (``For``).
  The body is traced once with ``k`` a loop ``Var`` (bounds from static limits). Leaving
  the body early (``break``, ``return``) is a ``KernelError``; an exception raised in the
  body propagates. Plain Python loops (``for s in range(STAGES)``) unroll at trace time.
  Loop-carried register state must be updated in place (``acc += ...``, ``out=``,
  ``hl.assign``): rebinding a Python name in the body does not carry to the next iteration.
- ``with hl.if_(cond):`` / ``with hl.else_():`` (right after): a runtime branch on an
  integer ``Expr`` (``If``). Python ``if`` on an ``Expr`` is a ``KernelError``.
- ``with hl.warp_group(i, ...):``: the body runs only in warp group(s) ``i`` (threads
  ``128*i .. 128*i+127``): an ``If`` on ``hl.warp_group_index()`` with ``warp_groups``
  set; ``hl.else_()`` may follow for the other warp groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hexlayout.ir.expr import Expr, ExprLike, as_expr, bounds
from hexlayout.ir.tile import Block, For, If

from . import source
from .checks import as_index, begin, static_int
from .context import TraceContext
from .launch import warp_group_index
from .tensor import Tile

__all__ = ["range_", "if_", "else_", "warp_group"]


def range_(start: ExprLike, stop: ExprLike | None = None, step: int = 1, unroll: bool | int = False
           ) -> Iterator[Expr]:
    """A runtime loop: ``for (k = start; k < stop; k += step)``, written ``for k in hl.range(...)``.

    The body is traced once, with ``k`` a loop variable (an ``Expr`` whose bounds come
    from static limits), and becomes a ``For`` op. Like Python's ``range``, one argument
    is ``stop`` with ``start = 0``. Leaving the body early (``break``, ``return``) is an
    error: the body is not re-run per iteration at trace time. Loop-carried register
    state must be updated in place (``acc += ...``, ``out=``, ``hl.assign``); rebinding a
    Python name inside the body does not carry to the next iteration. A Python
    ``range`` loop instead unrolls at trace time. Named ``hl.range`` in the ``hl``
    namespace only (it shadows the built-in there).

    Args:
        start (int | Expr): the first value, or ``stop`` when ``stop`` is omitted.
        stop (int | Expr | None): the bound (exclusive).
        step (int): a static positive step; default 1.
        unroll (bool | int): ``#pragma unroll`` for ``True``, ``#pragma unroll n`` for an
            int ``n``, ``#pragma unroll 1`` (no unrolling) for ``False`` (default). A loop
            whose body indexes register tiles with ``k`` is unrolled fully regardless.

    Returns:
        Iterator[Expr]: yields the loop variable once (the body is traced once).

    Raises:
        KernelError: called outside a kernel trace; ``start`` / ``stop`` are not integer
            indices; ``step`` is not a static positive integer; ``unroll`` is neither a
            bool nor an int; the body is left by ``break`` or ``return`` (reported at the
            ``for`` line).

    Example:
        Accumulate over the K dimension::

            @hl.kernel(threads=128)
            def ksum(a: hl.f32["M", "K"], c: hl.f32["M", "N"]):
                M, K = a.shape
                acc = hl.zeros((64, 32), hl.f32)
                for k in hl.range(hl.cdiv(K, 32)):
                    r = hl.register(hl.f32, (64, 32))
                    hl.copy(a.tile((64, 32), (0, k * 32)), r)
                    acc += r
                hl.copy(acc, c.tile((64, 32), (0, 0)))

            tk = ksum.trace()
            assert any(op.name == "For" for op in tk.body.ops)
    """
    ctx, loc = begin("range")
    if stop is None:
        start, stop = 0, start
    lo = as_index(ctx, "range", loc, start, "start")
    hi = as_index(ctx, "range", loc, stop, "stop")
    st = static_int(step)
    if st is None or st <= 0:
        raise ctx.error("range", loc, f"step {step!r} must be a static positive integer")
    if not isinstance(unroll, (bool, int)):
        raise ctx.error("range", loc, f"unroll={unroll!r} must be a bool or an unroll factor")
    vlo = bounds(lo)[0]
    shi = bounds(hi)[1]
    vhi = None if shi is None else max(shi - 1, 0 if vlo is None else vlo)
    var = ctx.new_var(source.for_target(loc) or "i", vlo, vhi, "loop")
    return _loop(ctx, For(var, lo, hi, st, Block(), unroll, loc=loc))


def _loop(ctx: TraceContext, op: For) -> Iterator[Expr]:
    ctx.emit(op)
    ctx.push(op.body)
    finished = False
    try:
        yield op.var
        finished = True
    finally:
        if ctx.blocks and ctx.blocks[-1] is op.body:
            ctx.pop(op.body)
        if not finished and ctx.broken_loop is None:
            # closed without resuming: the body was left by break/return (or an exception,
            # which then propagates and makes this record moot)
            ctx.broken_loop = op.loc


class _Region:
    def __init__(self, ctx: TraceContext, op: If, block: Block, is_then: bool) -> None:
        self.ctx, self.op, self.block, self.is_then = ctx, op, block, is_then

    def __enter__(self) -> None:
        self.ctx.push(self.block)

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.ctx.pop(self.block)
        if self.is_then and exc_type is None:
            self.ctx.last_if = self.op


def _cond(ctx: TraceContext, op: str, loc: Any, cond: Any) -> Expr:
    if isinstance(cond, Tile):
        raise ctx.error(op, loc, f"the condition is the tile %{cond.name}; a branch needs a scalar "
                        "expression "
                        "(use hl.where for elementwise choice)")
    if isinstance(cond, (bool, int, Expr)):
        return as_expr(cond)
    raise ctx.error(op, loc, f"condition {cond!r} is not an integer expression")


def if_(cond: ExprLike) -> _Region:
    """A runtime branch: ``with hl.if_(cond):`` runs its body where ``cond != 0``.

    ``cond`` is a scalar integer ``Expr`` (block or thread indices, loop variables,
    scalar arguments, their comparisons ``x.eq(y)``, ``x < y``); the body is traced once
    into the ``then`` block of an ``If`` op. ``with hl.else_():`` may follow directly.
    A Python ``if`` on an ``Expr`` is an error; an elementwise choice on tiles is
    ``hl.where``.

    Args:
        cond (Expr | int | bool): the condition, nonzero = taken.

    Returns:
        _Region: a context manager; its body is the branch.

    Raises:
        KernelError: called outside a kernel trace; ``cond`` is a tile or not an integer
            expression.

    Example:
        Only blocks inside the problem store their tile::

            @hl.kernel(threads=128)
            def guarded(c: hl.f32["M", "N"], n: hl.i32):
                pid = hl.grid(hl.spatial(8))
                acc = hl.zeros((64, 64), hl.f32)
                with hl.if_(pid * 64 < n):
                    hl.copy(acc, c.tile((64, 64), (pid * 64, 0)))

            guarded.trace()
    """
    ctx, loc = begin("if_")
    op = If(_cond(ctx, "if_", loc, cond), Block(), loc=loc)
    ctx.emit(op)
    return _Region(ctx, op, op.then_body, True)


def else_() -> _Region:
    """The other branch: ``with hl.else_():`` right after ``hl.if_`` / ``hl.warp_group``.

    The body runs where the preceding branch's condition is 0 (for ``hl.warp_group``: in
    the other warp groups). It must directly follow the ``with`` block it completes.

    Returns:
        _Region: a context manager; its body is the ``else`` block of the same ``If``.

    Raises:
        KernelError: called outside a kernel trace, or not directly after a ``with
            hl.if_(...)`` / ``with hl.warp_group(...)`` block (or after one that already
            has an else).

    Example:
        Producer and consumer warp groups::

            @hl.kernel(threads=256)
            def specialized():
                with hl.warp_group(0):
                    hl.setmaxnreg(40, increase=False)
                with hl.else_():
                    hl.setmaxnreg(232)

            specialized.trace()
    """
    ctx, loc = begin("else_")
    op = ctx.last_if
    if op is None or not ctx.blocks[-1].ops or ctx.blocks[-1].ops[-1] is not op or op.else_body is not None:
        raise ctx.error("else_", loc, "hl.else_() must directly follow a `with hl.if_(...)` or "
                        "`with hl.warp_group(...)` block")
    op.else_body = Block()
    ctx.last_if = None
    return _Region(ctx, op, op.else_body, False)


def warp_group(*indices: int) -> _Region:
    """Warp specialization: ``with hl.warp_group(i, ...):`` runs its body in those warp groups.

    Warp group ``i`` is threads ``128*i .. 128*i + 127``. The body becomes an ``If`` on
    ``hl.warp_group_index()`` whose ``warp_groups`` lists ``indices``, so synthesis and
    the lowering know which threads execute it (e.g. a wgmma or a ``hl.syncthreads()``
    inside synchronizes only those warp groups). ``hl.else_()`` may follow.

    Args:
        *indices (int): static warp-group indices in ``[0, threads / 128)``.

    Returns:
        _Region: a context manager; its body is the branch.

    Raises:
        KernelError: called outside a kernel trace; no index given; an index is not a
            static warp group of the block.

    Example:
        Warp group 0 loads, warp groups 1 and 2 compute::

            @hl.kernel(threads=384)
            def ws():
                with hl.warp_group(0):
                    hl.setmaxnreg(40, increase=False)
                with hl.warp_group(1, 2):
                    hl.setmaxnreg(232)

            tk = ws.trace()
            assert [op.warp_groups for op in tk.body.ops] == [(0,), (1, 2)]
    """
    ctx, loc = begin("warp_group")
    groups = max(ctx.threads // 128, 1)
    if not indices:
        raise ctx.error("warp_group", loc, "give at least one warp-group index")
    idx = []
    for i in indices:
        v = static_int(i)
        if v is None or not 0 <= v < groups:
            raise ctx.error("warp_group", loc, f"warp group {i!r} out of range: the block of {ctx.threads} "
                            f"threads has {groups}")
        idx.append(v)
    wg = warp_group_index()
    cond: Expr = wg.eq(idx[0])
    for v in idx[1:]:
        cond = cond.logical_or(wg.eq(v))
    op = If(cond, Block(), warp_groups=tuple(idx), loc=loc)
    ctx.emit(op)
    return _Region(ctx, op, op.then_body, True)
