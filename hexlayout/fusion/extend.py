"""Tracing new ops into an already traced ``TileKernel``.

``KernelExtender(tk)`` is a tile-language trace context for an existing program: inside
``ext.trace(fn)`` the ``hl`` functions emit their ops into a fresh block (returned as a
list of ops for the rewriter to splice in), names never clash with the program's values or
variables, ``ext.tile(value)`` wraps an existing value as an ``hl`` tile, and
``ext.tensor_param`` / ``ext.scalar_param`` add kernel parameters (appended to
``tk.params``) whose shapes are expressions over the program's own size variables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hexlayout.ir.expr import ExprLike, Var, free_vars
from hexlayout.ir.tile import Block, GlobalParam, GlobalView, Op, ScalarParam, TileKernel, Value
from hexlayout.ir.walk import walk
from hexlayout.lang.context import TraceContext
from hexlayout.lang.tensor import GlobalTensor, Tile

__all__ = ["KernelExtender", "defining_ops"]


def defining_ops(tk: TileKernel) -> dict[int, Op]:
    """value id -> the op that defines it (its first writer in program order)."""
    out: dict[int, Op] = {}
    for op in walk(tk):
        for v in op.outputs():
            out.setdefault(v.id, op)
    return out


class KernelExtender:
    """Emit new ops and parameters into ``tk`` (see the module docstring)."""

    def __init__(self, tk: TileKernel) -> None:
        self.tk = tk
        self.ctx = TraceContext(tk.name, None, tk.launch.threads, tk.launch.cluster)
        self.ctx._used.update(v.name for v in tk.values())
        self.ctx._used.update(p.name for p in tk.params)
        for op in walk(tk):
            if isinstance(op, GlobalView):
                for e in op.origin:
                    self.ctx._var_names.update(v.name for v in free_vars(e))
        for p in tk.params:
            self.ctx.reserve_var_name(p.name)
            if isinstance(p, GlobalParam):
                for e in (*p.shape, *p.stride):
                    self.ctx._var_names.update(v.name for v in free_vars(e))

    def fresh_param_name(self, base: str) -> str:
        names = {p.name for p in self.tk.params} | self.ctx._var_names | self.ctx._used
        name, n = base, 0
        while name in names:
            n += 1
            name = f"{base}_{n}"
        return name

    def tensor_param(self, base: str, dtype: Any, shape: tuple[ExprLike, ...],
                     stride: tuple[ExprLike, ...] | None = None, align_bytes: int = 16) -> GlobalTensor:
        """A new global tensor parameter (row-major unless ``stride``; pointer, rows and views
        ``align_bytes``-aligned), appended to the kernel."""
        if stride is None:
            acc: ExprLike = 1
            st: list[ExprLike] = []
            for s in reversed(shape):
                st.append(acc)
                acc = acc * s
            stride = tuple(reversed(st))
        p = GlobalParam(self.fresh_param_name(base), dtype, tuple(shape), tuple(stride), align_bytes)
        self.tk.params.append(p)
        self.ctx._used.add(p.name)
        return GlobalTensor(p, self.ctx)

    def size_var(self, base: str) -> Var:
        """A new symbolic size (bound at launch from the shape of the parameter that has it)."""
        name = self.fresh_param_name(base)
        self.ctx.reserve_var_name(name)
        return Var(name, 0, None, kind="size")

    def scalar_param(self, base: str, dtype: Any) -> Var:
        """A new scalar parameter (a runtime value), appended to the kernel; its ``Var``."""
        name = self.fresh_param_name(base)
        var = Var(name, None, None, kind="scalar")
        self.ctx.reserve_var_name(name)
        self.tk.params.append(ScalarParam(name, dtype, var))
        return var

    def tile(self, value: Value) -> Tile:
        """An existing value as an ``hl`` tile of this context."""
        return Tile(value, self.ctx)

    def trace(self, fn: Callable[[], Any]) -> tuple[list[Op], Any]:
        """Run ``fn`` with ``hl`` emitting into a fresh block; ``(its ops, fn's result)``."""
        block = Block()
        self.ctx.blocks = [block]
        self.ctx.body = block
        with self.ctx:
            out = fn()
        return list(block.ops), out
