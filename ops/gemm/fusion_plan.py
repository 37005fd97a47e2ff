"""Planning a fused GEMM call: from a ``FusedSpec`` and its arguments to the kernel plan.

``plan_call(spec, anchor_args, extra_inputs)`` reads the aten semantics of the anchor:

- ``aten.mm.default(a[M,K], b[K,N])``, ``aten.addmm.default(bias, a, b, beta=1, alpha=1)``
  (``beta * bias + alpha * (a @ b)``: two epilogue nodes before the spec's own),
  ``aten.linear.default(x[..., K], w[N,K], bias=None)`` (``x`` flattened to ``M x K``,
  outputs given back the leading dims), ``aten.bmm.default(a[B,M,K], b[B,K,N])`` (one
  launch per batch entry, one build);
- ``b`` given as ``K x N`` row-major runs the ``"kn"`` kernel, its transpose (a ``.t()`` of
  an ``N x K`` row-major tensor, as ``linear``'s weight) the ``"nk"`` one;
- extra inputs are placed against the frame they are used in (the output ``M x N``, a
  column half ``M x N/2``, or a prologue's operand): a mode equal to the frame's is a full
  mode, a mode of 1 broadcasts (stride 0; a one-element tensor is a ``1 x 1`` tile, read on
  the device, never synchronized to the host); Python numbers are runtime scalar parameters;
- epilogue outputs that end in views (``view``, ``permute``, ``t``, ``transpose``,
  ``reshape``, ``unsqueeze``, ``squeeze``) are stored unviewed and returned as the same view
  of the stored tensor (values, shape and strides as eager's);
- column slices of the anchor's output into two halves (``split`` of a concatenated
  gate/up projection): the kernel computes column tiles of ``BN`` whose first ``BN/2``
  columns are from the first half and last ``BN/2`` from the second (``B``'s columns
  re-laid out once per weight and cached), and each half is a tile half;
- a ``hexlayout::rope`` of the product (``fusion.rope``: RoPE of the q / k heads) reads its
  tables as rows of one head (``T x D``) and its position ids one per row; the column tile
  holds whole heads (``rope_head_dim``) and the epilogue is not staged in windows;
- a prologue written through reshapes that group an operand's columns (per-group
  dequantization ``w.view(N, K/g, g) * scale[N, K/g, 1]``, int4 unpacking): the reshapes are
  identities in the operand's frame and its per-group / per-position inputs are gathered
  (``fusion_groups``);
- a reduction of A's rows in A's prologue (RMSNorm ``x * rsqrt(mean(x * x, -1) + eps) * w``,
  ``NORM_REDUCTIONS``) needs each A tile to hold whole rows:
  ``K <= NORM_MAX_K``, and the kernel runs with ``BK`` the power of two ``>= K``
  (``norm_consts``), so its K loop runs once per tile; a longer row fuses when the
  reductions enter the prologue as one row factor of its value (``TilePlan.row_scale``,
  ``hexlayout.fusion.row_scale``: RMSNorm, not LayerNorm): the kernel keeps its tiles, sums
  the rows over its k-loop and scales the product's rows.

It returns the call's ``TilePlan`` (shape-free: the part of the build key), the tile
problem (``m``, ``n``, ``k``, batch), the host tensors each parameter receives and what the
host does to the outputs; anything that cannot fuse raises ``FusionUnsupported``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from hexlayout.fusion.aten import SLICES, VIEWS, dtype_name, is_fusible
from hexlayout.fusion.mechanism import InputSpec, TilePlan
from hexlayout.fusion.planning import (
    arch_of,
    bind_inputs,
    clear_meta,
    host_shapes,
    meta_eval,
    meta_tensors,
    place,
    sig,
)
from hexlayout.fusion.reference import eval_nodes, reference
from hexlayout.fusion.rope import ROPE
from hexlayout.fusion.row_scale import row_scale
from hexlayout.fusion.spec import FusedSpec, FusionUnsupported, Node, Prologue

from .fusion_groups import flat_views, grouped_host, regroup

__all__ = ["GemmCall", "plan_call", "planned", "gemm_binder", "bind_inputs", "host_shapes", "output_frames",
           "rope_head_dim", "rope_unsupported",
           "clear_plans", "NORM_MAX_K", "NORM_REDUCTIONS", "norm_prologue", "norm_consts"]

#: the longest row (``K``) a GEMM's A prologue reduces whole (an RMSNorm of the activation):
#: a ``BM x K`` tile of A and a ``BN x K`` tile of B per stage, two stages in 48 KiB of shared
#: memory; longer rows take the norm as a row factor of the product (``row_scale``) or keep it
#: as a row-reduction kernel of its own
NORM_MAX_K = 128
#: the reductions over the last dimension (``keepdim``) an A prologue may hold (``TilePlan.row_reductions``)
NORM_REDUCTIONS = {"aten.mean.dim": "mean", "aten.sum.dim_IntList": "sum"}

_LOCK = threading.Lock()
_TRANSPOSES = ("aten.t.default", "aten.transpose.int", "aten.permute.default")


@dataclass
class GemmCall:
    """One planned call (see the module docstring)."""

    arch: str
    dtype: Any                   # torch dtype of a / b
    b_layout: str
    staged: bool
    a: Any                       # M x K (or B x M x K), None when a prologue computes it
    b: Any                       # N x K ("nk") / K x N ("kn") (batched for bmm), None likewise
    m: int
    n: int
    k: int
    batch: int | None
    lead: tuple[int, ...]        # linear: the leading dims of the output
    plan: TilePlan
    inputs: list[Any]            # host values of the plan's inputs (rank-2 tensors / numbers)
    out_views: list[list[Node]]  # per output, the trailing view nodes to apply on the host
    out_shapes: list[tuple[int, ...]]


def _is_rowmajor(t: Any) -> bool:
    """A row-major contiguous matrix (strides of modes of extent 1 free)."""
    return (t.dim() == 2 and (t.stride(1) == 1 or t.shape[1] <= 1)
            and (t.stride(0) == t.shape[1] or t.shape[0] <= 1))


def _trailing_views(nodes: tuple[Node, ...], ref: tuple) -> tuple[tuple, list[Node]]:
    """The output ``ref`` without its trailing view nodes, and those nodes in order."""
    chain: list[Node] = []
    while ref[0] == "node" and nodes[ref[1]].op in VIEWS:
        n = nodes[ref[1]]
        chain.insert(0, n)
        ref = n.args[0]
    return ref, chain


_RESHAPE_OPS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def _heads_output(nodes: tuple[Node, ...], ref: tuple) -> tuple[tuple, int, int, list[int]] | None:
    """An output ``clone(permute(reshape(y, [B, T, H, hd]), (0, 2, 1, 3)))`` (a projection
    materialized as ``[B, H, T, hd]`` heads): ``(y's ref, H, hd, the chain's node indices)``,
    or None. ``H`` and ``hd`` are static."""
    if ref[0] != "node" or nodes[ref[1]].op != "aten.clone.default":
        return None
    chain = [ref[1]]
    p = nodes[ref[1]].args[0]
    if p[0] != "node" or nodes[p[1]].op != "aten.permute.default" or \
            tuple(nodes[p[1]].args[1][1]) not in ((0, 2, 1, 3), (0, 2, 1, -1), (-4, -2, -3, -1)):
        return None
    chain.append(p[1])
    r = nodes[p[1]].args[0]
    if r[0] != "node" or nodes[r[1]].op not in _RESHAPE_OPS or len(nodes[r[1]].args) < 2:
        return None
    shape = tuple(nodes[r[1]].args[1][1])
    if len(shape) != 4 or not all(isinstance(x, int) and x > 0 for x in shape[2:]):
        return None
    while r[0] == "node" and nodes[r[1]].op in _RESHAPE_OPS:
        chain.append(r[1])
        r = nodes[r[1]].args[0]
    return r, shape[2], shape[3], chain


def _frames(nodes: tuple[Node, ...], base: str) -> list[str]:
    """Per node, the frame it runs in (``base`` or ``"half"`` after a column slice)."""
    out: list[str] = []
    for n in nodes:
        if n.op in SLICES:
            out.append("half")
            continue
        out.append(next((out[a[1]] for a in n.args if isinstance(a, tuple) and a and a[0] == "node"), base))
    return out


def _shift(ref: tuple, offset: int, anchor_to: tuple) -> tuple:
    if ref[0] == "anchor":
        return anchor_to
    if ref[0] == "node":
        return ("node", ref[1] + offset)
    return ref


@dataclass(frozen=True)
class _Recipe:
    """How a call's host values come from its arguments (the same for every call with one
    plan): operand positions, whether ``a`` is flattened and how ``b`` is turned, which
    anchor arguments are extra inputs too (a bias), and each input's frame."""

    anchor: str
    a_i: int | None                      # None: a prologue computes it
    b_i: int | None
    b_layout: str
    batched: bool
    m: int
    k: int
    implied: tuple[int, ...]
    frames: tuple[tuple | None, ...]
    expand: tuple[bool, ...] = ()
    groups: tuple[tuple[str, int] | None, ...] = ()


