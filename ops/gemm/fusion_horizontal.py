"""Horizontal fusion of GEMMs before partitioning: two projections of one activation whose
products meet in a gated product (``act(x @ Wg.t()) * (x @ Wu.t())``: Llama's
``silu(gate(h)) * up(h)``, Gemma's GELU-tanh gate) become ONE GEMM over the concatenated
weight ``Wgu = cat([Wg, Wu], 0)`` (``N x K`` each, so ``2N x K``), whose product is split
back into its two column halves: ``x @ Wgu.t() = [x @ Wg.t() | x @ Wu.t()]``. The fusion
front end then computes ``act(gate) * up`` on the pairs of columns ``(j, j + N)`` in the
GEMM's epilogue (the column-halves path) and a norm producing ``x`` is the single GEMM's A
prologue. The concatenation is a derived parameter: computed once per pair of weight
tensors (and again only when one of them is modified in place), never per call.

``fuse_gated_pairs(gm)`` is the GEMM record's ``prepare`` (``AnchorRecord.prepare``)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["fuse_gated_pairs", "concat_weights"]

_LOCK = threading.Lock()
_CONCAT: dict[tuple, Any] = {}
_MM, _T, _VIEW = "aten.mm.default", "aten.t.default", ("aten.view.default", "aten._unsafe_view.default",
                                                      "aten.reshape.default")
#: the activations of a gate (``act(gate) * up``)
_GATES = ("aten.silu.default", "aten.gelu.default", "aten.relu.default", "aten.sigmoid.default")


def concat_weights(w1: Any, w2: Any) -> Any:
    """``cat([w1, w2], 0)``, cached per pair of tensors (the same objects at the same
    versions: a weight modified in place is concatenated again).

    Example::

        >>> import torch
        >>> a, b = torch.ones(2, 3), torch.zeros(2, 3)
        >>> concat_weights(a, b).shape, concat_weights(a, b) is concat_weights(a, b)
        (torch.Size([4, 3]), True)
    """
    import torch

    key = tuple((w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype, w.device) for w in (w1, w2))
    with _LOCK:
        hit = _CONCAT.get(key)
    if hit is not None and hit[0]() is w1 and hit[1]() is w2 and hit[2] == (w1._version, w2._version):
        return hit[3]
    out = torch.cat([w1, w2], 0)
    with _LOCK:
        if len(_CONCAT) > 64:
            _CONCAT.clear()
        _CONCAT[key] = (weakref.ref(w1), weakref.ref(w2), (w1._version, w2._version), out)
    return out


concat_weights.hexlayout_derived = True       # a parameter computed once: not an op left to torch


def _op(n: Any) -> str:
    from hexlayout.fusion.partition import op_name

    return op_name(n.target) if n.op == "call_function" else n.op


def _projection(n: Any) -> tuple[Any, Any, tuple] | None:
    """``mm(view(x, s) | x, t(W))`` with ``W`` a 2-D graph input: ``(x, W, s)``, else None."""
    if _op(n) != _MM or len(n.args) != 2 or n.kwargs:
        return None
    a, bt = n.args
    if not hasattr(bt, "op") or _op(bt) != _T or bt.args[0].op not in ("placeholder", "get_attr"):
        return None
    w = bt.args[0]
    v = w.meta.get("val")
    if v is None or len(v.shape) != 2 or len(bt.users) != 1 or "val" not in n.meta:
        return None
    shape: tuple = ()
    if hasattr(a, "op") and _op(a) in _VIEW:
        shape, a = tuple(a.args[1]), a.args[0]
    return a, w, shape


def _through_views(n: Any) -> Any:
    """The single non-view consumer reached from ``n`` through single-user views, or None."""
    while len(n.users) == 1:
        (u,) = n.users
        if _op(u) not in _VIEW:
            return u
        n = u
    return None


def _gate_of(g: Any, u: Any) -> bool:
    """Whether ``act(g ...) * (u ...)`` reads the two products (``g`` under the activation)."""
    act = _through_views(g)
    if act is None or _op(act) not in _GATES or len(act.users) != 1:
        return False
    mul = next(iter(act.users))
    return _op(mul) == "aten.mul.Tensor" and _through_views(u) is mul


def fuse_gated_pairs(gm: Any) -> list[str]:
    """Rewrite each gated pair of projections of one activation in ``gm`` into one GEMM over
    the concatenated weight and a split of its product (see the module docstring); the
    notes say which pairs."""
    groups: dict[tuple, list] = {}
    for n in gm.graph.nodes:
        p = _projection(n)
        if p is not None:
            groups.setdefault((p[0], str(p[2])), []).append((n, p[1]))
    notes = []
    for pair in groups.values():
        if len(pair) != 2:
            continue
        (m1, w1), (m2, w2) = pair
        v1, v2 = w1.meta["val"], w2.meta["val"]
        if tuple(v1.shape) != tuple(v2.shape) or v1.dtype != v2.dtype:
            continue
        if _gate_of(m2, m1):
            (m1, w1), (m2, w2) = (m2, w2), (m1, w1)
        elif not _gate_of(m1, m2):
            continue
        _rewrite(gm, m1, w1, m2, w2)
        notes.append(f"gate and up: one GEMM over cat([{w1.name}, {w2.name}]) (concatenated once), "
                     f"act(gate) * up in its epilogue")
    if notes:
        gm.graph.lint()
        gm.recompile()
    return notes


def _rewrite(gm: Any, gate: Any, wg: Any, up: Any, wu: Any) -> None:
    """``gate = mm(a, t(wg))``, ``up = mm(a', t(wu))`` -> ``split(mm(a, t(cat(wg, wu))), N, -1)``."""
    import contextlib
    import operator

    import torch
    from torch._guards import detect_fake_mode

    g = gm.graph
    first = gate if list(g.nodes).index(gate) < list(g.nodes).index(up) else up
    a = first.args[0]
    n = wg.meta["val"].shape[0]
    fake = detect_fake_mode([a.meta["val"], wg.meta["val"]]) or contextlib.nullcontext()
    with g.inserting_before(first):
        cat = g.call_function(concat_weights, (wg, wu))
        t = g.call_function(torch.ops.aten.t.default, (cat,))
        mm = g.call_function(torch.ops.aten.mm.default, (a, t))
        sp = g.call_function(torch.ops.aten.split.Tensor, (mm, n, -1))
        parts = [g.call_function(operator.getitem, (sp, i)) for i in range(2)]
    with fake:
        cat.meta["val"] = torch.cat([wg.meta["val"], wu.meta["val"]], 0)
        t.meta["val"] = cat.meta["val"].t()
        mm.meta["val"] = torch.ops.aten.mm.default(a.meta["val"], t.meta["val"])
        sp.meta["val"] = list(torch.ops.aten.split.Tensor(mm.meta["val"], n, -1))
    for i, part in enumerate(parts):
        part.meta["val"] = sp.meta["val"][i]
    for old, new in ((gate, parts[0]), (up, parts[1])):
        ta, view = old.args[1], old.args[0]
        old.replace_all_uses_with(new)
        g.erase_node(old)
        g.erase_node(ta)
        if hasattr(view, "op") and view is not a and not view.users:
            g.erase_node(view)
