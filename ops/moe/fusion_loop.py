"""HF's per-expert MoE loop, unrolled in one graph, as one ``fused_moe``.

transformers' ``MixtralSparseMoeBlock`` (the ``for expert_idx in range(num_experts)`` form)
computes, per expert ``e``::

    idx, top_x = torch.where(expert_mask[e])          # expert_mask = one_hot(ids, E).permute(2, 1, 0)
    cur = expert_e(hidden[None, top_x].reshape(-1, H)) * routing_weights[top_x, idx, None]
    final.index_add_(0, top_x, cur)                   # final = zeros(T, H)

``torch.where`` of a mask is a ``nonzero``, whose size depends on the data: by default dynamo
ends the graph there (each expert's MLP is then a graph of its own, and no backend sees the
experts together). With ``torch._dynamo.config.capture_dynamic_output_shape_ops = True`` the
loop is one graph, the experts unrolled over unbacked sizes; ``fuse_expert_loop`` (a pass of
the MoE record's ``prepare``) finds the chain of ``index_add`` s from ``zeros`` that covers
every expert ``0 .. E-1`` once, each reading the same hidden states, routing weights and top-k
ids through the ``nonzero`` of its row of the one-hot mask, with an expert MLP
``w2_e(act(w1_e x) * w3_e x)`` (``mm`` s of the transposed ``Linear`` weights, SiLU or exact
GELU), and replaces it by ``fused_moe(hidden, stack(cat(w1_e, w3_e)), stack(w2_e), weights,
ids)``: the stacked weights are derived parameters (computed once per set of weights), the
``nonzero`` s and their size assertions are gone. The loop over ``expert_hit`` (newer
transformers: ``for e in expert_mask.sum(...).nonzero()``) iterates a tensor of
data-dependent length, which dynamo cannot unroll: it stays one graph per expert.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .derived import cached_derived
from .fusion_routing import leave_routing

__all__ = ["fuse_expert_loop", "moe_stack_w13", "moe_stack_w2"]

_ACTS = {"aten.silu.default": "silu", "aten.gelu.default": "gelu"}
_CASTS = ("aten._to_copy.default", "aten.clone.default", "aten.alias.default")


def _op(n: Any) -> str:
    from hexlayout.fusion.partition import op_name

    return op_name(n.target) if hasattr(n, "op") and n.op == "call_function" else getattr(n, "op", "")


def _stack13(*ws: Any) -> Any:
    import torch

    e = len(ws) // 2
    return torch.stack([torch.cat([ws[i], ws[e + i]], 0) for i in range(e)]).contiguous()


def _stack2(*ws: Any) -> Any:
    import torch

    return torch.stack(list(ws)).contiguous()


def moe_stack_w13(*ws: Any) -> Any:
    """``fused_moe``'s ``w13`` ``[E, 2I, H]`` from the experts' gate weights ``w1_0 .. w1_{E-1}``
    then their up weights ``w3_0 ..`` (``[I, H]`` each), computed once per set of weights."""
    return cached_derived(ws, "stack13", lambda: _stack13(*ws))


def moe_stack_w2(*ws: Any) -> Any:
    """``fused_moe``'s ``w2`` ``[E, H, I]`` from the experts' down weights, computed once."""
    return cached_derived(ws, "stack2", lambda: _stack2(*ws))


moe_stack_w13.hexlayout_derived = True
moe_stack_w2.hexlayout_derived = True


def _strip(n: Any) -> Any:
    while _op(n) in _CASTS and n.args and hasattr(n.args[0], "op") and \
            n.meta.get("val") is not None and n.args[0].meta.get("val") is not None and \
            n.meta["val"].dtype == n.args[0].meta["val"].dtype:
        n = n.args[0]
    return n


def _weight_of(t: Any) -> Any:
    """``t(W)`` of a 2-D graph input ``W``: ``W``, else None."""
    if _op(t) != "aten.t.default" or t.args[0].op not in ("placeholder", "get_attr"):
        return None
    return t.args[0]


def _mm(n: Any) -> tuple[Any, Any] | None:
    """``mm(a, t(W))``: ``(a, W)``."""
    n = _strip(n)
    if _op(n) != "aten.mm.default" or len(n.args) != 2:
        return None
    w = _weight_of(n.args[1])
    return None if w is None else (n.args[0], w)


def _selection(top_x: Any) -> tuple[Any, int, Any] | None:
    """``getitem(unbind(nonzero(select(P, 0, e)), 1), 1)`` with ``P`` the one-hot mask of
    top-k ids permuted ``(2, 1, 0)``: ``(ids, e, the unbind node)``."""
    if _op(top_x) != "getitem" or top_x.args[1] != 1:
        return None
    unbind = top_x.args[0]
    if _op(unbind) != "aten.unbind.int" or (unbind.args[1:] or [0])[0] != 1:
        return None
    nz = unbind.args[0]
    if _op(nz) != "aten.nonzero.default":
        return None
    sel = nz.args[0]
    if _op(sel) != "aten.select.int" or sel.args[1] != 0:
        return None
    perm = sel.args[0]
    if _op(perm) != "aten.permute.default" or list(perm.args[1]) != [2, 1, 0]:
        return None
    oh = _strip(perm.args[0])
    if _op(oh) == "aten._to_copy.default":
        oh = oh.args[0]
    ids = None
    if _op(oh) == "aten.one_hot.default":
        ids = oh.args[0]
    elif _op(oh) == "aten.eq.Tensor" and _op(oh.args[0]) == "aten.unsqueeze.default" and \
            _op(oh.args[1]) == "aten.arange.default":
        ids = oh.args[0].args[0]
    if ids is None:
        return None
    return ids, int(sel.args[2]), unbind


def _block(add: Any) -> dict | None:
    """One expert's ``index_add(acc, 0, top_x, mlp(x[top_x]) * w[top_x, idx, None])``."""
    if _op(add) != "aten.index_add.default" or add.args[1] != 0 or len(add.args) != 4:
        return None
    acc, _, top_x, y = add.args
    found = _selection(top_x)
    if found is None:
        return None
    ids, e, unbind = found
    y = _strip(y)
    if _op(y) != "aten.mul.Tensor":
        return None
    for out, rw in (y.args, y.args[::-1]):
        rw = _strip(rw)
        if _op(rw) != "aten.index.Tensor" or _op(rw.args[0]) != "aten.unsqueeze.default":
            continue
        sel = list(rw.args[1])
        if len(sel) != 2 or sel[0] is not top_x or _op(sel[1]) != "getitem" or sel[1].args[0] is not unbind:
            continue
        down = _mm(out)
        if down is None:
            continue
        inter, w2 = down
        inter = _strip(inter)
        if _op(inter) != "aten.mul.Tensor":
            continue
        for a, b in (inter.args, inter.args[::-1]):
            if _op(a) not in _ACTS:
                continue
            approximate = (a.args[1:] or [a.kwargs.get("approximate", "none")])[0]
            if _op(a) == "aten.gelu.default" and approximate != "none":
                continue
            g, u = _mm(a.args[0]), _mm(b)
            if g is None or u is None or g[0] is not u[0]:
                continue
            xs = _strip(g[0])
            if _op(xs) in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"):
                xs = xs.args[0]
            if _op(xs) != "aten.index.Tensor" or len(xs.args[1]) != 2 or xs.args[1][0] is not None or \
                    xs.args[1][1] is not top_x or _op(xs.args[0]) != "aten.unsqueeze.default":
                continue
            return {"acc": acc, "e": e, "ids": ids, "x": xs.args[0].args[0], "rw": rw.args[0].args[0],
                    "w1": g[1], "w3": u[1], "w2": w2, "act": _ACTS[_op(a)], "nonzero": unbind.args[0]}
    return None


