"""``hexlayout.ops.selective_state_update``: one Mamba decode step (vLLM's ``selective_state_update``).

``selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, *,
dt_softplus=False, state_batch_indices=None)`` for both forms - Mamba-1: state ``[S, dim, N]``,
``A [dim, N]``, ``x``, ``dt``, ``z`` ``[batch, dim]``, ``B``, ``C`` ``[batch, N]`` or
``[batch, G, N]``, ``D``, ``dt_bias`` ``[dim]``; Mamba-2: state ``[S, H, P, N]``, ``A [H]`` (or
vLLM's ``[H, P, N]``), ``x``, ``z`` ``[batch, H, P]``, ``dt`` ``[batch, H]`` or ``[batch, H, P]``,
``B``, ``C`` ``[batch, G, N]``, ``D``, ``dt_bias`` ``[H]`` or ``[H, P]``. With
``s = state_batch_indices[b]`` (``b`` without indices)::

    Δ = softplus(dt + dt_bias)                      (dt + dt_bias without dt_softplus)
    state[s] = exp(Δ A) ⊙ state[s] + Δ x[b] B[b]ᵀ    (in place, f32 arithmetic)
    y[b] = state[s] C[b] + D x[b]                    (· silu(z[b]) with z)

A row with ``s = -1`` is skipped: its state is untouched and its ``y`` is 0. Returns ``y``
(x's shape and dtype). The kernel is ``state_update_kernel.state_update_kernel``; no host
synchronization, no allocation that depends on the data (CUDA-graph safe).

Example (CPU, emulator), Mamba-2 with one padded row::

    import os, torch
    os.environ["HEXLAYOUT_EMULATE"] = "1"
    from hexlayout.ops import selective_state_update
    state = torch.zeros(3, 2, 4, 8)
    x, dt = torch.randn(2, 2, 4), torch.rand(2, 2)
    A, B, C = -torch.rand(2), torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    y = selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.tensor([2, -1]))
    assert y.shape == (2, 2, 4) and not state[0].any() and state[2].any()
"""

from __future__ import annotations

import math
from typing import Any

from ..host.torch import require_torch
from .state_update_args import check_selective_state_update, state_update_form

__all__ = ["selective_state_update", "run_selective_state_update"]


def selective_state_update(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    *,
    dt_softplus: bool = False,
    state_batch_indices: Any = None,
) -> Any:
    """One Mamba decode step (Mamba-1 state ``[S, dim, N]`` or Mamba-2 state ``[S, H, P, N]``; shapes
    in the module docstring): for batch row ``b`` and ``s = state_batch_indices[b]`` (``b``
    without indices; ``-1`` skips the row, whose ``y`` is 0), ``Δ = softplus(dt[b] + dt_bias)``
    (no softplus unless ``dt_softplus``), ``state[s] = exp(Δ A) ⊙ state[s] + Δ x[b] B[b]ᵀ``
    in place, ``y[b] = state[s] C[b] + D x[b]``, times ``silu(z[b])`` when ``z`` is given.
    Returns ``y`` (x's shape and dtype); runs through
    ``torch.ops.hexlayout.selective_state_update``, so it traces under ``torch.compile``. Raises
    ``ArgumentError`` / ``ArgumentTypeError`` naming a bad argument.

    Example (CPU tensors, emulator; Mamba-1 from a zero state)::

        import os, torch
        os.environ["HEXLAYOUT_EMULATE"] = "1"
        from hexlayout.ops import selective_state_update
        state = torch.zeros(2, 8, 4)
        x, dt, A = torch.randn(2, 8), torch.rand(2, 8), -torch.rand(8, 4)
        B, C = torch.randn(2, 4), torch.randn(2, 4)
        y = selective_state_update(state, x, dt, A, B, C)
        assert torch.allclose(state, (dt * x)[..., None] * B[:, None], atol=1e-5)
    """
    require_torch("hexlayout.ops.selective_state_update")
    import torch

    if not torch.compiler.is_compiling():  # the op checks again; here: errors of the Python API's kinds
        check_selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)
    return torch.ops.hexlayout.selective_state_update(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices
    )


def _general(t: Any, shape: tuple[int, ...]) -> Any:
    """``t`` as a contiguous tensor of the general form's ``shape``: the same elements reshaped
    (Mamba-1's ``[..., dim]`` split into heads), or per-head values (``dt [batch, H]``, ``A [H]``,
    ``D [H]``) broadcast over the trailing modes."""
    if t.numel() == math.prod(shape):
        return t.reshape(shape).contiguous()
    return t.reshape(*t.shape, *([1] * (len(shape) - t.dim()))).expand(shape).contiguous()


def run_selective_state_update(state: Any, x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any = None,
                               z: Any = None, dt_bias: Any = None, dt_softplus: bool = False,
                               state_batch_indices: Any = None) -> Any:  # fmt: skip
    """``y`` on arguments ``check_selective_state_update`` accepted (the torch op's implementation:
    the schema's arguments, by position or name), with ``state`` updated in place: both forms run
    as the general form (Mamba-1's ``[S, dim, N]`` state as its ``[S, G, dim / G, N]`` view);
    absent optional tensors are placeholders the kernel skips."""
    import torch

    from ..host.launch import build_for, fresh, run_kernel, zeroed
    from .selective_scan import kernel_dtype
    from .state_update_kernel import state_update_consts, state_update_kernel

    idx = state_batch_indices
    h, p, n, g = state_update_form(state, B)
    batch = x.shape[0]
    y = zeroed(tuple(x.shape), x.dtype, x.device)
    if batch == 0 or h * p == 0:
        return y
    st4 = state if state.dim() == 4 else state.unflatten(1, (h, p))
    rows = (batch, h, p)
    # A as a [H, P, N] view: per-head values broadcast with stride 0 (no copy on CUDA; the
    # emulator reads C-contiguous arrays, so the CPU path passes a copy and its strides)
    a3 = A.reshape(h, p, n) if A.dim() == 2 else A if A.dim() == 3 else A[:, None, None].expand(h, p, n)
    a3 = a3 if x.device.type == "cuda" else a3.contiguous()
    args = (
        st4,
        _general(x, rows),
        _general(dt, rows),
        a3,
        B.reshape(batch, g, n).contiguous(),
        C.reshape(batch, g, n).contiguous(),
        _general(D, (h, p)) if D is not None else fresh((h, p), A.dtype, x.device),
        _general(z, rows) if z is not None else _general(x, rows),
        _general(dt_bias, (h, p)) if dt_bias is not None else fresh((h, p), A.dtype, x.device),
        idx if idx is not None else fresh((batch,), torch.int32, x.device),
        y.view(rows),
    )
    consts = state_update_consts(p, n)
    consts.update(
        SOFTPLUS=dt_softplus,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_BIAS=dt_bias is not None,
        HAS_IDX=idx is not None,
    )
    it = kernel_dtype_index(args[9].dtype)
    kern = state_update_kernel(kernel_dtype(x.dtype), kernel_dtype(state.dtype), it)
    bld = build_for(kern, x.device, consts)
    run_kernel(bld, (*args, *a3.stride()), outputs=(0, 10), strides=(0,))
    return y


def kernel_dtype_index(torch_dtype: Any) -> Any:
    """The language's integer type of an index tensor's dtype (int32 / int64)."""
    import torch

    from hexlayout.lang import i32, i64

    return i64 if torch_dtype == torch.int64 else i32
