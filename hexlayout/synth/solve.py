"""Synthesis: choose every unspecified layout and instruction of a tile program.

Order (as in Hexcute): mma ops are the seeds, then register layouts, then shared tiles,
and global<->shared copies last.

1. Each ``mma`` op gets candidate TiledMmas (``mma_choice``); python-constraint
   enumerates assignments of candidates to the mma ops under one n-ary constraint: the
   register layouts they imply are consistent (``registers``) and every op on register
   tiles only (elementwise, reduce, mma, global<->register copies) lowers.
2. For a register solution, each shared root buffer gets candidate layouts
   (``shared``); candidates are checked use by use through the lowering and scored by
   static cost (``cost``); ops touching several shared roots (a wgmma reading A and B)
   become joint constraints in a second python-constraint problem.
3. Register solutions are tried in preference order until one also has legal shared
   layouts; the cheapest complete solution among the first ``MAX_REGISTER_SOLUTIONS``
   register solutions tried wins (ties keep candidate order, so the same program gives the
   same answer). The search is complete: it never stops before a legal solution because of a
   count of solutions, only when ``MAX_REGISTER_CHECKS`` mma choices and shared-layout checks
   were spent, and then its error says so.
4. Every copy gets its cheapest legal instruction under the static cost model (``cost``:
   issue slots, shared wavefronts with bank conflicts, global sectors, TMA boxes and
   atomics included) among those the copy rules offer
   (``hexlayout.ir.lower.copy_rules.legal_copies``), ties in the rules' preference order, as
   the checks above found it (the copy legality rule ranks them with ``copy_cost``).

Every choice is a value: the search builds immutable ``Assignment`` values (layout per
tensor value, TiledMma and copy instruction per op) and asks each op's legality rule
(``Legality(kernel, arch, assignment).check(op)``, ``hexlayout.ir.lower.legality``: the op's
instructions or a ``LoweringError`` carrying a structured ``Rejection``) whether it is legal;
the program itself is never saved, changed or restored. The final assignment gives every
register layout and every copy instruction and is lowered as given (``lower_kernel(kernel,
arch, assignment)``): the lowering decides nothing and refuses a value or copy the
assignment leaves open.

Failures become a ``SynthesisError`` naming the ops in conflict, their source lines and
the two requirements that cannot both hold (``diagnose``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from constraint import BacktrackingSolver, Constraint, Problem

from hexlayout.ir.accumulator_handoff import handoff_regions
from hexlayout.ir.assignment import EMPTY, Assignment
from hexlayout.ir.lower.kernel import LoweredProgram, LoweringError, lower_kernel
from hexlayout.ir.lower.legality import Legality
from hexlayout.ir.mma_in_flight import commit_cap, ring_depths
from hexlayout.ir.tile import (
    Cast,
    Copy,
    Elementwise,
    Fill,
    GlobalView,
    Iota,
    Mma,
    Op,
    Rearrange,
    Reduce,
    Scan,
    TileKernel,
    Value,
)
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.ir.types import Scope
from hexlayout.layout import ComposedLayout, Layout

from .cost import CostBreakdown, instr_cost
from .cta_pair import PairChoice, pair_rewrite
from .diagnose import joint_conflict, no_mma, register_conflict, shared_conflict
from .errors import SynthesisError
from .graph import LayoutGraph, build_graph
from .mma_choice import mma_candidates
from .registers import RegisterAssignment, assign_registers
from .shared import (
    WGMMA_LAYOUT_ARCHS,
    SharedCandidate,
    block_scale_candidate,
    root_mode_map,
    scale_roots,
    shared_candidates,
    uses_of,
)
from .umma_choice import a_source_comparison, register_a_source

__all__ = ["synthesize", "Synthesis", "SynthesisError", "Decision", "Alternative"]

MAX_REGISTER_SOLUTIONS = 3      # complete solutions ranked by cost once one is found
MAX_REGISTER_CHECKS = 20000     # mma choices + shared-layout checks before the search gives up


class _SearchLimit(Exception):
    """The search checked ``MAX_REGISTER_CHECKS`` mma choices and shared layouts."""


def _rejection(rejected: dict[tuple[int | None, ...], str], key: tuple[int, ...]) -> str | None:
    """Why the full choice ``key`` was rejected: its own entry, or that of a partial choice
    (``None`` = not yet chosen) it completes."""
    if key in rejected:
        return rejected[key]
    for part, why in rejected.items():
        if all(p is None or p == k for p, k in zip(part, key)):
            return why
    return None


class LazyConstraint(Constraint):
    """A python-constraint constraint over all its variables: ``fn`` once every variable is
    assigned, ``partial_fn`` (a necessary condition, given the assigned subset) before; no
    pre-processing pass over the domains (each check lowers ops, so stay lazy)."""

    def __init__(self, fn: Any, partial_fn: Any = None) -> None:
        self.fn = fn
        self.partial_fn = partial_fn

    def __call__(self, variables: Any, domains: Any, assignments: dict, forwardcheck: bool = False) -> bool:
        assigned = {v: assignments[v] for v in variables if v in assignments}
        if len(assigned) < len(variables):
            return len(assigned) < 2 or self.partial_fn is None or bool(self.partial_fn(assigned))
        return bool(self.fn(*[assignments[v] for v in variables]))

    def preProcess(self, variables: Any, domains: Any, constraints: Any, vconstraints: Any) -> None:
        return None


@dataclass
class Alternative:
    what: str
    status: str             # "chosen", "legal", "rejected", "not tried"
    reason: str = ""
    cost: float | None = None


@dataclass
class Decision:
    subject: str            # e.g. "mma at gemm.py:42", "shared %sa"
    op: Op | None
    value: Value | None
    chosen: str
    alternatives: list[Alternative] = field(default_factory=list)


@dataclass
class Synthesis:
    kernel: TileKernel
    arch: str
    lowered: LoweredProgram
    decisions: list[Decision]
    cost: CostBreakdown
    seconds: float
    mma: dict[int, TiledMma] = field(default_factory=dict)   # by op uid (``Op.uid``)
    assignment: Assignment = field(default_factory=Assignment)   # what the lowering was given

    def layouts(self) -> list[tuple[Value, Any]]:
        """Every tile value with its synthesized layout, in program order."""
        out, seen = [], set()
        for op in self.kernel.body.walk():
            for v in op.results() + op.operands():
                if v.id not in seen and v.type.scope != Scope.GLOBAL:
                    seen.add(v.id)
                    out.append((v, v.type.layout))
        return out


SharedSolution = tuple[dict[int, SharedCandidate], CostBreakdown, list[Decision]]


def _undecided_shared(v: Value) -> bool:
    return v.type.scope == Scope.SHARED and not isinstance(v.root.type.layout, (Layout, ComposedLayout))


def _loc(op: Op | None) -> str:
    if op is None or op.loc is None:
        return ""
    return op.loc.format()


def _opname(op: Op) -> str:
    return type(op).__name__.lower()


def _register_ops(tk: TileKernel) -> list[Op]:
    out = []
    for op in tk.body.walk():
        if isinstance(op, (Elementwise, Cast, Reduce, Scan, Iota, Fill, Rearrange)):
            if isinstance(op, Fill) and op.dst.type.scope != Scope.REGISTER:
                continue
            out.append(op)
        elif isinstance(op, Mma) and op.a.type.scope == Scope.REGISTER and op.b.type.scope == Scope.REGISTER:
            out.append(op)
        elif isinstance(op, Copy):
            scopes = {op.src.type.scope, op.dst.type.scope}
            if Scope.SHARED not in scopes:
                out.append(op)
    return out


class _Synth:
    def __init__(self, tk: TileKernel, arch: str) -> None:
        self.tk = tk
        self.arch = arch
        self.g: LayoutGraph = build_graph(tk)
        self.base = Legality(tk, arch, copy_cost=self.copy_cost)
        self.regions = self.base.regions
        # tcgen05 accumulators read by another warp role: their tiles belong to the readers
        self.handoff = handoff_regions(tk, self.regions) if arch == "sm_100a" else {}
        self.handoff_roots = {op.c.root.id: self.handoff[op.uid] for op in tk.body.walk()
                              if isinstance(op, Mma) and op.uid in self.handoff}
        self.register_values = [v for vs in self.g.classes().values() for v in vs]
        # the assignment being checked: register layouts and mma choices, then shared layouts
        # (rebound, never changed; the program itself is never changed)
        self.current: Assignment = EMPTY
        self._a_sets: dict[int, int] | None = None     # register-A mma uid -> R (a_sets)
        self.shared_roots = [op.result for op in tk.body.walk()
                             if type(op).__name__ == "Alloc" and op.result.type.scope == Scope.SHARED]
        self.uses = uses_of(tk)
        self.modes = root_mode_map(tk)
        self.reg_ops = _register_ops(tk)
        self.op_uid = {id(op): op.uid for op in tk.body.walk()}   # the assignment's op keys
        if len(set(self.op_uid.values())) != len(self.op_uid):
            raise RuntimeError(f"{tk.name}: two ops of the tile program share a uid (an op object "
                               "copied into its own program): an assignment could not tell them apart")
        self.depth = _loop_depths(tk)
        self.decisions: list[Decision] = []
        self.shared_checks = 0      # shared-layout checks so far (bounded with the mma checks)
        self.reg_cost: dict[tuple, CostBreakdown] = {}
        # the copy instructions the checks found (the cheapest legal ones), to assign them
        self.reg_copies: dict[tuple, dict[int, tuple[str, str]]] = {}
        self.shared_copies: dict[tuple[int, int], tuple[SharedCandidate, dict[int, tuple[str, str]]]] = {}
        self.global_views = {op.result.id: self.base.view_of(op.result)
                             for op in tk.body.walk() if isinstance(op, GlobalView)}

    # --- phase 1: mma choices and register layouts --------------------------------------
    def threads_of(self, op: Op) -> int:
        lo, hi = self.regions.get(id(op), (0, self.tk.launch.threads))
        return hi - lo

    def mma_threads(self, op: Mma) -> int:
        """The threads an mma's tiling is chosen for: the readers of a handed-off tcgen05
        accumulator (``ir.accumulator_handoff``), else the threads running it."""
        lo, hi = self.handoff.get(op.uid, (0, self.threads_of(op)))
        return hi - lo

    def class_threads(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for op in self.tk.body.walk():
            for v in op.results() + op.operands():
                if v.type.scope == Scope.REGISTER:
                    lo, hi = self.handoff_roots.get(v.root.id, (0, self.threads_of(op)))
                    out.setdefault(self.g.find(v.id), hi - lo)
        return out

    def register_assignment(self, ra: RegisterAssignment, choice: dict[int, TiledMma]) -> Assignment:
        """The assignment of the register layouts ``ra`` and the mma choices ``choice``."""
        layouts = {}
        for v in self.register_values:
            lay = ra.layouts.get(self.g.find(v.id))
            if lay is not None:
                layouts[v.id] = lay
        return Assignment(layouts, {self.op_uid[k]: tm for k, tm in choice.items()})

    def check_register_ops(self, choice: dict[int, TiledMma], asg: Assignment) -> LoweringError | None:
        """Lower every op on register tiles only under ``asg``; keeps their cost in ``self.reg_cost``."""
        prober = self.base.with_assignment(asg)
        total = CostBreakdown()
        for op in self.reg_ops:
            try:
                instrs = prober.check(op)
            except LoweringError as e:
                return e
            total.add(self.op_cost(op, instrs, prober), 8.0 ** self.depth.get(id(op), 0))
        key = tuple(sorted((k, str(v)) for k, v in choice.items()))
        self.reg_cost[key] = total
        self.reg_copies[key] = dict(prober.copy_choices)
        return None

    # --- phase 2: shared layouts ----------------------------------------------------------
    def contiguous_modes(self, root: Value) -> list[int]:
        out = []
        for op in self.uses.get(root.id, []):
            if not isinstance(op, Copy):
                continue
            other, mine = (op.src, op.dst) if op.dst.root is root else (op.dst, op.src)
            if other.type.scope != Scope.GLOBAL:
                continue
            gv = self.base.view_of(other)
            if gv is None:
                continue
            _, modes = self.modes.get(mine.id, (root, list(range(len(root.type.shape)))))
            for k in range(len(gv.shape)):
                if gv.static_stride(k) == 1 and k < len(modes):
                    out.append(modes[k])
        return out

    def check_shared(self, root: Value, cand: SharedCandidate) -> tuple[str | None, CostBreakdown, Op | None]:
        """Lower every op that touches ``root`` with ``cand`` added to the current assignment
        (other undecided shared roots stay undecided)."""
        self.shared_checks += 1
        cost = CostBreakdown()
        prober = self.base.with_assignment(self.current.with_layouts({root.id: cand.layout}))
        for op in self.uses.get(root.id, []):
            if any(v.root is not root and _undecided_shared(v) for v in op.operands()):
                continue            # joint with an undecided root: checked in the joint problem
            try:
                instrs = prober.check(op)
            except LoweringError as e:
                return str(e), cost, op
            cost.add(self.op_cost(op, instrs, prober), 8.0 ** self.depth.get(id(op), 0))
        self.shared_copies[(root.id, id(cand))] = (cand, dict(prober.copy_choices))
        return None, cost, None

    def copy_cost(self, prober: Any, op: Op, instrs: list[Any]) -> float:
        """The static cost of a copy's instructions (the ranking of legal copies)."""
        return self.op_cost(op, instrs, prober).total

    def op_cost(self, op: Op, instrs: list[Any], prober: Any) -> CostBreakdown:
        lo, hi = self.regions.get(id(op), (0, self.tk.launch.threads))
        c = CostBreakdown()
        for ins in instrs:
            c.add(instr_cost(ins, prober.tid, lo, hi))
        return c

    def solve_shared(self, explain: bool = True) -> SharedSolution | SynthesisError | None:
        """The shared layouts of the current register assignment, with their cost and
        decisions; when there are none, the diagnosis (``explain``) or ``None`` (the search
        tries further register solutions first and explains only if all fail)."""
        has_wgmma = any(Scope.SHARED in (op.a.type.scope, op.b.type.scope) for op in self.g.mmas)
        legal: dict[int, list[tuple[SharedCandidate, CostBreakdown]]] = {}
        decisions = []
        fixed: dict[int, SharedCandidate] = {}
        scales = scale_roots(self.tk)
        for root in self.shared_roots:
            lay = root.type.layout
            if isinstance(lay, (Layout, ComposedLayout)):
                fixed[root.id] = SharedCandidate(lay, "given", "given explicitly")
                continue
            if root.id in scales:
                one = block_scale_candidate(tuple(root.type.shape))
                cands = [one] if one is not None else []
            else:
                cands = shared_candidates(root, self.contiguous_modes(root),
                                          has_wgmma and self.arch in WGMMA_LAYOUT_ARCHS, root.type.dtype.bits)
            alts, ok = [], []
            failures: dict[int, tuple[SharedCandidate, str, Op]] = {}
            done = False
            for cand in cands:
                if done:
                    alts.append(Alternative(str(cand), "not tried",
                                            "an earlier, preferred candidate is legal and conflict-free"))
                    continue
                err, cost, bad = self.check_shared(root, cand)
                if err is None:
                    ok.append((cand, cost))
                    conflicts = cost.bank_conflicts
                    alts.append(Alternative(str(cand), "legal", f"{conflicts:g} bank conflicts predicted"
                                            if conflicts else "", cost=cost.total))
                    done = cost.bank_conflicts == 0 and cand.kind != "plain"
                else:
                    alts.append(Alternative(str(cand), "rejected", err))
                    failures[id(cand)] = (cand, err, bad)
            if not ok:
                return self.explain_shared(root, cands, failures) if explain else None
            ok.sort(key=lambda x: x[1].total)
            legal[root.id] = ok
            decisions.append((root, alts))
        # joint ops (touching two undecided roots): python-constraint over the legal sets
        problem = Problem(BacktrackingSolver())
        for rid, ok in legal.items():
            # python-constraint tries a domain from its end: best candidates last
            problem.addVariable(rid, list(reversed(range(len(ok)))))
        joint = [op for op in self.tk.body.walk()
                 if len({v.root.id for v in op.operands()
                         if v.type.scope == Scope.SHARED and v.root.id in legal}) >= 2]
        by_id = {r.id: r for r in self.shared_roots}
        for op in joint:
            rids = sorted({v.root.id for v in op.operands()
                           if v.type.scope == Scope.SHARED and v.root.id in legal})

            def check(*idx: int, op: Op = op, rids: list[int] = rids) -> bool:
                return self.joint_ok(op, {r: legal[r][i][0] for r, i in zip(rids, idx)}, by_id)

            problem.addConstraint(LazyConstraint(check), rids)
        best = None
        # python-constraint yields nothing for a problem without variables: no undecided root
        shared_solutions = problem.getSolutionIter() if legal else iter([{}])
        for k, sol in enumerate(shared_solutions):
            total = CostBreakdown()
            for rid, i in sol.items():
                total.add(legal[rid][i][1])
            if best is None or total.total < best[1].total:
                best = (sol, total)
            if k >= 16:
                break
        if best is None:
            if not explain:
                return None
            return joint_conflict(self, joint, legal, by_id)
        sol, total = best
        chosen = dict(fixed)
        for rid, i in sol.items():
            chosen[rid] = legal[rid][i][0]
        out_decisions = []
        for root, alts in decisions:
            pick = chosen[root.id]
            for a in alts:
                if a.what == str(pick):
                    a.status = "chosen"
            said = next((a.reason for a in alts if a.what == str(pick) and a.reason), "")
            # a layout with bank conflicts says so
            note = f"; {said} (the least costly legal candidate)" if said else ""
            out_decisions.append(Decision(f"shared %{root.name}", None, root, str(pick) + note, alts))
        return chosen, total, out_decisions

    def joint_ok(self, op: Op, picks: dict[int, SharedCandidate], by_id: dict[int, Value]) -> bool:
        asg = self.current.with_layouts({rid: cand.layout for rid, cand in picks.items()})
        try:
            self.base.with_assignment(asg).check(op)
            return True
        except LoweringError:
            return False

    def explain_shared(self, root: Value, cands: list[SharedCandidate],
                       failures: dict[int, tuple[SharedCandidate, str, Op]]) -> SynthesisError:
        return shared_conflict(self, root, cands, failures)

    # --- driver -----------------------------------------------------------------------------
    def search_order(self) -> list[int]:
        """Indices into ``g.mmas``: breadth-first over "shares a register tile", program order
        first, so each mma after the first of its group meets one already chosen."""
        mmas = self.g.mmas
        pos = {id(op): j for j, op in enumerate(mmas)}
        by_cls: dict[int, set[int]] = {}
        for r in self.g.mma_roles:
            by_cls.setdefault(r.cls, set()).add(pos[id(r.op)])
        nbrs: dict[int, set[int]] = {j: set() for j in range(len(mmas))}
        for group in by_cls.values():
            for j in group:
                nbrs[j] |= group - {j}
        order: list[int] = []
        for start in range(len(mmas)):
            if start in order:
                continue
            queue = [start]
            order.append(start)
            while queue:
                j = queue.pop(0)
                for n in sorted(nbrs[j]):
                    if n not in order:
                        order.append(n)
                        queue.append(n)
        return order

    def unresolved_error(self, unresolved: list[int], cthreads: dict[int, int]) -> SynthesisError:
        """No mma and no global copy determines a register tile's layout: name the tile, the
        op that moves it and why no coalesced layout spreads it over the threads."""
        from hexlayout.layout.tv import copy_thread_layout

        classes = self.g.classes()
        for c in unresolved:
            members = classes.get(c, [])
            if not members:
                continue
            v = members[0]
            copies = self.g.copies_with_global.get(c, [])
            shape = tuple(v.type.shape)
            threads = cthreads.get(c, self.tk.launch.threads)
            size = 1
            for e in shape:
                size *= e
            if copies:
                why = copy_thread_layout(shape, list(reversed(range(len(shape)))), 1, threads)
                why = why if isinstance(why, str) else "no coalesced layout is legal"
                declared = f" (declared at {v.loc.format(code='backticks')})" if v.loc is not None else ""
                return SynthesisError(
                    self.tk.name,
                    f"{_opname(copies[0])} at {_loc(copies[0])}: register tile %{v.name}{declared} "
                    f"{v.type.dtype}{shape} ({size} elements) has no layout over the {threads} threads "
                    "that run it "
                    f"({why}); use a tile whose element count is a multiple of {threads}, or fewer "
                    "threads", [copies[0]])
            ops = [op for op in self.tk.body.walk() if any(x.id == v.id for x in op.values())]
            where = f"{_opname(ops[0])} at {_loc(ops[0])}: " if ops else ""
            return SynthesisError(self.tk.name, f"{where}nothing determines the layout of register tile "
                                  f"%{v.name} (no mma or global copy reaches it); give it a layout",
                                  ops[:1])
        return SynthesisError(self.tk.name, "nothing determines the layout of some register tiles")

    def shared_major(self, v: Value, k_mode: int) -> str | None:
        """Which wgmma descriptor major the global copies into shared operand ``v`` make
        natural: "K" when its ``k_mode`` is contiguous in global memory, "MN" when its other
        mode is, ``None`` when neither or ``v`` is not shared."""
        if v.type.scope != Scope.SHARED or len(v.type.shape) != 2:
            return None
        root, modes = self.modes.get(v.id, (v.root, list(range(len(v.type.shape)))))
        contiguous = set(self.contiguous_modes(root))
        if modes[k_mode] in contiguous:
            return "K"
        if modes[1 - k_mode] in contiguous:
            return "MN"
        return None

    def prefer_majors(self, op: Mma, cands: list[TiledMma]) -> list[TiledMma]:
        """``cands`` with the wgmma majors that match the operands' global contiguity first
        (stable otherwise): the search still tries every candidate, this only finds the
        legal one sooner when an operand is MN-major in global memory."""
        want = (self.shared_major(op.a, 1), self.shared_major(op.b, 1))
        if want == (None, None) or want == ("K", "K"):
            return cands

        def mismatch(tm: TiledMma) -> int:
            got = (tm.atom.a_major, tm.atom.b_major)
            return sum(w is not None and w != g for w, g in zip(want, got))

        return sorted(cands, key=mismatch)

    def run(self) -> Synthesis:
        """Synthesize: search the mma choices (each fixes the register layouts) and, for each
        consistent one, the shared layouts; keep the cheapest and lower the program as chosen."""
        t0 = time.perf_counter()
        search = self.mma_search()
        best, failure = self.best_solution(search)
        if best is None:
            self.raise_no_solution(search, failure)
        return self.result(search, best, time.perf_counter() - t0)

    def mma_search(self) -> _MmaSearch:
        """The candidates of every mma op (an op with none is an error) and the search over them."""
        mma_ops = self.g.mmas
        cands = {id(op): self.prefer_majors(op, mma_candidates(op, self.arch, self.mma_threads(op),
                                                               self.other_accumulator_columns(op),
                                                               self.a_sets(op)))
                 for op in mma_ops}
        for op in mma_ops:
            if not cands[id(op)]:
                raise no_mma(self, op)
        return _MmaSearch(self, cands, [id(op) for op in mma_ops])

    def other_accumulator_columns(self, op: Mma) -> int:
        """On sm_100a, the TMEM columns (one per f32 column) of the accumulators of the kernel's
        other mmas with a shared operand (each accumulator tile once): what a register A written
        into TMEM beside ``op``'s accumulator must leave room for."""
        if self.arch != "sm_100a":
            return 0
        cols = {o.c.root.id: o.c.type.shape[1] for o in self.g.mmas
                if Scope.SHARED in (o.a.type.scope, o.b.type.scope) and o.c.root.id != op.c.root.id}
        return sum(cols.values())

    def a_sets(self, op: Mma) -> int:
        """On sm_100a, for an mma on a register A: ``R``, one more than the most of its executions
        whose MMAs may be in flight where it runs (``ir.mma_in_flight``): the TMEM column sets (or
        shared buffers) its A rotates through so that none in flight is rewritten."""
        if self.arch != "sm_100a" or op.a.type.scope != Scope.REGISTER:
            return 1
        if self._a_sets is None:
            body = self.tk.body

            def register_a(o: Op) -> bool:
                return isinstance(o, Mma) and o.a.type.scope == Scope.REGISTER

            self._a_sets = ring_depths(body.ops, register_a, commit_cap(body))
        return self._a_sets.get(op.uid, 1)

    def best_solution(self, search: _MmaSearch) -> tuple[tuple[float, Any, float] | None, _Failure]:
        """The cheapest ``(cost, (choice, assignment, shared, shared decisions, index, cost),
        bank conflicts)`` over the register solutions (at most ``MAX_REGISTER_SOLUTIONS`` once
        one is found, or the first without bank conflicts), and what failed on the way."""
        best: tuple[float, Any, float] | None = None
        failure = _Failure()
        try:
            for n, sol in enumerate(search.solutions()):
                idx = search.index(sol)
                choice = search.choice(idx)
                ra = assign_registers(self.g, choice, search.cthreads, self.global_views)
                if not search.keys and ra.conflict is not None:
                    # no mma to choose: the one register assignment conflicts (e.g. a window of a
                    # register tile that leaves some threads without values)
                    raise register_conflict(self, search.cands, [ra], search.rejected, False)
                self.current = self.register_assignment(ra, choice)
                found = self.shared_solution(search, choice, ra, idx, failure)
                if found is not None and (best is None or found[0] < best[0]):
                    best = found
                # no count of solutions hides a legal one: keep going until one is found
                if best is not None and (n + 1 >= MAX_REGISTER_SOLUTIONS or best[2] == 0):
                    break
                if search.over_limit():
                    raise _SearchLimit
        except _SearchLimit:
            failure.stopped = True
        return best, failure

    def shared_solution(self, search: _MmaSearch, choice: dict[int, TiledMma], ra: RegisterAssignment,
                        idx: tuple[int, ...], failure: _Failure) -> tuple[float, Any, float] | None:
        """The shared layouts under the register assignment ``self.current`` and the total cost
        as ``best_solution`` ranks it, or None (the failure recorded in ``failure``)."""
        res = self.solve_shared(explain=False)
        if res is None:
            if failure.last_error is None and failure.unexplained is None:
                failure.unexplained = self.current      # the preferred mma choice's failure, explained later
            return None
        if isinstance(res, SynthesisError):
            failure.last_error = failure.last_error or res
            return None
        shared, scost, sdec = res
        key = tuple(sorted((k, str(v)) for k, v in choice.items()))
        if key not in self.reg_cost:
            err = self.check_register_ops(choice, self.current)
            if err:
                if not search.keys and ra.conflict is None and ra.unresolved:
                    # no mma: a register tile no coalesced layout spreads over the threads
                    failure.last_error = (failure.last_error
                                          or self.unresolved_error(ra.unresolved, search.cthreads))
                failure.last_error = failure.last_error or SynthesisError(self.tk.name, err.located,
                                                                          [err.op] if err.op else [])
                return None
        cost = CostBreakdown()
        cost.add(scost)
        cost.add(self.reg_cost[key])
        return cost.total, (choice, self.current, shared, sdec, idx, cost), scost.bank_conflicts

    def raise_no_solution(self, search: _MmaSearch, failure: _Failure) -> None:
        """Raise the error that explains why no choice worked: the shared-layout failure of the
        preferred mma choice, else the first synthesis error, else the register conflicts."""
        last_error = failure.last_error
        if failure.unexplained is not None:
            self.current = failure.unexplained
            res = self.solve_shared()
            if isinstance(res, SynthesisError):
                last_error = res
        if last_error is not None:
            if failure.stopped:
                raise SynthesisError(
                    self.tk.name, f"{str(last_error).removeprefix(self.tk.name + ': ')} (the search "
                    f"stopped after {search.checks} mma choices and {self.shared_checks} shared-layout "
                    "checks, "
                    "MAX_REGISTER_CHECKS; the first failure is shown; give atom= or warps= to an mma "
                    "or layouts to shared tiles to narrow it)", last_error.ops)
            raise last_error
        raise register_conflict(self, search.cands, search.first_conflict, search.rejected, failure.stopped)

    def result(self, search: _MmaSearch, best: tuple[float, Any, float], seconds: float) -> Synthesis:
        """The synthesis of the best solution: a copy of the program annotated with the
        assignment, lowered as assigned, with every decision pointing into the copy."""
        _, (choice, asg, shared, sdec, idx, cost), _ = best
        asg = asg.with_layouts({root.id: shared[root.id].layout for root in self.shared_roots})
        asg = asg.with_copies(self.copy_choices(asg, choice, shared))
        kernel, ops = asg.annotate(self.tk)          # the copy keeps op uids and value ids
        prog = lower_kernel(kernel, self.arch, asg)
        values = {v.id: v for op in ops.values() for v in op.values()}
        decisions = (self.mma_decisions(search.cands, idx, search.rejected, search.accepted) + sdec
                     + self.copy_decisions(prog))
        for d in decisions:
            d.op = ops.get(id(d.op), d.op) if d.op is not None else None
            d.value = values.get(d.value.id, d.value) if d.value is not None else None
        return Synthesis(kernel, self.arch, prog, decisions, cost, seconds,
                         {self.op_uid[k]: choice[k] for k in search.keys}, asg)

    def copy_choices(self, asg: Assignment, choice: dict[int, TiledMma],
                     shared: dict[int, SharedCandidate]) -> dict[int, tuple[str, str]]:
        """The instruction of every copy under ``asg``, by ``op.uid``: the cheapest legal one
        (ties in the copy rules' preference order, ``legal_copies``), as the checks of the chosen
        register and shared layouts found it; copies no check lowered (those touching a shared
        tile whose layout is given) are asked here."""
        out = dict(self.reg_copies.get(tuple(sorted((k, str(v)) for k, v in choice.items())), {}))
        for rid, cand in shared.items():
            found = self.shared_copies.get((rid, id(cand)))
            if found is not None and found[0] is cand:
                out.update(found[1])
        copies = [op for op in self.tk.body.walk() if isinstance(op, Copy)]
        if all(op.uid in out for op in copies):
            return out
        prober = self.base.with_assignment(asg)
        defining = {id(op) for op in self.reg_ops}       # ops defining the register tiles copies read
        for op in self.tk.body.walk():
            if (isinstance(op, Copy) and op.uid not in out) or id(op) in defining:
                prober.check(op)
        return {**prober.copy_choices, **out}

    def mma_decisions(self, cands: dict[int, list[TiledMma]], idx: tuple[int, ...],
                      rejected: dict[tuple[int, ...], str], accepted: set[tuple[int, ...]]) -> list[Decision]:
        out = []
        for j, op in enumerate(self.g.mmas):
            chosen = cands[id(op)][idx[j]]
            alts = []
            for i, tm in enumerate(cands[id(op)][:12]):
                key = tuple(idx[:j]) + (i,) + tuple(idx[j + 1:])
                if i == idx[j]:
                    alts.append(Alternative(str(tm), "chosen"))
                elif (why := _rejection(rejected, key)) is not None:
                    alts.append(Alternative(str(tm), "rejected", why))
                elif key in accepted:
                    alts.append(Alternative(str(tm), "legal", "ranked lower (operand traffic per warp)"))
                else:
                    alts.append(Alternative(str(tm), "not tried", "an earlier, preferred choice was legal"))
            if getattr(chosen, "a_store", None) is not None:   # a register A fed through TMEM
                alts.insert(0, Alternative("A staged through shared memory for the _SS atom", "rejected",
                                           a_source_comparison(chosen)))
            elif getattr(chosen, "a_stage", None) is not None:   # a register A staged through shared memory
                m, n, k = chosen.tile_mnk
                a, b, c = op.a.type, op.b.type, op.c.type
                _, why = register_a_source(m, n, k, a.dtype, b.dtype, c.dtype, chosen.threads,
                                           other_columns=self.other_accumulator_columns(op),
                                           a_sets=self.a_sets(op))
                alts.insert(0, Alternative("A written to TMEM for the _TS atom", "rejected",
                                           f"{why}; {a_source_comparison(chosen)}"))
            out.append(Decision(f"mma at {_loc(op)}", op, None, str(chosen), alts))
        return out

    def copy_decisions(self, prog: LoweredProgram) -> list[Decision]:
        out = []
        for op, instr in prog.choices:
            if isinstance(op, Copy):
                out.append(Decision(f"copy at {_loc(op)}", op, None, instr,
                                    [Alternative(instr, "chosen")]))
        return out


