"""GPTQ act-order (``desc_act=True``) for the W4A16 / W8A16 fused MoE: the permutation of K
applied once to the weights in ``prepare_wna16`` and per expert to the activations in the op,
as vLLM's Marlin does.

A GPTQ act-order checkpoint quantizes the rows of K of ``W`` (``y = x @ W``, ``W [K, N]``) in
an order of its own: row ``k`` belongs to group ``g_idx[e, k]`` (not ``k // G``). With
``perm[e] = argsort(g_idx[e])`` (stable) the rows ``perm[e][G j .. G (j + 1))`` are exactly
group ``j``'s (every group has ``G`` rows), so ``W'[e] = W[e][perm[e], :]`` is an ordinary
grouped weight (row ``k'`` in group ``k' // G``) and, since a product over K does not depend on
the order of its terms::

    x @ W[e] = sum_k x[k] W[e][k, :] = sum_k' x[perm[e][k']] W'[e][k', :] = x[perm[e]] @ W'[e]

The op therefore runs the unchanged grouped kernels on ``W'`` with the activations' columns
gathered per expert: gate-up reads ``x[t, perm13[e]]`` (a ``[T * k, H]`` buffer, one row per
routed slot ``r = t * k + j``), down reads ``h[p, perm2[e]]`` (``[EM, I]``, one row per sorted
position ``p``, ``e`` the expert of its block) — vLLM's Marlin ``a_tmp``.

- ``act_order_perm(g_idx, ...)``: checks ``g_idx`` and returns ``perm`` (``prepare_wna16``);
- ``permute_rows(q, perm)``: ``q[e][perm[e], :]`` of the unpacked ``[E, K, N]`` weights;
- ``check_perm`` / ``check_perm_content``: the op's checks of a ``perm`` argument (eager and
  fake; the content on CPU tensors and under ``HEXLAYOUT_CHECK=1``);
- ``permuted_tokens`` / ``permuted_inter``: the activation gathers of the two GEMMs.
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError

__all__ = ["act_order_perm", "permute_rows", "check_perm", "check_perm_content", "permuted_tokens",
           "permuted_inter"]


def _kind(x: Any) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def act_order_perm(op: str, g_idx: Any, quant_format: str, e: int, k: int, group_size: int,
                   device: Any) -> Any:
    """``perm`` ``[E, K]`` int32 with ``perm[e] = argsort(g_idx[e])`` (stable), after checking
    ``g_idx``: an int32 ``[E, K]`` tensor on ``device`` (GPTQ only) whose ids lie in ``[0,
    K / G)`` and name every group exactly ``G`` times (``G = K`` for ``group_size = -1``).
    Raises ``ArgumentTypeError`` / ``ArgumentError`` naming ``g_idx`` (op ``op``)."""
    import torch

    if quant_format != "gptq":
        raise ArgumentError(op, "g_idx", f"act-order (g_idx) is a GPTQ format; {quant_format} has none: pass "
                            "g_idx=None")
    if not isinstance(g_idx, torch.Tensor):
        raise ArgumentTypeError(op, "g_idx", f"expected an int32 tensor [E, K], got {_kind(g_idx)}")
    if g_idx.dtype != torch.int32 or tuple(g_idx.shape) != (e, k):
        raise ArgumentError(op, "g_idx", f"must be an int32 tensor [E, K] = {[e, k]} (the group of each row "
                            f"of K), got {_kind(g_idx)}")
    if g_idx.device != device:
        raise ArgumentError(op, "g_idx", f"is on {g_idx.device}, qweight on {device}")
    gs = k if group_size == -1 else group_size
    groups = k // gs
    lo, hi = int(g_idx.min()), int(g_idx.max())
    if lo < 0 or hi >= groups:
        raise ArgumentError(op, "g_idx", f"holds group ids in [{lo}, {hi}], expected 0 <= id < K/G = "
                            f"{groups}")
    offset = groups * torch.arange(e, device=device).unsqueeze(1)        # expert e's groups at e * K/G
    counts = (g_idx.long() + offset).flatten().bincount(minlength=e * groups).view(e, groups)
    bad = torch.nonzero(counts != gs)
    if bad.numel():
        ex, gr = (int(v) for v in bad[0])
        raise ArgumentError(op, "g_idx", f"expert {ex} has {int(counts[ex, gr])} rows in group {gr}; every "
                            f"group must have exactly group_size = {gs} rows")
    return torch.argsort(g_idx, dim=1, stable=True).to(torch.int32).contiguous()


def permute_rows(q: Any, perm: Any) -> Any:
    """``q[e][perm[e], :]`` of ``q`` ``[E, K, N]``: the rows of each expert in group order."""
    return q.gather(1, perm.long().unsqueeze(-1).expand(-1, -1, q.shape[2]))


def check_perm(op: str, name: str, perm: Any, quant_format: Any, e: int, k: int) -> None:
    """``perm`` is None or an int32 ``[E, K]`` tensor (``WNA16Weights.perm``; GPTQ only)."""
    import torch

    if perm is None:
        return
    if quant_format != "gptq":
        raise ArgumentError(op, name, f"act-order permutations belong to GPTQ weights, not {quant_format}: "
                            "pass None")
    if not isinstance(perm, torch.Tensor):
        raise ArgumentTypeError(op, name, f"expected an int32 tensor [E, K] or None, got {_kind(perm)}")
    if perm.dtype != torch.int32 or tuple(perm.shape) != (e, k):
        raise ArgumentError(op, name, f"must be prepare_wna16's int32 [E, K] = {[e, k]} (argsort of g_idx), "
                            f"got {_kind(perm)}")


def check_perm_content(op: str, name: str, perm: Any) -> None:
    """Content check: every row of ``perm`` is a permutation of ``0 .. K-1``."""
    import torch

    k = perm.shape[1]
    ok = torch.equal(torch.sort(perm, dim=1).values,
                     torch.arange(k, dtype=perm.dtype, device=perm.device).expand_as(perm))
    if not ok:
        raise ArgumentError(op, name, f"is not a permutation of 0 .. {k - 1} in every row")


def permuted_tokens(x: Any, topk_ids: Any, expert_map: Any, perm: Any) -> Any:
    """``xp [T * k, H]`` with ``xp[t * k + j] = x[t, perm[e]]``, ``e`` the local expert of
    ``topk_ids[t, j]`` (a remote slot, ``expert_map`` -1, takes expert 0's order: never read)."""
    k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1).long()
    local = ids if expert_map is None else expert_map.long()[ids]
    cols = perm.long()[local.clamp(min=0)]                        # [T * k, H]
    return x.repeat_interleave(k, dim=0).gather(1, cols)


def permuted_inter(h: Any, expert_ids: Any, block_m: int, perm: Any) -> Any:
    """``hp [EM, I]`` with ``hp[p] = h[p, perm[e]]``, ``e = expert_ids[p // block_m]`` (a block
    without an expert, -1, takes expert 0's order: never read)."""
    blk = expert_ids.long().clamp(min=0).repeat_interleave(block_m)[: h.shape[0]]
    return h.gather(1, perm.long()[blk])