def fuse_expert_loop(gm: Any) -> list[str]:
    """Rewrite each unrolled per-expert loop of ``gm`` into one ``fused_moe`` node (see the
    module docstring); the notes say which."""
    notes = []
    for n in list(gm.graph.nodes):
        if _op(n) != "aten.index_add.default" or any(_op(u) == "aten.index_add.default" for u in n.users):
            continue
        chain, cur = [], n
        while True:
            b = _block(cur)
            if b is None:
                break
            chain.append((cur, b))
            cur = b["acc"]
        if not chain or _op(cur) != "aten.zeros.default":
            continue
        chain.reverse()
        blocks = [b for _, b in chain]
        first = blocks[0]
        e = len(blocks)
        keys = ("ids", "x", "rw", "act")
        if sorted(b["e"] for b in blocks) != list(range(e)) or any(b[k] is not first[k] for b in blocks
                                                                   for k in keys):
            continue
        blocks.sort(key=lambda b: b["e"])
        note = _rewrite(gm, chain[-1][0], cur, blocks)
        if note:
            notes.append(note)
    if notes:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return notes


def _rewrite(gm: Any, last: Any, zeros: Any, blocks: list) -> str | None:
    import torch
    from torch._guards import detect_fake_mode

    b0 = blocks[0]
    x, rw, ids = b0["x"], b0["rw"], b0["ids"]
    from hexlayout.fusion.partition import static_int

    xv, yv = x.meta["val"], last.meta["val"]
    t, h = (static_int(s) for s in yv.shape)
    if t is None or h is None:
        return None
    w13s = [b["w1"] for b in blocks] + [b["w3"] for b in blocks]
    w2s = [b["w2"] for b in blocks]
    if xv.dtype not in (torch.float16, torch.bfloat16) or tuple(xv.shape) != (t, h) or \
            yv.dtype != xv.dtype or \
            any(w.meta["val"].dtype != xv.dtype or w.meta["val"].dim() != 2 for w in w13s + w2s) or \
            len({tuple(w.meta["val"].shape) for w in w13s}) != 1 or \
            len({tuple(w.meta["val"].shape) for w in w2s}) != 1:
        return None
    g = gm.graph
    fake = detect_fake_mode([xv]) or contextlib.nullcontext()
    with g.inserting_before(last):
        w13 = g.call_function(moe_stack_w13, tuple(w13s))
        w2 = g.call_function(moe_stack_w2, tuple(w2s))
        tw = g.call_function(torch.ops.aten._to_copy.default, (rw,), {"dtype": torch.float32})
        ti = g.call_function(torch.ops.aten._to_copy.default, (ids,), {"dtype": torch.int32})
        moe = g.call_function(torch.ops.hexlayout.fused_moe.default, (x, w13, w2, tw, ti, b0["act"]))
    with fake:
        w13.meta["val"] = _stack13(*(w.meta["val"] for w in w13s))
        w2.meta["val"] = _stack2(*(w.meta["val"] for w in w2s))
        tw.meta["val"] = rw.meta["val"].float()
        ti.meta["val"] = ids.meta["val"].int()
        moe.meta["val"] = xv.clone()
    last.replace_all_uses_with(moe)
    _drop_selections(g, last, [b["nonzero"] for b in blocks])
    leave_routing(ids, rw, (tw, ti), len(blocks))
    return (f"moe: HF's per-expert loop ({len(blocks)} experts, unrolled in one graph) -> one fused_moe "
            f"({b0['act']}); its nonzero selections and index_add chain are gone")


def _drop_selections(g: Any, last: Any, nonzeros: list) -> None:
    """Erase the loop's ``index_add`` chain and each ``nonzero`` with everything that reads
    it (its size assertions included: they are impure, so dead-code elimination keeps them)."""
    doomed: list = []
    seen: set = set()
    work = [last, *nonzeros]
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        doomed.append(n)
        work.extend(n.users)
    order = {n: i for i, n in enumerate(g.nodes)}
    for n in sorted(doomed, key=order.__getitem__, reverse=True):
        g.erase_node(n)
