"""Partition an aten-level FX graph into fused hexlayout kernels and ops left to torch.

The graph is the inference graph ``aot_autograd`` gives (aten ops after
functionalization). Every **anchor** - a node whose op an ``AnchorRecord`` registered with
``fusion.anchors`` lists (the op packages register theirs: the matmuls and hexlayout's own
GEMM, the row reductions, attention) and which the record admits - becomes one kernel, in
graph order. A record's ``to_spec`` says how its node becomes the spec's anchor (an op's
bias or activation become epilogue nodes, ``x @ w.t()`` reads ``w`` as it is, ...). An anchor
whose record says ``rows`` reduces rows: its epilogue may broadcast the reduced value over
the rows it reduced (``x * rsqrt(mean(x * x) + eps) * w``), and a producer of its operand
that the epilogue also reads (the norm's ``x.float()``) joins the prologue and is recomputed
in the epilogue:

1. **prologue** of each anchor operand: walking back from the operand, a producer joins
   when it is injective (elementwise, cast, view / permute / transpose, broadcast) and all
   of its users are already in that prologue (a value used elsewhere is read from memory,
   not recomputed);
2. **epilogue**: walking forward in graph order, a consumer joins when it is bijective on
   what it reads from the kernel (elementwise without broadcasting the kernel's value up,
   cast, view / permute, a column slice of ``split`` / ``chunk``, an op of whole heads of a
   2-D anchor's product: ``hexlayout::rope``, which the GEMM record's graph pass puts there)
   and every other input does
   not depend on the kernel (so the kernel can run before it). Kernel values used outside
   the kernel (or returned by the graph) are the kernel's outputs. A split of the output
   joins only when it makes two equal halves that elementwise math reads (``silu(gate) *
   up``); other splits, slices, ``unbind`` and the views of their parts (``q, k, v =
   qkv.split([q, kv, kv], -1)``) are views torch makes of the stored output, without a
   kernel or a copy (left to torch with that reason). Elementwise math of graph inputs
   alone of rank <= 1 that only an epilogue op reads (Gemma's ``1 + w.float()`` of a norm
   weight) joins the epilogue before that op (recomputed per column);

Such a group is convex (no path leaves it and comes back), so replacing it by one call
keeps the graph acyclic. Every other op that computes a tensor is left to torch, with the
reason. A record may find its operands' prologues itself (attention: at most the
``where(m, 0, -inf)`` of a boolean mask); an anchor whose record says ``tuple_output``
(attention) has the views of its output and elementwise math of it alone as its epilogue;
one whose record says ``epilogue=False`` has none (its consumers are left to torch, or other
kernels' prologues, with that reason). A
record with ``row_prologue`` takes a reduction of its operand 0's rows over their last
dimension into that operand's prologue (RMSNorm ``x * rsqrt(mean(x * x, -1) + eps) * w`` as
a GEMM's A prologue): before the walk, each such anchor's prologue is found with row
reductions allowed; when it holds one over rows of static length ``K <= row_prologue``, its
nodes are reserved for that anchor (the reduction is no kernel of its own, no other kernel's
epilogue takes them) - over longer rows too when the record says ``row_scale`` and the
reductions enter the prologue as one row factor (``row_scale.row_scale``) - else the
partition's ``notes`` say ``norm: two kernels (K=... > limit)`` (``three`` for a norm of
two reductions: LayerNorm's mean and variance). A norm read by several such anchors (a MoE
block's router GEMM and experts) is recomputed in each one's prologue - its nodes reserved
for all of them and duplicated in each kernel - when every one of them takes its rows, else
it stays a kernel of its own (``norm: read by N kernels, a kernel of its own (...)``;
``_reserve_shared``). A node a record's graph pass marked ``LEFT_TO_TORCH`` (a MoE block's
routing) is left to torch with its reason. An anchor its record does not admit (attention in
f32, with dropout, ...) is left to torch with the record's reason.

How a group becomes a spec the mechanism runs (``run_fused``; every spec evaluates with
eager aten ops on the arguments it is given):

- views of graph inputs (``view``, ``t``, ``permute``, ``unsqueeze``, ``expand``) are applied
  by the host before the call (free), never put in a prologue; in a prologue, a view that
  adds, drops or broadcasts dimensions of extent 1 of elementwise math of one input
  (``scale.to(f16)[:, None]``) commutes with that math: the host views the input;
- in a kernel whose anchor is 2-D, a reshape that regroups leading dimensions of a computed
  value is free (the value keeps the ``rows x columns`` frame), and tensors of rank > 2 that
  elementwise ops read are flattened to that frame by the host (an op that broadcasts along
  some leading dimensions only is not fused); a permute / reshape of the output ends it
  (views end an output), and ``split`` / ``chunk`` halves along the last dimension become
  ``slice`` nodes;
- specs are shape-free: constant sizes stay constants, and a view whose size has one
  symbolic dimension (dynamic shapes) writes ``-1`` for it, so one spec (and one kernel
  build) serves every sequence length.
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass, field
from typing import Any

from .anchors import AnchorRecord, AnchorSpec, anchor_records, record_of_op
from .aten import BITWISE, CASTS, HEAD_OPS, dtype_name
from .aten import ELEMENTWISE as _MATH
from .aten import VIEWS as _ATEN_VIEWS
from .row_scale import row_scale
from .spec import Epilogue, FusedSpec, Node, Prologue

__all__ = ["partition", "Partition", "Group", "Step", "ELEMENTWISE", "VIEWS", "op_name", "rows", "row",
           "static_int", "GraphView", "LEFT_TO_TORCH"]

#: ``node.meta`` key a record's graph pass (``AnchorRecord.prepare``) sets to a reason: the node
#: is left to torch with it (no kernel anchors it or takes it into a prologue or an epilogue)
LEFT_TO_TORCH = "hexlayout_left_to_torch"

#: Elementwise ops and casts that the mechanism can fuse (``aten.ELEMENTWISE``, ``aten.CASTS``):
#: injective as prologues; bijective as epilogues when the kernel's value is not broadcast up.
ELEMENTWISE = frozenset(_MATH) | frozenset(CASTS)
#: Reshapes and permutations (bijective).
VIEWS = frozenset(_ATEN_VIEWS) - {"aten.expand.default"}
_RESHAPES = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"})
#: Views that pick parts of a kernel's output (left to torch: views of the stored output).
_PART_VIEWS = frozenset({"aten.slice.Tensor", "aten.unbind.int", "aten.select.int"})
_VIEW_REASON = ("a view of a fused kernel's output (a split into parts, a slice, unbind, a view of a "
                "part): torch makes it without a kernel or a copy")
_THROUGH_REASON = ("reads a fused kernel's output through an op left to torch (an epilogue ends at the "
                   "first op the kernel does not fuse)")
#: Views that commute with elementwise math of one input in a prologue (``_commuted``).
_COMMUTING = _RESHAPES | {"aten.unsqueeze.default", "aten.expand.default"}
#: Ops whose result is a view of their first argument, besides ``VIEWS``.
_ALIASES = frozenset({"aten.alias.default", "aten.detach.default", "aten.expand.default", "aten.slice.Tensor",
                      "getitem", "aten.split.Tensor", "aten.split_with_sizes.default"})
#: Broadcasts: injective, so prologue only.
_BROADCASTS = frozenset({"aten.expand.default"})
#: Splits of the kernel's output (epilogue only), read through ``getitem``.
_SPLITS = frozenset({"aten.split.Tensor", "aten.split_with_sizes.default"})
_REDUCTIONS = ("sum", "mean", "amax", "amin", "max", "min", "var", "std", "prod", "argmax", "argmin",
               "logsumexp", "_softmax", "_log_softmax", "cumsum", "norm", "linalg_vector_norm")


def op_name(target: Any) -> str:
    """The op's name as FX prints it (``aten.add.Tensor``)."""
    if target is operator.getitem:
        return "getitem"
    if hasattr(target, "_schema"):
        return str(target)
    return getattr(target, "__qualname__", str(target))