def _expanded(host: list, r: _Recipe) -> list:
    """Host values with the broadcast inputs of prologues expanded (stride 0) to their frame
    (``InputSpec.expand``)."""
    if not any(r.expand):
        return host
    return [h.expand(*f) if e else h for h, e, f in zip(host, r.expand, r.frames)]


def _host_values(r: _Recipe, args: list[Any], extra_inputs: list[Any], where: str) -> tuple[Any, Any, list]:
    """``(a, b, inputs)`` as the kernel takes them, for this call's arguments."""
    a_host = b_host = None
    if r.a_i is not None:
        a_host = args[r.a_i].reshape(r.m, r.k) if r.anchor == "aten.linear.default" else args[r.a_i]
    if r.b_i is not None:
        b = args[r.b_i]
        if r.batched:
            b_host = b if r.b_layout == "kn" else b.transpose(1, 2)
        elif r.anchor == "aten.linear.default":
            b_host = b
        else:
            b_host = b if r.b_layout == "kn" else b.t()
    inputs = [*extra_inputs, *(args[i] for i in r.implied)]
    groups = r.groups or (None,) * len(inputs)
    host = [0.0 if f is None else grouped_host(t, g, f) if g is not None else place(t, f, where, i)[1]
            for i, (t, f, g) in enumerate(zip(inputs, r.frames, groups))]
    return a_host, b_host, _expanded(host, r)


