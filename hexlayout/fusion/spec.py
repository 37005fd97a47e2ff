"""What a fused kernel computes, as plain frozen data: the interface between a graph front
end (FX partitioning) and the fusion mechanism.

A fused kernel is one **anchor** (an aten op that hexlayout schedules: one that an anchor
record registered with ``fusion.anchors`` runs - ``spec_anchors()`` lists them, e.g. the
matmuls, the row reductions over the last dimension, whose epilogue sees the reduced
``[..., 1]`` value broadcast over the row, and attention) plus

- **prologues**: injective computations that produce an anchor operand from extra tensor
  inputs (cast, scale, dequantization, broadcast, transpose/permute/reshape, elementwise of
  several inputs). ``operand = prologue(extra inputs)`` element by element; the anchor reads
  the operand from the prologue's result instead of from memory;
- an **epilogue**: bijective consumers of the anchor's output (bias, activation, residual
  add, scale, cast, column slices, permute/reshape of an output), with several outputs.

Every computation is a list of ``Node`` s in topological order; a node's arguments refer to

- ``("anchor",)``: in an epilogue, the anchor's output ``Y`` (f32 accumulator semantics);
  in a prologue, not used;
- ``("input", i)``: ``extra_inputs[i]`` of ``run_fused``;
- ``("node", j)``: the result of node ``j`` of the same node list (``j`` < own index);
- ``("const", v)``: a Python scalar (int, float, bool), ``None``, a dtype name (``"f16"``,
  ``"bf16"``, ``"f32"``, ``"int8"``, ...) or a tuple of ints (dims of a permute/view).

Node ``op`` names are aten overloads as FX prints them (``str(node.target)``), e.g.
``"aten.gelu.default"``, ``"aten.add.Tensor"``, ``"aten._to_copy.default"`` (kwargs
``(("dtype", "f16"),)``), ``"aten.permute.default"`` (args ``(x, ("const", (0, 2, 1, 3)))``),
``"aten.view.default"``, ``"aten.slice.Tensor"`` (args ``(x, ("const", dim), ("const", start),
("const", end))``: a column half of a concatenated output). ``kwargs`` are sorted
``(name, value)`` pairs with plain values (a dtype by its hexlayout name).

The semantics of a spec is exactly what torch eager computes when the nodes run as the aten
ops they name (``reference(spec, anchor_args, extra_inputs)`` in ``hexlayout.fusion``);
the fused kernel computes the same with f32 intermediates. ``run_fused`` raises
``FusionUnsupported`` (with the reason) for a spec it cannot fuse; a front end then leaves
those ops to torch with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hexlayout.errors import HexlayoutError

__all__ = ["Node", "Prologue", "Epilogue", "FusedSpec", "FusionUnsupported", "Ref"]

Ref = tuple  # ("anchor",) | ("input", i) | ("node", j) | ("const", value)


class FusionUnsupported(HexlayoutError, ValueError):
    """The spec cannot be fused (``reason`` says why); the caller runs it with torch."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _check_ref(ref: Any, where: str, index: int, *, anchor_ok: bool) -> None:
    if not isinstance(ref, tuple) or not ref or ref[0] not in ("anchor", "input", "node", "const"):
        raise FusionUnsupported(f"{where}: argument {ref!r} is not ('anchor',), ('input', i), "
                                "('node', j) or ('const', value)")
    if ref[0] == "anchor" and not anchor_ok:
        raise FusionUnsupported(f"{where}: a prologue cannot read the anchor's output")
    if ref[0] == "node" and not (len(ref) == 2 and isinstance(ref[1], int) and 0 <= ref[1] < index):
        raise FusionUnsupported(f"{where}: {ref!r} must name an earlier node (index < {index})")
    if ref[0] == "input" and not (len(ref) == 2 and isinstance(ref[1], int) and ref[1] >= 0):
        raise FusionUnsupported(f"{where}: {ref!r} must be ('input', i) with i >= 0")


