"""Diagnostics for programs that have no layout assignment.

Every message names the ops in conflict, their source lines (``file:line`` and the code)
and the two requirements that cannot both hold:

- ``no_mma``: no atom of the architecture multiplies the operand types and scopes, or
  none tiles the block with the threads that run the op;
- ``register_conflict``: two requirements give one register tile different layouts
  (e.g. operand a of one mma and the accumulator of another), or an op on the tiles
  cannot be lowered with the layouts the mma choices imply;
- ``shared_conflict``: two uses of a shared tile accept disjoint sets of layouts: a
  layout one accepts is rejected by the other with the lowering's reason, and vice versa.
"""

from __future__ import annotations

from typing import Any

from hexlayout.ir.tile import Mma, Op, Value

__all__ = ["no_mma", "register_conflict", "shared_conflict", "describe_op"]


def describe_op(op: Op | None) -> str:
    if op is None:
        return "(unknown op)"
    name = type(op).__name__.lower()
    if op.loc is None:
        return name
    code = f" `{op.loc.code.strip()}`" if op.loc.code else ""
    return f"{name} at {op.loc.file.rsplit('/', 1)[-1]}:{op.loc.line}{code}"


def _error(s: Any, msg: str, ops: list[Op]) -> Exception:
    from .solve import SynthesisError

    return SynthesisError(s.tk.name, msg, ops)


def no_mma(s: Any, op: Mma) -> Exception:
    a, b, c = op.a.type, op.b.type, op.c.type
    threads = s.threads_of(op)
    what = (f"{describe_op(op)}: no mma atom of {s.arch} computes {c.dtype} += {a.dtype} ({a.scope}) x "
            f"{b.dtype} ({b.scope}) for a {c.shape[0]}x{c.shape[1]}x{a.shape[1]} tile with {threads} threads")
    if op.atom is not None:
        what += f" with the requested atom {op.atom}"
    if op.warps is not None:
        what += f" and warps={op.warps}"
    return _error(s, what, [op])


def _value_names(values: list[Value]) -> str:
    return ", ".join(f"%{v.name}" for v in values[:4])


def register_conflict(s: Any, cands: dict[int, list[Any]], first: list[Any]) -> Exception:
    if not first:
        return _error(s, "no mma choice gives consistent register layouts", list(s.g.mmas))
    ra = first[0]
    if isinstance(ra, str):
        return _error(s, f"with every mma choice an op on register tiles cannot be lowered; first: {ra}",
                      list(s.g.mmas))
    if ra.conflict is not None:
        c = ra.conflict
        (l1, op1, why1), (l2, op2, why2) = c.first, c.second
        tiles = _value_names(c.values)
        msg = (f"register tile {tiles} needs two different layouts: {describe_op(op1)} requires {l1} "
               f"({why1}), but {describe_op(op2)} requires {l2} ({why2})")
        return _error(s, msg, [o for o in (op1, op2) if o is not None])
    names = []
    classes = s.g.classes()
    for cls in ra.unresolved:
        names.append(_value_names(classes.get(cls, [])))
    return _error(s, f"nothing determines the layout of register tile(s) {'; '.join(names)}: they meet "
                  "no mma, explicit layout or global copy", [])


def shared_conflict(s: Any, root: Value, cands: list[Any],
                    failures: dict[int, tuple[Any, str, Op]]) -> Exception:
    """Find two uses with disjoint accepted candidates and explain both sides."""
    uses = s.uses.get(root.id, [])
    if not cands:
        return _error(s, f"shared tile %{root.name}: no candidate layout for shape {root.type.shape} "
                      f"(hints {getattr(root.type.layout, 'hints', {})})", uses)
    accepted: dict[int, set[int]] = {id(op): set() for op in uses}
    reasons: dict[tuple[int, int], str] = {}
    saved = root.type.layout
    from hexlayout.ir.lower.kernel import LoweringError, Prober

    try:
        for i, cand in enumerate(cands):
            root.type = root.type.with_layout(cand.layout)
            prober = Prober(s.tk, s.arch)
            for op in uses:
                try:
                    prober.probe(op)
                    accepted[id(op)].add(i)
                except LoweringError as e:
                    reasons[(id(op), i)] = str(e).split(": ", 2)[-1]
    finally:
        root.type = root.type.with_layout(saved)
    for x in uses:
        for y in uses:
            if x is y or not accepted[id(x)] or not accepted[id(y)]:
                continue
            if accepted[id(x)] & accepted[id(y)]:
                continue
            i = min(accepted[id(x)])
            j = min(accepted[id(y)])
            msg = (f"shared tile %{root.name}: {describe_op(x)} and {describe_op(y)} need incompatible "
                   f"layouts. {describe_op(x)} works with {cands[i].layout} ({cands[i].note}), but with it "
                   f"{describe_op(y)} fails: {reasons.get((id(y), i), '?')}. {describe_op(y)} works with "
                   f"{cands[j].layout} ({cands[j].note}), but with it {describe_op(x)} fails: "
                   f"{reasons.get((id(x), j), '?')}")
            return _error(s, msg, [x, y])
    for op in uses:
        if not accepted[id(op)]:
            first = min(i for i in range(len(cands)))
            return _error(s, f"shared tile %{root.name}: {describe_op(op)} accepts none of its "
                          f"{len(cands)} candidate layouts; with {cands[first].layout}: "
                          f"{reasons.get((id(op), first), '?')}", [op])
    return _error(s, f"shared tile %{root.name}: no layout satisfies all of its uses together", uses)