def gemm_binder(call: GemmCall, recipe: _Recipe, extra_inputs: list[Any]) -> Any:
    """``bind(anchor_args, extra_inputs) -> (a, b, inputs)`` for later calls with the shapes,
    strides, dtypes and devices of ``call``'s (the planning of ``plan_call`` done once)."""
    shapes = list(host_shapes(call.inputs))
    for i, f in enumerate(recipe.frames):
        if f is None:
            shapes[i] = None
    shapes = tuple(shapes)
    r = recipe
    linear = r.anchor == "aten.linear.default"

    def bind(args: list[Any], extra: list[Any]) -> tuple[Any, Any, list[Any]]:
        a_host = b_host = None
        if r.a_i is not None:
            a_host = args[r.a_i].reshape(r.m, r.k) if linear else args[r.a_i]
        if r.b_i is not None:
            b = args[r.b_i]
            if r.batched:
                b_host = b if r.b_layout == "kn" else b.transpose(1, 2)
            elif linear:
                b_host = b
            else:
                b_host = b if r.b_layout == "kn" else b.t()
        inputs = [*extra, *(args[i] for i in r.implied)] if r.implied else extra
        return a_host, b_host, _expanded(bind_inputs(shapes, inputs), r)

    return bind


_PLANS: dict[tuple, tuple[GemmCall, _Recipe]] = {}


def plan_call(spec: FusedSpec, anchor_args: list[Any], extra_inputs: list[Any]) -> GemmCall:
    """How to run ``spec`` on these arguments (raises ``FusionUnsupported``). Memoized on the
    spec and the arguments' shapes, strides, dtypes and devices: a later call only binds its
    own tensors and numbers."""
    return planned(spec, anchor_args, extra_inputs)[0]


def planned(spec: FusedSpec, anchor_args: list[Any], extra_inputs: list[Any]) -> tuple[GemmCall, _Recipe]:
    """``plan_call``'s call and the recipe of its host values."""
    import dataclasses

    key = (spec, sig(anchor_args), sig(extra_inputs), os.environ.get("HEXLAYOUT_EMULATE_ARCH"))
    try:
        hit = _PLANS.get(key)
    except TypeError:                    # an unhashable constant in the spec
        hit, key = None, None
    if hit is None:
        hit = _plan(spec, list(anchor_args), list(extra_inputs))
        if key is not None:
            with _LOCK:
                if len(_PLANS) > 4096:
                    _PLANS.clear()
                _PLANS[key] = hit
    template, recipe = hit
    a, b, host = _host_values(recipe, list(anchor_args), list(extra_inputs), spec.display_name())
    return dataclasses.replace(template, a=a, b=b, inputs=host), recipe


@dataclass
class _Anchor:
    """What the aten semantics of a matmul anchor say: which arguments are A and B, the
    epilogue nodes the anchor itself implies (``pre``: a bias, ``addmm``'s ``beta`` /
    ``alpha``), the anchor arguments that are extra inputs too (``implied``) and the extra
    inputs with them appended."""

    a_i: int
    b_i: int
    inputs: list
    pre: list = field(default_factory=list)
    implied: list = field(default_factory=list)


def _addmm(spec: FusedSpec, args: list, inputs: list, kw: dict, pro: dict, where: str) -> _Anchor:
    """``beta * bias + alpha * (a @ b)``: two epilogue nodes before the spec's own."""
    r = _Anchor(1, 2, inputs)
    beta, alpha = kw.pop("beta", 1), kw.pop("alpha", 1)
    if 0 in pro:
        raise FusionUnsupported(f"{where}: a prologue of addmm's bias is not fused")
    inputs.append(args[0])
    r.implied.append(0)
    bias_ref: tuple = ("input", len(inputs) - 1)
    y: tuple = ("anchor",)
    if alpha != 1:
        r.pre.append(Node("aten.mul.Tensor", (y, ("const", alpha))))
        y = ("node", len(r.pre) - 1)
    if beta != 1:
        r.pre.append(Node("aten.mul.Tensor", (bias_ref, ("const", beta))))
        bias_ref = ("node", len(r.pre) - 1)
    r.pre.append(Node("aten.add.Tensor", (y, bias_ref)))
    return r


def _linear(spec: FusedSpec, args: list, inputs: list, kw: dict, pro: dict, where: str) -> _Anchor:
    """``x @ w.t() (+ bias)``."""
    r = _Anchor(0, 1, inputs)
    if len(args) > 2 and args[2] is not None:
        if 2 in pro:
            raise FusionUnsupported(f"{where}: a prologue of linear's bias is not fused")
        inputs.append(args[2])
        r.implied.append(2)
        r.pre.append(Node("aten.add.Tensor", (("anchor",), ("input", len(inputs) - 1))))
    return r


