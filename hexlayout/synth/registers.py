"""Register TV layouts from the mma choices: seed, propagate, check.

Seeds: each mma's operand classes get its TiledMma's ``a_tv`` / ``b_tv`` / ``c_tv``;
explicit layouts are seeds too. Propagation: a ``reduced(dst, src, axes)`` relation gives
``dst = reduced_tv(src, axes)`` (the reduction's layout; a broadcast operand's); a
``mapped(dst, src, fwd, bwd)`` relation (``x.T`` of a register tile) gives ``dst = fwd o src``
or ``src = bwd o dst``, whichever side is known first; a ``derived`` relation (a join) gives
``dst = fn(src)``, and ``src = inv(dst)`` when the result is known first (an unpacked tile that
feeds an mma: the words are loaded where the mma wants their values). A class
that receives two layouts that differ as functions ``(t, v) -> index`` is a conflict,
reported with both origins. Classes left without a layout that are copied to or from
global memory get a coalesced layout (``w``-element vectors along the tensor's contiguous
mode, consecutive threads on consecutive vectors); any other is unresolved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hexlayout.ir.lower.copy import declared_vector_bits
from hexlayout.ir.tile import GlobalView, Mma, Op, Value
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.layout import Layout, composition
from hexlayout.layout.tv import copy_thread_layout
from hexlayout.layout.tv_maps import reduced_tv, same_function

from .graph import LayoutGraph

__all__ = ["RegisterAssignment", "Conflict", "LayoutSource", "assign_registers", "same_function"]


@dataclass(frozen=True)
class LayoutSource:
    """Why a register class must have a layout (one side of a conflict), as a value.

    ``kind``: ``"mma"`` (operand ``role`` a / b / c of the TiledMma ``mma``), ``"explicit"``
    (given in the program), ``"coalesced"`` (the default for a tile copied with global
    memory), ``"reduced"`` (a reduction's or broadcast's result, ``detail`` names it),
    ``"mapped"`` (a view of another class, ``x.T``) or ``"invalid"`` (the layout cannot be
    derived, ``detail`` says why). ``str()`` is the
    requirement in words."""

    kind: str
    role: str | None = None
    mma: TiledMma | None = None
    detail: str = ""

    def __str__(self) -> str:
        if self.kind == "mma":
            return f"operand {self.role} of {self.mma}"
        if self.kind == "explicit":
            return "given explicitly"
        if self.kind == "coalesced":
            return "coalesced with global memory"
        return self.detail


EXPLICIT = LayoutSource("explicit")
COALESCED = LayoutSource("coalesced")


@dataclass
class Conflict:
    """Two requirements on one register class that cannot both hold."""

    cls: int
    first: tuple[Layout, Op | None, LayoutSource]
    second: tuple[Layout, Op | None, LayoutSource]
    values: list[Value] = field(default_factory=list)


@dataclass
class RegisterAssignment:
    layouts: dict[int, Layout]
    origin: dict[int, tuple[Op | None, LayoutSource]]
    conflict: Conflict | None = None
    unresolved: list[int] = field(default_factory=list)


def assign_registers(g: LayoutGraph, choice: dict[int, TiledMma], threads_of: dict[int, int],
                     global_views: dict[int, Any] | None = None, *,
                     partial: bool = False) -> RegisterAssignment:
    """Layouts for every register class given ``choice`` (mma op id -> TiledMma).

    ``partial``: ``choice`` covers only some mma ops; the others' operands are left open, no
    class gets a default (coalesced) layout and none is reported unresolved. A conflict found
    so is a conflict of every completion of ``choice``."""
    s = _Layouts(g)
    err = s.seed(choice, partial) or s.propagate()
    if err:
        return RegisterAssignment(s.lay, s.origin, err)
    if partial:
        return RegisterAssignment(s.lay, s.origin, None, [])
    err, unresolved = s.defaults(threads_of, global_views or {})
    if err:
        return RegisterAssignment(s.lay, s.origin, err)
    s.index_layouts(unresolved, threads_of)
    return RegisterAssignment(s.lay, s.origin, None, unresolved)


class _Layouts:
    """The register layouts of one ``assign_registers`` call as they are found: ``lay`` (class
    -> layout), ``origin`` (class -> the op and the reason), and the steps that add to them."""

    def __init__(self, g: LayoutGraph) -> None:
        self.g = g
        self.lay: dict[int, Layout] = {}
        self.origin: dict[int, tuple[Op | None, LayoutSource]] = {}
        self.classes = g.classes()
        self.shape_of = {c: tuple(vs[0].type.shape) for c, vs in self.classes.items()}

    def put(self, c: int, layout: Layout, op: Op | None, why: LayoutSource) -> Conflict | None:
        """Give class ``c`` ``layout``; the conflict if it already has a different one."""
        if c in self.lay:
            if not same_function(self.lay[c], layout):
                return Conflict(c, (self.lay[c], *self.origin[c]), (layout, op, why), self.classes.get(c, []))
            return None
        self.lay[c] = layout
        self.origin[c] = (op, why)
        return None

    def seed(self, choice: dict[int, TiledMma], partial: bool) -> Conflict | None:
        """The explicit layouts, then the operand layouts of every chosen mma."""
        for vid, layout, op in self.g.explicit:
            err = self.put(self.g.find(vid), layout, op, EXPLICIT)
            if err:
                return err
        for r in self.g.mma_roles:
            if partial and id(r.op) not in choice:
                continue
            tm = choice[id(r.op)]
            layout = {"a": tm.a_tv, "b": tm.b_tv, "c": tm.c_tv}[r.role]()
            err = self.put(r.cls, layout, r.op, LayoutSource("mma", r.role, tm))
            if err:
                return err
        return None

    def propagate(self) -> Conflict | None:
        """Apply the reduced, derived and mapped relations until no class gains a layout."""
        changed = True
        while changed:
            changed = False
            for step in (self.propagate_reduced, self.propagate_derived, self.propagate_mapped):
                err, grew = step()
                if err:
                    return err
                changed |= grew
        return None

    def propagate_reduced(self) -> tuple[Conflict | None, bool]:
        """``dst = reduced_tv(src, axes)`` for every reduction (or broadcast) whose source is
        known; (the conflict, whether a class gained a layout)."""
        changed = False
        lay = self.lay
        for rel in self.g.reduced:
            if rel.src not in lay:
                continue
            out = lay[rel.src]
            shape = self.shape_of[rel.src]
            try:
                for ax in rel.axes:
                    out = reduced_tv(out, shape, ax)
                    shape = tuple(1 if k == ax else s for k, s in enumerate(shape))
            except ValueError as e:
                bad = LayoutSource("invalid", detail=str(e))
                return Conflict(rel.dst, (lay[rel.src], rel.op, bad), (lay[rel.src], rel.op, bad)), changed
            known = rel.dst in lay
            why = LayoutSource("reduced", detail=f"{type(rel.op).__name__.lower()} along axes {rel.axes}")
            err = self.put(rel.dst, out, rel.op, why)
            if err:
                return err, changed
            changed |= not known
        return None, changed

    def propagate_derived(self) -> tuple[Conflict | None, bool]:
        """``src = inv(dst)`` for a join whose result is known first, ``dst = fn(src)`` for
        every join whose sources are known; (the conflict, whether a class gained a layout)."""
        changed = False
        lay, g = self.lay, self.g
        for d in g.derived:
            src, dst = g.find(d.src), g.find(d.dst)
            if src not in lay and dst in lay and d.inv is not None:
                back = d.inv(lay[dst])          # the sources' layout a required result asks for
                if back is not None:
                    err = self.put(src, back, d.op, LayoutSource(
                        "derived", detail=f"the sources of a {type(d.op).__name__.lower()} whose result "
                        f"is {self.origin[dst][1]}"))
                    if err:
                        return err, changed
                    changed = True
            if src not in lay:
                continue
            try:
                out = d.fn(lay[src])
            except ValueError as e:
                bad = LayoutSource("invalid", detail=f"{type(d.op).__name__.lower()}: {e}")
                return Conflict(dst, (lay[src], d.op, bad), (lay[src], d.op, bad)), changed
            known = dst in lay
            err = self.put(dst, out, d.op, LayoutSource("derived", detail=f"a {type(d.op).__name__.lower()} "
                                                        "of register tiles"))
            if err:
                return err, changed
            changed |= not known
        return None, changed

    def propagate_mapped(self) -> tuple[Conflict | None, bool]:
        """``dst = fwd o src`` or ``src = bwd o dst`` for every view (``x.T``) with a known side;
        (the conflict, whether a class gained a layout)."""
        changed = False
        lay, g = self.lay, self.g
        for m in g.mapped:
            src, dst = g.find(m.src), g.find(m.dst)       # classes may have merged since
            for a, b, f in ((src, dst, m.fwd), (dst, src, m.bwd)):
                if a not in lay:
                    continue
                try:
                    out = composition(f, lay[a])
                except ValueError as e:
                    bad = LayoutSource("invalid", detail=f"{type(m.op).__name__.lower()}: {e}")
                    return Conflict(b, (lay[a], m.op, bad), (lay[a], m.op, bad)), changed
                known = b in lay
                why = LayoutSource("mapped", detail=f"a view ({type(m.op).__name__.lower()})")
                err = self.put(b, out, m.op, why)
                if err:
                    return err, changed
                changed |= not known
        return None, changed

    def defaults(self, threads_of: dict[int, int],
                 global_views: dict[int, Any]) -> tuple[Conflict | None, list[int]]:
        """A coalesced layout for every class still open that is copied with global memory
        (each propagated at once); (the conflict, the classes still unresolved)."""
        g, lay, origin = self.g, self.lay, self.origin
        unresolved: list[int] = []
        for c in self.classes:
            if c in lay:
                continue
            layout = _coalesced(g, c, self.shape_of[c], threads_of.get(c, 0), global_views)
            if layout is None:
                unresolved.append(c)
            else:
                lay[c] = layout
                origin[c] = (g.copies_with_global[c][0], COALESCED)
                if g.mapped or g.derived:
                    # a view's class follows at once (before it gets a default of its own)
                    err = self.propagate()
                    if err:
                        return err, unresolved
        if unresolved:
            # a broadcast operand too small for a coalesced layout of its own (a (64, 1) scale
            # column) takes the reduced layout of a class that only now has its coalesced one
            err = self.propagate()
            if err:
                return err, unresolved
            unresolved = [c for c in unresolved if c not in lay]
        return None, unresolved

    def index_layouts(self, unresolved: list[int], threads_of: dict[int, int]) -> None:
        """Integer tiles that only compute gather indices (iota and integer math): the gather
        recomputes them per thread (hexlayout.ir.lower.index_tiles), any layout holds them;
        each such class gets one and leaves ``unresolved``."""
        for c in list(unresolved):
            integer = all(v.type.dtype.kind != "float" for v in self.classes.get(c, []))
            if integer and threads_of.get(c, 0) > 0:
                tv = _index_layout(self.shape_of[c], threads_of[c])
                if tv is not None:
                    self.lay[c] = tv
                    self.origin[c] = (None, LayoutSource("index", detail="an index computation: any layout"))
                    unresolved.remove(c)


def _index_layout(shape: tuple[int, ...], threads: int) -> Layout | None:
    """Element ``t % size`` per thread when the tile has fewer elements than threads
    (replicated), else whole elements spread over the threads in order."""
    size = 1
    for s in shape:
        size *= s
    if size < threads:
        return Layout(((size, threads // size), 1), ((1, 0), 0)) if threads % size == 0 else None
    tv = copy_thread_layout(shape, list(range(len(shape))), 1, threads)
    return None if isinstance(tv, str) else tv


def _coalesced(g: LayoutGraph, c: int, shape: tuple[int, ...], threads: int,
               global_views: dict[int, Any]) -> Layout | None:
    copies = g.copies_with_global.get(c)
    if not copies or threads <= 0:
        return None
    op = copies[0]
    gv = op.src if op.src.type.scope.value == "global" else op.dst
    view = global_views.get(gv.id)
    order = list(range(len(shape)))
    if view is not None:
        # contiguous modes first; a broadcast mode (stride 0) has no neighbours in memory: last
        def key(k: int) -> tuple[int, int]:
            st = view.static_stride(k)
            return (1, -k) if st is None else (2, -k) if st == 0 else (0, st)

        order = sorted(order, key=key)
    elem_bits = gv.type.dtype.bits
    # vectors as wide as the tensor's declared alignment allows (hl.f16[...].aligned(n))
    w = max(1, min(128, declared_vector_bits(view) if view is not None else 128) // elem_bits)
    while w > 1:
        tv = copy_thread_layout(shape, order, w, threads)
        if not isinstance(tv, str):
            return tv
        w //= 2
    tv = copy_thread_layout(shape, order, 1, threads)
    return None if isinstance(tv, str) else tv


def mma_ops(g: LayoutGraph) -> list[Mma]:
    return list(g.mmas)


def global_view_ops(g: LayoutGraph) -> list[GlobalView]:
    return [op for op in g.kernel.body.walk() if isinstance(op, GlobalView)]
