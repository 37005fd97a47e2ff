"""The layout constraint graph of a tile program.

Register tiles are grouped into classes that must share one TV layout (a union-find over
values): the result and same-shaped operands of an elementwise op, a cast and its source,
the destination and source of an in-place update, a scan and its sources. Relations between classes:

- ``reduced(dst, src, axes)``: ``dst``'s layout is ``src``'s with ``axes`` collapsed
  (a reduction's result; an operand that broadcasts along ``axes``);
- ``mma(op, role)``: the class is operand ``role`` (a, b, c) of an mma op;
- ``mapped(dst, src, fwd, bwd)``: ``dst = fwd o src`` and ``src = bwd o dst`` (``x.T`` of a
  register tile: the same registers; a reshape);
- ``derived(dst, src, fn, inv)``: ``dst = fn(src)`` (a join of register tiles, a window), and
  ``src = inv(dst)`` where ``inv`` is given and finds one (a join's sources from a required
  result layout: ``join_source_tv``).

Shared tiles are handled per root buffer: every copy, mma operand use and view chain
that touches the buffer is recorded so candidate layouts can be checked use by use.
Each relation remembers the op that created it, for diagnostics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hexlayout.ir.atomic import AtomicAdd
from hexlayout.ir.gather import ScalarLoad
from hexlayout.ir.lower.kernel import LoweringError
from hexlayout.ir.registry import OpRegistry
from hexlayout.ir.regroup import Join, Reshape
from hexlayout.ir.tile import (
    Alloc,
    AsyncCommit,
    AsyncWait,
    Cast,
    ClusterSync,
    Copy,
    Elementwise,
    FenceProxyAsync,
    Fill,
    For,
    GlobalView,
    If,
    Iota,
    MbarrierArrive,
    MbarrierInit,
    MbarrierWait,
    Mma,
    Op,
    Permute,
    Rearrange,
    Reduce,
    Scan,
    SetMaxNReg,
    Slice,
    SubTile,
    Sync,
    TileKernel,
    Value,
    WgmmaCommit,
    WgmmaFence,
    WgmmaWait,
)
from hexlayout.ir.types import Scope
from hexlayout.ir.walk import walk
from hexlayout.layout import ComposedLayout, Layout

__all__ = ["LayoutGraph", "Reduced", "Mapped", "Derived", "MmaRole", "build_graph", "RELATIONS"]


@dataclass
class Reduced:
    dst: int            # class id
    src: int
    axes: tuple[int, ...]
    op: Op


@dataclass
class Mapped:
    """``dst = fwd o src`` and ``src = bwd o dst``: a register view that moves no data
    (``x.T``; ``hexlayout.ir.lower.register_views``)."""

    dst: int            # class id when recorded (``find`` it: classes merge later)
    src: int
    fwd: Layout
    bwd: Layout
    op: Op


@dataclass
class Derived:
    """``dst = fn(src)``: a layout derived from another (a join's result from its sources');
    ``inv``, when given, goes back: ``src = inv(dst)``, None where no source layout gives
    ``dst`` (then only the forward direction is used)."""

    dst: int            # class id when recorded (``find`` it: classes merge later)
    src: int
    fn: Callable[[Layout], Layout]
    op: Op
    inv: Callable[[Layout], Layout | None] | None = None


@dataclass
class MmaRole:
    cls: int
    op: Mma
    role: str           # "a", "b", "c"


@dataclass
class LayoutGraph:
    kernel: TileKernel
    parent: dict[int, int] = field(default_factory=dict)          # union-find over value ids
    values: dict[int, Value] = field(default_factory=dict)
    why: dict[int, list[Op]] = field(default_factory=dict)         # ops that merged into a class
    reduced: list[Reduced] = field(default_factory=list)
    mapped: list[Mapped] = field(default_factory=list)
    derived: list[Derived] = field(default_factory=list)
    mma_roles: list[MmaRole] = field(default_factory=list)
    mmas: list[Mma] = field(default_factory=list)
    explicit: list[tuple[int, Layout, Op]] = field(default_factory=list)   # (value id, given layout, op)
    shared_uses: dict[int, list[tuple[Op, Value]]] = field(default_factory=dict)  # root id -> uses
    copies_with_global: dict[int, list[Copy]] = field(default_factory=dict)       # class -> copies
    regions: dict[int, Any] = field(default_factory=dict)

    # union-find ---------------------------------------------------------------------
    def find(self, vid: int) -> int:
        p = self.parent.setdefault(vid, vid)
        if p != vid:
            p = self.find(p)
            self.parent[vid] = p
        return p

    def union(self, a: Value, b: Value, op: Op) -> None:
        self.values.setdefault(a.id, a)
        self.values.setdefault(b.id, b)
        ra, rb = self.find(a.id), self.find(b.id)
        if ra != rb:
            self.parent[rb] = ra
            self.why.setdefault(ra, []).extend(self.why.pop(rb, []))
        self.why.setdefault(ra, []).append(op)

    def cls(self, v: Value) -> int:
        self.values.setdefault(v.id, v)
        return self.find(v.id)

    def classes(self) -> dict[int, list[Value]]:
        out: dict[int, list[Value]] = {}
        for vid, v in self.values.items():
            out.setdefault(self.find(vid), []).append(v)
        return out


def _register(v: Any) -> bool:
    return isinstance(v, Value) and v.type.scope == Scope.REGISTER


RELATIONS: OpRegistry[Callable[[LayoutGraph, Any], None]] = OpRegistry("layout relation")
"""The layout-graph rule of each tile-op class: ``rule(graph, op)`` records the op's classes,
unions and relations in ``graph``. Ops that relate no layouts register ``_no_relation``."""


def build_graph(tk: TileKernel) -> LayoutGraph:
    """The layout constraint graph of ``tk``: every op's rule in ``RELATIONS``, in program order."""
    g = LayoutGraph(tk)
    rule = RELATIONS.rule
    for op in walk(tk):
        fn = rule(type(op))
        if fn is None:
            raise LoweringError(tk.name, op, f"{op.name} has no layout relation for synthesis")
        fn(g, op)
    for r in g.reduced:
        r.dst, r.src = g.find(r.dst), g.find(r.src)
    for m in g.mma_roles:
        m.cls = g.find(m.cls)
    g.copies_with_global = {g.find(c): v for c, v in g.copies_with_global.items()}
    return g


