"""Loop-invariant code motion and strength reduction of a lowered kernel's sequential loops.

For every ``ForLoop`` that the code generator keeps as a loop (``unroll`` ``False`` or a
partial unroll factor ``n``, ``#pragma unroll n``: the rewritten body is an equal program
whatever the compiler then unrolls; not ``True``, and no register array indexed by its
variable), the address, predicate and descriptor
expressions of the instructions in its body (``pred``, ``GlobalRef.offset``,
``SharedRef.offset``, ``SmemDesc.offset`` (whose thread-index terms, a warp group's
offset, stay in place), mbarrier indices and wait parities, TMA
coordinates) are rewritten into an equal form:

1. **swizzle folding** (``algebra.fold``): ``Swizzle(r + stage*size) = Swizzle(r) + stage*size``
   when the stage size is a multiple of the swizzle period, so a swizzled shared address is
   a per-thread constant plus a stage offset;
2. **stage rotation**: every ``(k + c) % S`` over the loop variable ``k`` (constant step
   ``d``, ``S`` not a power of two: those are a mask) becomes a rotating counter ``s`` in
   an ``i32`` register: ``s = (start + c) % S``
   before the loop, ``s = s + d%S < S ? s + d%S : s + d%S - S`` at the end of each
   iteration (no division in the loop); ``c`` may be any non-negative loop-invariant
   expression (e.g. ``tile * num_k`` of a persistent kernel). For a unit step,
   ``((k + c) // S) % 2`` (an mbarrier phase) becomes a bit that flips after the
   iteration in which that counter wraps to 0;
3. **loop-invariant code motion**: each expression is written as a sum of terms
   (``algebra.linear_terms``); the terms that do not depend on the loop (its variable, the
   variables of loops nested in it, registers written in it) are summed and computed once
   before the loop into an ``i32`` register, as are loop-invariant comparisons and other
   maximal invariant sub-expressions (e.g. a division by kernel scalars). Equal invariant
   expressions share one register (common sub-expressions across instructions).
4. **invariant index loads**: an ``LdGlobal`` at the top of the loop's body from a tensor the
   kernel never writes, at a loop-invariant address and predicate, into registers no other
   instruction of the loop writes and none before it reads (a gathered copy's row index,
   ``hexlayout.ir.lower.index_tiles``, loaded again by every copy of every k-tile), is done
   once before the loop (predicated on the loop running at all, its other predicate kept),
   so what is computed from it (the gathered rows' addresses and bounds) is invariant too
   and hoisted by 3; loads of one address share one register in the hoisted expressions.

Only values proven non-negative are kept in registers (a register value ``x`` counts as one
inside a branch on ``0 <= x``, e.g. a block's expert index after the test for a block with
nothing to do) (32-bit, as the printed ``int``
arithmetic computes them; an ``i32`` register read is not assumed non-negative by later
simplifications, so the rewritten expressions are folded no further than exactness allows).
A hoisted expression that divides by a non-constant is computed only where the loop runs
at least once (its divisor may be zero otherwise). The rewritten instructions are copies;
the input kernel is not changed.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from hexlayout.ir.expr import (
    BinOp,
    Const,
    Expr,
    ExprLike,
    RegRead,
    Select,
    UnOp,
    Var,
    as_expr,
    free_vars,
    reg_reads,
    replace_leaves,
    select,
    to_c,
)
from hexlayout.ir.lowered import (
    Alu,
    ForLoop,
    GlobalRef,
    IfThen,
    Instr,
    LdGlobal,
    LoweredKernel,
    MbarArrive,
    MbarRef,
    MbarWait,
    RegArray,
    RegRef,
    SharedRef,
    SmemDesc,
    TmaLoad,
    TmaStore,
    walk_instrs,
)
from hexlayout.ir.lowered_tcgen05 import Tcgen05Commit
from hexlayout.ir.tile import GlobalParam
from hexlayout.ir.types import i32

from .algebra import apply, fold, linear_terms, nonnegative, sum_terms, xor_constant_out

__all__ = ["optimize_loops", "HOIST_ARRAY", "ROTATION_ARRAY"]

HOIST_ARRAY = "loop_inv"
ROTATION_ARRAY = "loop_stage"

#: register fields an instruction only reads; any other ``RegRef`` field counts as written
_READ_FIELDS = ("src", "srcs", "a", "b", "c")


def _ops(e: Expr) -> int:
    """Number of operations in ``e``."""
    if isinstance(e, BinOp):
        return 1 + _ops(e.a) + _ops(e.b)
    if isinstance(e, UnOp):
        return 1 + _ops(e.a)
    if isinstance(e, Select):
        return 1 + _ops(e.cond) + _ops(e.a) + _ops(e.b)
    return 0


def _divides_by_variable(e: Expr) -> bool:
    if isinstance(e, BinOp):
        if e.op in ("//", "%") and not isinstance(e.b, Const):
            return True
        return _divides_by_variable(e.a) or _divides_by_variable(e.b)
    if isinstance(e, UnOp):
        return _divides_by_variable(e.a)
    if isinstance(e, Select):
        return any(_divides_by_variable(x) for x in (e.cond, e.a, e.b))
    return False


def _is_sequential(loop: ForLoop) -> bool:
    """The code generator keeps ``loop`` as a loop, partially unrolled or not (it unrolls fully
    those marked ``unroll=True`` and those indexing register arrays with the loop variable)."""
    if loop.unroll is True:
        return False
    for ins in list(walk_instrs(loop.body)):
        for v in vars(ins).values():
            if isinstance(v, RegRef) and loop.var in free_vars(v.start):
                return False
        for s in getattr(ins, "srcs", ()):
            if isinstance(s, RegRef) and loop.var in free_vars(s.start):
                return False
    return True


class _Registers:
    """The ``i32`` register arrays the pass adds: hoisted values and stage counters."""

    def __init__(self, kernel: LoweredKernel) -> None:
        taken = {a.name for a in kernel.registers}
        self.inv = RegArray(_fresh(HOIST_ARRAY, taken), i32, 0)
        self.rot = RegArray(_fresh(ROTATION_ARRAY, taken), i32, 0)
        self.moved = 0                  # index loads moved before their loops

    def new(self, arr: RegArray) -> RegRead:
        arr.count += 1
        return RegRead(arr, arr.count - 1)


def _fresh(name: str, taken: set[str]) -> str:
    out, i = name, 1
    while out in taken:
        out, i = f"{name}{i}", i + 1
    return out


class _LoopPass:
    """LICM and stage rotation of one sequential loop (its nested loops already done)."""

    def __init__(self, loop: ForLoop, regs: _Registers, read_only: frozenset[int] = frozenset(),
                 facts: tuple[RegRead, ...] = ()) -> None:
        self.loop = loop
        # register values known non-negative here (enclosing branches), read as such by
        # ``nonneg`` through a stand-in variable bounded below by 0
        self.facts = {r: Var(f"hl_nonneg{i}", 0, None, kind="size") for i, r in enumerate(facts)}
        self.regs = regs
        self.k = loop.var
        inner = list(walk_instrs(loop.body))
        self.inner_vars = {ins.var for ins in inner if isinstance(ins, ForLoop)} | {self.k}
        self.written: set[int] = set()
        for ins in inner:
            for f, r in vars(ins).items():
                if isinstance(r, RegRef) and f not in _READ_FIELDS:
                    self.written.add(id(r.array))
        self.hoisted: dict[Expr, RegRead] = {}
        self.loads: list[Instr] = []                      # invariant index loads, before the loop
        self.canon: dict[RegRead, RegRead] = {}           # a hoisted load's element -> its address's first
        self._invariant_loads(read_only)
        self.pre: list[Instr] = []
        self.rotations: dict[tuple[int, int], RegRead] = {}
        self.post: list[Instr] = []

    def _invariant_loads(self, read_only: frozenset[int]) -> None:
        """Step 4 of the module docstring: move the invariant index loads to ``self.loads``."""
        body = self.loop.body
        writers: dict[int, int] = {}
        for ins in walk_instrs(body):
            for f, r in vars(ins).items():
                if isinstance(r, RegRef) and f not in _READ_FIELDS:
                    writers[id(r.array)] = writers.get(id(r.array), 0) + 1
        seen: list[RegArray] = []        # arrays the body mentions before the current instruction
        first: dict[tuple[str, str, str, int], RegRead] = {}
        keep: list[Instr] = []
        for ins in body:
            arr = ins.dst.array if isinstance(ins, LdGlobal) else None
            if arr is not None and id(ins.src.param) in read_only and writers.get(id(arr)) == 1 \
                    and isinstance(ins.dst.start, int) and ins.dst.count == 1 \
                    and not any(a is arr for a in seen) and not self.variant(as_expr(ins.src.offset)) \
                    and (ins.pred is None or not self.variant(as_expr(ins.pred))):
                self.written.discard(id(arr))
                new = copy.copy(ins)
                runs = as_expr(self.loop.start) < as_expr(self.loop.stop)
                new.pred = runs if ins.pred is None else runs.logical_and(as_expr(ins.pred))
                self.loads.append(new)
                key = (ins.src.param.name, to_c(as_expr(ins.src.offset)),
                       "" if ins.pred is None else to_c(as_expr(ins.pred)), ins.bits)
                mine = RegRead(arr, ins.dst.start)
                self.canon[mine] = first.setdefault(key, mine)
                continue
            seen += _mentioned(ins)
            keep.append(ins)
        if self.loads:
            self.loop = copy.copy(self.loop)
            self.loop.body = keep
            self.regs.moved += len(self.loads)

    # --- classification -----------------------------------------------------------------
    def variant(self, e: Expr) -> bool:
        if free_vars(e) & self.inner_vars:
            return True
        return any(id(r.array) in self.written or r.array is self.regs.rot for r in reg_reads(e))

    # --- stage rotation -------------------------------------------------------------------
    def rotate(self, e: Expr) -> Expr:
        """``(k + c) % S`` -> a rotating counter, ``((k + c) // S) % 2`` -> a phase bit that
        flips when that counter wraps (recursively; ``c`` loop-invariant)."""
        if isinstance(e, BinOp):
            if e.op == "%" and isinstance(e.b, Const) and e.b.value == 2 and isinstance(e.a, BinOp) \
                    and e.a.op == "//" and isinstance(e.a.b, Const) and e.a.b.value > 1:
                c = self._offset_of_k(e.a.a)
                if c is not None and self.loop.step == 1:
                    return self._phase(c, e.a.b.value)
            a, b = self.rotate(e.a), self.rotate(e.b)
            if e.op == "%" and isinstance(b, Const) and b.value > 1:
                c = self._offset_of_k(a)
                if c is not None:
                    return self._counter(c, b.value)
            return apply(e.op, a, b)
        if isinstance(e, UnOp):
            return UnOp.make(e.op, self.rotate(e.a))
        if isinstance(e, Select):
            return select(self.rotate(e.cond), self.rotate(e.a), self.rotate(e.b))
        return e

    def _offset_of_k(self, a: Expr) -> Expr | None:
        """``c`` when ``a`` is ``k + c`` (``k`` the loop variable, ``c >= 0`` loop-invariant)."""
        terms = linear_terms(a)
        ks = [t for t in terms if isinstance(t, Var) and t is self.k]
        rest = [t for t in terms if not (isinstance(t, Var) and t is self.k)]
        if len(ks) != 1 or any(self.variant(t) for t in rest):
            return None
        c = sum_terms(rest)
        return c if nonnegative(c) else None

    def _check_rotatable(self, n: int) -> None:
        """Rotate by ``n`` only where it saves work: ``% 2^j`` and ``// 2^j`` are one mask or
        shift, cheaper than a counter's update (add, compare, select) and its register."""
        if n & (n - 1) == 0:
            raise _NoRotation
        step = self.loop.step
        if not isinstance(step, int) or step <= 0 or not nonnegative(as_expr(self.loop.start)):
            raise _NoRotation

    def _counter(self, c: Expr, n: int) -> RegRead:
        self._check_rotatable(n)
        key = ("stage", c, n)
        r = self.rotations.get(key)
        if r is None:
            r = self.regs.new(self.regs.rot)
            ref = RegRef(r.array, r.index, 1)
            self.pre.append(Alu("mov", ref, ((as_expr(self.loop.start) + c) % n,), origin="stage counter"))
            d = self.loop.step % n
            nxt = r + d
            self.post.append(Alu("mov", ref, (select(nxt < n, nxt, nxt - n),), origin="stage counter"))
            self.rotations[key] = r
        return r

    def _phase(self, c: Expr, n: int) -> RegRead:
        """``((k + c) // n) % 2`` for a unit-step loop: flips after the iteration whose stage
        counter ``(k + c) % n`` wraps to 0 (the update follows the counter's)."""
        self._check_rotatable(n)
        key = ("phase", c, n)
        r = self.rotations.get(key)
        if r is None:
            stage = self._counter(c, n)
            r = self.regs.new(self.regs.rot)
            ref = RegRef(r.array, r.index, 1)
            self.pre.append(Alu("mov", ref, ((as_expr(self.loop.start) + c) // n % 2,), origin="phase bit"))
            self.post.append(Alu("mov", ref, (select(stage.eq(0), 1 - r, r),), origin="phase bit"))
            self.rotations[key] = r
        return r

    # --- hoisting ------------------------------------------------------------------------
    def nonneg(self, e: Expr) -> bool:
        """``nonnegative(e)``, the register values of ``facts`` known non-negative."""
        if self.facts and reg_reads(e):
            e = replace_leaves(e, lambda x: self.facts.get(x, x) if isinstance(x, RegRead) else x)
        return nonnegative(e)

    def materialize(self, e: Expr) -> Expr:
        """A register holding the loop-invariant ``e`` (``e`` itself when cheap or signed);
        a constant term stays outside (an immediate offset), so that ``x`` and ``x + 1024``
        share one register."""
        terms = linear_terms(e)
        c = sum(t.value for t in terms if isinstance(t, Const))
        if c and len(terms) > 1:
            rest = sum_terms([t for t in terms if not isinstance(t, Const)])
            if self.nonneg(rest):
                return self.materialize(rest) + c
        xc = xor_constant_out(e)
        if xc is not None:
            return self.materialize(xc[0]) ^ xc[1]
        if _ops(e) < 2:
            return e
        if not self.nonneg(e):
            return self._hoist_children(e)
        r = self.hoisted.get(e)
        if r is None:
            r = self.regs.new(self.regs.inv)
            pred = None
            if _divides_by_variable(e):
                pred = as_expr(self.loop.start) < as_expr(self.loop.stop)
            self.pre.append(Alu("mov", RegRef(r.array, r.index, 1), (e,), pred=pred, origin="loop invariant"))
            self.hoisted[e] = r
        return r

    def _hoist_children(self, e: Expr) -> Expr:
        """A signed invariant ``e``: hoist its non-negative parts."""
        if isinstance(e, BinOp):
            if e.op in ("+", "-", "*"):
                return apply(e.op, self.materialize(e.a), self.materialize(e.b))
        return e

    def hoist(self, e: Expr) -> Expr:
        if not self.variant(e):
            return self.materialize(e)
        if isinstance(e, BinOp) and e.op in ("+", "-", "*", "<<"):
            terms = linear_terms(e)
            inv = [t for t in terms if not self.variant(t)]
            var = [t for t in terms if self.variant(t)]
            if len(terms) > 1 and inv:
                return self.materialize(sum_terms(inv)) + sum_terms([self._hoist_inside(t) for t in var])
        return self._hoist_inside(e)

    def _hoist_inside(self, e: Expr) -> Expr:
        if isinstance(e, BinOp):
            return apply(e.op, self.hoist(e.a), self.hoist(e.b))
        if isinstance(e, UnOp):
            return UnOp.make(e.op, self.hoist(e.a))
        if isinstance(e, Select):
            return select(self.hoist(e.cond), self.hoist(e.a), self.hoist(e.b))
        return e

    def rewrite(self, e: ExprLike) -> ExprLike:
        if self.canon and isinstance(e, Expr):
            e = replace_leaves(e, lambda x: self.canon.get(x, x) if isinstance(x, RegRead) else x)
        if not isinstance(e, Expr) or isinstance(e, (Const, Var, RegRead)):
            return e
        x = fold(e)
        try:
            x = self.rotate(x)
        except _NoRotation:
            pass
        return self.hoist(x)

    def rewrite_desc(self, e: ExprLike) -> ExprLike:
        """A wgmma descriptor offset: its terms over the thread index (a warp group's
        offset, warp-uniform) stay in place, whole products that the code generator divides
        into the descriptor's 16-byte units; the other terms are rewritten as ``rewrite``."""
        if not isinstance(e, Expr) or isinstance(e, (Const, Var, RegRead)):
            return e
        terms = linear_terms(fold(e))
        mine = [t for t in terms if any(v.kind == "thread" for v in free_vars(t))]
        if not mine:
            return self.rewrite(e)
        rest = [t for t in terms if not any(v.kind == "thread" for v in free_vars(t))]
        return sum_terms(mine) + (self.rewrite(sum_terms(rest)) if rest else 0)

    # --- instructions ---------------------------------------------------------------------
    def instr(self, ins: Instr) -> Instr:
        new = copy.copy(ins)
        if ins.pred is not None:
            new.pred = self.rewrite(ins.pred)
        for f in dataclasses.fields(ins):
            v = getattr(ins, f.name)
            if isinstance(v, SmemDesc):
                setattr(new, f.name, dataclasses.replace(v, offset=self.rewrite_desc(v.offset)))
            elif isinstance(v, (GlobalRef, SharedRef)):
                setattr(new, f.name, dataclasses.replace(v, offset=self.rewrite(v.offset)))
            elif isinstance(v, MbarRef):
                setattr(new, f.name, dataclasses.replace(v, index=self.rewrite(v.index)))
        if isinstance(ins, MbarWait):
            new.phase = self.rewrite(ins.phase)
        if isinstance(ins, (TmaLoad, TmaStore)):
            new.coords = tuple(self.rewrite(c) for c in ins.coords)
        if isinstance(ins, (TmaLoad, Tcgen05Commit)) and ins.multicast is not None:
            new.multicast = self.rewrite(ins.multicast)
        if isinstance(ins, MbarArrive) and ins.cta is not None:
            new.cta = self.rewrite(ins.cta)
        if isinstance(ins, ForLoop):
            new.body = [self.instr(i) for i in ins.body]
        elif isinstance(ins, IfThen):
            new.then_body = [self.instr(i) for i in ins.then_body]
            new.else_body = [self.instr(i) for i in ins.else_body]
        return new

    def run(self) -> list[Instr]:
        body = [self.instr(i) for i in self.loop.body]
        if not self.pre and not self.loads:
            return [self.loop]
        loop = copy.copy(self.loop)
        loop.body = body + self.post
        return self.loads + self.pre + [loop]


class _NoRotation(Exception):
    pass


def _mentioned(ins: Instr) -> list[RegArray]:
    """The register arrays ``ins`` (and what it nests) reads or writes: its ``RegRef`` s and the
    ``RegRead`` s of its expressions."""
    out: list[RegArray] = []

    def scan(v: Any, depth: int = 0) -> None:
        if isinstance(v, RegRef):
            out.append(v.array)
            scan(v.start, depth + 1)
        elif isinstance(v, Expr):
            out.extend(r.array for r in reg_reads(v))
        elif isinstance(v, Instr):
            for f in vars(v).values():
                scan(f, depth + 1)
        elif isinstance(v, (list, tuple)) and depth < 4:
            for x in v:
                scan(x, depth + 1)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type) and depth < 4:
            for f in dataclasses.fields(v):
                scan(getattr(v, f.name), depth + 1)

    scan(ins)
    return out


def _nonneg_facts(cond: ExprLike) -> tuple[RegRead, ...]:
    """The register values a branch condition proves non-negative: ``0 <= x``, ``x >= 0``,
    ``-1 < x``, ``x > -1`` and conjunctions of them."""
    c = as_expr(cond)
    if not isinstance(c, BinOp):
        return ()
    if c.op == "&&":
        return _nonneg_facts(c.a) + _nonneg_facts(c.b)

    def const(x: Expr, v: int) -> bool:
        return isinstance(x, Const) and x.value == v

    if (c.op == "<=" and const(c.a, 0) or c.op == "<" and const(c.a, -1)) and isinstance(c.b, RegRead):
        return (c.b,)
    if (c.op == ">=" and const(c.b, 0) or c.op == ">" and const(c.b, -1)) and isinstance(c.a, RegRead):
        return (c.a,)
    return ()


def _body(body: list[Instr], regs: _Registers, read_only: frozenset[int] = frozenset(),
          facts: tuple[RegRead, ...] = ()) -> list[Instr]:
    out: list[Instr] = []
    for ins in body:
        if isinstance(ins, ForLoop):
            inner = copy.copy(ins)
            inner.body = _body(ins.body, regs, read_only, facts)
            if _is_sequential(inner):
                out += _LoopPass(inner, regs, read_only, facts).run()
            else:
                out.append(inner)
        elif isinstance(ins, IfThen):
            new = copy.copy(ins)
            written = {id(r.array) for i in walk_instrs(ins.then_body) for f, r in vars(i).items()
                       if isinstance(r, RegRef) and f not in _READ_FIELDS}
            held = tuple(r for r in _nonneg_facts(ins.cond) if id(r.array) not in written)  # (not rewritten)
            new.then_body = _body(ins.then_body, regs, read_only, facts + held)
            new.else_body = _body(ins.else_body, regs, read_only, facts)
            out.append(new)
        else:
            out.append(ins)
    return out


def optimize_loops(kernel: LoweredKernel) -> LoweredKernel:
    """``kernel`` with its sequential loops' invariant address / predicate computations
    hoisted and their stage indices rotated (module docstring); an equal program."""
    regs = _Registers(kernel)
    written = {id(p) for p in kernel.written_params()}
    read_only = frozenset(id(p) for p in kernel.params if isinstance(p, GlobalParam) and id(p) not in written)
    body = _body(kernel.body, regs, read_only)
    added: list[Any] = [a for a in (regs.inv, regs.rot) if a.count]
    if not added and not regs.moved:
        return kernel
    return dataclasses.replace(kernel, body=body, registers=list(kernel.registers) + added)
