"""Mixture-of-experts as a fusion anchor: the experts of a MoE block written with gathered
expert weights (gpt-fast's and many serving codes' "topk + index" form) become ONE call of
``torch.ops.hexlayout.fused_moe``; importing this module registers the record ``MOE`` with
``hexlayout.fusion.anchors``.

The form recognized (``fuse_gathered_experts``, the record's ``prepare``), for any
``einsum`` / ``bmm`` / ``mm`` / ``mul`` + ``sum`` spelling of the contractions and any views
between them::

    G1, G3, G2 = W1[ids], W3[ids], W2[ids]              # ids [T, k]: the top-k expert ids
    inter[t, a, o] = act(sum_i x[t, i] G1[t, a, o, i]) * sum_i x[t, i] G3[t, a, o, i]
    y[t, h] = sum_a w[t, a] sum_o inter[t, a, o] G2[t, a, h, o]

(``W1`` / ``W3`` ``[E, I, H]`` or ``[E, H, I]``, ``W2`` ``[E, H, I]`` or ``[E, I, H]`` graph
inputs; ``act`` SiLU or exact GELU; ``w`` the ``[T, k]`` routing weights). It is
``fused_moe(x, cat([W1, W3], 1), W2, w.float(), ids.int(), act)``: the graph gets that
node, with ``cat([W1, W3], 1)`` (and a transpose of a weight stored the other way) a derived
parameter computed once per weight (``hexlayout_derived``: again only after an in-place
update), the gathers and contractions are gone. The routing (router GEMM aside: softmax,
``topk``, renormalisation, the casts of the weights and ids) stays in torch: data-dependent
selection, cheap next to the experts; the pass marks it ``LEFT_TO_TORCH`` with that reason
(``fusion_routing``) so its row reductions do not become kernels of their own.

The record takes a prologue of ``hidden_states`` that scales its rows and columns (an
RMSNorm, recomputed here when the router GEMM reads it too: ``fusion_prologue``) and an
epilogue of elementwise math of the output (the residual add: ``fusion_epilogue``), both in
kernels ``fused_moe`` launches anyway.

The shapes are tracked symbolically: each value is a role (an input, a gathered weight, a
projection, the activation, the gated product, the down projection, the weighted sum) and,
per dimension, the labels of the index variables it holds (views regroup them,
contractions unify them), so the match does not depend on how ``einsum`` was lowered; a
symbolic size (dynamic token counts) is one symbolic index that reshapes carry along (never
specialized: the pass adds no guard). A
block written with HF's per-expert loop (``torch.where(expert_mask[e])``, ``index_add_``)
is not this form: ``torch.where`` of a mask is data-dependent (``nonzero``), so by default
dynamo breaks the graph there and each expert's MLP is a graph of its own (two GEMM kernels
each: the gate / up pair as one, the down projection; ``LOOP_NOTE`` in the plan); when dynamo
captures ``nonzero`` the loop over ``range(E)`` is one graph, which ``fusion_loop`` makes one
``fused_moe``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

from hexlayout.fusion.anchors import AnchorRecord, AnchorSpec, register_anchor
from hexlayout.fusion.spec import FusedSpec, FusionUnsupported

from .derived import cached_derived
from .fusion_loop import fuse_expert_loop
from .fusion_prologue import ROW_SCALE_REDUCTIONS
from .fusion_routing import leave_routing

__all__ = ["MOE", "fuse_gathered_experts", "moe_w13", "moe_w2", "MOE_OP", "prepare"]

#: the graph op the experts become (``op_name`` of ``torch.ops.hexlayout.fused_moe.default``)
MOE_OP = "hexlayout.fused_moe.default"
_VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
_PASS = ("aten.clone.default", "aten.alias.default", "aten._to_copy.default", "aten.contiguous.default")
_ACTS = {"aten.silu.default": "silu", "aten.gelu.default": "gelu"}


def _w13(w1: Any, w3: Any, transposed: bool) -> Any:
    import torch

    a, b = (w.transpose(1, 2) if transposed else w for w in (w1, w3))
    return torch.cat([a, b], 1).contiguous()


def _w2(w2: Any, transposed: bool) -> Any:
    return (w2.transpose(1, 2) if transposed else w2).contiguous()


def moe_w13(w1: Any, w3: Any, transposed: bool) -> Any:
    """``fused_moe``'s ``w13`` ``[E, 2I, H]``: the gate rows then the up rows (``W1`` / ``W3``
    given ``[E, I, H]``, or ``[E, H, I]`` when ``transposed``), computed once per pair."""
    return cached_derived((w1, w3), ("w13", transposed), lambda: _w13(w1, w3, transposed))


def moe_w2(w2: Any, transposed: bool) -> Any:
    """``fused_moe``'s ``w2`` ``[E, H, I]`` (``W2`` given so, or ``[E, I, H]`` when
    ``transposed``), contiguous, computed once per weight."""
    return cached_derived((w2,), ("w2", transposed), lambda: _w2(w2, transposed))


moe_w13.hexlayout_derived = True     # parameters computed once: not ops left to torch
moe_w2.hexlayout_derived = True


# --- the symbolic match -------------------------------------------------------------------------
@dataclass
class _Val:
    """A value's role and, per dimension, its labels (row-major within a merged dimension)."""

    role: tuple
    dims: list