@RELATIONS.register(Alloc)
def _alloc(g: LayoutGraph, op: Alloc) -> None:
    """A register tile is a class (with its given layout, if any); a shared tile a root buffer."""
    if _register(op.result):
        g.cls(op.result)
        if isinstance(op.result.type.layout, Layout):
            g.explicit.append((op.result.id, op.result.type.layout, op))
    elif op.result.type.scope == Scope.SHARED:
        g.shared_uses.setdefault(op.result.id, [])


@RELATIONS.register(Elementwise, Cast)
def _pointwise(g: LayoutGraph, op: Elementwise | Cast) -> None:
    """The result and every same-shaped register operand share one layout; an operand that
    broadcasts along some axes has the result's layout with those axes reduced."""
    res = op.result
    args = op.args if isinstance(op, Elementwise) else (op.src,)
    g.cls(res)
    if isinstance(res.type.layout, Layout) and res.id not in {e[0] for e in g.explicit}:
        g.explicit.append((res.id, res.type.layout, op))
    for a in args:
        if not _register(a):
            continue
        if tuple(a.type.shape) == tuple(res.type.shape):
            g.union(res, a, op)
        else:
            pad = len(res.type.shape) - len(a.type.shape)
            ashape = (1,) * pad + tuple(a.type.shape)
            axes = tuple(k for k, (x, y) in enumerate(zip(ashape, res.type.shape)) if x != y)
            g.reduced.append(Reduced(g.cls(a), g.cls(res), axes, op))


@RELATIONS.register(Iota)
def _iota(g: LayoutGraph, op: Iota) -> None:
    g.cls(op.result)
    if isinstance(op.result.type.layout, Layout):
        g.explicit.append((op.result.id, op.result.type.layout, op))


@RELATIONS.register(Fill)
def _fill(g: LayoutGraph, op: Fill) -> None:
    if _register(op.dst):
        g.cls(op.dst)


@RELATIONS.register(Reduce)
def _reduce(g: LayoutGraph, op: Reduce) -> None:
    """The result's layout is the source's with ``axis`` collapsed."""
    g.reduced.append(Reduced(g.cls(op.result), g.cls(op.src), (op.axis,), op))


@RELATIONS.register(Scan)
def _scan(g: LayoutGraph, op: Scan) -> None:
    """The result has the sources' layout (each element stays in its thread); ``init`` and
    ``carry`` have the result's layout with ``axis`` collapsed."""
    for src in op.srcs:
        g.union(op.result, src, op)
    for v in (op.init, op.carry):
        if v is not None and _register(v):
            g.reduced.append(Reduced(g.cls(v), g.cls(op.result), (op.axis,), op))


@RELATIONS.register(Rearrange)
def _rearrange(g: LayoutGraph, op: Rearrange) -> None:
    """Source and result are classes of their own (the data moves through shared memory)."""
    g.cls(op.result)
    g.cls(op.src)


@RELATIONS.register(Mma)
def _mma(g: LayoutGraph, op: Mma) -> None:
    """Register operands take the roles a, b, c of the mma; shared operands are buffer uses."""
    g.mmas.append(op)
    for role in ("a", "b", "c"):
        v = getattr(op, role)
        if _register(v):
            g.mma_roles.append(MmaRole(g.cls(v), op, role))
        else:
            g.shared_uses.setdefault(v.root.id, []).append((op, v))