def _mm(spec: FusedSpec, args: list, inputs: list, kw: dict, pro: dict, where: str) -> _Anchor:
    return _Anchor(0, 1, inputs)


def _bmm_problem(anchor: str, a: Any, b: Any, pro: dict, where: str) -> tuple:
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0]:
        raise FusionUnsupported(f"{where}: bmm of shapes {tuple(a.shape)} x {tuple(b.shape)}")
    if pro:
        raise FusionUnsupported(f"{where}: prologues of bmm are not fused")
    return a.shape[1], b.shape[2], a.shape[2], a.shape[0], (), b[0]


def _linear_problem(anchor: str, a: Any, b: Any, pro: dict, where: str) -> tuple:
    if b.dim() != 2 or a.dim() < 1 or a.shape[-1] != b.shape[1]:
        raise FusionUnsupported(f"{where}: linear of shapes {tuple(a.shape)} x {tuple(b.shape)}")
    lead = tuple(a.shape[:-1])
    m = 1
    for s in lead:
        m *= s
    return m, b.shape[0], a.shape[-1], None, lead, b.t()


def _mm_problem(anchor: str, a: Any, b: Any, pro: dict, where: str) -> tuple:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise FusionUnsupported(f"{where}: {anchor} of shapes {tuple(a.shape)} x {tuple(b.shape)}")
    return a.shape[0], b.shape[1], a.shape[1], None, (), b


#: per spec anchor: its arguments' roles, and its problem ``(m, n, k, batch, lead, B as K x N)``
_ANCHORS: dict[str, tuple[Any, Any]] = {
    "aten.addmm.default": (_addmm, _mm_problem),
    "aten.linear.default": (_linear, _linear_problem),
    "aten.mm.default": (_mm, _mm_problem),
    "aten.bmm.default": (_mm, _bmm_problem),
}


def _operand_meta(spec: FusedSpec, i: int, args: list, extra_inputs: list, where: str) -> Any:
    """Operand ``i``: the argument, or a prologue's result on meta tensors."""
    pro = {p.operand: p for p in spec.prologues}
    if i not in pro:
        return args[i]
    p = pro[i]
    try:
        return meta_eval(("prologue", i, spec, sig(extra_inputs)),
                         lambda: eval_nodes(p.nodes, None, meta_tensors(extra_inputs))[p.output])
    except Exception as e:  # noqa: BLE001 - any failure of the prologue's ops on meta tensors
        raise FusionUnsupported(f"{where}: the prologue of operand {i} does not evaluate: {e}") from None


def _device(args: list, inputs: list, where: str) -> Any:
    """The one device of the call's tensors."""
    import torch

    first = next((x for x in [*args, *inputs] if isinstance(x, torch.Tensor) and x.device.type != "meta"),
                 None)
    device = first.device if first is not None else None
    if device is None or device.type not in ("cuda", "cpu"):
        raise FusionUnsupported(f"{where}: tensors on {device} (CUDA, or CPU with HEXLAYOUT_EMULATE=1)")
    others = {str(x.device) for x in [*args, *inputs] if isinstance(x, torch.Tensor)} - {str(device)}
    if others:
        raise FusionUnsupported(f"{where}: tensors on {device} and on {', '.join(sorted(others))} (fused "
                                "kernels take one device)")
    return first


def _b_layout(anchor: str, b2: Any, b_i: int, pro: dict) -> str:
    """B as K x N (``b2``): ``"kn"`` when row-major, ``"nk"`` when its transpose is."""
    if b_i in pro:
        return "nk" if anchor == "aten.linear.default" else "kn"
    if _is_rowmajor(b2):
        return "kn"
    if _is_rowmajor(b2.t()):
        return "nk"
    return "nk"                                       # copied once below


def _epilogue(spec: FusedSpec, pre: list, batch: Any, where: str) -> tuple:
    """The anchor's implied nodes, then the spec's: ``(nodes, y_ref, outputs' bases, their
    trailing views, heads)``; outputs' trailing views run on the host; an output materialized
    permuted into heads is stored by the kernel in its own layout."""
    off = len(pre)
    y_ref: tuple = ("node", off - 1) if pre else ("anchor",)
    ep_nodes = list(pre) + [Node(n.op, tuple(_shift(x, off, y_ref) if isinstance(x, tuple) and x
                                             and x[0] in ("anchor", "node") else x for x in n.args), n.kwargs)
                            for n in spec.epilogue.nodes]
    outputs = [_shift(o, off, y_ref) for o in spec.epilogue.outputs]
    bases, chains, heads = [], [], []
    exempt: set[int] = set()
    for o in outputs:
        found = _heads_output(tuple(ep_nodes), o)
        if found is not None and batch is None:
            base, nh, hd, chain_idx = found
            bases.append(base)
            chains.append([])
            heads.append((nh, hd))
            exempt.update(chain_idx)
            continue
        base, chain = _trailing_views(tuple(ep_nodes), o)
        bases.append(base)
        chains.append(chain)
        heads.append(None)
    for j in exempt:                  # the heads chain: no value of its own in the kernel
        ep_nodes[j] = Node("aten.view.default", ep_nodes[j].args[:1])
    for j, node in enumerate(ep_nodes):
        if j in exempt:
            continue
        if node.op in VIEWS and not any(o == ("node", j) or (o[0] == "node" and any(
                c is node for c in ch)) for o, ch in zip(outputs, chains)):
            raise FusionUnsupported(f"{where}: epilogue node {j} ({node.op}) is a view inside the epilogue "
                                    "(only the last ops of an output may be views)")
        if not is_fusible(node.op):
            raise FusionUnsupported(f"{where}: epilogue node {j}: {node.op} is not an op fusion knows")
    return ep_nodes, y_ref, bases, chains, heads