@dataclass
class _Match:
    parent: dict = field(default_factory=dict)
    size: dict = field(default_factory=dict)
    vals: dict = field(default_factory=dict)
    ids_labels: dict = field(default_factory=dict)

    def new(self, size: int) -> int:
        lab = len(self.size)
        self.size[lab] = size
        self.parent[lab] = lab
        return lab

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            a = self.parent[a]
        return a

    def unify(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            if self.size[a] != self.size[b] and None not in (self.size[a], self.size[b]):
                raise ValueError("contracted sizes differ")
            self.parent[a] = b

    def unify_dims(self, x: tuple, y: tuple) -> None:
        x, y = (tuple(a for a in d if self.size[a] != 1) for d in (x, y))   # (an index of one value: none)
        if len(x) != len(y):
            raise ValueError("merged dimensions differ")
        for a, b in zip(x, y):
            self.unify(a, b)


def _op(n: Any) -> str:
    from hexlayout.fusion.partition import op_name

    return op_name(n.target) if n.op == "call_function" else n.op


def _shape(n: Any) -> tuple:
    """``n``'s sizes, None for a symbolic one (never specialized: no guard is added)."""
    from hexlayout.fusion.partition import static_int

    return tuple(static_int(s) for s in n.meta["val"].shape)


def _leaf(m: _Match, n: Any) -> _Val:
    return _Val(("leaf", n), [() if s == 1 else (m.new(s),) for s in _shape(n)])


def _static_groups(m: _Match, atoms: list, shape: tuple) -> list:
    """``atoms`` (static sizes) grouped row-major into the static sizes ``shape``."""
    out, i = [], 0
    for s in shape:
        grp: list = []
        prod = 1
        while prod < s:
            if i >= len(atoms) or m.size[atoms[i]] is None:
                raise ValueError("a reshape that merges a symbolic size")
            prod *= m.size[atoms[i]]
            grp.append(atoms[i])
            i += 1
        if prod != s:
            raise ValueError("a reshape that splits an index")
        out.append(tuple(grp))
    if i != len(atoms):
        raise ValueError("reshape")
    return out


def _regroup(m: _Match, dims: list, shape: tuple) -> list:
    """The indices of a reshape to ``shape`` (None: a symbolic size) of a value whose
    dimensions hold ``dims``: merged and split row-major. One symbolic size takes the indices
    the static sizes before and after it leave (one of them symbolic)."""
    atoms = [a for d in dims for a in d]
    syms = [d for d, s in enumerate(shape) if s is None]
    if not syms:
        return _static_groups(m, atoms, shape)
    if len(syms) > 1:
        raise ValueError("a reshape with several symbolic sizes")
    d = syms[0]
    before, after = shape[:d], shape[d + 1:]
    n_after = 0
    if after:                          # the static sizes after it, from the right
        prod, need = 1, 1
        for s in after:
            need *= s
        while prod < need:
            k = len(atoms) - 1 - n_after
            if k < 0 or m.size[atoms[k]] is None:
                raise ValueError("a reshape that merges a symbolic size")
            prod *= m.size[atoms[k]]
            n_after += 1
        if prod != need:
            raise ValueError("a reshape that splits an index")
    tail = atoms[len(atoms) - n_after:]
    head = atoms[:len(atoms) - n_after]
    n_before = 0
    prod = 1
    for s in before:
        prod *= s
    acc = 1
    while acc < prod:
        if n_before >= len(head) or m.size[head[n_before]] is None:
            raise ValueError("a reshape that merges a symbolic size")
        acc *= m.size[head[n_before]]
        n_before += 1
    mid = head[n_before:]
    if acc != prod or sum(m.size[a] is None for a in mid) != 1:
        raise ValueError("a reshape of a symbolic size")
    return (_static_groups(m, head[:n_before], before) + [tuple(mid)] + _static_groups(m, tail, after))


def _value(m: _Match, n: Any) -> _Val:
    """The role and labels of ``n`` (memoized; an unknown producer is a leaf)."""
    if n in m.vals:
        return m.vals[n]
    v = _compute(m, n)
    m.vals[n] = v
    return v


def _compute(m: _Match, n: Any) -> _Val:  # noqa: C901 - one case per op
    op = _op(n)
    if "val" not in n.meta or not hasattr(n.meta["val"], "shape"):
        raise ValueError("not a tensor")
    if op == "aten.index.Tensor" and len(n.args) == 2 and len(n.args[1]) == 1 and \
            hasattr(n.args[1][0], "op") and n.args[0].op in ("placeholder", "get_attr") and \
            len(_shape(n.args[0])) == 3:
        w, ids = n.args[0], n.args[1][0]
        iv = ids.meta.get("val")
        if iv is None or iv.dtype.is_floating_point or iv.dim() != 2:
            return _leaf(m, n)
        if ids not in m.ids_labels:
            m.ids_labels[ids] = [m.new(s) for s in _shape(ids)]
        t, a = m.ids_labels[ids]
        r, c = (m.new(s) for s in _shape(w)[1:])
        return _Val(("G", w, ids, r, c), [(t,), (a,), (r,), (c,)])
    args = [a for a in n.args if hasattr(a, "op")]
    if op in _PASS and args and n.meta["val"].dtype == getattr(n.args[0].meta.get("val"), "dtype", None):
        v = _value(m, n.args[0])                # (a cast that changes the type is a value of its own)
        return _Val(v.role, list(v.dims))
    if op in _VIEWS:
        v = _value(m, n.args[0])
        if v.role[0] == "leaf":             # an opaque value: its reshape has fresh indices
            return _Val(v.role, _leaf(m, n).dims)
        return _Val(v.role, _regroup(m, v.dims, _shape(n)))
    if op == "aten.unsqueeze.default":
        v = _value(m, n.args[0])
        d = n.args[1] % (len(v.dims) + 1)
        return _Val(v.role, v.dims[:d] + [()] + v.dims[d:])
    if op == "aten.permute.default":
        v = _value(m, n.args[0])
        return _Val(v.role, [v.dims[d % len(v.dims)] for d in n.args[1]])
    if op in ("aten.t.default", "aten.transpose.int"):
        v = _value(m, n.args[0])
        a, b = (0, 1) if op == "aten.t.default" else (n.args[1] % len(v.dims), n.args[2] % len(v.dims))
        dims = list(v.dims)
        dims[a], dims[b] = dims[b], dims[a]
        return _Val(v.role, dims)
    if op in _ACTS:
        if op == "aten.gelu.default" and (n.args[1:] or [n.kwargs.get("approximate", "none")])[0] != "none":
            return _leaf(m, n)
        v = _value(m, n.args[0])
        if v.role[0] != "proj":
            return _leaf(m, n)
        return _Val(("act", _ACTS[op], v.role), list(v.dims))
    if op in ("aten.bmm.default", "aten.mm.default"):
        x, y = (_value(m, a) for a in n.args[:2])
        batch = op == "aten.bmm.default"
        if batch:
            m.unify_dims(x.dims[0], y.dims[0])
        m.unify_dims(x.dims[-1], y.dims[-2])
        dims = ([x.dims[0]] if batch else []) + [x.dims[-2], y.dims[-1]]
        return _Val(_combine(m, x, y, set(x.dims[-1]), n), dims)
    if op == "aten.mul.Tensor" and len(args) == 2:
        x, y = (_value(m, a) for a in n.args[:2])
        rank = max(len(x.dims), len(y.dims))
        xd = [()] * (rank - len(x.dims)) + x.dims
        yd = [()] * (rank - len(y.dims)) + y.dims
        dims = []
        for a, b in zip(xd, yd):
            if a and b:
                m.unify_dims(a, b)
            dims.append(a or b)
        return _Val(_combine(m, x, y, set(), n), dims)
    if op == "aten.sum.dim_IntList":
        v = _value(m, n.args[0])
        red = {d % len(v.dims) for d in n.args[1]}
        keep = bool(n.args[2]) if len(n.args) > 2 else bool(n.kwargs.get("keepdim", False))
        gone = {a for d in red for a in v.dims[d]}
        dims = [() if d in red else v.dims[d] for d in range(len(v.dims)) if keep or d not in red]
        if v.role[0] == "wdown" and {m.find(a) for a in gone} == {m.find(v.role[3])}:
            return _Val(("out",) + v.role[1:], dims)
        return _leaf(m, n)
    return _leaf(m, n)


def _combine(m: _Match, x: _Val, y: _Val, contracted: set, n: Any) -> tuple:
    """The role of a product of ``x`` and ``y`` contracted over the labels ``contracted``."""
    c = {m.find(a) for a in contracted}
    for p, q in ((x, y), (y, x)):
        if p.role[0] == "leaf" and q.role[0] == "G" and len(c) == 1:
            _, w, ids, r, cl = q.role
            k = c.pop()
            if k not in (m.find(r), m.find(cl)):
                break
            out = r if k == m.find(cl) else cl
            return ("proj", p.role[1], w, ids, out, k == m.find(r))
        if p.role[0] == "act" and q.role[0] == "proj" and not c:
            g, u = p.role[2], q.role
            if g[1] is u[1] and g[3] is u[3] and m.find(g[4]) == m.find(u[4]) and g[5] == u[5]:
                return ("inter", p.role[1], g, u)
        if p.role[0] == "inter" and q.role[0] == "G" and len(c) == 1:
            _, w, ids, r, cl = q.role
            k = c.pop()
            if k != m.find(p.role[2][4]) or k not in (m.find(r), m.find(cl)) or ids is not p.role[2][3]:
                break
            h = r if k == m.find(cl) else cl
            return ("down", p.role, w, h, k == m.find(r))
        if p.role[0] == "down" and q.role[0] == "leaf":
            t, a = m.ids_labels[p.role[1][2][3]]
            qd = [lab for d in q.dims for lab in d]
            want = {m.find(t), m.find(a)} if m.size[t] != 1 else {m.find(a)}   # one token: no token index
            if {m.find(lab) for lab in qd} != want or len(qd) != len(want):
                break
            role = (p.role, q.role[1], a)
            if c == {m.find(a)}:
                return ("out",) + role
            if not c:
                return ("wdown",) + role
    return ("leaf", n)


def fuse_gathered_experts(gm: Any) -> list[str]:
    """Rewrite each MoE expert computation of gathered weights in ``gm`` into one
    ``fused_moe`` node (see the module docstring); the notes say which."""
    notes: list[str] = []
    m = _Match()
    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        try:
            v = _value(m, n)
        except Exception:  # noqa: BLE001 - an op or a shape the match does not follow: a leaf
            try:
                m.vals[n] = _leaf(m, n)
            except Exception:  # noqa: BLE001 - not a tensor
                m.vals[n] = _Val(("leaf", n), [])
            continue
        if v.role[0] != "out" or any(_role_out(m, u) for u in n.users):
            continue
        note = _rewrite(gm, m, n, v)
        if note:
            notes.append(note)
    notes += _expert_loop_notes(gm)
    if any(n.startswith("moe: the experts of") for n in notes):
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return notes


#: why HF's per-expert loop is not one ``fused_moe`` (the plan's note on its routing graph)
LOOP_NOTE = ("moe: the top-k ids become a one-hot expert mask (a per-expert loop, as HF's "
             "MixtralSparseMoeBlock): its torch.where(expert_mask[e]) is a nonzero of data-dependent "
             "size, so dynamo ends the graph there and each expert's MLP is a graph of its own (its "
             "GEMM kernels); one fused_moe needs every expert in one graph: written with gathered "
             "expert weights (w1[ids]) it is one")


def _expert_loop_notes(gm: Any) -> list[str]:
    """``LOOP_NOTE`` when ``gm`` turns ``topk`` ids into a one-hot mask (``one_hot``, or its
    decomposition ``eq(unsqueeze(ids, -1), arange(E))``)."""
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        op, src = _op(n), None
        if op == "aten.one_hot.default":
            src = n.args[0]
        elif op == "aten.eq.Tensor" and all(hasattr(a, "op") for a in n.args[:2]) and \
                _op(n.args[1]) == "aten.arange.default" and _op(n.args[0]) == "aten.unsqueeze.default":
            src = n.args[0].args[0]
        if src is not None and _op(src) == "getitem" and src.args[1] == 1 and \
                _op(src.args[0]) == "aten.topk.default":
            return [LOOP_NOTE]
    return []


def _role_out(m: _Match, u: Any) -> bool:
    """Whether ``u`` (a user of an output) is an output too (a view or cast of it)."""
    try:
        return _value(m, u).role[0] == "out"
    except Exception:  # noqa: BLE001 - not a tensor op the match knows
        return False


def _rewrite(gm: Any, m: _Match, y: Any, v: _Val) -> str | None:
    """``y`` (the weighted sum) -> ``view(fused_moe(...), y's shape)``; None when the match's
    sizes do not fit ``fused_moe`` (the graph is left as it is)."""
    import torch
    from torch._guards import detect_fake_mode

    down, w_node = v.role[1], v.role[2]
    _, inter, w2, h_lab, w2_t = down
    _, act, gate, up = inter
    _, x, w1, ids, o_lab, w1_t = gate
    w3, w3_t = up[2], up[5]
    xv, wv, iv = (t.meta["val"] for t in (x, w_node, ids))
    hid, e = _shape(x)[-1], _shape(w1)[0]
    tokens, k = _shape(ids)
    lead = [d for d in _shape(x)[:-1] if d != 1]
    ys = [-1 if d is None else d for d in _shape(y)]
    if w1_t != w3_t or xv.dtype not in (torch.float16, torch.bfloat16) or None in (hid, e, k) or \
            {w.meta["val"].dtype for w in (w1, w3, w2)} != {xv.dtype} or m.size[h_lab] != hid or \
            (tokens is not None and None not in lead and math.prod(lead) != tokens) or \
            _shape(w_node)[1] != k or _shape(w2)[0] != e or _shape(w3)[0] != e or ys.count(-1) > 1:
        return None
    g = gm.graph
    fake = detect_fake_mode([xv]) or contextlib.nullcontext()
    with g.inserting_before(y):
        xs = g.call_function(torch.ops.aten.view.default, (x, [-1, hid]))
        w13 = g.call_function(moe_w13, (w1, w3, w1_t))
        w2d = g.call_function(moe_w2, (w2, w2_t))
        tw = g.call_function(torch.ops.aten._to_copy.default, (w_node,), {"dtype": torch.float32})
        ti = g.call_function(torch.ops.aten._to_copy.default, (ids,), {"dtype": torch.int32})
        moe = g.call_function(torch.ops.hexlayout.fused_moe.default, (xs, w13, w2d, tw, ti, act))
        out = g.call_function(torch.ops.aten.view.default, (moe, ys))
        res = out
        if y.meta["val"].dtype != xv.dtype:
            res = g.call_function(torch.ops.aten._to_copy.default, (out,), {"dtype": y.meta["val"].dtype})
    with fake:
        xs.meta["val"] = xv.reshape(-1, hid)
        w13.meta["val"] = _w13(w1.meta["val"], w3.meta["val"], w1_t)
        w2d.meta["val"] = _w2(w2.meta["val"], w2_t)
        tw.meta["val"] = wv.float()
        ti.meta["val"] = iv.int()
        moe.meta["val"] = xs.meta["val"].clone()        # [T, H], x's dtype
        out.meta["val"] = moe.meta["val"].view(tuple(ys))
        if res is not out:
            res.meta["val"] = out.meta["val"].to(y.meta["val"].dtype)
    y.replace_all_uses_with(res)
    g.erase_node(y)
    leave_routing(ids, w_node, (tw, ti), e)
    return (f"moe: the experts of gathered weights {w1.name}, {w3.name}, {w2.name} by {ids.name} -> one "
            f"fused_moe ({e} experts, top-{k}, {act}); routing (softmax, topk, weights, casts) in torch")


# --- the record ---------------------------------------------------------------------------------
def _operands(g: Any, n: Any) -> tuple:
    return tuple(n.args[:5])


def _to_spec(g: Any, s: AnchorSpec) -> None:
    n = g.anchor
    s.order = [0, 1, 2, 3, 4]
    s.kwargs = (("activation", n.args[5] if len(n.args) > 5 else "silu"),)


def _eager(anchor: str, args: list, kwargs: dict) -> Any:
    import torch

    return torch.ops.hexlayout.fused_moe(*args, **kwargs)


def _run(spec: FusedSpec, anchor_args: list, extra_inputs: list) -> tuple[list, None]:
    """The experts as one ``fused_moe`` call: a prologue of ``hidden_states`` that scales its
    rows and columns (an RMSNorm: ``fusion_prologue``) in the gate-up kernel and the gate-up
    weights, an epilogue of elementwise math of the output (the residual add:
    ``fusion_epilogue``) in the top-k sum kernel - the same launches as without them."""
    import torch

    from hexlayout.fusion.planning import meta_eval, meta_tensors, sig
    from hexlayout.fusion.reference import reference

    from .args import check_fused_moe
    from .fusion_epilogue import moe_sum_epilogue
    from .fusion_prologue import moe_prologue, scaled_w13
    from .op import run_fused_moe

    where = spec.display_name()
    act = dict(spec.anchor_kwargs).get("activation", "silu")
    args = list(anchor_args)
    scales: tuple = ()
    if any(p.operand != 0 for p in spec.prologues):
        raise FusionUnsupported(f"{where}: fused_moe takes a prologue of hidden_states only")
    if spec.prologues:
        w13 = args[1]
        if not isinstance(w13, torch.Tensor) or w13.dim() != 3:
            raise FusionUnsupported(f"{where}: a prologue of hidden_states needs w13 as a [E, 2I, H] tensor")
        hidden = int(w13.shape[2])
        tokens = int(args[4].shape[0])                      # topk_ids [T, k]
        pro = moe_prologue(spec.prologues[0], extra_inputs, tokens, hidden, where)
        x = extra_inputs[pro.x]
        if x.dtype != w13.dtype:
            raise FusionUnsupported(f"{where}: the prologue's activation is {x.dtype}, the weights "
                                    f"{w13.dtype} (fused_moe scales an activation of the weights' type)")
        args[0] = x.reshape(-1, hidden).contiguous()
        args[1] = scaled_w13(w13, pro, extra_inputs, hidden)
        scales = pro.scales
    check_fused_moe(*args, act, False, None, None)
    combine = None
    if spec.epilogue.nodes or spec.epilogue.outputs != (("anchor",),):
        if args[0].shape[0] == 0:                # no token: nothing to launch
            return list(reference(spec, anchor_args, extra_inputs)), None
        metas = meta_eval(("moe outputs", spec, sig(anchor_args), sig(extra_inputs)),
                          lambda: reference(spec, meta_tensors(anchor_args), meta_tensors(extra_inputs)))
        combine = moe_sum_epilogue(spec, args[0], extra_inputs, metas)
    out = run_fused_moe(*args, activation=act, row_scales=scales, combine=combine)
    return (out if combine is not None else [out]), None


def prepare(gm: Any) -> list[str]:
    """The record's graph pass: HF's per-expert loop unrolled in one graph
    (``fusion_loop.fuse_expert_loop``), then experts of gathered weights
    (``fuse_gathered_experts``), each -> one ``fused_moe``."""
    return fuse_expert_loop(gm) + fuse_gathered_experts(gm)


def _prologues(g: Any, n: Any) -> dict[int, list]:
    """Only ``hidden_states`` (operand 0) takes a prologue (``fusion_prologue``)."""
    nodes = g.prologue(n, n.args[0]) if hasattr(n.args[0], "op") else []
    return {0: nodes} if nodes else {}


MOE = register_anchor(AnchorRecord(
    "moe experts", frozenset({MOE_OP}), run=_run, operands=_operands, prologues=_prologues,
    to_spec=_to_spec, eager=_eager, prepare=prepare, row_scale=True,
    row_reductions=frozenset(ROW_SCALE_REDUCTIONS)))
