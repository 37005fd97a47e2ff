"""Fusion anchors as records: what the op packages register so that fusion can fuse into
their kernels, while this layer holds only the generic mechanism.

The anchor kernels live in the kernels layer (``hexlayout.ops``), above fusion: each op
package that contributes an anchor registers an ``AnchorRecord`` here when it is imported
(``register_anchor``); importing ``hexlayout.ops`` - or its ``compile_backend``, which
torch's ``torch_dynamo_backends`` entry point names - registers them all. Fusion never
imports that layer (statically or by name) and names no op: the partitioner looks a graph
node's op up in ``ops`` of the records, ``run_fused`` a spec's anchor in their
``spec_ops``; an anchor nobody registered is not an anchor (``FusionUnsupported`` with that
reason for a spec).

A record's callables get the partitioner's view of the graph, ``g`` (see
``partition.GraphView``: ``g.op(n)``, ``g.value(n)``, ``g.shape(n)``, ``g.named_args(n)``,
``g.const(v, n)``, ``g.unclaimed(n)``), and the anchor's ``fx.Node`` ``n``:

- ``admit(g, n) -> str | None``: why ``n`` is not an anchor (the reason the plan shows), or
  None when it is;
- ``operands(g, n) -> tuple``: the arguments a prologue may produce (default: ``n.args``);
- ``prologues(g, n) -> dict[int, list] | None``: the record's own prologue nodes per operand
  instead of the generic walk (attention: only the ``where(m, 0, -inf)`` of a boolean mask);
  ``lower_prologue(g, n, i, nodes, extra_ref) -> ("spec", spec nodes, output)``: how such a
  prologue becomes spec nodes;
- ``to_spec(g, s) -> None``: how the node becomes the spec's anchor; ``s`` is an
  ``AnchorSpec`` holding ``anchor`` (the spec anchor's name, the node's op by default),
  ``order`` (the spec's anchor arguments as indices of ``operands``), ``kwargs`` (its
  constant keyword arguments), ``operands`` (per operand ``("spec", nodes, out)`` - a
  prologue - or ``("ext", node, host views)``), ``implied`` (epilogue nodes the anchor
  itself computes, a fused op's bias or activation) and ``extra_ref(node, views)`` (an
  extra input's reference); the record updates them in place;
- ``run(spec, anchor_args, extra_inputs) -> (outputs, prepared | None)``: the planner and
  runner of a spec whose anchor is in ``spec_ops`` (``FusionUnsupported`` before anything
  runs when it cannot fuse); ``prepared`` (``run._Prepared``'s fields) lets a later call of
  the same spec with arguments of the same shapes only bind and launch;
- ``eager(anchor, args, kwargs)``: the spec anchor's eager meaning, when it is not the aten
  op called with ``args`` and ``kwargs`` (``reference``);
- ``decompositions() -> dict``: aten decompositions the graph front end applies first (the
  softmax that the row reductions fuse as ``amax``, ``exp``, ``sum``);
- ``clear()``: forget the record's memoized plans and builds (``clear_fused_builds``).

Flags: ``rows`` (the anchor reduces rows: the kernel's frame is ``rows x columns``, its
epilogue broadcasts the reduced value over the rows it reduced, and a producer of its
operand that the epilogue also reads joins the prologue and is recomputed in the epilogue);
``tuple_output`` (the op returns a tuple whose element 0 is the output, read through
``getitem``; views of the output and elementwise math of it alone fuse after them, and the
``clone`` a reshape makes of it is free); ``row_prologue``: the largest static row length
``K`` for which a reduction of an operand's rows over their last dimension (an RMSNorm
``x * rsqrt(mean(x * x, -1) + eps) * w`` of the activation) joins that operand's prologue -
a GEMM's A: the kernel then loads whole rows of ``A`` per block (``K <= BK``; its planner
refuses a reduction in another operand's prologue) - instead of being a row
reduction kernel of its own (0: never; a longer row keeps the two kernels and the plan
says so, unless ``row_scale``); ``row_scale``: a longer row's reduction joins the prologue too
when it reaches the operand only as one product by a row value (``row_scale.row_scale``: an
RMSNorm, not a LayerNorm): the anchor sums the rows over its k-loop and scales its product's
rows; a norm several such anchors read is recomputed in each one's prologue when every one
takes its rows (``fused_moe``: rows of any length, its row scale accumulated over its
k-loop); ``row_reductions``: those reductions' aten names; ``epilogue``: False when the
anchor's kernel takes no epilogue (its output is stored as it is and its consumers are left
to torch or other kernels, with that reason).

Graph pass: ``prepare(gm) -> list[str]`` rewrites the aten graph before it is partitioned (the GEMMs:
  two projections of one activation become one GEMM over the weights concatenated once), and
  returns notes for the plan; a node it adds whose target has ``hexlayout_derived = True``
  computes a parameter once (cached), so the plan does not list it as an op left to torch; a
  node whose ``meta[partition.LEFT_TO_TORCH]`` it sets to a reason is left to torch with that
  reason (no kernel anchors it or fuses it: a MoE block's routing).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .spec import FusionUnsupported, Node

__all__ = ["AnchorRecord", "AnchorSpec", "register_anchor", "unregister_anchor", "anchor_records",
           "record_of_op", "record_of_spec", "spec_anchors"]


@dataclass
class AnchorSpec:
    """The spec's anchor as ``AnchorRecord.to_spec`` builds it (see the module docstring)."""

    anchor: str
    order: list[int]
    kwargs: tuple
    operands: dict[int, Any]
    implied: list[Node]
    extra_ref: Callable[[Any, tuple], tuple]