def _column_halves(ep_nodes: list, y_ref: tuple, pre: list, n: int, lead: tuple, where: str) -> bool:
    """Normalize column slices of the product into its halves (in place); whether any."""
    halves = False
    for j, node in enumerate(ep_nodes):
        if node.op not in SLICES:
            continue
        if node.args[0] != ("anchor",) and node.args[0] != y_ref:
            raise FusionUnsupported(f"{where}: epilogue node {j} slices something other than the product")
        if node.args[0] != ("anchor",) or pre:
            raise FusionUnsupported(f"{where}: column halves of addmm / linear with a bias are not fused")
        vals = [x[1] for x in node.args[1:]]
        dim, start, end = (vals + [None, None, None])[:3]
        step = vals[3] if len(vals) > 3 else 1
        ndim = 2 if not lead else len(lead) + 1
        if dim not in (-1, ndim - 1) or step != 1 or n % 2:
            raise FusionUnsupported(f"{where}: epilogue node {j}: slice {vals} is not a column half")
        h = n // 2
        if start == 0 and end == h:
            half = 0
        elif start == h and end is not None and end >= n:
            half = 1
        else:
            raise FusionUnsupported(f"{where}: epilogue node {j}: slice [{start}:{end}] of {n} columns is "
                                    "not one of the two halves")
        ep_nodes[j] = Node(node.op, (("anchor",), ("const", -1), ("const", half)))
        halves = True
    return halves


def _prologues(spec: FusedSpec, r: _Anchor, b_layout: str, where: str) -> tuple[list, str, dict]:
    """The prologues as the tile plan takes them; a trailing transpose of B's (``t(w)`` of a
    linear decomposed to mm) is stripped (then B is ``"nk"``); reshapes that group the
    operand's columns are identities (``fusion_groups.regroup``: how each input of a group
    frame is read, the third value)."""
    prologues = []
    groups: dict[int, tuple[str, int]] = {}
    for p in spec.prologues:
        nodes, out = p.nodes, p.output
        if nodes[out].op in _TRANSPOSES and p.operand == r.b_i and spec.anchor != "aten.linear.default":
            if nodes[out].op == "aten.permute.default" and tuple(nodes[out].args[1][1]) != (1, 0):
                raise FusionUnsupported(f"{where}: prologue permute {nodes[out].args[1][1]} of a matrix")
            out = nodes[out].args[0][1]
            b_layout = "nk"
        nodes, found = regroup(nodes, out, r.inputs, where)
        if set(found) & set(groups):
            raise FusionUnsupported(f"{where}: an input grouped in two prologues")
        groups.update(found)
        for j, node in enumerate(nodes[:out + 1]):
            if node.op in VIEWS:
                raise FusionUnsupported(f"{where}: prologue node {j} ({node.op}) is a view inside a prologue")
        prologues.append((0 if p.operand == r.a_i else 1, nodes[:out + 1], out))
    return prologues, b_layout, groups


def _evaluable(spec: FusedSpec, extra_inputs: list[Any]) -> FusedSpec:
    """``spec`` with the reshapes of a prologue that does not evaluate as the front end gave it
    (a view to ``[R, C/g, g]`` of a value whose inputs the front end flattened) reshaping to
    the flattened frame instead (``fusion_groups.flat_views``): the same values."""
    pros = []
    for p in spec.prologues:
        if any(n.op in VIEWS for n in p.nodes):
            try:
                meta_eval(("prologue-eval", spec, p.operand, sig(extra_inputs)),
                          lambda p=p: eval_nodes(p.nodes, None, meta_tensors(extra_inputs)))
            except Exception:  # noqa: BLE001 - torch's ops refuse the shapes: try the flattened frame
                p = Prologue(p.operand, flat_views(p.nodes), p.output)
        pros.append(p)
    if all(a is b for a, b in zip(pros, spec.prologues)):
        return spec
    return FusedSpec(spec.anchor, tuple(pros), spec.epilogue, spec.name, spec.anchor_kwargs)


def _rope_frame(node: Node, a: int) -> str | None:
    """The frame of argument ``a`` of a rope node (``fusion.rope``): its tables are rows of
    one head (``"table<D>"``), its position ids one per row (``"rows"``); None otherwise."""
    if node.op != ROPE or a not in (1, 2, 3):
        return None
    return "rows" if a == 3 else f"table{int(node.args[4][1])}"


