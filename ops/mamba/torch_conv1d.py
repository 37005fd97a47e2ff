"""``torch.ops.hexlayout.causal_conv1d`` / ``causal_conv1d_update`` registered with torch.library.

Schemas: ``causal_conv1d(Tensor x, Tensor weight, Tensor? bias=None, str? activation=None,
Tensor? initial_states=None, Tensor? cu_seqlens=None) -> (Tensor, Tensor)`` always returns
``(out, final_states)``; ``causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight,
Tensor? bias=None, str? activation=None, Tensor? conv_state_indices=None) -> Tensor`` updates
``conv_state`` in place. Every path (CUDA, CPU under ``HEXLAYOUT_EMULATE=1``, fake) first runs
the checks of ``conv1d_args``; the fake implementations allocate the outputs with the real
paths' shapes and strides.
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.torch_ops import define_op

from .conv1d import conv1d_outputs, run_causal_conv1d, run_causal_conv1d_update
from .conv1d_args import check_causal_conv1d, check_causal_conv1d_update

__all__ = ["causal_conv1d_op", "causal_conv1d_update_op"]

CONV_SCHEMA = ("(Tensor x, Tensor weight, Tensor? bias=None, str? activation=None, "
               "Tensor? initial_states=None, Tensor? cu_seqlens=None) -> (Tensor, Tensor)")
UPDATE_SCHEMA = ("(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias=None, str? activation=None, "
                 "Tensor? conv_state_indices=None) -> Tensor")


def _conv_fake(x: Any, weight: Any, bias: Any = None, activation: Any = None, initial_states: Any = None,
               cu_seqlens: Any = None) -> tuple[Any, Any]:
    seqs = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return conv1d_outputs(x, weight.shape[1], seqs)


def _conv_impl(x: Any, weight: Any, bias: Any = None, activation: Any = None, initial_states: Any = None,
               cu_seqlens: Any = None) -> tuple[Any, Any]:
    return run_causal_conv1d(x, weight, bias, activation, initial_states, cu_seqlens)


def _conv_check(x: Any, weight: Any, bias: Any = None, activation: Any = None, initial_states: Any = None,
                cu_seqlens: Any = None) -> None:
    check_causal_conv1d(x, weight, bias, activation, initial_states, cu_seqlens)


def _update_fake(x: Any, conv_state: Any, weight: Any, bias: Any = None, activation: Any = None,
                 conv_state_indices: Any = None) -> Any:
    from ..host.launch import fresh

    x3 = x.unsqueeze(-1) if x.dim() == 2 else x
    out = fresh((x3.shape[0], x3.shape[2], x3.shape[1]), x.dtype, x.device).transpose(1, 2)
    return out[..., 0] if x.dim() == 2 else out


def _update_impl(x: Any, conv_state: Any, weight: Any, bias: Any = None, activation: Any = None,
                 conv_state_indices: Any = None) -> Any:
    return run_causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices)


causal_conv1d_op = define_op("causal_conv1d", CONV_SCHEMA, fake=_conv_fake, impl=_conv_impl,
                             check=_conv_check)
causal_conv1d_update_op = define_op("causal_conv1d_update", UPDATE_SCHEMA, fake=_update_fake,
                                    impl=_update_impl, check=check_causal_conv1d_update)
