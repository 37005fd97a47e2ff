"""LayerNorm of a GEMM's activation, written out so that it fuses as the GEMM's A prologue.

``F.layer_norm(x, [K], w, b, eps)`` reaches the aten graph as one op,
``native_layer_norm`` (its output, the row means and the reciprocal deviations), which no
kernel computes. In front of a GEMM whose A operand it produces, over rows of static
length ``K <= NORM_MAX_K``, ``decompose_layer_norms(gm)`` (part of the GEMM record's
``prepare``) rewrites it into the ops eager computes it with (f32 inside, rounded to
``x``'s dtype at the end)::

    xf = x.float();  mu = mean(xf, -1, keepdim)
    d = xf - mu;     var = mean(d * d, -1, keepdim)
    y = (d * rsqrt(var + eps) * w.float() + b.float()).to(x.dtype)

which the front end takes as the GEMM's A prologue (two row reductions of a tile that holds
whole rows, as RMSNorm's one). Only the normalized output may be used (the means and
deviations are what training reads: then it stays one op). A longer row keeps
``native_layer_norm`` in torch and the notes say ``norm: two kernels (K=... > 128):
native_layer_norm in torch, then the GEMM``.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

__all__ = ["decompose_layer_norms"]

_LN = "aten.native_layer_norm.default"
_GEMMS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.linear.default")
_VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def _op(n: Any) -> str:
    from hexlayout.fusion.partition import op_name

    return op_name(n.target) if n.op == "call_function" else n.op


def _feeds_gemm(n: Any) -> Any:
    """The GEMM whose A operand ``n`` is (through reshapes), or None."""
    work = [n]
    while work:
        v = work.pop()
        for u in v.users:
            if _op(u) in _VIEWS:
                work.append(u)
            elif _op(u) in _GEMMS and u.args[1 if _op(u) == "aten.addmm.default" else 0] is v:
                return u
    return None


def decompose_layer_norms(gm: Any) -> list[str]:
    """Rewrite each ``native_layer_norm`` that produces a GEMM's A operand over rows of
    ``K <= NORM_MAX_K`` into its ops (see the module docstring); notes for the longer ones."""
    from .fusion_plan import NORM_MAX_K

    notes: list[str] = []
    changed = False
    for n in list(gm.graph.nodes):
        if _op(n) != _LN:
            continue
        outs = [u for u in n.users if u.target is operator.getitem]
        if len(outs) != len(n.users) or any(u.args[1] != 0 and u.users for u in outs):
            continue                            # the means / deviations are read: keep the op
        y = next((u for u in outs if u.args[1] == 0), None)
        gemm = _feeds_gemm(y) if y is not None else None
        shape = n.args[1]
        if gemm is None or len(shape) != 1 or not isinstance(shape[0], int):
            continue
        k = shape[0]
        if k > NORM_MAX_K:
            notes.append(f"norm: two kernels (K={k} > {NORM_MAX_K}): native_layer_norm in torch, then "
                         f"{_op(gemm)} ({gemm.name})")
            continue
        _rewrite(gm, n, y)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return notes


def _rewrite(gm: Any, ln: Any, y: Any) -> None:
    """Replace ``getitem(native_layer_norm(x, [K], w, b, eps), 0)`` by its ops."""
    import torch
    from torch._guards import detect_fake_mode

    aten = torch.ops.aten
    g = gm.graph
    x, _, w, b = ln.args[:4]
    eps = ln.args[4] if len(ln.args) > 4 else 1e-5
    xv = x.meta["val"]
    fake = detect_fake_mode([xv]) or contextlib.nullcontext()
    made: list[tuple[Any, Any, tuple, dict]] = []

    def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        node = g.call_function(fn, args, kwargs)
        made.append((node, fn, args, kwargs))
        return node

    def f32(v: Any) -> Any:
        return call(aten._to_copy.default, v, dtype=torch.float32)

    with g.inserting_before(y):
        xf = f32(x) if xv.dtype != torch.float32 else x
        mu = call(aten.mean.dim, xf, [-1], True)
        d = call(aten.sub.Tensor, xf, mu)
        var = call(aten.mean.dim, call(aten.mul.Tensor, d, d), [-1], True)
        out = call(aten.mul.Tensor, d, call(aten.rsqrt.default, call(aten.add.Tensor, var, float(eps))))
        if w is not None:
            out = call(aten.mul.Tensor, out, f32(w))
        if b is not None:
            out = call(aten.add.Tensor, out, f32(b))
        if xv.dtype != torch.float32:
            out = call(aten._to_copy.default, out, dtype=xv.dtype)
    with fake:
        for node, fn, args, kwargs in made:
            vals = [a.meta["val"] if hasattr(a, "meta") else a for a in args]
            node.meta["val"] = fn(*vals, **kwargs)
    y.replace_all_uses_with(out)