@dataclass
class _Failure:
    """What went wrong while searching: the first synthesis error, the first register solution
    whose shared layouts failed unexplained, and whether the search stopped at its limit."""
    last_error: SynthesisError | None = None
    unexplained: Assignment | None = None
    stopped: bool = False


class _MmaSearch:
    """The search over the mma choices of one synthesis: the candidates of every mma op (by
    ``id``), the constraint problem over their indices, and what the checks found (choices
    rejected and why, the first conflict, the choices accepted, the number of checks)."""

    def __init__(self, synth: _Synth, cands: dict[int, list[TiledMma]], keys: list[int]) -> None:
        self.synth = synth
        self.cands = cands
        self.keys = keys
        self.cthreads = synth.class_threads()
        # problem variables are positions in a search order that visits mmas sharing a register
        # tile one after another (python-constraint breaks ties by variable name), so partial
        # choices meet their conflicts early and the search is the same in every process
        self.var_of = {j: p for p, j in enumerate(synth.search_order())}
        self.rejected: dict[tuple[int | None, ...], str] = {}
        self.first_conflict: list[Any] = []
        self.partial_seen: dict[tuple[int | None, ...], bool] = {}
        self.accepted: set[tuple[int, ...]] = set()
        self.checks = 0

    def solutions(self) -> Any:
        """The complete mma choices consistent in registers, as python-constraint solutions."""
        if not self.keys:
            return iter([{}])
        problem = Problem(BacktrackingSolver())
        for j, k in enumerate(self.keys):
            problem.addVariable(self.var_of[j], list(reversed(range(len(self.cands[k])))))
        problem.addConstraint(LazyConstraint(self.consistent, self.partially_consistent),
                              [self.var_of[j] for j in range(len(self.keys))])
        return problem.getSolutionIter()

    def index(self, sol: dict[int, int]) -> tuple[Any, ...]:
        """The candidate index of every mma op (None where unassigned) in a (partial) solution."""
        return tuple(sol.get(self.var_of[j]) for j in range(len(self.keys)))

    def choice(self, idx: tuple[int | None, ...]) -> dict[int, TiledMma]:
        """The chosen candidate of every assigned mma op."""
        return {k: self.cands[k][i] for k, i in zip(self.keys, idx) if i is not None}

    def over_limit(self) -> bool:
        return self.checks + self.synth.shared_checks > MAX_REGISTER_CHECKS

    def count(self) -> None:
        """Count one check; stop the search past ``MAX_REGISTER_CHECKS``."""
        self.checks += 1
        if self.over_limit():
            raise _SearchLimit

    def note(self, idx: tuple[int | None, ...], why: str, first: Any) -> None:
        """Record that choice ``idx`` is rejected (``why``), and ``first`` if it is the first."""
        self.rejected[idx] = why
        if not self.first_conflict:
            self.first_conflict.append(first)

    def conflict(self, idx: tuple[int | None, ...], ra: Any) -> bool:
        """Whether register assignment ``ra`` has a conflict (recorded for choice ``idx``)."""
        if ra.conflict is None:
            return False
        c = ra.conflict
        names = ", ".join(f"%{v.name}" for v in c.values[:3])
        self.note(idx, f"register tile {names} would need two layouts: {c.first[2]} "
                  f"({_loc(c.first[1])}) and {c.second[2]} ({_loc(c.second[1])})", ra)
        return True

    def partially_consistent(self, assigned: dict[int, int]) -> bool:
        """No register conflict among the mma ops chosen so far (prunes the search)."""
        idx = self.index(assigned)
        if idx not in self.partial_seen:
            self.count()
            ra = assign_registers(self.synth.g, self.choice(idx), self.cthreads, self.synth.global_views,
                                  partial=True)
            self.partial_seen[idx] = not self.conflict(idx, ra)
        return self.partial_seen[idx]

    def consistent(self, *idx: int) -> bool:
        """The complete choice ``idx`` has consistent, determined register layouts whose
        register ops (casts, reductions, ...) are legal."""
        self.count()
        s = self.synth
        choice = self.choice(idx)
        ra = assign_registers(s.g, choice, self.cthreads, s.global_views)
        if self.conflict(idx, ra):
            return False
        if ra.unresolved:
            classes = s.g.classes()
            names = ", ".join(f"%{v.name}" for c in ra.unresolved[:3] for v in classes.get(c, [])[:1])
            self.note(idx, f"nothing determines the layout of register tile(s) {names}", ra)
            return False
        err = s.check_register_ops(choice, s.register_assignment(ra, choice))
        if err:
            self.note(idx, str(err), err)
            return False
        self.accepted.add(idx)
        return True


