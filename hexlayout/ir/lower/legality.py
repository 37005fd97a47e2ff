"""Legality of single tile ops under a partial assignment: synthesis's oracle.

``Legality(kernel, arch, assignment, copy_cost).check(op)`` is the list of instructions ``op``
lowers to when the values and ops ``assignment`` fixes (layouts per value, TiledMma and copy
instruction per op) are as it says, the others left open; or a ``LoweringError`` carrying the
structured ``Rejection`` of why not. Only the views ``op`` reads are built, each operand
followed back to the op that defines it (a global window, a shared or register allocation
whose layout is known, a slice, window or permutation of a memory tile), so a check costs the
op and its operand chains (and the global windows, which a gather's index tiles read), not
the whole program. The program is never changed.

One rule per op class (``LEGALITY``); an op without one is legal when its lowering rule
(``hexlayout.ir.lower.kernel.LOWERING``) lowers it:

- **copy**: the assignment's instruction, else the program's ``instruction=``, else the
  cheapest under ``copy_cost`` of the legal instructions (each copy rule's first legal one,
  a rule listing its best first: the widest vector, ldmatrix .x4 before .x2; ties in the
  rules' order, ``legal_copies``); without ``copy_cost``, the first legal one. The choices
  are kept in ``copy_choices`` (op uid -> (rule family, name)) for the assignment.
- **views** (a global window, an allocation, a slice, window or permutation of a memory
  tile): legal when the view can be built from the layouts known so far; an allocation whose
  layout is still open is undecided, not illegal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hexlayout.layout import ComposedLayout, Layout

from ..assignment import Assignment
from ..expr import as_expr
from ..lowered import Instr
from ..registry import OpRegistry
from ..tile import Alloc, Copy, GlobalView, Op, Permute, Slice, SubTile, TileKernel, Value
from ..types import Scope
from .copy_rules import CopyChoice, CopyContext, legal_copies, lower_choice
from .kernel import Lowering, LoweringError
from .rejection import Rejection
from .views import RegisterTile

__all__ = ["LEGALITY", "Legality", "CopyCost"]

# the static cost of a copy's instructions, ``cost(lowering, op, instrs)``, to rank legal ones
CopyCost = Callable[[Lowering, Op, list[Instr]], float]

# the legality rule of a tile-op class, ``rule(legality, op) -> instructions``
LEGALITY: OpRegistry[Callable[[Any, Any], list[Instr]]] = OpRegistry("legality")

_VIEWS = (GlobalView, Alloc, Slice, SubTile, Permute)


class Legality:
    """The legality checks of one tile kernel under one (partial) assignment."""

    def __init__(self, tk: TileKernel, arch: str, assignment: Assignment | None = None,
                 copy_cost: CopyCost | None = None, *, _facts: tuple[dict, dict] | None = None) -> None:
        self.tk = tk
        self.arch = arch
        self.copy_cost = copy_cost
        self.lw = Lowering(tk, arch, assignment)
        self.copy_choices: dict[int, tuple[str, str]] = self.lw.copy_choices
        if _facts is None:
            _facts = (_op_regions(self.lw), {r.id: op for op in tk.body.walk() for r in op.results()})
        self._facts = _facts
        self.regions, self.producer = _facts
        for op in tk.body.walk():       # global windows first: a gather's index tiles read them
            if isinstance(op, GlobalView):
                self.ensure(op.result)

    def with_assignment(self, assignment: Assignment) -> Legality:
        """The checks of the same kernel under ``assignment`` (the program facts shared)."""
        return Legality(self.tk, self.arch, assignment, self.copy_cost, _facts=self._facts)

    @property
    def tid(self) -> Any:
        return self.lw.tid

    # --- checks ----------------------------------------------------------------------------
    def check(self, op: Op) -> list[Instr]:
        """The instructions of ``op`` under the assignment (raises ``LoweringError``)."""
        rule = LEGALITY.rule(type(op))
        with self._running(op):
            try:
                for v in op.operands():
                    self.ensure(v)
                return rule(self, op) if rule is not None else self.lw.op(op)
            except LoweringError:
                raise
            except ValueError as e:
                raise self.lw.fail(op, str(e)) from None

    def view_of(self, v: Value) -> Any:
        """The view of ``v`` under the assignment, or None while its layout is open."""
        self.ensure(v)
        return self.lw.views.get(v.id)

    def views(self) -> dict[int, Any]:
        """The views of every tile whose layout is known (by value id)."""
        for op in self.tk.body.walk():
            for v in op.results():
                self.ensure(v)
        return self.lw.views

    def ensure(self, v: Value) -> None:
        """Build the view of ``v`` if its defining op is a view whose layouts are known."""
        if v.id in self.lw.views:
            return
        op = self.producer.get(v.id)
        if not isinstance(op, _VIEWS):
            return
        if isinstance(op, (Slice, SubTile, Permute)):
            self.ensure(op.src)
            if not isinstance(self.lw.views.get(op.src.id), (type(None), RegisterTile)):
                with self._running(op):
                    self.lw.op(op)
            return
        if isinstance(op, Alloc) and not _known(self.lw.layout(v), v.scope):
            return
        with self._running(op):
            self.lw.op(op)

    def cheapest_copy(self, lw: Lowering, op: Copy, ctx: CopyContext) -> list[CopyChoice] | Rejection:
        """The copy rule of the module docstring."""
        given = lw.assignment.copies.get(op.uid)
        if given is not None:
            return lower_choice(ctx, *given)
        cost = self.copy_cost
        if cost is None or ctx.want is not None:      # an instruction the program asked for wins
            return legal_copies(ctx, limit=1)
        res = legal_copies(ctx, per_rule=1)
        if isinstance(res, Rejection) or len(res) < 2:
            return res
        return [min(res, key=lambda c: cost(lw, op, c.plan.instrs))]

    @contextmanager
    def _running(self, op: Op) -> Iterator[None]:
        """Lower inside the thread range that runs ``op`` (a warp-group branch's)."""
        region = self.regions.get(id(op), (0, self.lw.threads))
        self.lw.group_threads.append(region)
        self.lw.elect.append(as_expr(self.lw.tid).eq(region[0]))
        try:
            yield
        finally:
            self.lw.group_threads.pop()
            self.lw.elect.pop()


def _known(lay: Any, scope: Scope) -> bool:
    if scope == Scope.SHARED:
        return isinstance(lay, (Layout, ComposedLayout))
    return isinstance(lay, Layout)


@LEGALITY.register(Copy)
def _copy(leg: Legality, op: Copy) -> list[Instr]:
    return leg.lw.lower_copy(op, leg.cheapest_copy)


@LEGALITY.register(*_VIEWS)
def _view(leg: Legality, op: Op) -> list[Instr]:
    src = getattr(op, "src", None)
    if src is not None and isinstance(leg.lw.views.get(src.id), RegisterTile):
        return leg.lw.op(op)        # a window of a register tile: register moves
    for r in op.results():
        leg.ensure(r)
    return []


def _op_regions(lw: Lowering) -> dict[int, tuple[int, int]]:
    """The thread range ``[lo, hi)`` that runs each op of the kernel (``Lowering.op_regions``)."""
    return lw.op_regions()
