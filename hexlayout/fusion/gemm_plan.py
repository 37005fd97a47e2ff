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
  re-laid out once per weight and cached), and each half is a tile half.

It returns the call's ``TilePlan`` (shape-free: the part of the build key), the tile
problem (``m``, ``n``, ``k``, batch), the host tensors each parameter receives and what the
host does to the outputs; anything that cannot fuse raises ``FusionUnsupported``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from .aten import SLICES, VIEWS, dtype_name, is_fusible
from .mechanism import InputSpec, TilePlan
from .reference import eval_nodes, reference
from .spec import FusedSpec, FusionUnsupported, Node

__all__ = ["GemmCall", "plan_call", "planned", "gemm_binder", "bind_inputs", "host_shapes", "output_frames",
           "clear_plans"]

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


_ARCHS: dict[Any, str] = {}


def _arch_of(device: Any, cuda: bool) -> str:
    """The hexlayout target of ``device`` (CUDA: by compute capability, cached; CPU: the
    emulated architecture, ``HEXLAYOUT_EMULATE_ARCH`` or sm_80)."""
    if cuda:
        hit = _ARCHS.get(device)
        if hit is not None:
            return hit
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        arch = {(9, 0): "sm_90a", (8, 9): "sm_89"}.get((major, minor), "sm_80" if major == 8 else None)
        if arch is None:
            raise FusionUnsupported(f"compute capability {major}.{minor} has no hexlayout GEMM "
                                    "(sm_80-sm_89, sm_90a)")
        _ARCHS[device] = arch
        return arch
    arch = os.environ.get("HEXLAYOUT_EMULATE_ARCH", "sm_80")
    if arch not in ("sm_80", "sm_89", "sm_90a"):
        raise FusionUnsupported(f"HEXLAYOUT_EMULATE_ARCH={arch!r} is not a GEMM architecture (sm_80, sm_89, "
                                "sm_90a)")
    return arch


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


def _place(t: Any, frame: tuple[int, int], where: str, i: int) -> tuple[InputSpec, Any]:
    """Extra input ``t`` against a rank-2 frame ``(rows, cols)`` (leading dims flattened)."""
    import numbers

    import torch

    if isinstance(t, numbers.Number) and not isinstance(t, bool):
        return InputSpec("scalar"), float(t)
    if not isinstance(t, torch.Tensor):
        raise FusionUnsupported(f"{where}: extra input {i} is {type(t).__name__}, not a tensor or a number")
    rows, cols = frame
    shape = tuple(t.shape)
    last = shape[-1] if shape else 1
    lead = shape[:-1]
    nlead = 1
    for s in lead:
        nlead *= s
    if last not in (cols, 1):
        raise FusionUnsupported(f"{where}: extra input {i} of shape {shape} does not broadcast to the "
                                f"{rows} x {cols} tile frame (last dim must be {cols} or 1)")
    if nlead == rows:
        brow = False
    elif nlead == 1:
        brow = True
    else:
        raise FusionUnsupported(f"{where}: extra input {i} of shape {shape}: its leading dims hold {nlead} "
                                f"rows, the frame {rows} (only full rows or a broadcast row fuse)")
    bcol = last == 1 and cols != 1
    host = t.reshape(1 if brow else rows, 1 if bcol else cols)
    if not host.is_contiguous() or host.data_ptr() % 16:
        host = host.clone(memory_format=torch.contiguous_format)     # a fresh, aligned allocation
    return InputSpec("tensor", dtype_name(t.dtype), (brow, bcol)), host


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


def _sig(xs: list[Any]) -> tuple:
    """What the meta evaluation of a spec depends on: tensors' shapes, strides and dtypes."""
    out = []
    for x in xs:
        if hasattr(x, "shape") and hasattr(x, "stride"):
            out.append((tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device), bool(x.is_cuda)))
        else:
            out.append(type(x).__name__)
    return tuple(out)


def _metas(xs: list[Any]) -> list[Any]:
    import torch

    return [torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
            if isinstance(x, torch.Tensor) else x for x in xs]


_META: dict[tuple, Any] = {}