def _loop_depths(tk: TileKernel) -> dict[int, int]:
    from hexlayout.ir.walk import walk_with_context

    return {id(v.op): v.loop_depth for v in walk_with_context(tk)}


def synthesize(tk: TileKernel, arch: str = "sm_80") -> Synthesis:
    """Fill in every ``auto`` layout, mma atom and warp arrangement and choose every copy
    instruction of ``tk`` for ``arch``.

    ``tk`` itself is never modified: the search builds immutable ``Assignment`` values and
    asks each op's legality rule (``hexlayout.ir.lower.legality``) whether each is legal.
    The result carries the chosen assignment (``.assignment``), a copy of ``tk`` annotated
    with it (``.kernel``), its lowered program (``.lowered``, lowered from exactly that
    assignment), the decisions with their rejected alternatives (``.decisions``) and the
    predicted cost (``.cost``). A fully explicit program (every layout, atom and warp
    arrangement given) synthesizes too: its decisions are the program's own.
    """
    paired, choice = pair_rewrite(tk, arch)
    syn = None
    if paired is not None and choice is not None:
        try:
            syn = _Synth(paired, arch).run()
        except (LoweringError, SynthesisError) as e:      # the one-CTA program below, with the reason
            choice = choice.refused(f"the pair form did not synthesize: {str(e).splitlines()[0]}")
    if syn is None:
        try:
            syn = _Synth(tk, arch).run()
        except LoweringError as e:
            raise SynthesisError(tk.name, e.located, [e.op] if e.op else []) from None
    if choice is not None:
        syn.decisions.insert(0, _pair_decision(syn, choice))
    return syn


def _pair_decision(syn: Synthesis, choice: PairChoice) -> Decision:
    """The 2-CTA pair choice (``cta_pair``) as a decision: both forms with the cost model's numbers,
    the reason on the one not taken."""
    op = next((o for o in syn.kernel.body.walk() if choice.mma is not None and o.uid == choice.mma.uid),
              None)
    pair = Alternative(f"tcgen05.mma.{choice.costs.get(2)}", "chosen" if choice.paired else "rejected",
                       choice.reason)
    why = f"{choice.reason}; the pair stages half of B and issues half the MMAs per CTA"
    single = Alternative(f"tcgen05.mma.{choice.costs.get(1)}", "rejected" if choice.paired else "chosen",
                         why if choice.paired else "")
    return Decision(f"2-CTA pair at {_loc(op)}" if op is not None else "2-CTA pair", op, None,
                    (pair if choice.paired else single).what, [pair, single])