def rows(t: Any) -> Any:
    """``t`` as ``rows x columns``: its leading dimensions flattened."""
    return t.reshape(-1, t.shape[-1])


def row(t: Any) -> Any:
    """``t`` (leading dimensions of size 1) as one row."""
    return t.reshape(1, t.shape[-1])


class _NotFusible(Exception):
    """An argument a spec cannot express (the message says which)."""


@dataclass(frozen=True)
class Step:
    """One op of a group as the torch fallback runs it: ``target(*args, **kwargs)`` with
    ``Slot`` references (``("slot", k)``) to the group's inputs and earlier steps."""

    target: Any
    args: tuple
    kwargs: dict


@dataclass
class Group:
    """One fused kernel: the spec, the FX nodes it replaces and how to call it."""

    spec: FusedSpec
    anchor: Any                       # the anchor fx.Node
    nodes: list                       # every fx.Node of the group, in graph order
    inputs: list                      # external fx.Nodes (tensors first, then symbolic ints)
    n_tensors: int                    # how many of ``inputs`` are tensors
    outputs: list                     # fx.Nodes whose values the kernel returns
    anchor_args: list                 # per anchor argument: index into ``kernel_inputs`` or None
    extra_inputs: list                # per spec ("input", i): index into ``kernel_inputs``
    kernel_inputs: list               # (index into ``inputs``, host views: ((target, args), ...))
    out_shapes: list                  # per output: its sizes (-1: the symbolic one), or None
    ops: tuple = ()                   # (anchor op, prologue ops, epilogue ops) of the graph
    clone_outputs: list = field(default_factory=list)   # per output: it views an earlier output
    steps: list = field(default_factory=list)   # the torch fallback program
    out_slots: list = field(default_factory=list)


@dataclass
class Partition:
    """The fused groups and the ops left to torch (``(fx.Node, reason)``)."""

    groups: list
    fallbacks: list
    notes: list = field(default_factory=list)     # planning decisions the plan reports


def _val(n: Any) -> Any:
    return n.meta.get("val") if hasattr(n, "meta") else None


def _is_tensor(v: Any) -> bool:
    import torch

    return isinstance(v, torch.Tensor)


def _computes_tensor(n: Any) -> bool:
    v = _val(n)
    if _is_tensor(v):
        return True
    return isinstance(v, (list, tuple)) and any(_is_tensor(x) for x in v)


def static_int(x: Any) -> int | None:
    """``x`` as an int when it is one (a constant ``SymInt`` included), else None."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    try:
        import torch

        if isinstance(x, torch.SymInt) and x.node.is_constant():
            return int(x.node.maybe_as_int())
    except Exception:  # pragma: no cover - symbolic internals vary across torch versions
        return None
    return None


def _same(a: Any, b: Any) -> bool:
    """Whether two sizes are equal for every value of their symbols."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    try:
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        return bool(statically_known_true(a == b))
    except Exception:  # pragma: no cover - symbolic internals vary across torch versions
        return False


def _shape(n: Any) -> tuple:
    return tuple(_val(n).shape)


def _arg_nodes(n: Any) -> list:
    from torch.fx import Node as FxNode
    from torch.fx.node import map_arg

    out: list = []
    map_arg((n.args, n.kwargs), lambda a: out.append(a) if isinstance(a, FxNode) else None)
    return out


def _kind_reason(op: str) -> str:
    record = record_of_op(op)
    if record is not None:
        return f"{record.name} anchor not fused"
    base = op.split(".")[1] if op.startswith("aten.") else op
    if base in _REDUCTIONS:
        return "a reduction: neither an injective prologue nor a bijective epilogue of an anchor"
    return "not an anchor and not a fusible op (elementwise, cast, view/permute, split)"


class _KernelInputs:
    """A group's kernel inputs: ``kin`` the (fx.Node, host steps) pairs, ``extra`` per spec
    ``("input", i)`` its index into ``kin``. ``tag`` tells apart uses of one tensor that the
    kernel reads in different tile frames (an operand's prologue and the epilogue: the
    residual ``x`` of ``x + linear(norm(x))``): each is an input of its own."""

    def __init__(self) -> None:
        self.kin: list = []
        self.keys: list = []
        self.extra: list = []
        self.tag: Any = None

    def kernel_input(self, a: Any, steps: tuple) -> int:
        if not _is_tensor(_val(a)):
            raise _NotFusible(f"{a.name} is a symbolic value, not a tensor")
        if (a, steps, self.tag) not in self.keys:
            self.keys.append((a, steps, self.tag))
            self.kin.append((a, steps))
        return self.keys.index((a, steps, self.tag))

    def extra_ref(self, a: Any, steps: tuple) -> tuple:
        """The spec reference of input ``a`` seen through the host views ``steps``."""
        k = self.kernel_input(a, steps)
        if k not in self.extra:
            self.extra.append(k)
        return ("input", self.extra.index(k))


class GraphView:
    """What an anchor record's callables see of the graph (``anchors.AnchorRecord``): the op
    of a node, its value (``meta["val"]``), shape and arguments by name, a constant argument
    as a spec holds it, whether a node is still free to join a kernel, graph ``order``, the
    current ``anchor``, ``untranspose`` (drop an operand's trailing 2-D transpose) and
    ``prologue`` (the generic walk back from one operand)."""

    anchor: Any = None
    order: dict

    def op(self, n: Any) -> str:
        return op_name(n.target) if n.op == "call_function" else n.op

    @staticmethod
    def value(n: Any) -> Any:
        return _val(n)

    @staticmethod
    def shape(n: Any) -> tuple:
        return _shape(n)

    @staticmethod
    def named_args(n: Any) -> dict:
        """An op node's arguments by their schema names (``self``, ``dim``, ``keepdim``, ...)."""
        names = [a.name for a in n.target._schema.arguments]
        return dict(zip(names, n.args)) | dict(n.kwargs)


