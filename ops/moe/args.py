"""Argument checks of the mixture-of-experts ops (``fused_moe``, ``moe_align``): the one check
each op runs eagerly, in its torch op and in its fake implementation (meta / fake tensors,
``torch.compile``, CUDA-graph capture). Errors are ``ArgumentError`` (``ValueError``) or
``ArgumentTypeError`` (``TypeError``) naming the argument. Checks that read tensor contents
(``topk_ids`` in range) run on CPU tensors and, on CUDA, only with ``HEXLAYOUT_CHECK=1``.

The quantized variants (``fused_moe_wna16``, ``fused_moe_fp8``) reuse ``check_routing`` for
the routing arguments and check their own weight tensors.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from types import SimpleNamespace
from typing import Any

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError

from ..host.checks import check_device, check_dtype, check_rows, check_tensors
from ..host.checks import is_real as _is_real
from ..host.checks import kind as _kind
from ..host.launch import content_checks

__all__ = ["check_fused_moe", "check_routing", "check_moe_align", "bind_args", "ACTIVATIONS", "OP"]

OP = "hexlayout.fused_moe"
ACTIVATIONS = ("silu", "gelu")


@cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def bind_args(check: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> SimpleNamespace:
    """The arguments ``args`` / ``kwargs`` of an op's call named as the parameters of its check
    ``check`` (defaults filled in): the op's implementation takes exactly its check's arguments,
    declared once, in the check's signature. A call the signature does not accept is a
    ``TypeError``, as for the check."""
    bound = _signature(check).bind(*args, **kwargs)
    bound.apply_defaults()
    return SimpleNamespace(**bound.arguments)


def _contiguous(op: str, name: str, t: Any) -> None:
    if not t.is_contiguous():
        raise ArgumentError(op, name, f"has strides {tuple(t.stride())}; it must be contiguous: "
                            f"pass {name}.contiguous()")


def _int32(op: str, name: str, t: Any) -> None:
    """``t`` holds int32 indices; another integer type (``torch.topk`` returns int64 indices)
    gets the hint ``.int()``."""
    import torch

    if t.dtype != torch.int32:
        hint = ""
        if not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool:
            hint = f"; pass {name}.int()"
            if name == "topk_ids":
                hint += " (torch.topk returns int64 indices)"
        raise ArgumentError(op, name, f"has dtype {t.dtype}, expected torch.int32{hint}")


def _aligned(op: str, name: str, t: Any) -> None:
    off = t.data_ptr() % 16 if _is_real(t) else t.storage_offset() * t.element_size() % 16
    if off and t.numel():
        raise ArgumentError(op, name, f"starts {off} bytes off 16-byte alignment; pass {name}.clone()")


def check_routing(
    op: str,
    hidden_states: Any,
    topk_weights: Any,
    topk_ids: Any,
    num_experts: int,
    activation: Any,
    apply_router_weight_on_input: Any,
    expert_map: Any,
    global_num_experts: Any,
) -> int:
    """The routing arguments shared by every fused MoE op; returns the number of global experts
    (``global_num_experts``, else ``len(expert_map)``, else ``num_experts``; -1, vLLM's default,
    counts as not given)."""
    import torch

    check_tensors(
        op,
        [("hidden_states", hidden_states, 2), ("topk_weights", topk_weights, 2), ("topk_ids", topk_ids, 2)],
    )
    check_dtype(op, "hidden_states", hidden_states)
    check_device(
        op, ("hidden_states", hidden_states), [("topk_weights", topk_weights), ("topk_ids", topk_ids)]
    )
    t = hidden_states.shape[0]
    _int32(op, "topk_ids", topk_ids)
    if topk_weights.dtype != torch.float32:
        raise ArgumentError(op, "topk_weights", f"has dtype {topk_weights.dtype}, expected torch.float32")
    if topk_ids.shape[0] != t:
        raise ArgumentError(op, "topk_ids", f"has {topk_ids.shape[0]} rows, hidden_states {t} tokens")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ArgumentError(
            op, "topk_weights", f"has shape {tuple(topk_weights.shape)}, topk_ids {tuple(topk_ids.shape)}"
        )
    k = topk_ids.shape[1]
    if k < 1:
        raise ArgumentError(op, "topk_ids", f"has shape {tuple(topk_ids.shape)}: top-k must be at least 1")
    for name, x in (("hidden_states", hidden_states), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        _contiguous(op, name, x)
    check_rows(op, "hidden_states", hidden_states)
    _aligned(op, "topk_weights", topk_weights)
    _aligned(op, "topk_ids", topk_ids)
    if not isinstance(activation, str):
        raise ArgumentTypeError(op, "activation", f"expected a string, got {_kind(activation)}")
    if activation not in ACTIVATIONS:
        raise ArgumentError(op, "activation", f"must be 'silu' or 'gelu', not {activation!r}")
    if not isinstance(apply_router_weight_on_input, bool):
        raise ArgumentTypeError(
            op, "apply_router_weight_on_input", f"expected a bool, got {_kind(apply_router_weight_on_input)}"
        )
    if apply_router_weight_on_input and k != 1:
        raise ArgumentError(
            op,
            "apply_router_weight_on_input",
            f"needs top-k = 1 (the weight scales the "
            f"input, shared by the token's experts); topk_ids has k = {k}",
        )
    if global_num_experts is not None and (
        not isinstance(global_num_experts, int) or isinstance(global_num_experts, bool)
    ):
        raise ArgumentTypeError(
            op, "global_num_experts", f"expected an int or None, got {_kind(global_num_experts)}"
        )
    if global_num_experts == -1:  # vLLM's "not given"
        global_num_experts = None
    if expert_map is not None:
        check_tensors(op, [("expert_map", expert_map, 1)])
        check_device(op, ("hidden_states", hidden_states), [("expert_map", expert_map)])
        _int32(op, "expert_map", expert_map)
        _contiguous(op, "expert_map", expert_map)
        _aligned(op, "expert_map", expert_map)
        g = expert_map.shape[0]
        if global_num_experts is not None and global_num_experts != g:
            raise ArgumentError(
                op, "expert_map", f"has {g} entries, global_num_experts is {global_num_experts}"
            )
        if content_checks(expert_map) and g:
            lo, hi = int(expert_map.min()), int(expert_map.max())
            if lo < -1 or hi >= num_experts:
                raise ArgumentError(
                    op,
                    "expert_map",
                    f"holds {lo if lo < -1 else hi}; entries must be -1 "
                    f"(remote) or a local expert in [0, {num_experts})",
                )
    else:
        g = num_experts if global_num_experts is None else global_num_experts
        if g != num_experts:
            raise ArgumentError(
                op,
                "global_num_experts",
                f"is {g} without an expert_map, but the weights hold {num_experts} experts",
            )
    if content_checks(topk_ids) and topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= g:
            raise ArgumentError(op, "topk_ids", f"holds expert id {lo if lo < 0 else hi}, outside [0, {g})")
    return g


def check_fused_moe(
    hidden_states: Any,
    w13: Any,
    w2: Any,
    topk_weights: Any,
    topk_ids: Any,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    expert_map: Any = None,
    global_num_experts: Any = None,
) -> None:
    """The arguments of ``fused_moe`` with bf16 / f16 weights: ``hidden_states`` [T, H],
    ``w13`` [E, 2I, H], ``w2`` [E, H, I] of the activations' dtype, ``topk_weights`` [T, k]
    fp32, ``topk_ids`` [T, k] int32, contiguous and 16-byte aligned."""
    op = OP
    check_tensors(op, [("hidden_states", hidden_states, 2), ("w13", w13, 3), ("w2", w2, 3)])
    check_dtype(op, "hidden_states", hidden_states)
    check_device(op, ("hidden_states", hidden_states), [("w13", w13), ("w2", w2)])
    t, h = hidden_states.shape
    e, n2, hw = w13.shape
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dtype != hidden_states.dtype:
            raise ArgumentError(op, name, f"has dtype {w.dtype}, hidden_states {hidden_states.dtype}")
        _contiguous(op, name, w)
        check_rows(op, name, w)
    if hw != h:
        raise ArgumentError(
            op, "w13", f"has shape {tuple(w13.shape)}: expected [E, 2I, {h}] (H of hidden_states)"
        )
    if n2 % 2 or n2 == 0:
        raise ArgumentError(
            op,
            "w13",
            f"has shape {tuple(w13.shape)}: dimension 1 is 2I (gate rows, then "
            "up rows), a positive even number",
        )
    i = n2 // 2
    if tuple(w2.shape) != (e, h, i):
        raise ArgumentError(
            op,
            "w2",
            f"has shape {tuple(w2.shape)}: expected [{e}, {h}, {i}] ([E, H, I] from w13 {tuple(w13.shape)})",
        )
    if h % 8 or i % 8:
        raise ArgumentError(
            op, "w13", f"has shape {tuple(w13.shape)}: H and I must be multiples of 8 (rows of 16 bytes)"
        )
    if e < 1:
        raise ArgumentError(op, "w13", f"has shape {tuple(w13.shape)}: no expert")
    check_routing(
        op,
        hidden_states,
        topk_weights,
        topk_ids,
        e,
        activation,
        apply_router_weight_on_input,
        expert_map,
        global_num_experts,
    )


def check_moe_align(topk_ids: Any, num_experts: Any, block_m: Any, expert_map: Any) -> None:
    """The arguments of ``moe_align``."""

    op = "hexlayout.moe_align"
    check_tensors(op, [("topk_ids", topk_ids, 2)])
    _int32(op, "topk_ids", topk_ids)
    for name, v in (("num_experts", num_experts), ("block_m", block_m)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ArgumentTypeError(op, name, f"expected an int, got {_kind(v)}")
        if v < 1:
            raise ArgumentError(op, name, f"must be positive, got {v}")
    if expert_map is not None:
        check_tensors(op, [("expert_map", expert_map, 1)])
        _int32(op, "expert_map", expert_map)
        check_device(op, ("topk_ids", topk_ids), [("expert_map", expert_map)])