def _meta_eval(key: tuple, fn: Any) -> Any:
    """``fn()`` (torch's ops on meta tensors: shapes and dtypes), memoized on ``key``."""
    try:
        hit = _META.get(key)
    except TypeError:                    # an unhashable constant in the spec
        return fn()
    if hit is None:
        hit = fn()
        with _LOCK:
            if len(_META) > 4096:
                _META.clear()
            _META[key] = hit
    return hit


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
    frames: tuple[tuple[int, int] | None, ...]


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
    host = [0.0 if f is None else _place(t, f, where, i)[1] for i, (t, f) in enumerate(zip(inputs, r.frames))]
    return a_host, b_host, host


def bind_inputs(shapes: tuple, inputs: list[Any]) -> list[Any]:
    """The host values of extra inputs placed before (``_place``) with these results: per
    input ``None`` (unused: ``0.0``), ``"scalar"`` (a number) or the rank-2 shape it was
    given as (a contiguous, 16-byte aligned tensor: a copy when the view is not)."""
    import torch

    out: list[Any] = []
    for t, shape in zip(inputs, shapes):
        if shape is None:
            out.append(0.0)
        elif shape == "scalar":
            out.append(float(t))
        else:
            h = t.reshape(shape)
            if not h.is_contiguous() or h.data_ptr() % 16:
                h = h.clone(memory_format=torch.contiguous_format)
            out.append(h)
    return out


def host_shapes(inputs: list[Any]) -> tuple:
    """What ``bind_inputs`` repeats of a call's placed ``inputs`` (``GemmCall.inputs``)."""
    import torch

    return tuple(tuple(h.shape) if isinstance(h, torch.Tensor) else "scalar" for h in inputs)


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
        return a_host, b_host, bind_inputs(shapes, inputs)

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

    key = (spec, _sig(anchor_args), _sig(extra_inputs), os.environ.get("HEXLAYOUT_EMULATE_ARCH"))
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