def _input_frames(spec: FusedSpec, ep_nodes: list, r: _Anchor, mnk: tuple, b_layout: str, batch: Any,
                  where: str, groups: dict | None = None) -> tuple[list, list]:
    """Each extra input placed against the frame it is used in: ``(InputSpec s, frames)``; a
    broadcast input of a prologue is read as the whole operand frame (``InputSpec.expand``)."""
    import dataclasses

    import torch

    m, n, k = mnk
    frames = _frames(tuple(ep_nodes), "out")
    used: dict[int, str] = {}
    uses = [(x, _rope_frame(node, a) or frames[j]) for j, node in enumerate(ep_nodes)
            for a, x in enumerate(node.args)]
    uses += [(x, f"operand{p.operand}") for p in spec.prologues for node in p.nodes for x in node.args]
    for x, f in uses:
        if isinstance(x, tuple) and x and x[0] == "input" and used.setdefault(x[1], f) != f:
            raise FusionUnsupported(f"{where}: extra input {x[1]} is used in two tile frames")
    specs: list[InputSpec] = []
    placed: list[tuple[int, int] | None] = []
    for i, t in enumerate(r.inputs):
        f = used.get(i)
        if f is None:
            specs.append(InputSpec("scalar"))
            placed.append(None)
            continue
        if f == "out":
            frame = (m, n)
        elif f.startswith("table"):              # a rope table: rows of one head (module docstring)
            hd = int(f[len("table"):])
            frame = (t.numel() // hd if isinstance(t, torch.Tensor) else 0, hd)
        elif f == "rows":                        # one position id per row
            frame = (m, 1, "per_row")
        elif f == "half":
            frame = (m, n // 2)
        elif f == f"operand{r.a_i}":
            frame = (m, k)
        else:
            frame = (n, k) if b_layout == "nk" else (k, n)
        if batch is not None and isinstance(t, torch.Tensor) and t.dim() == 3:
            raise FusionUnsupported(f"{where}: batched extra inputs of bmm are not fused")
        how = (groups or {}).get(i)
        if how is not None:                # read through its group frame (fusion_groups)
            h = grouped_host(t, how, frame)
            if how[0] == "full":
                spec = place(h, frame, where, i)[0]
            else:
                spec = InputSpec("tensor", dtype_name(t.dtype), (h.shape[0] == 1, False),
                                 group=how[1] if how[0] == "group" else 0,
                                 period=how[1] if how[0] == "period" else 0)
            specs.append(spec)
            placed.append(frame)
            continue
        spec = place(t, frame, where, i)[0]
        if f.startswith("operand") and spec.kind == "tensor" and any(spec.bcast):
            spec = dataclasses.replace(spec, expand=True)       # read as the whole operand tile
        specs.append(spec)
        placed.append(frame)
    return specs, placed


def _out_metas(spec: FusedSpec, anchor_args: list, extra_inputs: list, where: str) -> tuple[list, list]:
    """The outputs as torch computes them on meta tensors, and their dtype names."""
    import torch

    try:
        metas = meta_eval(("outputs", spec, sig(anchor_args), sig(extra_inputs)),
                          lambda: reference(spec, meta_tensors(anchor_args), meta_tensors(extra_inputs)))
    except FusionUnsupported:
        raise
    except Exception as e:  # noqa: BLE001 - the spec's ops on meta tensors fail: not fusible
        raise FusionUnsupported(f"{where}: the spec does not evaluate with torch's ops: {e}") from None
    out_dtypes = []
    for t in metas:
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise FusionUnsupported(f"{where}: an output of dtype {t.dtype} (fused outputs are f16, bf16 "
                                    "or f32)")
        out_dtypes.append(dtype_name(t.dtype))
    return metas, out_dtypes


def _anchor_of(spec: FusedSpec, args: list, extra_inputs: list, where: str) -> tuple[_Anchor, Any, Any]:
    """The anchor's roles and its operands A and B (tensors, meta ones from a prologue)."""
    import torch

    anchor = spec.anchor
    kw = dict(spec.anchor_kwargs)
    pro = {p.operand: p for p in spec.prologues}
    if anchor not in _ANCHORS:
        raise FusionUnsupported(f"{where}: {anchor} is not an anchor the mechanism schedules "
                                "(mm, addmm, linear, bmm)")
    r = _ANCHORS[anchor][0](spec, args, list(extra_inputs), kw, pro, where)
    if kw:
        raise FusionUnsupported(f"{where}: {anchor} with {kw} is not fused")
    if set(pro) - {r.a_i, r.b_i}:
        raise FusionUnsupported(f"{where}: prologues of operands {sorted(set(pro) - {r.a_i, r.b_i})} are not "
                                "fused")
    a, b = (_operand_meta(spec, i, args, extra_inputs, where) for i in (r.a_i, r.b_i))
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise FusionUnsupported(f"{where}: the operands of {anchor} are not tensors")
    if a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype:
        raise FusionUnsupported(f"{where}: {anchor} on {a.dtype} x {b.dtype} (fused GEMMs take f16 or bf16, "
                                "one dtype)")
    return r, a, b


def _plan(spec: FusedSpec, anchor_args: list[Any], extra_inputs: list[Any]) -> tuple[GemmCall, _Recipe]:
    """The plan of ``plan_call`` and the recipe of its host values (no memo)."""
    anchor, where, args = spec.anchor, spec.display_name(), list(anchor_args)
    spec = _evaluable(spec, list(extra_inputs))
    pro = {p.operand: p for p in spec.prologues}
    r, a, b = _anchor_of(spec, args, extra_inputs, where)
    first = _device(args, r.inputs, where)
    m, n, k, batch, lead, b2 = _ANCHORS[anchor][1](anchor, a, b, pro, where)
    b_layout = _b_layout(anchor, b2, r.b_i, pro)
    if k % 8 or n % 8 or k == 0 or m == 0:
        raise FusionUnsupported(f"{where}: {m} x {n} x {k}: fused GEMMs need K and N multiples of 8 and "
                                "non-empty operands (16-byte rows for the vector / TMA copies)")
    ep_nodes, y_ref, bases, chains, heads = _epilogue(spec, r.pre, batch, where)
    halves = _column_halves(ep_nodes, y_ref, r.pre, n, lead, where)
    # the kernel's plan keeps no sizes: trailing views (done on the host) lose their shapes
    ep_nodes = [Node(nd.op, nd.args[:1]) if nd.op in VIEWS else nd for nd in ep_nodes]
    if halves and (r.b_i in pro or batch is not None):
        raise FusionUnsupported(f"{where}: column halves with a B prologue or bmm are not fused")
    if halves and (n // 2) % 8:
        raise FusionUnsupported(f"{where}: column halves of N = {n} need N/2 a multiple of 8")
    prologues, b_layout, groups = _prologues(spec, r, b_layout, where)
    if _reduces_rows(prologues, 1):
        raise FusionUnsupported(f"{where}: a row reduction fuses only into the A operand's prologue")
    norm = _reduces_rows(prologues, 0)
    scaled = norm and k > NORM_MAX_K and batch is None and _row_scaled(prologues, extra_inputs)
    if norm and (k > NORM_MAX_K or batch is not None) and not scaled:
        raise FusionUnsupported(f"{where}: norm: the A prologue reduces rows of K = {k} (a GEMM's A prologue "
                                f"holds whole rows up to {NORM_MAX_K}, or takes them as a row factor of its "
                                "product (an RMSNorm), not batched: two kernels)")
    if any(nd.op == ROPE for nd in ep_nodes) and (halves or batch is not None):
        raise FusionUnsupported(f"{where}: rope with column halves or bmm is not fused")
    _check_rope(ep_nodes, r.inputs, where)
    specs, frames = _input_frames(spec, ep_nodes, r, (m, n, k), b_layout, batch, where, groups)
    metas, out_dtypes = _out_metas(spec, anchor_args, extra_inputs, where)
    plan = TilePlan(output_param="c", operands=((0, "a"), (1, "b")), prologues=tuple(prologues),
                    epilogue=tuple(ep_nodes), outputs=tuple(bases), out_dtypes=tuple(out_dtypes),
                    inputs=tuple(specs), halves=halves, heads=tuple(heads) if any(heads) else (),
                    row_reductions=tuple(sorted(NORM_REDUCTIONS.items())) if norm else (), row_scale=scaled)
    arch = arch_of(first.device, first.is_cuda)
    staged = bool(prologues) or halves or any(heads) or any(nd.op == ROPE for nd in ep_nodes)
    for k_, (hd_, t) in enumerate(zip(heads, metas)):
        if hd_ is not None and (t.dim() != 4 or t.shape[0] * t.shape[2] != m or
                                (t.shape[1], t.shape[3]) != hd_):
            raise FusionUnsupported(f"{where}: output {k_} of shape {tuple(t.shape)} is not the {m} x {n} "
                                    f"product permuted into {hd_[0]} heads of {hd_[1]}")
    recipe = _Recipe(anchor, None if r.a_i in pro else r.a_i, None if r.b_i in pro else r.b_i, b_layout,
                     batch is not None, m, k, tuple(r.implied), tuple(frames), tuple(x.expand for x in specs),
                     tuple(groups.get(i) for i in range(len(specs))))
    call = GemmCall(arch, a.dtype, b_layout, staged, None, None, m, n, k, batch, lead, plan, [],
                    chains, [tuple(t.shape) for t in metas])
    return call, recipe


def _reduces_rows(prologues: Any, operand: int) -> bool:
    """Whether the prologue of ``operand`` (0: A, 1: B) among ``(operand, nodes, out)``
    reduces rows (``NORM_REDUCTIONS``)."""
    return any(op == operand and any(nd.op in NORM_REDUCTIONS for nd in nodes) for op, nodes, _ in prologues)


def _row_scaled(prologues: Any, extra_inputs: list[Any]) -> bool:
    """Whether the A prologue among ``(operand, nodes, out)`` takes its row reductions as one
    row factor of its value (``hexlayout.fusion.row_scale``): the kernel then sums rows over
    its k-loop and scales the product's rows (any ``K``)."""
    def arg(a: Any) -> Any:
        if a[0] == "node":
            return a[1]
        if a[0] == "input":
            x = extra_inputs[a[1]]
            return "t" if hasattr(x, "numel") and x.numel() > 1 else "s"
        return "s" if a[0] == "const" else "t"

    for op, nodes, out in prologues:
        if op == 0:
            args = [[arg(a) for a in nd.args if isinstance(a, tuple) and a] for nd in nodes]
            return row_scale([nd.op for nd in nodes], args, out, frozenset(NORM_REDUCTIONS)) is not None
    return False


def norm_prologue(plan: TilePlan) -> bool:
    """Whether ``plan``'s A prologue reduces A's rows (an RMSNorm of the activation)."""
    return _reduces_rows(plan.prologues, 0)


def norm_consts(consts: dict[str, Any], k: int) -> dict[str, Any]:
    """Tile constants whose A tile holds whole rows of ``k <= NORM_MAX_K`` elements: ``BK``
    the power of two ``>= max(k, 16)``, two pipeline stages when ``BK > 64``, the epilogue
    not staged in windows of ``BK`` columns when those do not divide ``BN``.

    Example::

        >>> norm_consts({"BM": 16, "BN": 64, "BK": 64, "STAGES": 4, "STAGE_EPILOGUE": True}, 96)
        {'BM': 16, 'BN': 64, 'BK': 128, 'STAGES': 2}
    """
    bk = 16
    while bk < k:
        bk *= 2
    out = dict(consts, BK=max(bk, consts["BK"]) if consts["BK"] >= k else bk)
    if out["BK"] > 64:
        out["STAGES"] = min(out.get("STAGES", 2), 2)
    if out["BN"] % out["BK"]:             # the staged epilogue's column windows are BK wide
        out.pop("STAGE_EPILOGUE", None)
    return out


def rope_unsupported(hd: int, table_dtype: Any, ids_dtype: Any) -> str | None:
    """Why the GEMM epilogue cannot compute a rope of heads of ``hd`` with tables of
    ``table_dtype`` (and position ids of ``ids_dtype``, None when the tables are rows), or
    None: a column tile holds whole heads (``hd`` a power of two, 8 to 256), table rows are
    16-byte aligned, ids are 32- or 64-bit integers."""
    import torch

    if hd < 8 or hd > 256 or hd & (hd - 1):
        return f"heads of {hd} (a column tile holds whole heads: a power of two from 8 to 256)"
    if table_dtype not in (torch.float16, torch.bfloat16, torch.float32) or hd * table_dtype.itemsize % 16:
        return f"tables of {table_dtype} rows of {hd} (f16, bf16 or f32 rows of a multiple of 16 bytes)"
    if ids_dtype is not None and ids_dtype not in (torch.int32, torch.int64):
        return f"position ids of {ids_dtype} (int32 or int64)"
    return None


def _check_rope(ep_nodes: list, inputs: list, where: str) -> None:
    """Each rope node's constants and inputs as the kernel takes them (``rope_unsupported``)."""
    import torch

    for j, nd in enumerate(ep_nodes):
        if nd.op != ROPE:
            continue
        hd, cols = (x[1] for x in nd.args[4:6])
        tabs = [inputs[a[1]] if a[0] == "input" else None for a in nd.args[1:3]]
        ids = inputs[nd.args[3][1]] if nd.args[3][0] == "input" else None
        if not all(isinstance(t, torch.Tensor) for t in tabs) or (nd.args[3][0] == "input" and
                                                                  not isinstance(ids, torch.Tensor)):
            raise FusionUnsupported(f"{where}: epilogue node {j}: rope's tables and ids are tensors")
        why = rope_unsupported(int(hd), tabs[0].dtype, None if ids is None else ids.dtype)
        if why is None and (tabs[0].dtype != tabs[1].dtype or tabs[0].shape != tabs[1].shape):
            why = "cos and sin tables of different shapes or dtypes"
        if why is None and not isinstance(cols, int):
            why = f"rope_cols {cols!r}"
        if why:
            raise FusionUnsupported(f"{where}: epilogue node {j}: rope of {why}")


def rope_head_dim(plan: TilePlan) -> int:
    """The head size of the plan's rope nodes (``fusion.rope``: a column tile must hold whole
    heads), 0 when it has none."""
    return max((int(nd.args[4][1]) for nd in plan.epilogue if nd.op == ROPE), default=0)


def output_frames(call: GemmCall) -> list[tuple[int, int]]:
    """Per output, the rank-2 shape the kernel stores (``M x N``, ``M x N/2`` for a half)."""
    out = []
    for ref in call.plan.outputs:
        half = False
        if ref[0] == "node":
            frames = _frames(call.plan.epilogue, "out")
            half = frames[ref[1]] == "half"
        out.append((call.m, call.n // 2 if half else call.n))
    return out


def clear_plans() -> None:
    """Forget the memoized meta evaluations."""
    clear_meta()
    with _LOCK:
        _PLANS.clear()
