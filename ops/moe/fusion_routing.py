"""A MoE block's routing left to torch: the ops from the router GEMM's output (exclusive)
through the f32 softmax, ``topk`` and the renormalisation to the top-k weights and ids that
``fused_moe`` reads (and the casts the MoE passes add) are marked ``LEFT_TO_TORCH`` with one
reason (``routing_reason``): a data-dependent selection on rows of a few values, whose row
reductions would each be a launch of their own as kernels. The
router GEMM itself stays a kernel."""

from __future__ import annotations

from typing import Any

__all__ = ["leave_routing", "routing_reason"]


def _op(n: Any) -> str:
    from hexlayout.fusion.partition import op_name

    return op_name(n.target) if n.op == "call_function" else n.op


_MATMULS = ("aten.mm.default", "aten.addmm.default", "aten.linear.default", "aten.bmm.default")


def routing_reason(experts: int) -> str:
    """Why a MoE block's routing is left to torch (the plan's reason for each of its ops)."""
    return (f"MoE routing over {experts} experts (softmax, top-k, renormalisation, casts): a data-dependent "
            "selection on rows of a few values; as kernels its row reductions would be launches of their own")


def leave_routing(ids: Any, weights: Any, casts: tuple, experts: int) -> None:
    """Mark the routing that produces the top-k ``ids`` and ``weights`` as left to torch
    (``LEFT_TO_TORCH``): from the router GEMM's output (exclusive) through the ``topk`` to the
    weights and ids fused_moe reads (``casts``, the f32 / int32 casts the pass adds). Nothing
    is marked when no GEMM bounds it (the routing is then not told apart from the rest)."""
    from hexlayout.fusion.partition import LEFT_TO_TORCH

    topk = ids.args[0] if _op(ids) == "getitem" else None
    if topk is None or _op(topk) != "aten.topk.default" or not hasattr(topk.args[0], "op"):
        return
    up: list = []
    work, bounded = [topk.args[0]], False
    while work:
        n = work.pop()
        if n in up or n.op != "call_function":
            continue
        if _op(n) in _MATMULS:
            bounded = True
            continue
        up.append(n)
        work.extend(a for a in n.all_input_nodes)
    if not bounded:
        return
    down: list = []
    work = [topk]
    targets = {weights, ids, *casts}
    while work:                          # topk's descendants that lead to the weights / ids
        n = work.pop()
        if n in down:
            continue
        down.append(n)
        work.extend(u for u in n.users if u in targets or _leads_to(u, targets))
    reason = routing_reason(experts)
    for n in up + down:
        n.meta[LEFT_TO_TORCH] = reason


def _leads_to(n: Any, targets: set, depth: int = 16) -> bool:
    """Whether ``targets`` are reached from ``n`` through at most ``depth`` users."""
    if n in targets:
        return True
    return depth > 0 and any(_leads_to(u, targets, depth - 1) for u in n.users)