@dataclass(frozen=True)
class Node:
    """One fused op: ``op(*args, **dict(kwargs))`` with the aten semantics of ``op``."""

    op: str
    args: tuple = ()
    kwargs: tuple = ()

    def refs(self) -> list[Ref]:
        """The tensor arguments (``anchor`` / ``input`` / ``node`` references)."""
        return [a for a in self.args if isinstance(a, tuple) and a and a[0] != "const"]


def _check_nodes(nodes: tuple[Node, ...], where: str, *, anchor_ok: bool) -> None:
    for j, n in enumerate(nodes):
        if not isinstance(n, Node):
            raise FusionUnsupported(f"{where}: node {j} is {type(n).__name__}, not Node")
        for a in n.args:
            _check_ref(a, f"{where} node {j} ({n.op})", j, anchor_ok=anchor_ok)


@dataclass(frozen=True)
class Prologue:
    """Anchor operand ``operand`` (index into the anchor's aten arguments) is the result of
    node ``output`` of ``nodes``, computed from extra inputs (``anchor_args[operand]`` is
    then ignored and may be None)."""

    operand: int
    nodes: tuple[Node, ...]
    output: int

    def __post_init__(self) -> None:
        _check_nodes(self.nodes, f"prologue of operand {self.operand}", anchor_ok=False)
        if not 0 <= self.output < len(self.nodes):
            raise FusionUnsupported(f"prologue of operand {self.operand}: output {self.output} is not "
                                    f"a node index (it has {len(self.nodes)} nodes)")


@dataclass(frozen=True)
class Epilogue:
    """Consumers of the anchor's output ``Y``; ``outputs`` are what the fused kernel returns,
    in order, each ``("anchor",)`` or ``("node", j)``. The default is ``Y`` alone."""

    nodes: tuple[Node, ...] = ()
    outputs: tuple[Ref, ...] = (("anchor",),)

    def __post_init__(self) -> None:
        _check_nodes(self.nodes, "epilogue", anchor_ok=True)
        if not self.outputs:
            raise FusionUnsupported("epilogue: no outputs")
        for o in self.outputs:
            _check_ref(o, "epilogue output", len(self.nodes), anchor_ok=True)
            if o[0] not in ("anchor", "node"):
                raise FusionUnsupported(f"epilogue output {o!r} must be ('anchor',) or ('node', j)")


@dataclass(frozen=True)
class FusedSpec:
    """One fused kernel: ``anchor`` (an aten op name a registered anchor record runs) with its
    constant keyword arguments ``anchor_kwargs`` (sorted pairs, e.g. a matmul's ``beta`` / ``alpha``),
    ``prologues`` (at most one per operand), ``epilogue``, and a display ``name``."""

    anchor: str
    prologues: tuple[Prologue, ...] = ()
    epilogue: Epilogue = field(default_factory=Epilogue)
    name: str = ""
    anchor_kwargs: tuple = ()

    def __post_init__(self) -> None:
        ops = [p.operand for p in self.prologues]
        if len(set(ops)) != len(ops):
            raise FusionUnsupported(f"{self.anchor}: more than one prologue for operand(s) "
                                    f"{sorted({o for o in ops if ops.count(o) > 1})}")

    def prologue_ops(self) -> list[str]:
        """The aten names of the prologue nodes, operand by operand, in node order."""
        return [n.op for p in sorted(self.prologues, key=lambda p: p.operand) for n in p.nodes]

    def epilogue_ops(self) -> list[str]:
        """The aten names of the epilogue nodes, in node order."""
        return [n.op for n in self.epilogue.nodes]

    def display_name(self) -> str:
        """``name`` or one made of the anchor and the fused ops."""
        if self.name:
            return self.name
        short = [self.anchor.split(".")[1]]
        short += [o.split(".")[1] for o in self.prologue_ops() + self.epilogue_ops()]
        return "fused_" + "_".join(short)