def _plan(spec: FusedSpec, anchor_args: list[Any], extra_inputs: list[Any]) -> tuple[GemmCall, _Recipe]:
    """The plan of ``plan_call`` and the recipe of its host values (no memo)."""
    import torch

    anchor = spec.anchor
    where = spec.display_name()
    args = list(anchor_args)
    inputs = list(extra_inputs)
    implied: list[int] = []              # anchor arguments that are extra inputs too (a bias)
    kw = dict(spec.anchor_kwargs)
    pre: list[Node] = []                 # epilogue nodes the anchor itself implies
    pro = {p.operand: p for p in spec.prologues}

    def operand_meta(i: int) -> Any:
        if i in pro:
            p = pro[i]
            try:
                return _meta_eval(("prologue", i, spec, _sig(extra_inputs)),
                                  lambda: eval_nodes(p.nodes, None, _metas(extra_inputs))[p.output])
            except Exception as e:  # noqa: BLE001 - any failure of the prologue's ops on meta tensors
                raise FusionUnsupported(f"{where}: the prologue of operand {i} does not evaluate: "
                                        f"{e}") from None
        return args[i]

    if anchor == "aten.addmm.default":
        a_i, b_i = 1, 2
        beta, alpha = kw.pop("beta", 1), kw.pop("alpha", 1)
        if 0 in pro:
            raise FusionUnsupported(f"{where}: a prologue of addmm's bias is not fused")
        inputs.append(args[0])
        implied.append(0)
        bias_ref: tuple = ("input", len(inputs) - 1)
        y: tuple = ("anchor",)
        if alpha != 1:
            pre.append(Node("aten.mul.Tensor", (y, ("const", alpha))))
            y = ("node", len(pre) - 1)
        if beta != 1:
            pre.append(Node("aten.mul.Tensor", (bias_ref, ("const", beta))))
            bias_ref = ("node", len(pre) - 1)
        pre.append(Node("aten.add.Tensor", (y, bias_ref)))
    elif anchor == "aten.linear.default":
        a_i, b_i = 0, 1
        if len(args) > 2 and args[2] is not None:
            if 2 in pro:
                raise FusionUnsupported(f"{where}: a prologue of linear's bias is not fused")
            inputs.append(args[2])
            implied.append(2)
            pre.append(Node("aten.add.Tensor", (("anchor",), ("input", len(inputs) - 1))))
    elif anchor in ("aten.mm.default", "aten.bmm.default"):
        a_i, b_i = 0, 1
    else:
        raise FusionUnsupported(f"{where}: {anchor} is not an anchor the mechanism schedules "
                                "(mm, addmm, linear, bmm)")
    if kw:
        raise FusionUnsupported(f"{where}: {anchor} with {kw} is not fused")
    if set(pro) - {a_i, b_i}:
        raise FusionUnsupported(f"{where}: prologues of operands {sorted(set(pro) - {a_i, b_i})} are not "
                                "fused")

    a, b = operand_meta(a_i), operand_meta(b_i)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise FusionUnsupported(f"{where}: the operands of {anchor} are not tensors")
    if a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype:
        raise FusionUnsupported(f"{where}: {anchor} on {a.dtype} x {b.dtype} (fused GEMMs take f16 or bf16, "
                                "one dtype)")
    first = next((x for x in [*args, *inputs] if isinstance(x, torch.Tensor) and x.device.type != "meta"),
                 None)
    device = first.device if first is not None else None
    if device is None or device.type not in ("cuda", "cpu"):
        raise FusionUnsupported(f"{where}: tensors on {device} (CUDA, or CPU with HEXLAYOUT_EMULATE=1)")
    others = {str(x.device) for x in [*args, *inputs] if isinstance(x, torch.Tensor)} - {str(device)}
    if others:
        raise FusionUnsupported(f"{where}: tensors on {device} and on {', '.join(sorted(others))} (fused "
                                "kernels take one device)")
    batch = None
    lead: tuple[int, ...] = ()
    if anchor == "aten.bmm.default":
        if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0]:
            raise FusionUnsupported(f"{where}: bmm of shapes {tuple(a.shape)} x {tuple(b.shape)}")
        if pro:
            raise FusionUnsupported(f"{where}: prologues of bmm are not fused")
        batch = a.shape[0]
        m, k = a.shape[1], a.shape[2]
        n = b.shape[2]
        b2 = b[0]
    elif anchor == "aten.linear.default":
        if b.dim() != 2 or a.dim() < 1 or a.shape[-1] != b.shape[1]:
            raise FusionUnsupported(f"{where}: linear of shapes {tuple(a.shape)} x {tuple(b.shape)}")
        lead = tuple(a.shape[:-1])
        k, n = a.shape[-1], b.shape[0]
        m = 1
        for s in lead:
            m *= s
        b2 = b.t()
    else:
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
            raise FusionUnsupported(f"{where}: {anchor} of shapes {tuple(a.shape)} x {tuple(b.shape)}")
        m, k = a.shape
        n = b.shape[1]
        b2 = b
    # B as K x N (b2): "kn" when row-major, "nk" when its transpose is
    if b_i in pro:
        b_layout = "nk" if anchor == "aten.linear.default" else "kn"
    elif _is_rowmajor(b2):
        b_layout = "kn"
    elif _is_rowmajor(b2.t()):
        b_layout = "nk"
    else:
        b_layout = "nk"                               # copied once below
    if k % 8 or n % 8 or k == 0 or m == 0:
        raise FusionUnsupported(f"{where}: {m} x {n} x {k}: fused GEMMs need K and N multiples of 8 and "
                                "non-empty operands (16-byte rows for the vector / TMA copies)")

    # --- epilogue: the anchor's implied nodes, then the spec's ----------------------------
    off = len(pre)
    y_ref: tuple = ("node", off - 1) if pre else ("anchor",)
    ep_nodes = list(pre) + [Node(n.op, tuple(_shift(x, off, y_ref) if isinstance(x, tuple) and x
                                             and x[0] in ("anchor", "node") else x for x in n.args), n.kwargs)
                            for n in spec.epilogue.nodes]
    outputs = [_shift(o, off, y_ref) for o in spec.epilogue.outputs]
    # outputs' trailing views run on the host; an output materialized permuted into heads is
    # stored by the kernel in its own layout
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
    # column halves
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
    # the kernel's plan keeps no sizes: trailing views (done on the host) lose their shapes
    ep_nodes = [Node(nd.op, nd.args[:1]) if nd.op in VIEWS else nd for nd in ep_nodes]
    if halves and (b_i in pro or batch is not None):
        raise FusionUnsupported(f"{where}: column halves with a B prologue or bmm are not fused")
    if halves and (n // 2) % 8:
        raise FusionUnsupported(f"{where}: column halves of N = {n} need N/2 a multiple of 8")

    # prologue with a trailing transpose (t(w) of a linear decomposed to mm): strip it
    prologues = []
    for p in spec.prologues:
        nodes, out = p.nodes, p.output
        if nodes[out].op in _TRANSPOSES and p.operand == b_i and anchor != "aten.linear.default":
            if nodes[out].op == "aten.permute.default" and tuple(nodes[out].args[1][1]) != (1, 0):
                raise FusionUnsupported(f"{where}: prologue permute {nodes[out].args[1][1]} of a matrix")
            out = nodes[out].args[0][1]
            b_layout = "nk"
        for j, node in enumerate(nodes[:out + 1]):
            if node.op in VIEWS:
                raise FusionUnsupported(f"{where}: prologue node {j} ({node.op}) is a view inside a prologue")
        prologues.append((0 if p.operand == a_i else 1, nodes[:out + 1], out))

    # --- inputs: place each against the frame it is used in --------------------------------
    frames = _frames(tuple(ep_nodes), "out")
    used: dict[int, str] = {}
    for j, node in enumerate(ep_nodes):
        for x in node.args:
            if isinstance(x, tuple) and x and x[0] == "input":
                f = frames[j]
                if used.setdefault(x[1], f) != f:
                    raise FusionUnsupported(f"{where}: extra input {x[1]} is used in two tile frames")
    for p in spec.prologues:
        for node in p.nodes:
            for x in node.args:
                if isinstance(x, tuple) and x and x[0] == "input":
                    f = f"operand{p.operand}"
                    if used.setdefault(x[1], f) != f:
                        raise FusionUnsupported(f"{where}: extra input {x[1]} is used in two tile frames")
    specs: list[InputSpec] = []
    frames: list[tuple[int, int] | None] = []
    for i, t in enumerate(inputs):
        f = used.get(i)
        if f is None:
            specs.append(InputSpec("scalar"))
            frames.append(None)
            continue
        if f == "out":
            frame = (m, n)
        elif f == "half":
            frame = (m, n // 2)
        elif f == f"operand{a_i}":
            frame = (m, k)
        else:
            frame = (n, k) if b_layout == "nk" else (k, n)
        if batch is not None and isinstance(t, torch.Tensor) and t.dim() == 3:
            raise FusionUnsupported(f"{where}: batched extra inputs of bmm are not fused")
        specs.append(_place(t, frame, where, i)[0])
        frames.append(frame)
    # output dtypes and shapes: torch's (meta tensors)
    try:
        metas = _meta_eval(("outputs", spec, _sig(anchor_args), _sig(extra_inputs)),
                           lambda: reference(spec, _metas(anchor_args), _metas(extra_inputs)))
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
    plan = TilePlan(
        output_param="c",
        operands=((0, "a"), (1, "b")),
        prologues=tuple(prologues),
        epilogue=tuple(ep_nodes),
        outputs=tuple(bases),
        out_dtypes=tuple(out_dtypes),
        inputs=tuple(specs),
        halves=halves,
        heads=tuple(heads) if any(heads) else (),
    )
    arch = _arch_of(device, first.is_cuda)
    staged = bool(prologues) or halves or any(heads)
    for k_, (hd_, t) in enumerate(zip(heads, metas)):
        if hd_ is not None and (t.dim() != 4 or t.shape[0] * t.shape[2] != m or
                                (t.shape[1], t.shape[3]) != hd_):
            raise FusionUnsupported(f"{where}: output {k_} of shape {tuple(t.shape)} is not the {m} x {n} "
                                    f"product permuted into {hd_[0]} heads of {hd_[1]}")
    recipe = _Recipe(anchor, None if a_i in pro else a_i, None if b_i in pro else b_i, b_layout,
                     batch is not None, m, k, tuple(implied), tuple(frames))
    call = GemmCall(arch, a.dtype, b_layout, staged, None, None, m, n, k, batch, lead, plan, [],
                    chains, [tuple(t.shape) for t in metas])
    return call, recipe


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
    with _LOCK:
        _META.clear()
        _PLANS.clear()