@dataclass(frozen=True)
class AnchorRecord:
    """One family of fusion anchors (see the module docstring for each field)."""

    name: str
    ops: frozenset[str]
    run: Callable[..., tuple[list, dict[str, Any] | None]] | None = None
    spec_ops: frozenset[str] | None = None          # None: ``ops``
    admit: Callable[[Any, Any], str | None] | None = None
    operands: Callable[[Any, Any], tuple] | None = None
    prologues: Callable[[Any, Any], dict[int, list] | None] | None = None
    lower_prologue: Callable[..., tuple] | None = None
    to_spec: Callable[[Any, AnchorSpec], None] | None = None
    eager: Callable[[str, list, dict], Any] | None = None
    decompositions: Callable[[], dict] | None = None
    clear: Callable[[], None] | None = None
    rows: bool = False
    tuple_output: bool = False
    row_prologue: int = 0
    row_reductions: frozenset[str] = frozenset()
    row_scale: bool = False
    prepare: Callable[[Any], list[str]] | None = None
    epilogue: bool = True

    @property
    def runs(self) -> frozenset[str]:
        """The spec anchors ``run`` takes."""
        if self.run is None:
            return frozenset()
        return self.ops if self.spec_ops is None else self.spec_ops


_LOCK = threading.Lock()
_RECORDS: dict[str, AnchorRecord] = {}      # name -> record, in registration order


def register_anchor(record: AnchorRecord) -> AnchorRecord:
    """Register ``record`` (one of the same ``name`` is replaced); returns it."""
    with _LOCK:
        _RECORDS.pop(record.name, None)
        _RECORDS[record.name] = record
    return record


def unregister_anchor(name: str) -> None:
    """Remove the record ``name`` (if any)."""
    with _LOCK:
        _RECORDS.pop(name, None)


def anchor_records() -> list[AnchorRecord]:
    """The registered records, in registration order."""
    return list(_RECORDS.values())


def record_of_op(op: str) -> AnchorRecord | None:
    """The record whose graph ops include ``op`` (the latest registered), or None."""
    return next((r for r in reversed(_RECORDS.values()) if op in r.ops), None)


def record_of_spec(anchor: str) -> AnchorRecord:
    """The record that runs specs anchored at ``anchor`` (``FusionUnsupported`` when none)."""
    hit = next((r for r in reversed(_RECORDS.values()) if anchor in r.runs), None)
    if hit is None:
        known = sorted(spec_anchors())
        raise FusionUnsupported(f"{anchor} is not an anchor any registered anchor record runs "
                                f"({', '.join(known) or 'none registered'}: the kernels layer registers "
                                "them when it is imported - import hexlayout.ops; "
                                "torch.compile(backend='hexlayout') does)")
    return hit


def spec_anchors() -> tuple[str, ...]:
    """Every spec anchor a registered record runs."""
    out: list[str] = []
    for r in _RECORDS.values():
        out += [a for a in sorted(r.runs) if a not in out]
    return tuple(out)
