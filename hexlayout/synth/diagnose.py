"""Diagnostics for programs that have no layout assignment.

Every message names the ops in conflict, their source lines (``file:line`` and the code)
and the two requirements that cannot both hold, in plain words:

- ``no_mma``: no atom of the architecture multiplies the operand types and scopes, or
  none tiles the block with the threads that run the op;
- ``register_conflict``: two requirements give one register tile different layouts
  (operand a of one mma and operand b of another, an explicit layout and an mma operand,
  two accumulators joined by an elementwise op: the ops that join them are named too),
  or an op on the tiles cannot be lowered with the layouts the mma choices imply;
- ``shared_conflict``: two uses of a shared tile accept disjoint sets of layouts: a
  layout one accepts is rejected by the other with the lowering's reason, and vice versa;
  or a layout hint (``hl.auto(swizzle=...)``, ``hl.auto(stride=...)``) on the tile's
  allocation excludes every layout a use accepts;
- ``joint_conflict``: an op reading two shared tiles at once (a wgmma) accepts no pair of
  their legal layouts; when a hint on one of them is the cause, the hint is named.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hexlayout.ir.lower.kernel import LoweringError
from hexlayout.ir.lower.rejection import Rejection
from hexlayout.ir.tile import Alloc, Copy, Mma, Op, Value
from hexlayout.ir.types import LayoutVar, Scope

from .errors import SynthesisError
from .registers import LayoutSource

__all__ = ["no_mma", "register_conflict", "shared_conflict", "joint_conflict", "describe_op"]


# --- naming -----------------------------------------------------------------------------

def describe_op(op: Op | None) -> str:
    """``copy at gemm.py:42 `hl.copy(sa, ra)``` (the op's kind, file:line and code)."""
    if op is None:
        return "(unknown op)"
    name = _kind(op)
    if op.loc is None:
        return name
    return f"{name} at {op.loc.format(code='backticks')}"


def _kind(op: Op) -> str:
    if isinstance(op, Alloc):
        return {Scope.SHARED: "hl.shared", Scope.REGISTER: "hl.register"}.get(op.result.type.scope, "alloc")
    return type(op).__name__.lower()


def _error(s: Any, msg: str, ops: list[Op]) -> SynthesisError:
    return SynthesisError(s.tk.name, msg, ops)


def _reason(e: LoweringError) -> Rejection:
    """The lowering's reason (a ``Rejection``: no kernel, op or line in it)."""
    return e.reason


def _alloc_of(s: Any, root: Value) -> Op | None:
    for op in s.tk.body.walk():
        if isinstance(op, Alloc) and op.result is root:
            return op
    return None


def _values_of(op: Op) -> list[Value]:
    """Every value an op mentions (its outputs and inputs, in field order)."""
    return op.values()


def _tile(v: Value) -> str:
    shape = "x".join(str(x) for x in v.type.shape)
    return f"%{v.name} ({v.type.dtype} {shape})"


# --- mma -----------------------------------------------------------------------------------

def no_mma(s: Any, op: Mma) -> SynthesisError:
    """No atom / warp arrangement of ``s.arch`` computes ``op``."""
    a, b, c = op.a.type, op.b.type, op.c.type
    threads = s.mma_threads(op)
    what = (f"{describe_op(op)}: no mma atom of {s.arch} computes {c.dtype} += {a.dtype} ({a.scope}) x "
            f"{b.dtype} ({b.scope}) for a {c.shape[0]}x{c.shape[1]}x{a.shape[1]} tile with {threads} threads")
    if op.atom is not None:
        what += f" with the requested atom {op.atom}"
    if op.warps is not None and s.arch != "sm_100a":
        what += f" and warps={op.warps}"
    if op.scale_a is not None and s.arch != "sm_100a":
        what += (" with block scales (scale_a / scale_b): only sm_100a's block-scaled tcgen05.mma "
                 "(kind::mxf8f6f4, FP4 kind::mxf4 / mxf4nvf4) applies them; scale the products in registers "
                 "on " + s.arch)
    if s.arch == "sm_100a":
        from .umma_choice import operand_form, register_a_refusal, umma_refusal

        group = 2 if c.shape[1] == 2 * b.shape[0] else 1
        if b.scope != Scope.SHARED or a.scope not in (Scope.SHARED, Scope.REGISTER):
            why = ("tcgen05.mma reads B from shared memory and A from shared memory or (a register tile) "
                   "TMEM or a shared buffer synthesis stages it through")
        elif a.scope == Scope.REGISTER:
            da, db, k, form = operand_form(op)
            why = register_a_refusal(c.shape[0], c.shape[1], k, da, db, c.dtype, threads, form or False,
                                     group, s.other_accumulator_columns(op), s.a_sets(op))
        else:
            da, db, k, form = operand_form(op)
            why = umma_refusal(c.shape[0], c.shape[1], k, da, db, c.dtype, threads, form or False, group)
        why = s.pair_register_a_refusal(op) or why
        if op.atom is not None:
            why = f"atom={op.atom}: on sm_100a synthesis chooses the tcgen05 atom (leave atom= out)"
        if why:
            what += f" ({why})"
    return _error(s, what, [op])


# --- register tiles -----------------------------------------------------------------------

_ROLE = {"a": "A operand (M x K)", "b": "B operand (N x K)", "c": "accumulator (M x N)"}


def _mma_role(op: Op | None, why: LayoutSource) -> tuple[str, str] | None:
    """``(role, tiled mma)`` when ``why`` is an mma operand requirement."""
    if why.kind == "mma" and isinstance(op, Mma) and why.role is not None:
        return why.role, str(why.mma)
    return None


def _requirement(op: Op | None, why: LayoutSource, layout: Any, v: Value | None) -> str:
    """What ``op`` requires of register tile ``v``, in words, ending with the TV layout."""
    it = f"%{v.name}" if v is not None else "it"
    if (mr := _mma_role(op, why)) is not None:
        role, tm = mr
        hint = " (warps= given there)" if "warps=" in (op.loc.code if op.loc else "") else ""
        return (f"{describe_op(op)} needs {it} as the {_ROLE[role]} fragment of {tm}{hint}, "
                f"i.e. the TV layout {layout}")
    if why.kind == "explicit":
        return f"{describe_op(op)} gives {it} the explicit TV layout {layout}"
    if why.kind == "coalesced":
        return f"{describe_op(op)} copies {it} with global memory in the coalesced TV layout {layout}"
    return f"{describe_op(op)} requires {it} to have the TV layout {layout} ({why})"


def _chain_hint(s: Any, cands: dict[int, list[Any]], op1: Op | None, why1: LayoutSource,
                op2: Op | None, why2: LayoutSource) -> str:
    """A hint when an accumulator (C, M x N) must be the A operand of a later mma: the A
    fragment replicates over the warps that split N, so no warp may split the accumulator's
    N; that needs ``M / atom_m >= warps`` for some candidate atom."""
    roles = {}
    for op, why in ((op1, why1), (op2, why2)):
        if (mr := _mma_role(op, why)) is not None:
            roles[mr[0]] = op
    c_op = roles.get("c")
    if c_op is None or "a" not in roles or not cands.get(id(c_op)):
        return ""
    tm = cands[id(c_op)][0]
    warps = tm.threads // tm.atom.num_threads
    m_rows = c_op.c.type.shape[0]
    blocks = max(m_rows // t.atom.shape_mnk[0] for t in cands[id(c_op)])
    if blocks >= warps:
        return ""
    return (f" Hint: {describe_op(c_op)} has {m_rows} rows, {blocks} row block(s) of its mma atom, for "
            f"{warps} warps, so some warps must split its columns, while as the A operand of "
            f"{describe_op(roles['a'])} each warp must hold whole rows. Use at most {blocks} warps or a "
            f"larger M tile, or pass the tile through shared memory.")


def _join_path(s: Any, cls: int, v1: Value | None, v2: Value | None) -> list[Op]:
    """The ops (elementwise, cast, in-place updates) that put ``v1`` and ``v2`` in one class."""
    if v1 is None or v2 is None or v1.id == v2.id:
        return []
    members = {v.id for v in s.g.classes().get(cls, [])}
    adj: dict[int, list[tuple[int, Op]]] = {}
    for op in s.g.why.get(cls, []):
        vids = [v.id for v in _values_of(op) if v.id in members]
        for x in vids:
            for y in vids:
                if x != y:
                    adj.setdefault(x, []).append((y, op))
    prev: dict[int, tuple[int, Op] | None] = {v1.id: None}
    todo = deque([v1.id])
    while todo:
        x = todo.popleft()
        if x == v2.id:
            break
        for y, op in adj.get(x, []):
            if y not in prev:
                prev[y] = (x, op)
                todo.append(y)
    if v2.id not in prev:
        return []
    path: list[Op] = []
    cur = v2.id
    while prev[cur] is not None:
        x, op = prev[cur]           # type: ignore[misc]
        if op not in path:
            path.append(op)
        cur = x
    return list(reversed(path))


def _value_in(op: Op | None, why: LayoutSource, members: list[Value]) -> Value | None:
    if op is None:
        return None
    ids = {v.id for v in members}
    if (mr := _mma_role(op, why)) is not None:
        v = getattr(op, mr[0])
        return v if v.id in ids else None
    for v in _values_of(op):
        if v.id in ids:
            return v
    return None


def register_conflict(s: Any, cands: dict[int, list[Any]], first: list[Any],
                      rejected: dict[tuple[int, ...], str] | None = None,
                      stopped: bool = False) -> SynthesisError:
    """No combination of mma choices gives consistent register layouts; explain the first."""
    tried = len(rejected) if rejected else 0
    every = (f" Every combination of mma atoms and warp arrangements fails ({tried} full or partial "
             "combinations checked); the first conflict is shown." if tried > 1 else "")
    if stopped:
        every = (f" The search stopped after {tried} full or partial combinations of mma atoms and warp "
                 "arrangements, all failing (give atom= or warps= to an mma to narrow it); the first "
                 "conflict is shown.")
    if not first:
        return _error(s, "no mma choice gives consistent register layouts", list(s.g.mmas))
    ra = first[0]
    if isinstance(ra, LoweringError):
        return _error(s, f"with every mma choice an op on register tiles cannot be lowered; first: {ra}",
                      [o for o in [*s.g.mmas, ra.op] if o is not None])
    if ra.conflict is not None:
        c = ra.conflict
        (l1, op1, why1), (l2, op2, why2) = c.first, c.second
        members = c.values or s.g.classes().get(c.cls, [])
        if op1 is op2 and why1 == why2:
            name = _tile(members[0]) if members else "?"
            msg = f"register tile {name}: {describe_op(op1)} cannot be lowered: {why1}"
            return _error(s, msg, [op1] if op1 is not None else [])
        v1, v2 = _value_in(op1, why1, members), _value_in(op2, why2, members)
        joined = _join_path(s, c.cls, v1, v2)
        if v1 is not None and v2 is not None and v1.id != v2.id:
            subject = f"register tiles {_tile(v1)} and {_tile(v2)} must have one layout"
            if joined:
                subject += " (" + "; ".join(f"{describe_op(o)} combines them elementwise"
                                            for o in joined) + ")"
            subject += ", but two ops require different ones"
        else:
            v = v1 or v2 or (members[0] if members else None)
            name = _tile(v) if v is not None else "?"
            subject = f"register tile {name} cannot have one layout for two uses"
        msg = (f"{subject}: (1) {_requirement(op1, why1, l1, v1)}; (2) {_requirement(op2, why2, l2, v2)}. "
               f"These are different maps from (thread, value) to elements.{every}"
               f"{_chain_hint(s, cands, op1, why1, op2, why2)}")
        ops = [o for o in (op1, op2) if o is not None] + [o for o in joined if o not in (op1, op2)]
        return _error(s, msg, ops)
    names = []
    classes = s.g.classes()
    for cls in ra.unresolved:
        names.append(", ".join(_tile(v) for v in classes.get(cls, [])[:4]))
    return _error(s, f"nothing determines the layout of register tile(s) {'; '.join(names)}: they meet "
                  "no mma, explicit layout or global copy", [])


# --- shared tiles ---------------------------------------------------------------------------

def _probe_all(s: Any, root: Value, cands: list[Any], uses: list[Op]) -> tuple[dict[int, set[int]],
                                                                              dict[tuple[int, int], str]]:
    """Which candidates each use accepts (each use alone), with the reasons for the others."""
    accepted: dict[int, set[int]] = {id(op): set() for op in uses}
    reasons: dict[tuple[int, int], str] = {}
    for i, cand in enumerate(cands):
        prober = s.base.with_assignment(s.current.with_layouts({root.id: cand.layout}))
        for op in uses:
            try:
                prober.check(op)
                accepted[id(op)].add(i)
            except LoweringError as e:
                reasons[(id(op), i)] = _reason(e)
    return accepted, reasons


def _orientation(cand: Any) -> int | None:
    """The mode along which a candidate shared layout keeps elements contiguous."""
    return cand.mode


def _needs(s: Any, root: Value, op: Op, cands: list[Any], ok: set[int]) -> str:
    """What ``op`` needs of the shared tile, from the candidates it accepts."""
    dirs = {_orientation(cands[i]) for i in ok}
    if len(dirs) == 1 and None not in dirs:
        (d,) = dirs
        n = root.type.shape[d]
        what = (f"the tile's rows along mode {d} (its {n} elements of mode {d} contiguous in shared memory, "
                f"{n * root.type.dtype.bits // 8} bytes)")
    else:
        what = f"a layout such as {cands[min(ok)].layout} ({cands[min(ok)].note})"
    src = _global_contiguity(s, op, root)
    return what + (f"; {src}" if src else "")


def _global_contiguity(s: Any, op: Op, root: Value) -> str:
    """For a global<->shared copy: which mode of the global side is contiguous."""
    if not isinstance(op, Copy):
        return ""
    other = op.src if op.dst.type.scope == Scope.SHARED else op.dst
    if other.type.scope != Scope.GLOBAL:
        return ""
    gv = s.base.view_of(other)
    if gv is None:
        return ""
    modes = [k for k in range(len(gv.shape)) if gv.static_stride(k) == 1]
    if not modes:
        return f"its global side %{other.name} has no contiguous mode"
    k = modes[0]
    bytes_ = other.type.shape[k] * other.type.dtype.bits // 8
    return (f"its global side %{other.name} is contiguous along mode {k} only "
            f"({other.type.shape[k]} elements, {bytes_} bytes per row)")


def _hint_words(hints: dict[str, Any]) -> str:
    parts = []
    for k, v in hints.items():
        if k == "swizzle":
            if isinstance(v, str) and v.endswith("B"):
                parts.append(f'a {v[:-1]}-byte swizzle (swizzle="{v}")')
            else:
                parts.append(f"swizzle {v}")
        elif k == "stride":
            fixed = [f"stride {w} in mode {i}" for i, w in enumerate(v) if w is not None]
            rows = [f"rows along mode {i}" for i, w in enumerate(v) if w == 1]
            parts.append(", ".join(fixed) + (f" ({rows[0]})" if rows else ""))
        else:
            parts.append(f"{k}={v!r}")
    return " and ".join(parts)


def _row_note(root: Value, hints: dict[str, Any], cand: Any) -> str:
    """Why a swizzle hint cannot work: the swizzle spans more bytes than a row of ``cand`` has."""
    want = hints.get("swizzle")
    d = _orientation(cand) if cand is not None else None
    if not isinstance(want, str) or not want.endswith("B") or d is None or d >= len(root.type.shape):
        return ""
    span = int(want[:-1])
    n = root.type.shape[d]
    row = n * root.type.dtype.bits // 8
    if row >= span:
        return ""
    return (f" A {span}-byte swizzle permutes 16-byte chunks within {span}-byte rows, but a row of "
            f"%{root.name} along mode {d} is {n} x {root.type.dtype} = {row} bytes.")


def hint_conflict(s: Any, root: Value, op: Op, hinted: list[Any], reason: str) -> SynthesisError | None:
    """``op`` accepts none of the hinted candidates of ``root``: if it accepts one without the
    hint, the hint and ``op`` are the two requirements in conflict."""
    lay = root.type.layout
    hints = dict(lay.hints) if isinstance(lay, LayoutVar) else {}
    if not hints:
        return None
    free = _unhinted(s, root)
    accepted, _ = _probe_all(s, root, free, [op])
    if not accepted[id(op)]:
        return None
    good = free[min(accepted[id(op)])]
    alloc = _alloc_of(s, root)
    tried = f"with {hinted[0].layout} ({hinted[0].note}) it fails: {reason}" if hinted else \
        "no candidate layout has it"
    msg = (f"shared tile {_tile(root)}: the layout hint of {describe_op(alloc)} asks for "
           f"{_hint_words(hints)}, but {describe_op(op)} needs "
           f"{_needs(s, root, op, free, accepted[id(op)])}: {tried}."
           f"{_row_note(root, hints, hinted[0] if hinted else None)} "
           f"Without the hint it accepts {good.layout} ({good.note}).")
    return _error(s, msg, [o for o in (alloc, op) if o is not None])


def _unhinted(s: Any, root: Value) -> list[Any]:
    from .shared import WGMMA_LAYOUT_ARCHS, shared_candidates

    has_wgmma = any(Scope.SHARED in (m.a.type.scope, m.b.type.scope) for m in s.g.mmas)
    return shared_candidates(root, s.contiguous_modes(root), has_wgmma and s.arch in WGMMA_LAYOUT_ARCHS,
                             root.type.dtype.bits, hints={})


def shared_conflict(s: Any, root: Value, cands: list[Any],
                    failures: dict[int, tuple[Any, str, Op]]) -> SynthesisError:
    """Find two uses with disjoint accepted candidates (or a hint and a use) and explain both."""
    uses = s.uses.get(root.id, [])
    alloc = _alloc_of(s, root)
    if not cands:
        hints = getattr(root.type.layout, "hints", {})
        for op in uses:
            err = hint_conflict(s, root, op, [], "")
            if err is not None:
                return err
        return _error(s, f"shared tile {_tile(root)} ({describe_op(alloc)}): no candidate layout for shape "
                      f"{root.type.shape} with the hints {hints}",
                      [o for o in [alloc, *uses] if o is not None])
    accepted, reasons = _probe_all(s, root, cands, uses)
    for op in uses:
        if not accepted[id(op)]:
            err = hint_conflict(s, root, op, cands, reasons.get((id(op), 0), "?"))
            if err is not None:
                return err
    for x in uses:
        for y in uses:
            if x is y or not accepted[id(x)] or not accepted[id(y)]:
                continue
            if accepted[id(x)] & accepted[id(y)]:
                continue
            i, j = min(accepted[id(x)]), min(accepted[id(y)])
            msg = (f"shared tile {_tile(root)} ({describe_op(alloc)}) has no layout that serves both "
                   f"{describe_op(x)} and {describe_op(y)}: (1) {describe_op(x)} needs "
                   f"{_needs(s, root, x, cands, accepted[id(x)])}; with {cands[j].layout} ({cands[j].note}) "
                   f"it fails: {reasons.get((id(x), j), '?')}. (2) {describe_op(y)} needs "
                   f"{_needs(s, root, y, cands, accepted[id(y)])}; with {cands[i].layout} ({cands[i].note}) "
                   f"it fails: {reasons.get((id(y), i), '?')}.")
            return _error(s, msg, [x, y])
    for op in uses:
        if not accepted[id(op)]:
            return _error(s, f"shared tile {_tile(root)} ({describe_op(alloc)}): {describe_op(op)} accepts "
                          f"none of its {len(cands)} candidate layouts; with {cands[0].layout} "
                          f"({cands[0].note}): {reasons.get((id(op), 0), '?')}",
                          [o for o in (alloc, op) if o is not None])
    return _error(s, f"shared tile {_tile(root)} ({describe_op(alloc)}): no layout satisfies all of its "
                  f"uses together ({', '.join(describe_op(o) for o in uses)})", uses)


def joint_conflict(s: Any, joint: list[Op], legal: dict[int, list[Any]],
                   by_id: dict[int, Value]) -> SynthesisError:
    """The ops touching several shared roots at once (wgmmas reading A and B) accept no common
    choice of the roots' legal layouts. Either one op accepts no combination (a hint on one
    of its roots may be the cause, and is named), or two ops accept disjoint layouts of a root
    they share: both are named, each with what it needs and why it fails with what the other
    needs."""
    if not joint:
        return _error(s, "no combination of shared layouts satisfies the program", [])
    accepted = {id(op): _accepted_combinations(s, op, legal, by_id) for op in joint}
    for op in joint:
        if not accepted[id(op)]:
            return _single_joint_conflict(s, op, joint, legal, by_id)
    for x in joint:
        for y in joint:
            if x is y:
                continue
            err = _pair_conflict(s, x, y, accepted, legal, by_id)
            if err is not None:
                return err
    names = ", ".join(describe_op(op) for op in joint)
    return _error(s, f"no combination of the legal shared layouts satisfies {names} together (each pair of "
                  "them has a common choice)", list(joint))


_MAX_JOINT = 64         # legal layouts per root tried when explaining a joint conflict
_MAX_COMBINATIONS = 512  # combinations of them lowered per op (an error path: bounded time)


def _joint_roots(op: Op, legal: dict[int, list[Any]]) -> list[int]:
    return sorted({v.root.id for v in op.operands() if v.type.scope == Scope.SHARED and v.root.id in legal})


def _accepted_combinations(s: Any, op: Op, legal: dict[int, list[Any]],
                           by_id: dict[int, Value]) -> list[dict[int, int]]:
    """The combinations (root id -> index into its legal list) of the first legal layouts of
    ``op``'s roots that ``op`` accepts, best first."""
    from itertools import islice, product

    rids = _joint_roots(op, legal)
    out = []
    combos = product(*(range(min(len(legal[r]), _MAX_JOINT)) for r in rids))
    for idx in islice(combos, _MAX_COMBINATIONS):
        picks = {r: legal[r][i][0] for r, i in zip(rids, idx)}
        if _joint_reason(s, op, picks, by_id) is None:
            out.append(dict(zip(rids, idx)))
    return out


def _pair_conflict(s: Any, x: Op, y: Op, accepted: dict[int, list[dict[int, int]]],
                   legal: dict[int, list[Any]], by_id: dict[int, Value]) -> SynthesisError | None:
    """``x`` and ``y`` share roots whose layouts the two accept are disjoint: name both."""
    common = sorted(set(_joint_roots(x, legal)) & set(_joint_roots(y, legal)))
    if not common:
        return None
    ax = {tuple(c[r] for r in common) for c in accepted[id(x)]}
    ay = {tuple(c[r] for r in common) for c in accepted[id(y)]}
    if ax & ay:
        return None
    cx, cy = accepted[id(x)][0], accepted[id(y)][0]

    def shown(c: dict[int, int]) -> str:
        return ", ".join(f"%{by_id[r].name} = {legal[r][c[r]][0].layout} ({legal[r][c[r]][0].note})"
                         for r in common)

    def fails(op: Op, mine: dict[int, int], theirs: dict[int, int]) -> str:
        picks = {r: legal[r][theirs[r] if r in common else mine[r]][0] for r in mine}
        return str(_joint_reason(s, op, picks, by_id) or "?")

    tiles = " and ".join(_tile(by_id[r]) for r in common)
    msg = (f"shared tile {tiles} has no layout that serves both {describe_op(x)} and {describe_op(y)}: "
           f"(1) {describe_op(x)} needs {shown(cx)}; with {shown(cy)} it fails: {fails(x, cx, cy)}. "
           f"(2) {describe_op(y)} needs {shown(cy)}; with {shown(cx)} it fails: {fails(y, cy, cx)}.")
    return _error(s, msg, [x, y])


def _rejecting_use(s: Any, op: Op, joint: list[Op], legal: dict[int, list[Any]], by_id: dict[int, Value],
                   picks: dict[int, Any], reason: str) -> SynthesisError | None:
    """A layout of one of ``op``'s roots that ``op`` accepts, and another use of that root
    (another op reading several shared tiles first, then the root's other uses) that rejects
    it: the two ops in conflict, each with its requirement."""
    for rid in _joint_roots(op, legal):
        root = by_id[rid]
        for cand in _unhinted(s, root):
            trial = dict(picks)
            trial[rid] = cand
            if _joint_reason(s, op, trial, by_id) is not None:
                continue
            why: str | None = None
            for y in joint:
                if y is op or rid not in _joint_roots(y, legal):
                    continue
                theirs = {r: legal[r][0][0] for r in _joint_roots(y, legal)}
                theirs[rid] = cand
                why = _joint_reason(s, y, theirs, by_id)
                if why is not None:
                    break
            else:
                y = None
                for use in s.uses.get(rid, []):
                    if use is op or use in joint:
                        continue
                    _, reasons = _probe_all(s, root, [cand], [use])
                    if (id(use), 0) in reasons:
                        y, why = use, reasons[(id(use), 0)]
                        break
            if y is None or why is None:
                continue
            mine = picks[rid]
            alloc = describe_op(_alloc_of(s, root))
            msg = (f"shared tile {_tile(root)} ({alloc}) has no layout that serves both "
                   f"{describe_op(op)} and {describe_op(y)}: (1) {describe_op(op)} needs %{root.name} = "
                   f"{cand.layout} ({cand.note}); with {mine.layout} ({mine.note}) it fails: {reason}. "
                   f"(2) {describe_op(y)} rejects %{root.name} = {cand.layout}: {why}.")
            return _error(s, msg, [op, y])
    return None


def _single_joint_conflict(s: Any, op: Op, joint: list[Op], legal: dict[int, list[Any]],
                           by_id: dict[int, Value]) -> SynthesisError:
    """``op`` accepts no combination of its roots' legal layouts. A hint on one root that
    excludes the layout ``op`` would take is named."""
    rids = _joint_roots(op, legal)
    picks = {r: legal[r][0][0] for r in rids}
    reason = _joint_reason(s, op, picks, by_id) or "?"
    for rid in rids:
        root = by_id[rid]
        lay = root.type.layout
        if not (isinstance(lay, LayoutVar) and lay.hints):
            continue
        for cand in _unhinted(s, root):
            trial = dict(picks)
            trial[rid] = cand
            if _joint_reason(s, op, trial, by_id) is None and s.check_shared(root, cand)[0] is None:
                alloc = _alloc_of(s, root)
                mine = picks[rid]
                msg = (f"shared tile {_tile(root)}: the layout hint of {describe_op(alloc)} asks for "
                       f"{_hint_words(lay.hints)}, but {describe_op(op)} reads it from shared memory and "
                       f"needs a layout its instruction can address: with {mine.layout} ({mine.note}) it "
                       f"fails: {reason}.{_row_note(root, lay.hints, mine)} Without the hint it works "
                       f"with {cand.layout} ({cand.note}).")
                return _error(s, msg, [o for o in (alloc, op) if o is not None])
    other = _rejecting_use(s, op, joint, legal, by_id, picks, reason)
    if other is not None:
        return other
    shown = ", ".join(f"%{by_id[r].name} = {picks[r].layout} ({picks[r].note})" for r in rids)
    return _error(s, f"{describe_op(op)} accepts no combination of the legal layouts of "
                  f"{', '.join('%' + by_id[r].name for r in rids)}; with {shown}: {reason}", [op])


def _joint_reason(s: Any, op: Op, picks: dict[int, Any], by_id: dict[int, Value]) -> Rejection | None:
    """Why ``op`` rejects the layouts ``picks`` (root id -> candidate), or ``None``."""
    try:
        s.base.with_assignment(s.current.with_layouts({rid: c.layout for rid, c in picks.items()})).check(op)
        return None
    except LoweringError as e:
        return _reason(e)
