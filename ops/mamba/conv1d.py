"""``hexlayout.ops.causal_conv1d`` / ``causal_conv1d_update``: Mamba's depthwise causal
convolution (the semantics of the ``causal_conv1d`` package and vLLM's ops of those names).

``causal_conv1d(x, weight, bias=None, *, activation=None, initial_states=None,
cu_seqlens=None, return_final_states=False)``: for each sequence (row ``b`` of ``x`` [batch,
dim, L], or ``x[:, cu_seqlens[s]:cu_seqlens[s+1]]`` of a packed ``x`` [dim, T])::

    out[d, t] = act(bias[d] + sum_{k<W} weight[d, k] · xs[d, t - (W-1) + k])

with ``xs[d, j] = initial_states[s, d, (W-1) + j]`` (zeros without them) for ``j < 0``;
``act`` is the identity or SiLU. The final state is the last ``W-1`` inputs of the sequence
(``initial_states`` included when the sequence is shorter): ``final[s, d, j] = xs[d, n-(W-1)+j]``.
Returns ``out`` (x's shape and dtype) and ``(out, final_states)`` [S, dim, W-1] when asked.

``causal_conv1d_update(x, conv_state, weight, bias=None, *, activation=None,
conv_state_indices=None)``: ``L`` new positions per batch row (``x`` [batch, dim] or [batch,
dim, L]) continuing the state ``conv_state[r]`` (``[n, dim, SL]``, ``SL >= W-1``, its last
``W-1`` columns the window; ``r = conv_state_indices[b]``, else ``b``); the state becomes the
last ``SL`` columns of ``[conv_state[r], x[b]]`` in place (through its ``[n, SL, dim]`` view
with its own strides: no copy of the cache when dim is contiguous, as in vLLM). A row with
index -1 is skipped: its state is untouched and its output is 0.

Both run the kernels of ``conv1d_kernels`` on channel-last views (``[.., L, dim]`` with dim
contiguous, vLLM's layout); other layouts are read from (and the state written back to)
channel-last copies. No host synchronization: CUDA-graph safe.
"""

from __future__ import annotations

from typing import Any

from ..host.launch import build_for, fresh, lang_dtype, run_kernel, zeroed
from ..host.torch import require_torch
from .conv1d_args import check_causal_conv1d, check_causal_conv1d_update
from .conv1d_kernels import CONV_BD, causal_conv1d_kernel, causal_conv1d_update_kernel

__all__ = ["causal_conv1d", "causal_conv1d_update", "run_causal_conv1d", "run_causal_conv1d_update",
           "conv1d_outputs"]


def _channel_last(t: Any) -> Any:
    """``t`` ([.., L, dim]) itself when dim is contiguous, else a contiguous copy."""
    return t if t.numel() == 0 or t.stride(-1) == 1 else t.contiguous()


def conv1d_outputs(x: Any, width: int, seqs: int) -> tuple[Any, Any]:
    """Fresh ``(out, final_states)`` of ``causal_conv1d`` as views of channel-last storage:
    ``out`` of ``x``'s shape, ``final_states`` [S, dim, W-1] (also the fake implementation's)."""
    dim = x.shape[-2]
    if x.dim() == 2:
        out = fresh((1, x.shape[1], dim), x.dtype, x.device)[0].t()
    else:
        out = fresh((x.shape[0], x.shape[2], dim), x.dtype, x.device).transpose(1, 2)
    final = fresh((seqs, width - 1, dim), x.dtype, x.device).transpose(1, 2)
    return out, final


def causal_conv1d(x: Any, weight: Any, bias: Any = None, *, activation: str | None = None,
                  initial_states: Any = None, cu_seqlens: Any = None,
                  return_final_states: bool = False) -> Any:
    """The causal depthwise convolution (see the module docstring)::

        >>> import torch, hexlayout.ops as ops
        >>> out = ops.causal_conv1d(torch.randn(2, 64, 9).half(), torch.randn(64, 4).half(),
        ...                         activation="silu")   # [2, 64, 9]; HEXLAYOUT_EMULATE=1 on CPU
    """
    require_torch("hexlayout.ops.causal_conv1d")
    check_causal_conv1d(x, weight, bias, activation, initial_states, cu_seqlens, return_final_states)
    out, final = run_causal_conv1d(x, weight, bias, activation, initial_states, cu_seqlens)
    return (out, final) if return_final_states else out