@RELATIONS.register(Copy)
def _copy(g: LayoutGraph, op: Copy) -> None:
    """Shared ends are buffer uses; a register end of a global copy remembers the copy."""
    for v in (op.src, op.dst):
        if v.type.scope == Scope.SHARED:
            g.shared_uses.setdefault(v.root.id, []).append((op, v))
    if _register(op.dst) and op.src.type.scope == Scope.GLOBAL:
        g.copies_with_global.setdefault(g.cls(op.dst), []).append(op)
    if _register(op.src) and op.dst.type.scope == Scope.GLOBAL:
        g.copies_with_global.setdefault(g.cls(op.src), []).append(op)
    if _register(op.src):
        g.cls(op.src)
    if _register(op.dst):
        g.cls(op.dst)
    # a predicate-tile mask is distributed like the register end it masks
    reg = op.src if _register(op.src) else op.dst if _register(op.dst) else None
    if reg is not None and _register(op.mask):
        g.union(reg, op.mask, op)


@RELATIONS.register(AtomicAdd)
def _atomic_add(g: LayoutGraph, op: AtomicAdd) -> None:
    """The register tile added into global memory is coalesced with it, as a store's."""
    if _register(op.src):
        g.copies_with_global.setdefault(g.cls(op.src), []).append(op)


@RELATIONS.register(Slice, SubTile, Permute)
def _view(g: LayoutGraph, op: Slice | SubTile | Permute) -> None:
    """Views of shared and global tiles follow their source (handled per use of the root
    buffer); ``x.T`` of a register tile is the same registers under a mapped layout; a static
    window of a register tile keeps each thread's values (its layout derived: ``window_tv``)."""
    if _register(op.result) and isinstance(op, Permute):
        from hexlayout.layout.tv_maps import permute_maps

        fwd, bwd = permute_maps(tuple(op.src.type.shape), tuple(op.perm))
        g.mapped.append(Mapped(g.cls(op.result), g.cls(op.src), fwd, bwd, op))
    elif _register(op.result):
        from hexlayout.ir.windows import window_of
        from hexlayout.layout.tv_maps import window_tv

        try:
            origin, extent, _ = window_of(op)
        except ValueError as e:
            raise LoweringError(g.kernel.name, op, f"{e}; views of register tiles are not supported with "
                                "run-time indices (slice the shared or global tile the values came "
                                "from)") from None
        shape = tuple(op.src.type.shape)
        g.derived.append(Derived(g.cls(op.result), g.cls(op.src),
                                 lambda f: window_tv(f, f[0].size(), shape, origin, extent), op))


@RELATIONS.register(Reshape)
def _reshape(g: LayoutGraph, op: Reshape) -> None:
    """A reshape keeps every value in its thread: ``R o tv`` either way (``lower/regroup.py``)."""
    from hexlayout.layout.tv_maps import reshape_maps

    try:
        fwd, bwd = reshape_maps(tuple(op.src.type.shape), tuple(op.result.type.shape))
    except ValueError as e:
        raise LoweringError(g.kernel.name, op, f"reshape of %{op.src.name}: {e}") from None
    g.mapped.append(Mapped(g.cls(op.result), g.cls(op.src), fwd, bwd, op))


@RELATIONS.register(Join)
def _join(g: LayoutGraph, op: Join) -> None:
    """The sources share one layout; the result's is derived from it (``join_tv``), or theirs
    from a result layout required first (an mma operand: ``join_source_tv``)."""
    from hexlayout.layout.tv_maps import join_source_tv, join_tv

    first = op.srcs[0]
    for s in op.srcs[1:]:
        g.union(first, s, op)
    shape, k, axis, inter = tuple(first.type.shape), len(op.srcs), op.axis, op.interleave
    g.derived.append(Derived(g.cls(op.result), g.cls(first),
                             lambda f: join_tv(f, shape, k, axis, inter), op,
                             lambda r: join_source_tv(r, shape, k, axis, inter)))


@RELATIONS.register(GlobalView, ScalarLoad, Sync, AsyncCommit, AsyncWait, MbarrierInit, MbarrierArrive,
                    MbarrierWait, WgmmaFence, WgmmaCommit, WgmmaWait, FenceProxyAsync, SetMaxNReg,
                    ClusterSync, For, If)
def _no_relation(g: LayoutGraph, op: Op) -> None:
    """Global views (layouts given by the arguments), synchronization and control flow relate
    no layouts (a loop's or branch's body is walked op by op)."""


def given_layout(v: Value) -> Layout | ComposedLayout | None:
    lay = v.type.layout
    return lay if isinstance(lay, (Layout, ComposedLayout)) else None
