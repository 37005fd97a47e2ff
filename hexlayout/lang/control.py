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
    """A runtime loop ``for (k = start; k < stop; k += step)`` (see the module docstring)."""
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
    """``with hl.if_(cond):`` a runtime branch."""
    ctx, loc = begin("if_")
    op = If(_cond(ctx, "if_", loc, cond), Block(), loc=loc)
    ctx.emit(op)
    return _Region(ctx, op, op.then_body, True)


def else_() -> _Region:
    """``with hl.else_():`` the other branch of the ``hl.if_`` / ``hl.warp_group`` just closed."""
    ctx, loc = begin("else_")
    op = ctx.last_if
    if op is None or not ctx.blocks[-1].ops or ctx.blocks[-1].ops[-1] is not op or op.else_body is not None:
        raise ctx.error("else_", loc, "hl.else_() must directly follow a `with hl.if_(...)` or "
                        "`with hl.warp_group(...)` block")
    op.else_body = Block()
    ctx.last_if = None
    return _Region(ctx, op, op.else_body, False)


def warp_group(*indices: int) -> _Region:
    """``with hl.warp_group(0):`` the body runs in warp group 0 only (warp specialization)."""
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