class _Partitioner(GraphView):
    def __init__(self, gm: Any) -> None:
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}
        self.claimed: dict[Any, Any] = {}      # fx.Node -> anchor fx.Node
        self.flat = False                      # whether the current anchor is 2-D
        self.kernels: dict[Any, tuple] = {}    # anchor fx.Node -> (members bit mask, external inputs)
        self.prologue_nodes: set = set()       # the current kernel's prologue nodes
        self.row_shape: tuple | None = None    # a row reduction's operand shape (its epilogue's frame)
        self.epilogue_users: set = set()       # epilogue nodes a prologue node may also feed
        self.bit = {n: 1 << i for i, n in enumerate(self.nodes)}
        self.anc: dict[Any, int] = {}          # node -> bit mask of the nodes it depends on
        for n in self.nodes:
            mask = 0
            for d in _arg_nodes(n):
                mask |= self.bit[d] | self.anc[d]
            self.anc[n] = mask
        self.why: dict[Any, str] = {}          # fx.Node -> why it was not fused
        self.record: AnchorRecord | None = None   # the current anchor's record
        self.reserved: dict[Any, set] = {}     # fx.Node -> the anchors whose A prologue (a norm) it joins
        self.row_walk = False                  # the reservation walk: row reductions may join a prologue
        self.relaxed = False                   # the shared-norm walk: every producer's users are ignored
        self.notes: list[str] = []

    # --- op classes -----------------------------------------------------------------------------
    def _op(self, n: Any) -> str:
        return self.op(n)

    def unclaimed(self, n: Any) -> bool:
        """Whether ``n`` is in no kernel yet."""
        return n not in self.claimed

    def const(self, v: Any, n: Any) -> tuple:
        """Argument ``v`` of ``n`` as a spec constant ``("const", value)`` (else not fusible)."""
        return self._const(v, n)

    def _tuple_output(self, n: Any) -> bool:
        """Whether ``n`` is an anchor whose result is a tuple (its output is element 0)."""
        record = record_of_op(self._op(n)) if hasattr(n, "op") else None
        return record is not None and record.tuple_output

    def _expressible(self, n: Any) -> bool:
        """Whether a spec can hold ``n``'s arguments (else the reason is kept)."""
        import torch

        reshape = self._op(n) in _RESHAPES
        v = _val(n)
        if self._op(n) in BITWISE and (not _is_tensor(v) or v.dtype.is_floating_point
                                       or v.dtype == torch.bool):
            self.why.setdefault(n, f"{self._op(n)} ({n.name}): bitwise ops fuse on integer tensors only")
            return False
        for a in [*n.args, *n.kwargs.values()]:
            try:
                if hasattr(a, "op"):
                    if not _is_tensor(_val(a)):
                        raise _NotFusible(f"{self._op(n)} ({n.name}) reads the symbolic value {a.name}")
                elif not isinstance(a, (torch.memory_format, torch.device, torch.layout)):
                    self._const(a, n, reshape=reshape)
            except _NotFusible as e:
                self.why.setdefault(n, f"not expressible in a fused kernel: {e}")
                return False
        return True

    def _leading_view(self, n: Any) -> bool:
        """A reshape that changes nothing, or (in a kernel whose anchor is 2-D) only regroups
        the leading dimensions (``[B, S, N] <-> [B*S, N]``): free in the kernel's frame."""
        if self._op(n) not in _RESHAPES or not hasattr(n.args[0], "op"):
            return False
        src, out = _shape(n.args[0]), _shape(n)
        if len(src) == len(out) and all(_same(a, b) for a, b in zip(src, out)):
            return True
        return self.flat and len(src) >= 2 and len(out) >= 2 and _same(src[-1], out[-1])

    def _frame_ok(self, n: Any) -> bool:
        """An elementwise op of rank > 2 in a 2-D kernel: every tensor it reads is either
        broadcast along all leading dimensions or along none (so it is the same op in the
        flattened ``rows x columns`` frame)."""
        if not self.flat or self._op(n) not in ELEMENTWISE:
            return True
        lead = _shape(n)[:-1]
        if len(lead) < 2:
            return True
        for a in _arg_nodes(n):
            s = _shape(a) if _is_tensor(_val(a)) else ()
            if len(s) <= 1 or all(_same(x, 1) for x in s[:-1]):
                continue
            if len(s) == len(lead) + 1 and all(_same(x, y) for x, y in zip(s[:-1], lead)):
                continue
            self.why.setdefault(n, f"broadcasts {a.name} {list(s)} along some of the leading dimensions "
                                   f"of {list(_shape(n))} only (not expressible in the kernel's 2-D frame)")
            return False
        return True

    def _left(self, n: Any) -> bool:
        """Whether a graph pass left ``n`` to torch (``LEFT_TO_TORCH``; the reason kept)."""
        reason = n.meta.get(LEFT_TO_TORCH) if hasattr(n, "meta") else None
        if reason:
            self.why.setdefault(n, reason)
        return bool(reason)

    def _prologue_ok(self, n: Any) -> bool:
        op = self._op(n)
        if self._left(n):
            return False
        owners = self.reserved.get(n)
        if owners and self.anchor not in owners:
            return False
        rowred = op in self._row_ops() and (self.row_walk or bool(owners)) and self._last_row(n)
        return n.op == "call_function" and (op in ELEMENTWISE or op in VIEWS or op in _BROADCASTS or rowred) \
            and _is_tensor(_val(n)) and self._expressible(n) and self._frame_ok(n)

    def _row_ops(self) -> frozenset:
        """The row reductions the current anchor's record takes into a prologue."""
        return self.record.row_reductions if self.record is not None else frozenset()

    def _last_row(self, n: Any) -> bool:
        """A reduction over the last dimension only, with ``keepdim`` (``mean(x, -1, True)``)."""
        named = self.named_args(n)
        dims, rank = named.get("dim"), len(_shape(n))
        return bool(named.get("keepdim")) and named.get("dtype") is None and isinstance(dims, (list, tuple)) \
            and len(dims) == 1 and static_int(dims[0]) is not None and static_int(dims[0]) % rank == rank - 1

    def _reserve_rows(self) -> None:
        """Reserve each ``row_prologue`` anchor's operand prologue when it holds a row reduction over
        rows that fit (``K <= record.row_prologue``); note the norms that do not fit."""
        why = dict(self.why)
        shared = self._reserve_shared()
        for n in self.nodes:
            record = record_of_op(self._op(n)) if n.op == "call_function" else None
            if record is None or not (record.row_prologue or record.row_scale) or n in shared or \
                    not self._admitted(record, n):
                continue
            self.record, self.anchor, self.epilogue_users = record, n, set()
            self.flat = _is_tensor(_val(n)) and len(_shape(n)) == 2
            nodes, reds = self._row_walk(n)
            if not reds:
                continue
            ks = [static_int(_shape(r.args[0])[-1]) for r in reds]
            if all(k is not None and k <= record.row_prologue for k in ks) or \
                    (record.row_scale and self._row_scaled(nodes)):
                for p in nodes:
                    self.reserved[p] = {n}
            else:
                k = next(k for k in ks if k is None or k > record.row_prologue)
                count = {2: "two", 3: "three"}.get(len(reds) + 1, str(len(reds) + 1))
                limit = f"K={'symbolic' if k is None else k} > {record.row_prologue}" if record.row_prologue \
                    else "not a row factor of the operand"
                self.notes.append(f"norm: {count} kernels ({limit}) before {self._op(n)} ({n.name})")
        self.why = why
        self.record = None

    def _row_scaled(self, nodes: list) -> bool:
        """Whether the prologue ``nodes`` (graph order, the operand last) takes its row
        reductions through one product by a row value (``row_scale``): then the anchor
        accumulates the row sums over its k-loop and applies the row factor to its product."""
        from torch.fx import Node as FxNode

        index = {p: j for j, p in enumerate(nodes)}

        def arg(a: Any) -> Any:
            if isinstance(a, FxNode):
                if a in index:
                    return index[a]
                return "s" if _is_tensor(_val(a)) and _val(a).numel() == 1 else "t"
            return "s"

        def flat(a: Any) -> list:
            return [x for b in a for x in flat(b)] if isinstance(a, (list, tuple)) else [a]

        ops = [self._op(p) for p in nodes]
        args = [[arg(a) for a in flat(p.args)] for p in nodes]
        return row_scale(ops, args, len(nodes) - 1, self._row_ops()) is not None

    def _reserve_shared(self) -> set:
        """Norms read by several ``row_prologue`` anchors (the router GEMM and the experts of a
        MoE block both read the second RMSNorm): each such anchor's prologue walk ignoring
        users (``relaxed``); then, to a fixed point, a node keeps an anchor only when each of
        its users is that anchor or in the prologue of one of the anchors it keeps, and the
        node is reached from the anchor's operand through nodes it keeps. A reduction kept by
        several anchors is recomputed in each one's prologue (its nodes reserved for all of
        them, duplicated like a cheap producer) when every one of them takes its rows
        (``K <= record.row_prologue``); else none does (the norm stays a kernel of its own, as
        a norm read twice always was) and the notes say why. Returns the anchors whose
        prologues were reserved here."""
        walks: dict[Any, tuple] = {}
        for n in self.nodes:
            record = record_of_op(self._op(n)) if n.op == "call_function" else None
            if record is None or not (record.row_prologue or record.row_scale) or \
                    not self._admitted(record, n):
                continue
            self.record, self.anchor, self.epilogue_users = record, n, set()
            self.flat = _is_tensor(_val(n)) and len(_shape(n)) == 2
            self.relaxed = True
            try:
                nodes, reds = self._row_walk(n)
            finally:
                self.relaxed = False
            if reds:
                walks[n] = (record, nodes[-1], nodes)    # the operand: the latest of its producers
        owners: dict[Any, set] = {}
        for a, (_, _, nodes) in walks.items():
            for p in nodes:
                owners.setdefault(p, set()).add(a)
        changed = True
        while changed:
            changed = False
            for p in list(owners):
                if not all(any(u is b or b in owners.get(u, ()) for b in owners[p]) for u in p.users):
                    del owners[p]
                    changed = True
            for a, (_, operand, _) in walks.items():
                keep: set = set()
                work = [operand] if a in owners.get(operand, ()) else []
                while work:
                    p = work.pop()
                    if p not in keep:
                        keep.add(p)
                        work.extend(d for d in _arg_nodes(p) if a in owners.get(d, ()))
                for p in list(owners):
                    if a in owners[p] and p not in keep:
                        owners[p].discard(a)
                        changed = True
                        if not owners[p]:
                            del owners[p]
        done: set = set()
        for r in [p for p in self.nodes if len(owners.get(p, ())) > 1]:
            family = owners[r]
            if family <= done:
                continue
            too_long = []
            for a in sorted(family, key=self.order.__getitem__):
                record = walks[a][0]
                mine = [p for p in walks[a][2] if a in owners.get(p, ())]
                scaled = record.row_scale and self._row_scaled(mine)
                for red in (p for p in owners if a in owners[p] and self._op(p) in record.row_reductions):
                    k = static_int(_shape(red.args[0])[-1])
                    if (k is None or k > record.row_prologue) and not scaled:
                        limit = f"K={'symbolic' if k is None else k} > {record.row_prologue}" \
                            if record.row_prologue else "not a row factor"
                        too_long.append(f"{limit} for {self._op(a)} ({a.name})")
                        break
            if too_long:
                self.notes.append(f"norm: read by {len(family)} kernels, a kernel of its own (not recomputed "
                                  f"in each: {'; '.join(too_long)})")
                done |= family
                continue
            for p, s in owners.items():
                if s & family:
                    self.reserved[p] = set(s & family)
            done |= family
        self.record = None
        return {a for a in done if any(a in s for s in self.reserved.values())}

    def _row_walk(self, n: Any) -> tuple[list, list]:
        """The prologue of the first operand of anchor ``n`` whose producers hold a row
        reduction (row reductions allowed), and those reductions (empty: none does)."""
        for a in self._operands(n):
            if not hasattr(a, "op") or not _is_tensor(_val(a)) or len(_shape(a)) < 2:
                continue
            self.row_walk = True
            try:
                nodes = self._prologue(n, a)
            finally:
                self.row_walk = False
            reds = [p for p in nodes if self._op(p) in self._row_ops()]
            if reds:
                return nodes, reds
        return [], []

    def _epilogue_ok(self, n: Any, group: set, viewed: set) -> bool:
        op = self._op(n)
        if n.op != "call_function" or self._left(n):
            return False
        owners = self.reserved.get(n)
        if owners and self.anchor not in owners:
            names = ", ".join(o.name for o in sorted(owners, key=self.order.__getitem__))
            self.why.setdefault(n, f"joins the A prologue of {names} (a norm)")
            return False
        if op == "getitem":
            src = n.args[0]
            if self._tuple_output(src):
                return src in group and n.args[1] == 0
            return src in group and self._op(src) in _SPLITS
        if op in _PART_VIEWS:
            self.why.setdefault(n, _VIEW_REASON)
            return False
        if op in VIEWS and self._expressible(n):
            return True
        if op == "aten.clone.default" and self._tuple_output(self._base(n.args[0])):
            return True                 # reshape's copy of attention's transposed output: free
        if op == "aten.clone.default" and n.args[0] in viewed and \
                self._op(n.args[0]) == "aten.permute.default" and self._expressible(n):
            return True                 # a permuted output made contiguous: the kernel stores it so
        if any(a in viewed for a in _arg_nodes(n)):
            if op in ELEMENTWISE and _is_tensor(_val(n)) and all(a in group for a in _arg_nodes(n)) and \
                    any(self._tuple_output(g) for g in group) and self._expressible(n):
                return True             # attention: math of its (viewed) output alone, in its store
            self.why.setdefault(n, "reads a permuted / reshaped output of the kernel (views end a "
                                   "kernel's output)")
            return False
        if op in _SPLITS:
            src = _shape(n.args[0])
            dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)
            if dim % len(src) != len(src) - 1:
                self.why.setdefault(n, "splits the kernel's output along a dimension other than the last")
                return False
            if not self._halves(n, src):
                self.why.setdefault(n, _VIEW_REASON)
                return False
            return True

        if op in HEAD_OPS:                  # rope of the product: a tile of whole heads
            if not (self.flat and n.args[0] in group and self._expressible(n)):
                self.why.setdefault(n, "an op of whole heads fuses only into a 2-D GEMM's epilogue, of its "
                                       "product")
                return False
            return True
        if not _is_tensor(_val(n)) or not self._expressible(n) or not self._frame_ok(n):
            return False
        if op in ELEMENTWISE:
            out = _val(n)
            row = self.row_shape is not None and len(_shape(n)) == len(self.row_shape) and \
                all(_same(x, y) for x, y in zip(_shape(n), self.row_shape))
            for a in _arg_nodes(n):
                if a in group and _is_tensor(_val(a)) and _val(a).numel() != out.numel() and not row:
                    self.why.setdefault(n, "broadcasts the kernel's output up (not bijective)")
                    return False
            return True
        return False

    @staticmethod
    def _halves(n: Any, src: tuple) -> bool:
        """Whether split ``n`` of a value of sizes ``src`` (along the last dimension) makes two
        equal halves that elementwise math reads, directly or through reshapes (a gated
        ``silu(gate) * up``): the kernel
        computes those in its column tiles. Other splits (``q, k, v = qkv.split([q, kv, kv],
        -1)``) are views torch makes of the kernel's stored output."""
        size = static_int(src[-1])
        if size is None or size % 2:
            return False
        parts = n.args[1]
        if isinstance(parts, (list, tuple)):
            if [static_int(x) for x in parts] != [size // 2, size // 2]:
                return False
        elif static_int(parts) != size // 2:
            return False
        def math(v: Any) -> bool:          # elementwise math reads v (through reshapes)
            return any(w.op == "call_function" and getattr(w.target, "__name__", "") != "getitem" and
                       (str(w.target) in _MATH or (str(w.target) in _RESHAPES and math(w))) for w in v.users)

        return any(_is_tensor(_val(u)) and math(u) for u in n.users)

    # --- the walk -------------------------------------------------------------------------------
    def run(self) -> Partition:
        groups = []
        self._reserve_rows()
        for n in self.nodes:
            record = record_of_op(self._op(n)) if n.op == "call_function" else None
            if record is None or n in self.claimed or n in self.reserved or not self._admitted(record, n):
                continue
            g = self._group(record, n)
            if g is not None:
                groups.append(g)
                self.kernels[n] = (self._mask(g.nodes), list(g.inputs))
        groups = self._acyclic(groups)
        return Partition(groups, self._fallbacks(), self.notes)

    def _admitted(self, record: AnchorRecord, n: Any) -> bool:
        """Whether ``n`` is an anchor of ``record`` (else the reason is kept)."""
        why = n.meta.get(LEFT_TO_TORCH) or None
        if why is None and not record.tuple_output and not _is_tensor(_val(n)):
            why = "its value is not a tensor"
        elif why is None and record.admit is not None:
            self.anchor = n
            why = record.admit(self, n)
        if why is not None:
            self.why[n] = why
        return why is None

    def _fallbacks(self) -> list:
        """Every op that computes a tensor and is in no kernel, with the reason."""
        fallbacks = []
        for n in self.nodes:
            if n.op != "call_function" or n in self.claimed or not _computes_tensor(n):
                continue
            op = self._op(n)
            if op == "getitem" or getattr(n.target, "hexlayout_derived", False):
                continue                  # a derived parameter (``AnchorRecord.prepare``): not run per call
            if n.meta.get(LEFT_TO_TORCH):
                fallbacks.append((n, n.meta[LEFT_TO_TORCH]))
                continue
            if op in ELEMENTWISE or op in VIEWS or op in _BROADCASTS or op in _SPLITS:
                reason = self.why.get(n, "no anchor kernel to fuse into: it neither produces an anchor's "
                                         "operand alone nor consumes an anchor's output")
            else:
                reason = self.why.get(n, _kind_reason(op))
            fallbacks.append((n, reason))
        return fallbacks

    def _acyclic(self, groups: list) -> list:
        """``groups`` without any that would wait on a kernel waiting on it (a safety net:
        the epilogue walk avoids these); their ops go back to torch with the reason."""
        while True:
            masks = [self._mask(g.nodes) for g in groups]
            after = {i: {j for j, mj in enumerate(masks) if j != i and
                         any((self.bit[d] | self.anc[d]) & mj for d in g.inputs)}
                     for i, g in enumerate(groups)}
            bad = next((i for i in after if self._reaches(after, i)), None)
            if bad is None:
                return groups
            for n in groups[bad].nodes:
                self.claimed.pop(n, None)
                self.why[n] = "its kernel and another would wait for each other's outputs"
            groups = groups[:bad] + groups[bad + 1:]

    def _mask(self, nodes: list) -> int:
        """The bit mask of a kernel's nodes for the order between kernels: without a norm
        several kernels recompute (reading it waits on its inputs, not on one of them)."""
        return sum(self.bit[m] for m in nodes if len(self.reserved.get(m, ())) < 2)

    @staticmethod
    def _reaches(after: dict, start: int) -> bool:
        seen, work = set(), list(after[start])
        while work:
            j = work.pop()
            if j == start:
                return True
            if j not in seen:
                seen.add(j)
                work.extend(after[j])
        return False

    def _prologue(self, anchor: Any, operand: Any) -> list:
        """The producers of ``operand`` that join its prologue (graph order)."""
        if (operand in self.claimed and not self._duplicated(operand)) or not self._prologue_ok(operand):
            return []
        if any(u is not anchor and u not in self.epilogue_users and not self._shared(operand, u)
               for u in operand.users) or sum(1 for a in anchor.args if a is operand) != 1:
            self.why.setdefault(operand, "its result is also used outside the kernel it would be a "
                                         "prologue of (not recomputed)")
            return []
        taken = {operand}
        work = [a for a in _arg_nodes(operand)]
        while work:
            work.sort(key=self.order.__getitem__)
            p = work.pop()              # latest first: its users are decided before it
            if p in taken or (p in self.claimed and not self._duplicated(p)) or not self._prologue_ok(p):
                continue
            if all(u in taken or u in self.epilogue_users or self._shared(p, u) for u in p.users):
                taken.add(p)
                work.extend(a for a in _arg_nodes(p) if a not in taken)
            elif any(u in taken for u in p.users):
                self.why.setdefault(p, "its result is also used outside the kernel it would be a "
                                       "prologue of (not recomputed)")
        return sorted(taken, key=self.order.__getitem__)

    def _duplicated(self, p: Any) -> bool:
        """Whether ``p`` is reserved for the current anchor's prologue (a norm several anchors
        recompute: another kernel may have claimed it already)."""
        return self.anchor in self.reserved.get(p, ())

    def _shared(self, p: Any, u: Any) -> bool:
        """Whether user ``u`` of ``p`` reads it in the prologue of another anchor ``p`` is
        reserved for too (``_reserve_shared``), or the walk ignores users (``relaxed``)."""
        if self.relaxed:
            return True
        owners = self.reserved.get(p, ())
        return self.anchor in owners and any(
            b is not self.anchor and (u is b or b in self.reserved.get(u, ())) for b in owners)

    def _cycle(self, n: Any, members: set, ext: list) -> bool:
        """Whether adding ``n`` (reading ``ext`` from outside) to the kernel of ``members``
        would make it and an earlier kernel each wait for the other's output (through ops
        left to torch)."""
        mine = self._mask(list(members)) | self.bit[n]
        inputs = [d for d in [*ext, *self.ext_of(members)] if d not in members and d is not n]
        for other, (mask, their_inputs) in self.kernels.items():
            if any((self.bit[d] | self.anc[d]) & mask for d in inputs) and \
                    any((self.bit[i] | self.anc[i]) & mine for i in their_inputs):
                self.why.setdefault(n, f"reads kernel {other.name}'s output, which reads this kernel's "
                                       "(fusing it would make the two kernels wait for each other)")
                return True
        return False

    def ext_of(self, members: set) -> list:
        """The values ``members`` read from outside."""
        return [d for m in members for d in _arg_nodes(m) if d not in members]

    def _epilogue(self, anchor: Any) -> list:
        group = {anchor}
        depends = {anchor}              # nodes that depend on the group
        viewed: set = set()             # group values after a permute / a non-leading reshape
        taken = []
        for n in self.nodes[self.order[anchor] + 1:]:
            deps = _arg_nodes(n)
            if not any(d in depends for d in deps):
                continue
            outside = [d for d in deps if d in depends and d not in group]
            if not outside and n not in self.claimed and self._epilogue_ok(n, group, viewed) and \
                    not self._cycle(n, group | self.prologue_nodes, [d for d in deps if d not in group]):
                pulled = self._input_math(n, group)
                group.update(pulled)
                taken.extend(pulled)
                group.add(n)
                taken.append(n)
                if (self._op(n) in VIEWS and not self._leading_view(n)) or \
                        any(a in viewed for a in _arg_nodes(n)):
                    viewed.add(n)
            elif outside and n.op == "call_function" and self._op(n) in VIEWS | _PART_VIEWS | _SPLITS and \
                    all(self._op(d) in VIEWS | _PART_VIEWS | _SPLITS | {"getitem"} for d in outside):
                self.why.setdefault(n, _VIEW_REASON)
            elif outside and n.op == "call_function" and self._op(n) in ELEMENTWISE | VIEWS:
                self.why.setdefault(n, _THROUGH_REASON)
            depends.add(n)
        return taken

    def _input_math(self, n: Any, group: set) -> list:
        """The values elementwise epilogue op ``n`` reads that are elementwise math of graph
        inputs alone, rank <= 1 and read by ``n`` only - Gemma's ``1 + w.float()`` of a norm
        weight - with their producers of the same kind (graph order): recomputed in the
        kernel's epilogue from the inputs (per column), not left to torch."""
        if self._op(n) not in ELEMENTWISE:
            return []
        out: list = []

        def chain(d: Any) -> bool:
            if d.op in ("placeholder", "get_attr"):
                return True
            if d.op != "call_function" or d in group or d in out or not self.unclaimed(d) or \
                    self._op(d) not in ELEMENTWISE or len(d.users) != 1 or not _is_tensor(_val(d)) or \
                    _val(d).dim() > 1 or not self._expressible(d):
                return False
            if not all(chain(a) for a in _arg_nodes(d)):
                return False
            out.append(d)
            return True

        for d in _arg_nodes(n):
            if d not in group and d.op == "call_function":
                before = len(out)
                if not chain(d):
                    del out[before:]
        return sorted(out, key=self.order.__getitem__)

    def _operands(self, anchor: Any) -> tuple:
        """The anchor's arguments that are operands (a prologue may produce them)."""
        if self.record is not None and self.record.operands is not None:
            return tuple(self.record.operands(self, anchor))
        return tuple(anchor.args)

    def _group(self, record: AnchorRecord, anchor: Any) -> Group | None:
        """The kernel of ``anchor`` (its nodes claimed), or None (the reason kept)."""
        self.record, self.anchor = record, anchor
        # a row reduction's frame: rows x columns; a 2-D anchor's too (attention's output is 4-D)
        self.flat = record.rows or (_is_tensor(_val(anchor)) and len(_shape(anchor)) == 2)
        self.row_shape = _shape(anchor.args[0]) if record.rows else None
        self.epilogue_users: set = set()
        prologues = self._prologues(anchor)
        self.claimed[anchor] = anchor
        epi = self._epilogue(anchor) if record.epilogue else []
        if not record.epilogue:
            for u in anchor.users:
                self.why[u] = f"reads the output of a {record.name} kernel, which takes no epilogue"
        for e in epi:
            self.claimed[e] = anchor
        if record.rows and epi:
            # producers of the operand that the epilogue reads too join the prologue (recomputed)
            for p in self.prologue_nodes:
                del self.claimed[p]
            self.epilogue_users = set(epi)
            prologues = self._prologues(anchor)
            self.epilogue_users = set()
        try:
            return self._build(anchor, prologues, epi)
        except _NotFusible as e:
            for nodes in (*prologues.values(), epi, [anchor]):
                for n in nodes:
                    self.claimed.pop(n, None)
                    self.why[n] = f"not expressible in a fused kernel: {e}"
            return None

    def _prologues(self, anchor: Any) -> dict[int, list]:
        """Each operand's prologue nodes (claimed; also ``self.prologue_nodes``): the record's
        own, or the generic walk back from each operand."""
        prologues: dict[int, list] = {}
        if self.record is not None and self.record.prologues is not None:
            prologues = dict(self.record.prologues(self, anchor) or {})
        else:
            for i, a in enumerate(self._operands(anchor)):
                if hasattr(a, "op"):
                    nodes = self._prologue(anchor, a)
                    if nodes:
                        prologues[i] = nodes
        self.prologue_nodes = {p for nodes in prologues.values() for p in nodes}
        for p in self.prologue_nodes:
            self.claimed[p] = anchor
        return prologues

    # --- spec -----------------------------------------------------------------------------------
    def _build(self, anchor: Any, prologues: dict[int, list], epi: list) -> Group:
        """The group of ``anchor``: its spec, and the torch program of its nodes."""
        members = {anchor, *epi, *(p for ps in prologues.values() for p in ps)}
        inputs = _KernelInputs()
        operands = self._lower_operands(anchor, prologues, inputs)
        s = self._anchor_spec(anchor, operands, inputs)
        prologue_specs, anchor_args = [], []
        for pos, i in enumerate(s.order):
            o = s.operands[i]
            if o[0] == "spec":
                prologue_specs.append(Prologue(pos, tuple(o[1]), o[2]))
                anchor_args.append(None)
            else:
                anchor_args.append(inputs.kernel_input(o[1], o[2]))
        refs, flat, epi_nodes = self._lower_epilogue(anchor, prologues, epi, s, inputs)
        outputs = self._outputs(anchor, epi, members, refs)
        out_shapes = [self._sizes(o, strict=o in flat) for o in outputs]
        spec = FusedSpec(s.anchor, tuple(prologue_specs),
                         Epilogue(tuple(epi_nodes), tuple(refs[o] for o in outputs)), anchor_kwargs=s.kwargs)
        spec = FusedSpec(spec.anchor, spec.prologues, spec.epilogue, spec.display_name(), s.kwargs)
        ordered = sorted(members, key=self.order.__getitem__)
        group = self._fallback_program(spec, anchor, ordered, outputs, anchor_args, inputs, out_shapes)
        group.ops = (self._op(anchor), [self._op(n) for ps in prologues.values() for n in ps],
                     [self._op(n) for n in epi if self._op(n) != "getitem"])
        return group

    def _lower_operands(self, anchor: Any, prologues: dict[int, list],
                        inputs: _KernelInputs) -> dict[int, Any]:
        """Per operand: a prologue's spec nodes ``("spec", nodes, out)``, or an input with the
        views the host applies ``("ext", node, steps)``."""
        operands: dict[int, Any] = {}
        record = self.record
        for i, a in enumerate(self._operands(anchor)):
            if i in prologues and record is not None and record.lower_prologue is not None:
                operands[i] = record.lower_prologue(self, anchor, i, prologues[i], inputs.extra_ref)
            elif i in prologues:
                refs: dict[Any, tuple] = {}
                spec_nodes: list[Node] = []
                inputs.tag = None if record is not None and record.rows else ("operand", i)
                try:
                    self._lower(prologues[i], refs, set(), spec_nodes, inputs.extra_ref, commute=True)
                finally:
                    inputs.tag = None
                r = refs[a]
                operands[i] = ("spec", *_live(spec_nodes, r[1])) if r[0] == "node" else r
            elif hasattr(a, "op"):
                operands[i] = ("ext", a, ())
            else:
                raise _NotFusible(f"anchor argument {i} is {a!r}, not a tensor")
        return operands

    def _anchor_spec(self, anchor: Any, operands: dict[int, Any], inputs: _KernelInputs) -> AnchorSpec:
        """The spec's anchor: the node's op and arguments, as its record's ``to_spec`` makes them."""
        s = AnchorSpec(self._op(anchor), list(range(len(anchor.args))), (), operands, [], inputs.extra_ref)
        if self.record is not None and self.record.to_spec is not None:
            self.record.to_spec(self, s)
        else:
            s.kwargs = tuple(sorted((k, self._const(v, anchor)[1]) for k, v in anchor.kwargs.items()))
        return s

    def _lower_epilogue(self, anchor: Any, prologues: dict[int, list], epi: list, s: AnchorSpec,
                        inputs: _KernelInputs) -> tuple[dict, set, list]:
        """The epilogue's spec nodes after those the anchor implies; for a row reduction,
        prologue values the epilogue reads are recomputed in it (from the same inputs)."""
        refs = {anchor: ("node", len(s.implied) - 1) if s.implied else ("anchor",)}
        flat: set = set()
        epi_nodes: list[Node] = list(s.implied)
        if self.record is not None and self.record.rows:
            pro = {p for ps in prologues.values() for p in ps}
            need: set = set()
            work = [a for e in epi for a in _arg_nodes(e) if a in pro]
            while work:
                p = work.pop()
                if p not in need:
                    need.add(p)
                    work.extend(a for a in _arg_nodes(p) if a in pro)
            self._lower(sorted(need, key=self.order.__getitem__), refs, flat, epi_nodes, inputs.extra_ref)
        self._lower(epi, refs, flat, epi_nodes, inputs.extra_ref)
        return refs, flat, epi_nodes

    def _outputs(self, anchor: Any, epi: list, members: set, refs: dict) -> list:
        """The kernel's values used outside it (an anchor's tuple result is not one)."""
        tuple_output = self.record is not None and self.record.tuple_output
        outputs = [n for n in [anchor, *epi] if self._op(n) not in _SPLITS
                   and any(u not in members for u in n.users)
                   and not (n is anchor and tuple_output and not _is_tensor(_val(n)))]
        if not outputs:
            raise _NotFusible("the kernel's values are not used")
        if any(refs[o][0] == "ext" for o in outputs):
            raise _NotFusible("an output is a view of an input")
        return outputs

    def _fallback_program(self, spec: FusedSpec, anchor: Any, ordered: list, outputs: list, anchor_args: list,
                          inputs: _KernelInputs, out_shapes: list) -> Group:
        """The group, with its torch fallback: every member in graph order, reading the
        external inputs."""
        from torch.fx.node import map_arg

        members = set(ordered)
        ext: list = []
        for n in ordered:
            for a in _arg_nodes(n):
                if a not in members and a not in ext:
                    ext.append(a)
        tensors = [a for a in ext if _is_tensor(_val(a))]
        new_inputs = tensors + [a for a in ext if not _is_tensor(_val(a))]
        bases = [self._base(o) for o in outputs]
        group = Group(spec, anchor, ordered, new_inputs, len(tensors), outputs,
                      anchor_args, list(inputs.extra), [(new_inputs.index(a), st) for a, st in inputs.kin],
                      out_shapes)
        group.clone_outputs = [b in bases[:i] for i, b in enumerate(bases)]
        slots = {a: ("slot", i) for i, a in enumerate(new_inputs)}
        for n in ordered:
            args = map_arg(n.args, slots.__getitem__)
            kwargs = map_arg(n.kwargs, slots.__getitem__)
            group.steps.append(Step(n.target, args, dict(kwargs)))
            slots[n] = ("slot", len(new_inputs) + len(group.steps) - 1)
        group.out_slots = [slots[o][1] for o in outputs]
        return group

    def untranspose(self, operands: dict[int, Any], b_i: int) -> bool:
        """If operand ``b_i`` ends in a 2-D transpose, drop it (in place) and say so."""
        return self._untranspose(operands, b_i)

    def prologue(self, anchor: Any, operand: Any) -> list:
        """The generic prologue walk back from one ``operand`` of ``anchor`` (graph order; a
        record's ``prologues`` that fuses only some operands uses it)."""
        return self._prologue(anchor, operand)

    @staticmethod
    def _untranspose(operands: dict[int, Any], b_i: int) -> bool:
        """If operand ``b_i`` ends in a 2-D transpose, drop it (in place) and say so."""
        def is_t(name: str, args: tuple) -> bool:
            if name == "aten.t.default":
                return True
            if name == "aten.transpose.int":
                return {a % 2 for a in args} == {0, 1}
            return name == "aten.permute.default" and tuple(args[0]) == (1, 0)

        o = operands[b_i]
        if o[0] == "ext":
            if o[2] and is_t(op_name(o[2][-1][0]), o[2][-1][1]):
                operands[b_i] = ("ext", o[1], o[2][:-1])
                return True
            return False
        nodes, out = o[1], o[2]
        last = nodes[out]
        if out == len(nodes) - 1 and is_t(last.op, tuple(a[1] for a in last.args[1:])) \
                and last.args[0][0] == "node":
            operands[b_i] = ("spec", nodes[:-1], last.args[0][1])
            return True
        return False

    def _to_frame(self, n: Any, a: Any, steps: tuple) -> tuple:
        """The host views of input ``a`` of ``n``, and for an elementwise op of logical rank
        > 2 in a 2-D kernel its flattening into the ``rows x columns`` frame."""
        if not self.flat or self._op(n) not in ELEMENTWISE or len(_shape(n)) <= 2:
            return steps
        s = _shape(a)
        if len(s) <= 1:
            return steps
        return steps + ((row if all(_same(x, 1) for x in s[:-1]) else rows, ()),)

    def _sizes(self, n: Any, *, strict: bool = True) -> tuple | None:
        """``n``'s sizes with ``-1`` for its one symbolic size (None, or an error when
        ``strict``, if it has more)."""
        sizes = [static_int(x) for x in _shape(n)]
        if sum(x is None for x in sizes) > 1:
            if strict:
                raise _NotFusible(f"{n.name} has more than one symbolic size")
            return None
        return tuple(-1 if x is None else x for x in sizes)

    def _base(self, n: Any) -> Any:
        """The value ``n`` is a view of (``n`` itself when it is not a view)."""
        while self._op(n) in VIEWS or self._op(n) in _ALIASES:
            n = n.args[0]
        return n

    def _host_step(self, n: Any) -> tuple:
        """A view of an input as the host applies it: ``(target, constant args)``."""
        reshape = self._op(n) in _RESHAPES
        return (n.target, tuple(self._const(a, n, reshape=reshape)[1] for a in n.args[1:]))

    def _unary_of_input(self, n: Any, refs: dict, unary: dict) -> tuple | None:
        """``(input, host steps, chain)`` when ``n`` is a chain of elementwise ops of one
        tensor (the others constants: a cast, a scale by a number) applied to a (viewed)
        input, else None."""
        if n in unary:
            return unary[n]
        if self._op(n) not in ELEMENTWISE:
            return None
        args = _arg_nodes(n)
        if len(args) != 1:
            return None
        a = args[0]
        if a in unary:
            base, steps, chain = unary[a]
            return base, steps, chain + [n]
        r = refs.get(a)
        if r is None:
            return a, (), [n]
        if r[0] == "ext":
            return r[1], r[2], [n]
        inner = self._unary_of_input(a, refs, unary) if hasattr(a, "op") else None
        if inner is not None:            # a longer chain: ((p >> 4) & 15)
            base, steps, chain = inner
            return base, steps, chain + [n]
        return None

    def _commuted(self, n: Any, refs: dict, unary: dict, flat: set, out: list, extra_ref: Any) -> bool:
        """A view that only adds or drops dimensions of extent 1 or broadcasts them
        (``unsqueeze``, ``expand``, ``view``) of elementwise math of one input -
        ``unsqueeze(to(scale, f16), 1)`` - commutes with that math: the host views the input
        and the math is lowered again on the viewed input (``refs[n]``); the math's first
        lowering is left dead (``_live`` drops it). Whether it did."""
        src = n.args[0]
        found = self._unary_of_input(src, refs, unary) if hasattr(src, "op") else None
        if found is None or self._op(n) not in _COMMUTING:
            return False
        if self._op(n) in _RESHAPES and [x for x in _shape(n) if not _same(x, 1)] != \
                [x for x in _shape(src) if not _same(x, 1)]:
            return False
        base, steps, chain = found
        viewed = ("ext", base, steps + (self._host_step(n),))
        local = dict(refs)
        first = _arg_nodes(chain[0])[0]
        local[first] = viewed
        for c in chain:
            out.append(self._spec_node(c, local, flat, out, extra_ref))
            local[c] = ("node", len(out) - 1)
        refs[n] = local[chain[-1]]
        unary[n] = (base, viewed[2], chain)
        return True

    def _lower(self, nodes: list, refs: dict, flat: set, out: list, extra_ref: Any, *,
               commute: bool = False) -> None:
        """Spec nodes of ``nodes`` (graph order) appended to ``out``; ``refs`` maps each to its
        reference. Views of an input are the host's (``("ext", input, steps)``, resolved
        where read); in a 2-D kernel a leading reshape of a computed value is free (it keeps
        the ``rows x columns`` frame; ``flat`` holds the values whose logical rank is > 2).
        ``commute`` (prologues): a view of a cast input moves onto the input (``_commuted``)."""
        unary: dict = {}
        for n in nodes:
            op = self._op(n)
            if op in _SPLITS:
                continue                        # its parts are the getitems' slices
            src = n.args[0] if n.args else None
            if commute and op in _COMMUTING and self._commuted(n, refs, unary, flat, out, extra_ref):
                continue
            if (op in VIEWS or op in _BROADCASTS) and hasattr(src, "op") and \
                    (src not in refs or refs[src][0] == "ext"):
                base, steps = (src, ()) if src not in refs else refs[src][1:]
                refs[n] = ("ext", base, steps + (self._host_step(n),))
                continue
            if op == "getitem" and self._tuple_output(src):
                refs[n] = refs[src]                     # a tuple-valued anchor's output (attention's)
                continue
            if self._leading_view(n):
                refs[n] = refs[src]
                if len(_shape(n)) > 2:
                    flat.add(n)
                else:
                    flat.discard(n)
                continue
            if op == "getitem":
                node = self._slice_of(n, refs, flat)
                if n.args[0].args[0] in flat:
                    flat.add(n)
            else:
                node = self._spec_node(n, refs, flat, out, extra_ref)
                if (op in ELEMENTWISE or op in self._row_ops()) and len(_shape(n)) > 2 and self.flat:
                    flat.add(n)
            out.append(node)
            refs[n] = ("node", len(out) - 1)

    def _const(self, v: Any, n: Any, *, reshape: bool = False) -> tuple:
        import torch

        if v is None or isinstance(v, (bool, str)):
            return ("const", v)
        if isinstance(v, numbers.Number):
            return ("const", v)
        if isinstance(v, torch.dtype):
            return ("const", dtype_name(v))
        if isinstance(v, (list, tuple)):
            ints = [static_int(x) for x in v]
            if all(x is not None for x in ints):
                return ("const", tuple(ints))
            if reshape and sum(x is None for x in ints) == 1:
                return ("const", tuple(-1 if x is None else x for x in ints))
            raise _NotFusible(f"{self._op(n)} ({n.name}) has symbolic sizes {list(v)}")
        raise _NotFusible(f"{self._op(n)} ({n.name}) has an argument {v!r} a fused kernel cannot hold")

    def _spec_node(self, n: Any, refs: dict, flat: set, out: list, extra_ref: Any) -> Node:
        import torch

        op = self._op(n)
        reshape = op in _RESHAPES
        elementwise = op in ELEMENTWISE or op in self._row_ops()    # (rows: in the 2-D frame)

        def conv(a: Any) -> tuple:
            if not hasattr(a, "op"):
                return self._const(a, n, reshape=reshape)
            r = refs.get(a)
            if r is None:
                return extra_ref(a, self._to_frame(n, a, ()))
            if r[0] == "ext":                    # a view of an input: the host's
                return extra_ref(r[1], self._to_frame(n, a, r[2]))
            if a in flat and not elementwise:   # a view of a flattened value sees its logical sizes
                out.append(Node("aten.view.default", (r, ("const", self._sizes(a)))))
                r = ("node", len(out) - 1)
            return r

        args = tuple(conv(a) for a in n.args)
        if op in self._row_ops():           # over the frame's columns (``_last_row``)
            return Node(op, (args[0], ("const", (-1,)), ("const", True)))
        kwargs = []
        for k, v in sorted(n.kwargs.items()):
            if op == "aten.clone.default" and k == "memory_format":
                continue                        # values are the same in any memory format
            if op in CASTS and k in ("layout", "device", "pin_memory", "memory_format"):
                if k == "device" and v is not None and _val(n).device != _val(n.args[0]).device:
                    raise _NotFusible(f"{n.name} moves a tensor to {v}")
                continue
            if isinstance(v, torch.memory_format):
                raise _NotFusible(f"{op} ({n.name}) asks for memory format {v}")
            kwargs.append((k, conv(v) if hasattr(v, "op") else conv(v)[1]))
        return Node(op, args, tuple(kwargs))

    def _slice_of(self, getitem: Any, refs: dict, flat: set) -> Node:
        split, k = getitem.args
        src = split.args[0]
        shape = _shape(src)
        dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        dim = dim % len(shape)
        size = static_int(shape[dim])
        if self._op(split) == "aten.split.Tensor":
            step = static_int(split.args[1])
            if step is None or size is None:
                raise _NotFusible(f"{split.name} splits a symbolic size")
            start, end = k * step, min((k + 1) * step, size)
        else:
            sizes = [static_int(x) for x in split.args[1]]
            if any(x is None for x in sizes):
                raise _NotFusible(f"{split.name} splits into symbolic sizes")
            start, end = sum(sizes[:k]), sum(sizes[:k + 1])
        if src in flat:
            dim = 1                              # the last dimension of the 2-D frame
        return Node("aten.slice.Tensor", (refs[src], ("const", dim), ("const", start), ("const", end)))


def _live(nodes: list[Node], out: int) -> tuple[list[Node], int]:
    """``nodes`` without those node ``out`` does not read (directly or through others),
    renumbered; and ``out``'s new index."""
    keep = {out}
    for j in range(out, -1, -1):
        if j in keep:
            keep.update(a[1] for a in nodes[j].args if isinstance(a, tuple) and a and a[0] == "node")
    new = {j: i for i, j in enumerate(sorted(keep))}

    def ref(a: Any) -> Any:
        return ("node", new[a[1]]) if isinstance(a, tuple) and a and a[0] == "node" else a

    return [Node(nodes[j].op, tuple(ref(a) for a in nodes[j].args), nodes[j].kwargs)
            for j in sorted(keep)], new[out]


def partition(gm: Any) -> Partition:
    """Partition ``gm`` (an aten-level ``torch.fx.GraphModule`` whose nodes carry
    ``meta["val"]``): the fused groups and the ops left to torch with their reasons. Each
    record's ``prepare`` rewrites ``gm`` first (its notes lead the partition's)."""
    notes: list[str] = []
    for record in anchor_records():
        if record.prepare is not None:
            notes += record.prepare(gm)
    part = _Partitioner(gm).run()
    part.notes[:0] = notes
    return part

