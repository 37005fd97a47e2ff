"""The one rewriter of the tile IR: match ops, replace each by zero or more ops.

``rewrite(root, rule, kinds=...)`` calls ``rule(visit)`` for every op of ``root`` (a
``TileKernel`` or ``Block``, nested blocks included, in the order of ``walk``) whose class
is one of ``kinds`` (every op if ``kinds`` is empty). The rule returns

- ``None``: keep the op (its nested blocks are rewritten too);
- a sequence of ops, or a ``Replacement(ops, values)``: the op is removed and ``ops`` take
  its place in the same block (their own nested blocks are not visited again).
  ``values`` maps a value of the removed op to the value that now stands for it.
  Value replacements are applied to the whole program after the walk.

Value identity stays consistent: every value the removed op wrote (``outputs()``) must be
written by one of the new ops (the same ``Value`` object), or be mapped in ``values``, or
have no other use in the program; otherwise ``RewriteError`` names the op, the value and
a user, and the program is left unchanged.
After the walk, every op of ``root`` that mentions a mapped value (``inputs()`` or
``outputs()``) mentions its replacement instead, and views whose ``base`` was a mapped
value are views of the replacement. ``rewrite`` returns the number of ops replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hexlayout.errors import HexlayoutError

from .tile import Block, Op, TileKernel, Value
from .walk import Visit, walk

__all__ = ["Replacement", "RewriteError", "rewrite", "replace_values"]


class RewriteError(HexlayoutError, ValueError):
    """A rewrite rule left a value without its definition while it is still used."""


@dataclass
class Replacement:
    """What a matched op becomes: ``ops`` in its place, ``values`` old -> new value."""

    ops: Sequence[Op] = ()
    values: dict[Value, Value] = field(default_factory=dict)


Rule = Callable[[Visit], "Sequence[Op] | Replacement | None"]


def rewrite(root: TileKernel | Block, rule: Rule, kinds: tuple[type[Op], ...] = ()) -> int:
    """Apply ``rule`` to the ops of ``root`` of the classes ``kinds`` (see the module docstring)."""
    name = root.name if isinstance(root, TileKernel) else "<block>"
    block = root.body if isinstance(root, TileKernel) else root
    mapping: dict[int, Value] = {}
    removed: list[tuple[Op, list[Value]]] = []
    undo: list[tuple[Block, list[Op]]] = []
    count = 0

    def visit(b: Block, parents: tuple[Op, ...]) -> None:
        nonlocal count
        new_ops: list[Op] = []
        for i, op in enumerate(b.ops):
            rep = rule(Visit(op, parents, b, i)) if not kinds or isinstance(op, kinds) else None
            if rep is None:
                new_ops.append(op)
                for nested in op.blocks():
                    visit(nested, parents + (op,))
                continue
            if not isinstance(rep, Replacement):
                rep = Replacement(list(rep))
            written = {v.id for new in rep.ops for v in new.outputs()}
            for old, new in rep.values.items():
                mapping[old.id] = new
            lost = [v for v in op.outputs() if v.id not in written and v.id not in mapping]
            if lost:
                removed.append((op, lost))
            new_ops.extend(rep.ops)
            count += 1
        if len(new_ops) != len(b.ops) or any(x is not y for x, y in zip(new_ops, b.ops)):
            undo.append((b, list(b.ops)))
            b.ops[:] = new_ops

    visit(block, ())
    for op, lost in removed:
        for v in lost:
            user = next((u for u in walk(block) if any(w is v for w in u.values())), None)
            if user is not None:
                for b, ops in reversed(undo):   # leave the program as it was
                    b.ops[:] = ops
                where = f" at {op.loc.format()}" if op.loc is not None else ""
                uwhere = f" ({user.loc.format()})" if user.loc is not None else ""
                raise RewriteError(f"kernel {name}: rewriting {op.name}{where} removed the definition "
                                   f"of %{v.name}, which {user.name}{uwhere} still uses; map it in "
                                   "Replacement.values or write it in the new ops")
    if mapping:
        replace_values(block, mapping)
    return count


def replace_values(root: TileKernel | Block, mapping: dict[int, Value]) -> None:
    """Wherever an op under ``root`` mentions a value ``v`` with ``v.id`` in ``mapping``, it
    mentions ``mapping[v.id]`` instead (chains ``a -> b -> c`` resolve to ``c``); views of
    ``v`` become views of its replacement."""

    def final(v: Value) -> Value:
        seen = 0
        while v.id in mapping and mapping[v.id] is not v:
            v = mapping[v.id]
            seen += 1
            if seen > len(mapping):
                raise RewriteError(f"value replacements form a cycle through %{v.name}")
        return v

    resolved = {k: final(v) for k, v in mapping.items()}
    for op in walk(root):
        op.replace_values(resolved)
        for v in op.values():
            if v.base is not None and v.base.id in resolved:
                v.base = resolved[v.base.id]
