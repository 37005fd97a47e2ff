"""Interleaved unpacking written with ``stack``, as a sum of one-hot products.

Sub-byte weights are often unpacked by stacking the fields of each word along a new last
dimension and merging it into the columns::

    torch.stack([p & 0xF, p >> 4], -1).view(N, K)        # p: [N, K/2] uint8, two nibbles

``stack`` is no elementwise op, so the unpacking would stay in torch in front of the GEMM.
For integer tensors ``t_0 .. t_{r-1}`` of one shape ``S`` (finite values: products by 0 and
1 are exact),

    stack([t_0, ..., t_{r-1}], -1) = sum_i t_i[..., None] * e_i,   e_i = onehot(i, r) of shape [1, .., 1, r]

which is elementwise math of per-group values (``t_i[..., None]``: one value per group of
``r`` columns once the view merges the last two dimensions) and per-position constants
(``e_i``: ``InputSpec.period``), the grouped prologue form of ``fusion_groups``.
``unstack_interleaved(gm)`` (part of the GEMM record's ``prepare``) rewrites each such
``stack`` whose value reaches a GEMM operand; ``e_i`` are derived parameters, made once.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

__all__ = ["unstack_interleaved", "stack_onehot"]

_LOCK = threading.Lock()
_ONEHOT: dict[tuple, Any] = {}
_GEMMS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.linear.default")


def stack_onehot(r: int, i: int, rank: int, dtype: Any, device: Any) -> Any:
    """``e_i``: a ``[1] * rank + [r]`` tensor of ``dtype`` on ``device``, 1 at position ``i``
    of the last dimension, 0 elsewhere (cached).

    Example::

        >>> import torch
        >>> stack_onehot(2, 1, 2, torch.uint8, "cpu").tolist()
        [[[0, 1]]]
    """
    from hexlayout.runtime.alloc import zeroed

    key = (r, i, rank, dtype, str(device))
    with _LOCK:
        hit = _ONEHOT.get(key)
        if hit is None:
            hit = zeroed([1] * rank + [r], dtype, device)
            hit[..., i] = 1
            if len(_ONEHOT) > 256:
                _ONEHOT.clear()
            _ONEHOT[key] = hit
    return hit


stack_onehot.hexlayout_derived = True       # a constant made once: not an op left to torch


def _op(n: Any) -> str:
    from hexlayout.fusion.partition import op_name

    return op_name(n.target) if n.op == "call_function" else n.op


def _reaches_gemm(n: Any, depth: int = 16) -> bool:
    """Whether a GEMM reads ``n``'s value through at most ``depth`` ops."""
    work, seen = [(n, 0)], set()
    while work:
        v, d = work.pop()
        for u in v.users:
            if _op(u) in _GEMMS:
                return True
            if d < depth and u not in seen:
                seen.add(u)
                work.append((u, d + 1))
    return False


def _stacked(n: Any) -> list | None:
    """The stacked tensors of ``n`` when it is a ``stack`` along a new last dimension of
    at least two integer tensors of one shape and dtype, else None."""
    import torch

    if _op(n) != "aten.stack.default":
        return None
    tensors = list(n.args[0])
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
    vals = [getattr(t, "meta", {}).get("val") for t in tensors]
    if len(tensors) < 2 or any(v is None for v in vals):
        return None
    rank = vals[0].dim()
    if dim not in (-1, rank) or vals[0].dtype.is_floating_point or vals[0].dtype.is_complex or \
            vals[0].dtype == torch.bool:
        return None
    if any(tuple(v.shape) != tuple(vals[0].shape) or v.dtype != vals[0].dtype for v in vals):
        return None
    return tensors


def _onehot_fake(r: int, rank: int, dtype: Any, device: Any) -> Any:
    """``stack_onehot``'s value as the graph's fake mode makes it (called inside that mode)."""
    import torch

    return torch.zeros([1] * rank + [r], dtype=dtype, device=device)


def unstack_interleaved(gm: Any) -> list[str]:
    """Rewrite each integer ``stack`` along a new last dimension that a GEMM reads into the
    sum of one-hot products (see the module docstring); a note per rewrite."""
    import torch
    from torch._guards import detect_fake_mode

    aten = torch.ops.aten
    g = gm.graph
    notes = []
    for n in list(g.nodes):
        tensors = _stacked(n)
        if tensors is None or not _reaches_gemm(n):
            continue
        vals = [t.meta["val"] for t in tensors]
        r, rank, dtype, device = len(tensors), vals[0].dim(), vals[0].dtype, vals[0].device
        fake = detect_fake_mode(vals) or contextlib.nullcontext()
        with g.inserting_before(n):
            acc = None
            for i, t in enumerate(tensors):
                e = g.call_function(stack_onehot, (r, i, rank, dtype, device))
                u = g.call_function(aten.unsqueeze.default, (t, -1))
                term = g.call_function(aten.mul.Tensor, (u, e))
                with fake:
                    e.meta["val"] = _onehot_fake(r, rank, dtype, device)
                    u.meta["val"] = aten.unsqueeze.default(vals[i], -1)
                    term.meta["val"] = aten.mul.Tensor(u.meta["val"], e.meta["val"])
                if acc is None:
                    acc = term
                    continue
                s = g.call_function(aten.add.Tensor, (acc, term))
                with fake:
                    s.meta["val"] = aten.add.Tensor(acc.meta["val"], term.meta["val"])
                acc = s
        n.replace_all_uses_with(acc)
        g.erase_node(n)
        notes.append(f"unpack: stack of {r} fields ({n.name}) as one-hot products in the GEMM's prologue")
    if notes:
        g.lint()
        gm.recompile()
    return notes