def run_causal_conv1d(x: Any, weight: Any, bias: Any, activation: str | None, initial_states: Any,
                      cu_seqlens: Any) -> tuple[Any, Any]:
    """``causal_conv1d`` on checked arguments; returns ``(out, final_states)``."""
    import torch

    varlen = cu_seqlens is not None
    width = weight.shape[1]
    seqs = cu_seqlens.shape[0] - 1 if varlen else x.shape[0]
    out, final = conv1d_outputs(x, width, seqs)
    if seqs == 0 or x.shape[-2] == 0:
        return out, final
    x3 = _channel_last(x.t().unsqueeze(0) if varlen else x.transpose(1, 2))
    o3 = out.t().unsqueeze(0) if varlen else out.transpose(1, 2)
    dim = x.shape[-2]
    w = weight.t().contiguous()
    b = bias.reshape(1, dim).contiguous() if bias is not None else zeroed((1, dim), x.dtype, x.device)
    init = (initial_states.transpose(1, 2).contiguous() if initial_states is not None
            else zeroed((seqs, width - 1, dim), x.dtype, x.device))
    cu = cu_seqlens if varlen else zeroed((1,), torch.int32, x.device)
    consts = {"BD": CONV_BD, "WIDTH": width, "SILU": activation == "silu", "VARLEN": varlen, "FINAL": True}
    bld = build_for(causal_conv1d_kernel(lang_dtype(x.dtype)), x.device, consts)
    f3 = final.transpose(1, 2)
    run_kernel(bld, (x3, w, b, init, o3, f3, cu), outputs=(4, 5), strides=(0, 4))
    return out, final


def causal_conv1d_update(x: Any, conv_state: Any, weight: Any, bias: Any = None, *,
                         activation: str | None = None, conv_state_indices: Any = None) -> Any:
    """One decode step of the convolution, ``conv_state`` updated in place (see the module
    docstring)::

        >>> st = torch.zeros(4, 64, 3).half()
        >>> y = ops.causal_conv1d_update(torch.randn(2, 64).half(), st, torch.randn(64, 4).half(),
        ...                              conv_state_indices=torch.tensor([3, -1], dtype=torch.int32))
    """
    require_torch("hexlayout.ops.causal_conv1d_update")
    check_causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices)
    return run_causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices)


def run_causal_conv1d_update(x: Any, conv_state: Any, weight: Any, bias: Any, activation: str | None,
                             conv_state_indices: Any) -> Any:
    """``causal_conv1d_update`` on checked arguments; returns the output (x's shape)."""
    import torch

    x3 = x.unsqueeze(-1) if x.dim() == 2 else x
    batch, dim, n = x3.shape
    out3 = fresh((batch, n, dim), x.dtype, x.device)
    out = out3.transpose(1, 2)
    out = out[..., 0] if x.dim() == 2 else out
    if batch == 0 or dim == 0 or n == 0:
        return out
    xc = _channel_last(x3.transpose(1, 2))
    state = conv_state.transpose(1, 2)          # [n, SL, dim]: read and written in place
    st = _channel_last(state)
    w = weight.t().contiguous()
    b = bias.reshape(1, dim).contiguous() if bias is not None else zeroed((1, dim), x.dtype, x.device)
    idx = conv_state_indices if conv_state_indices is not None else zeroed((1,), torch.int32, x.device)
    consts = {"BD": CONV_BD, "WIDTH": weight.shape[1], "SILU": activation == "silu",
              "INDEXED": conv_state_indices is not None}
    bld = build_for(causal_conv1d_update_kernel(lang_dtype(x.dtype)), x.device, consts)
    run_kernel(bld, (xc, st, w, b, out3, idx), outputs=(1, 4), strides=(0, 1))
    if st is not state:
        state.copy_(st)
    return out
