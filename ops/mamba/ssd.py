"""``hexlayout.ops.ssd_scan``: the Mamba-2 selective state-space scan (the semantics of
mamba_ssm's ``mamba_chunk_scan_combined``).

``ssd_scan(x, dt, A, B, C, *, chunk_size=256, D=None, z=None, dt_bias=None, dt_softplus=False,
dt_limit=(0.0, inf), initial_states=None, cu_seqlens=None, return_final_states=False)``, with
``x`` [batch, L, H, P], ``dt`` [batch, L, H], ``A`` [H], ``B`` / ``C`` [batch, L, G, N] (head
``h`` reads group ``h // (H/G)``), per sequence and head::

    Δ_t = dt[t, h] (+ dt_bias[h]); Δ_t = softplus(Δ_t) if dt_softplus; clamped to dt_limit
          (only when dt_limit is not (0, inf))
    h_t = exp(Δ_t A[h]) h_{t-1} + Δ_t x[t, h] B[t, g]ᵀ             (P × N, h_{-1} = initial state)
    y[t, h] = h_t C[t, g] + D[h] ⊙ x[t, h];  y ← y · silu(z[t, h]) when z is given

With ``cu_seqlens`` [S+1] int32 (batch 1) the sequences are ``x[0, cu[s]:cu[s+1]]`` and no state
crosses a boundary; ``initial_states`` is [S or batch, H, P, N]. Returns ``y`` (x's dtype),
and ``(y, final_states)`` [S or batch, H, P, N] f32 when asked.

The kernel (``ssd_kernels.ssd_scan_kernel``) is, in this first version, the sequential
recurrence with the state in f32 registers, so the result does not depend on ``chunk_size``
at all (it is checked and accepted for mamba_ssm compatibility). ``dt``, ``A``, ``D``,
``dt_bias`` and the states are read as f32 (small tensors converted on the host); ``x``, ``B``,
``C``, ``z`` are read in place with their own strides (last mode contiguous). No host
synchronization: CUDA-graph safe.
"""

from __future__ import annotations

import math
from typing import Any

from ..host.launch import build_for, fresh, lang_dtype, run_kernel, zeroed
from ..host.torch import require_torch
from .ssd_args import check_dt_limit, check_ssd_scan, ssd_sequences
from .ssd_kernels import ssd_scan_kernel

__all__ = ["ssd_scan", "run_ssd_scan", "ssd_scan_consts", "ssd_outputs"]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def ssd_scan_consts(p: int, n: int) -> dict[str, int]:
    """Tile constants for head dim ``p`` and state size ``n``: ``NS`` the power of two ``>= n``
    (at least 16), ``BP`` channels per block with ``BP · NS <= 4096`` (at most 32 state
    registers a thread at 128 threads) and ``>= 128`` (a value a thread)."""
    ns = max(16, _pow2(n))
    bp = min(_pow2(p), max(1, 4096 // ns))
    return {"BP": max(bp, 128 // ns), "NS": ns}


def ssd_outputs(x: Any, n: int, seqs: int) -> tuple[Any, Any]:
    """Fresh ``(y, final_states)``: ``y`` like ``x``, ``final_states`` [S, H, P, N] f32."""
    import torch

    return fresh(tuple(x.shape), x.dtype, x.device), fresh((seqs, x.shape[2], x.shape[3], n), torch.float32,
                                                           x.device)


def ssd_scan(x: Any, dt: Any, A: Any, B: Any, C: Any, *, chunk_size: int = 256, D: Any = None, z: Any = None,
             dt_bias: Any = None, dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, math.inf),
             initial_states: Any = None, cu_seqlens: Any = None, return_final_states: bool = False) -> Any:
    """The SSD scan (see the module docstring)::

        >>> x = torch.randn(1, 10, 4, 8).half()
        >>> y = ops.ssd_scan(x, torch.rand(1, 10, 4), -torch.rand(4), torch.randn(1, 10, 2, 16).half(),
        ...                  torch.randn(1, 10, 2, 16).half(), dt_softplus=True)   # [1, 10, 4, 8]
    """
    require_torch("hexlayout.ops.ssd_scan")
    check_ssd_scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, dt_limit, initial_states,
                   cu_seqlens, return_final_states)
    y, final = run_ssd_scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, cu_seqlens)
    return (y, final) if return_final_states else y


def _f32(t: Any, shape: tuple[int, ...], like: Any) -> Any:
    """``t`` as a contiguous f32 tensor of ``shape``, zeros when ``None``; a tensor with fewer
    elements is the leading mode broadcast over the rest (``D`` [H] over [H, P])."""
    import torch

    if t is None:
        return zeroed(shape, torch.float32, like.device)
    t = t.to(torch.float32)
    if t.numel() != math.prod(shape):
        t = t.reshape(shape[0], *(1,) * (len(shape) - 1))
    return (t.reshape(shape) if t.numel() == math.prod(shape) else t.expand(shape)).contiguous()


def _rows(t: Any) -> Any:
    """``t`` read in place when its last mode is contiguous (any other strides: vLLM's views of
    the projection), else a contiguous copy."""
    return t if t.numel() == 0 or t.stride(-1) == 1 else t.contiguous()


def run_ssd_scan(x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any, z: Any, dt_bias: Any, dt_softplus: bool,
                 dt_limit: tuple[float, float], initial_states: Any, cu_seqlens: Any) -> tuple[Any, Any]:
    """``ssd_scan`` on checked arguments; returns ``(y, final_states)``."""
    import torch

    batch, length, heads, p = x.shape
    n = B.shape[3]
    seqs = ssd_sequences(x, cu_seqlens)
    y, final = ssd_outputs(x, n, seqs)
    if seqs == 0 or heads == 0 or p == 0:
        return y, final
    lo, hi = check_dt_limit(dt_limit)
    lim = zeroed((1, 2), torch.float32, x.device)
    lim[:, 0].fill_(lo)
    lim[:, 1].fill_(hi)
    cu = cu_seqlens if cu_seqlens is not None else zeroed((1,), torch.int32, x.device)
    args = (_rows(x), _f32(dt, (batch, length, heads), x), _f32(A, (1, heads), x),
            _rows(B), _rows(C), _f32(D, (heads, p), x), _rows(z if z is not None else x),
            _f32(dt_bias, (1, heads), x),
            lim, _f32(initial_states, (seqs, heads, p, n), x), final, y, cu)
    consts = {**ssd_scan_consts(p, n), "SOFTPLUS": dt_softplus, "CLAMP": (lo, hi) != (0.0, math.inf),
              "HAS_Z": z is not None, "VARLEN": cu_seqlens is not None, "FINAL": True}
    bld = build_for(ssd_scan_kernel(lang_dtype(x.dtype)), x.device, consts)
    run_kernel(bld, args, outputs=(10, 11), strides=(0, 3, 4, 6))
    return y, final
