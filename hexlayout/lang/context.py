"""The trace context: the builder state while a kernel function runs on proxies.

``TraceContext`` owns the block stack (ops go to the innermost open ``For`` / ``If``
body), names values and loop variables, collects mbarriers and the launch configuration,
and turns mistakes into ``KernelError``s that carry the current source line.
``current(op)`` is the context of the kernel being traced (a ``KernelError`` outside one).
"""

from __future__ import annotations

from types import CodeType
from typing import Any

from hexlayout.ir.expr import Var
from hexlayout.ir.tile import Block, If, Mbarrier, Op, SourceLoc, Value
from hexlayout.ir.types import LayoutVar, TileType

from . import source
from .errors import KernelError

__all__ = ["TraceContext", "current", "active"]

_STACK: list[TraceContext] = []


def _fresh(base: str, used: set[str]) -> str:
    """The first of ``base``, ``base_1``, ``base_2``, ... not in ``used``, added to it."""
    name, n = base, 0
    while name in used:
        n += 1
        name = f"{base}_{n}"
    used.add(name)
    return name


class TraceContext:
    """Builder of one ``TileKernel`` (see the module docstring)."""

    def __init__(self, name: str, code: CodeType | None, threads: int,
                 cluster: tuple[int, ...] | None = None) -> None:
        self.name = name
        self.code = code
        self.threads = threads
        self.cluster = cluster
        self.body = Block()
        self.blocks: list[Block] = [self.body]
        self.mbarriers: list[Mbarrier] = []
        self.grid: tuple[Any, ...] | None = None
        self.block_index: tuple[Var, ...] = ()
        self.thread_var = Var("threadIdx.x", 0, threads, kind="thread")
        self.last_if: If | None = None           # an If just closed (hl.else_ may follow)
        self.broken_loop: SourceLoc | None = None  # an hl.range loop left early
        self._used: set[str] = set()
        self._var_names: set[str] = {"threadIdx.x"}
        self._claims: dict[tuple[str, int], Value] = {}
        self._temps = 0

    # --- context stack --------------------------------------------------------------
    def __enter__(self) -> TraceContext:
        _STACK.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _STACK.remove(self)

    # --- locations and errors ---------------------------------------------------------
    def loc(self) -> SourceLoc | None:
        return source.capture(self.code)

    def error(self, op: str, loc: SourceLoc | None, detail: str) -> KernelError:
        return KernelError(self.name, op, loc, detail)

    def check_open(self, op: str, loc: SourceLoc | None) -> None:
        """Raise if an ``hl.range`` loop was left by ``break`` / ``return``."""
        if self.broken_loop is not None:
            bad = self.broken_loop
            self.broken_loop = None
            raise self.error("range", bad, "`break` or `return` inside an hl.range loop: a runtime loop's "
                             "body is traced once and cannot be left early (use hl.if_ to skip work, or a "
                             "Python range to unroll)")

    # --- blocks and ops -----------------------------------------------------------------
    def emit(self, op: Op) -> Op:
        self.check_open(op.name, op.loc)
        self.blocks[-1].append(op)
        self.last_if = None
        return op

    def push(self, block: Block) -> None:
        self.blocks.append(block)
        self.last_if = None

    def pop(self, block: Block) -> None:
        if self.blocks[-1] is not block:  # pragma: no cover - guarded by the region managers
            raise RuntimeError("hexlayout.lang: unbalanced control regions")
        self.blocks.pop()

    # --- naming -----------------------------------------------------------------------
    def _unique(self, base: str) -> str:
        return _fresh(base, self._used)

    def temp_name(self) -> str:
        while True:
            self._temps += 1
            name = f"t{self._temps}"
            if name not in self._used:
                self._used.add(name)
                return name

    def new_value(self, type: TileType, loc: SourceLoc | None, operands: tuple[Any, ...] = (),
                  base: Value | None = None, name: str | None = None, default: str | None = None) -> Value:
        """A fresh value, named ``name``, else after the line's assignment target, else ``tN``.

        Of several values created on one line (``p = hl.exp2(s - m)``), the outermost one
        gets the target name; inner ones feeding it become temporaries (``default`` names
        an unassigned value, else ``tN``).
        """
        if name is not None:
            vname = self._unique(name)
        else:
            target = source.assigned_name(loc)
            if target is None or loc is None:
                vname = self._unique(default) if default else self.temp_name()
            else:
                key = (loc.file, loc.line)
                prev = self._claims.get(key)
                if prev is not None and prev.name == target and any(o is prev for o in operands):
                    self._rename(prev, self.temp_name())
                    self._used.discard(target)
                vname = self._unique(target)
        if isinstance(type.layout, LayoutVar) and not type.layout.name:
            type.layout.name = vname
        v = Value(vname, type, loc, base)
        if name is None and loc is not None:
            self._claims[(loc.file, loc.line)] = v
        return v

    def _rename(self, v: Value, new: str) -> None:
        lay = v.type.layout
        if isinstance(lay, LayoutVar) and lay.name == v.name:
            lay.name = new
        v.name = new

    def new_var(self, base: str, lo: int | None, hi: int | None, kind: str) -> Var:
        return Var(_fresh(base, self._var_names), lo, hi, kind=kind)

    def reserve_var_name(self, name: str) -> None:
        self._var_names.add(name)


def active() -> TraceContext | None:
    return _STACK[-1] if _STACK else None


def current(op: str) -> TraceContext:
    """The context of the kernel being traced; ``KernelError`` when called outside one."""
    if not _STACK:
        raise KernelError("", f"hl.{op}", source.capture(None),
                          "called outside a kernel being traced (decorate the function with "
                          "@hl.kernel and call .trace())")
    return _STACK[-1]
