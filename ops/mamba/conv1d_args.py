"""The argument checks of ``causal_conv1d`` and ``causal_conv1d_update``, run eagerly and in
their fake implementations; each error names the op and the argument."""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.args import ArgumentError

from ..host.checks import check_dtype, check_index_tensors, check_one_device, check_tensors
from ..host.launch import content_checks

__all__ = ["check_causal_conv1d", "check_causal_conv1d_update", "check_cu_seqlens", "check_activation"]

ACTIVATIONS = (None, "silu")


def check_activation(op: str, activation: Any) -> bool:
    """``activation`` is ``None`` or ``"silu"``; returns whether SiLU is applied."""
    if activation not in ACTIVATIONS:
        raise ArgumentError(op, "activation", f"is {activation!r}; supported: None, 'silu'")
    return activation == "silu"


def check_cu_seqlens(op: str, cu_seqlens: Any, total: int) -> int:
    """``cu_seqlens`` [S+1] int32, non-decreasing from 0 up to at most ``total`` packed positions
    (contents checked where ``content_checks`` allows); returns ``S``."""
    import torch

    check_tensors(op, [("cu_seqlens", cu_seqlens, 1)])
    check_index_tensors(op, [("cu_seqlens", cu_seqlens)], torch.int32)
    if cu_seqlens.shape[0] < 1:
        raise ArgumentError(op, "cu_seqlens", "is empty; expected S+1 offsets starting at 0")
    if content_checks(cu_seqlens):
        c = cu_seqlens.cpu()
        if int(c[0]) != 0 or bool((c[1:] < c[:-1]).any()) or int(c[-1]) > total:
            raise ArgumentError(op, "cu_seqlens", f"holds {c.tolist()[:16]}: expected non-decreasing "
                                f"offsets from 0 to at most {total}")
    return cu_seqlens.shape[0] - 1


def _check_weight(op: str, x: Any, weight: Any, bias: Any, dim: int) -> int:
    """``weight`` [dim, width] (width 2-4) and ``bias`` [dim], of ``x``'s dtype; returns width."""
    check_tensors(op, [("weight", weight, 2)] + ([("bias", bias, 1)] if bias is not None else []))
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise ArgumentError(op, name, f"has dtype {t.dtype}, x {x.dtype}")
    if weight.shape[0] != dim or not 2 <= weight.shape[1] <= 4:
        raise ArgumentError(op, "weight", f"has shape {tuple(weight.shape)}: expected [{dim}, width] "
                            "with width 2-4")
    if bias is not None and bias.shape[0] != dim:
        raise ArgumentError(op, "bias", f"has shape {tuple(bias.shape)}: expected [{dim}]")
    return int(weight.shape[1])


def check_causal_conv1d(x: Any, weight: Any, bias: Any = None, activation: Any = None,
                        initial_states: Any = None, cu_seqlens: Any = None,
                        return_final_states: bool = False) -> None:
    """The arguments of ``causal_conv1d``: ``x`` [batch, dim, L] (f16 / bf16), or [dim, T] with
    ``cu_seqlens``; ``initial_states`` [batch or S, dim, width-1] of ``x``'s dtype."""
    op = "hexlayout.causal_conv1d"
    optional = (("cu_seqlens", cu_seqlens, 1), ("initial_states", initial_states, 3))
    check_tensors(op, [(n, t, r) for n, t, r in optional if t is not None])
    check_tensors(op, [("x", x, 2 if cu_seqlens is not None else 3)])
    check_dtype(op, "x", x)
    dim = x.shape[-2]
    width = _check_weight(op, x, weight, bias, dim)
    check_activation(op, activation)
    seqs = x.shape[0] if cu_seqlens is None else check_cu_seqlens(op, cu_seqlens, x.shape[-1])
    named = [("x", x, 0), ("weight", weight, 0)] + [
        (n, t, 0) for n, t in (("bias", bias), ("initial_states", initial_states), ("cu_seqlens", cu_seqlens))
        if t is not None]
    check_one_device(op, named)
    if initial_states is not None:
        check_tensors(op, [("initial_states", initial_states, 3)])
        if initial_states.dtype != x.dtype:
            raise ArgumentError(op, "initial_states", f"has dtype {initial_states.dtype}, x {x.dtype}")
        if tuple(initial_states.shape) != (seqs, dim, width - 1):
            raise ArgumentError(op, "initial_states", f"has shape {tuple(initial_states.shape)}: expected "
                                f"[{seqs}, {dim}, {width - 1}] (sequences, dim, width-1)")
    if not isinstance(return_final_states, bool):
        raise ArgumentError(op, "return_final_states", f"expected a bool, got {return_final_states!r}")


def check_causal_conv1d_update(x: Any, conv_state: Any, weight: Any, bias: Any = None,
                               activation: Any = None, conv_state_indices: Any = None) -> None:
    """The arguments of ``causal_conv1d_update``: ``x`` [batch, dim] or [batch, dim, L];
    ``conv_state`` [n, dim, SL] with ``SL >= width-1``; ``conv_state_indices`` [batch] int32 in
    ``[-1, n)`` (without it ``batch <= n``)."""
    import torch

    op = "hexlayout.causal_conv1d_update"
    check_tensors(op, [("x", x, x.dim() if isinstance(x, torch.Tensor) and x.dim() == 2 else 3),
                       ("conv_state", conv_state, 3)])
    if conv_state_indices is not None:
        check_tensors(op, [("conv_state_indices", conv_state_indices, 1)])
    check_dtype(op, "x", x)
    batch, dim = x.shape[0], x.shape[1]
    width = _check_weight(op, x, weight, bias, dim)
    check_activation(op, activation)
    if conv_state.dtype != x.dtype:
        raise ArgumentError(op, "conv_state", f"has dtype {conv_state.dtype}, x {x.dtype}")
    n, cdim, sl = conv_state.shape
    if cdim != dim or sl < width - 1:
        raise ArgumentError(op, "conv_state", f"has shape {tuple(conv_state.shape)}: expected [n, {dim}, SL] "
                            f"with SL >= width-1 = {width - 1}")
    named = [("x", x, 0), ("conv_state", conv_state, 0), ("weight", weight, 0)] + [
        (nm, t, 0) for nm, t in (("bias", bias), ("conv_state_indices", conv_state_indices)) if t is not None]
    check_one_device(op, named)
    if conv_state_indices is None:
        if batch > n:
            raise ArgumentError(op, "conv_state", f"has {n} rows for a batch of {batch} "
                                "(no conv_state_indices)")
        return
    check_tensors(op, [("conv_state_indices", conv_state_indices, 1)])
    check_index_tensors(op, [("conv_state_indices", conv_state_indices)], torch.int32)
    if conv_state_indices.shape[0] != batch:
        raise ArgumentError(op, "conv_state_indices", f"has {conv_state_indices.shape[0]} entries, x "
                            f"{batch} rows")
    if content_checks(conv_state_indices) and batch:
        lo, hi = int(conv_state_indices.min()), int(conv_state_indices.max())
        if lo < -1 or hi >= n:
            raise ArgumentError(op, "conv_state_indices", f"holds {lo if lo < -1 else hi}: expected -1 "
                                f"(skip) or a row of conv_state's {n}")
