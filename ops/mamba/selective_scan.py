"""``hexlayout.ops.selective_scan``: the Mamba-1 selective scan (mamba_ssm's ``selective_scan_fn``).

``selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, *, delta_softplus=False,
return_last_state=False)`` with ``u``, ``delta``, ``z`` ``[batch, dim, L]``, ``A`` ``[dim, N]``
f32, ``B``, ``C`` ``[batch, N, L]`` or ``[batch, G, N, L]`` (channel ``d`` reads group
``d // (dim / G)``), ``D``, ``delta_bias`` ``[dim]`` f32 computes, from ``h_{-1} = 0``::

    Δ_t = softplus(delta_t + delta_bias)            (delta_t + delta_bias without delta_softplus)
    h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t u_t        (per channel d: h_t[d, :] of N states, f32)
    y_t = C_t · h_t + D u_t                          out_t = y_t · silu(z_t) when z is given

and returns ``out`` (u's dtype), or ``(out, last_state)`` with ``last_state = h_{L-1}``
``[batch, dim, N]`` f32. The kernel is ``selective_scan_kernel.selective_scan_kernel``.
CUDA tensors launch it; CPU tensors run it in the emulator under ``HEXLAYOUT_EMULATE=1``.
No host synchronization and no allocation that depends on the data (CUDA-graph safe).

Example (CPU, emulator)::

    import os, torch
    os.environ["HEXLAYOUT_EMULATE"] = "1"
    from hexlayout.ops import selective_scan
    u, delta = torch.randn(1, 8, 20), torch.rand(1, 8, 20)
    A, B, C = -torch.rand(8, 4), torch.randn(1, 4, 20), torch.randn(1, 4, 20)
    out, last = selective_scan(u, delta, A, B, C, return_last_state=True)
    assert out.shape == (1, 8, 20) and last.shape == (1, 8, 4)
"""

from __future__ import annotations

from typing import Any

from ..host.torch import require_torch
from .selective_scan_args import check_selective_scan

__all__ = ["selective_scan", "run_selective_scan", "kernel_dtype"]


def kernel_dtype(torch_dtype: Any) -> Any:
    """The language's element type of a torch float dtype (f16 / bf16 / f32)."""
    import torch

    from hexlayout.lang import bf16, f16, f32

    return {torch.float16: f16, torch.bfloat16: bf16, torch.float32: f32}[torch_dtype]


def selective_scan(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    delta_bias: Any = None,
    *,
    delta_softplus: bool = False,
    return_last_state: bool = False,
) -> Any:
    """Mamba-1's selective scan: from ``h_{-1} = 0``, per channel ``d`` (group ``d // (dim / G)``
    of B and C) and step ``t``, ``Δ_t = softplus(delta_t + delta_bias)`` (no softplus unless
    ``delta_softplus``; torch's threshold 20), ``h_t = exp(Δ_t A[d]) ⊙ h_{t-1} + Δ_t B_t u_t``
    (f32), ``y_t = C_t · h_t + D[d] u_t``, ``out_t = y_t · silu(z_t)`` when ``z`` is given.

    Shapes as in the module docstring. Returns ``out`` (u's dtype), or ``(out, last_state)``
    (``h_{L-1}``, ``[batch, dim, N]`` f32) when ``return_last_state``; runs through
    ``torch.ops.hexlayout.selective_scan``, so it traces under ``torch.compile``. Raises
    ``ArgumentError`` / ``ArgumentTypeError`` naming a bad argument.

    Example (CPU tensors, emulator)::

        import os, torch
        os.environ["HEXLAYOUT_EMULATE"] = "1"
        from hexlayout.ops import selective_scan
        u, delta = torch.randn(1, 8, 20), torch.rand(1, 8, 20)
        A, B, C = -torch.rand(8, 4), torch.randn(1, 4, 20), torch.randn(1, 4, 20)
        out, last = selective_scan(u, delta, A, B, C, return_last_state=True)
        assert out.shape == (1, 8, 20) and last.shape == (1, 8, 4)
    """
    require_torch("hexlayout.ops.selective_scan")
    import torch

    if not torch.compiler.is_compiling():  # the op checks again; here: errors of the Python API's kinds
        check_selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    out, last = torch.ops.hexlayout.selective_scan(
        u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state
    )
    return (out, last) if return_last_state else out


def run_selective_scan(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None,
                       delta_bias: Any = None, delta_softplus: bool = False, return_last_state: bool = False
                       ) -> tuple[Any, Any]:  # fmt: skip
    """``(out, last_state)`` on arguments ``check_selective_scan`` accepted (the torch op's
    implementation: the schema's arguments, by position or name). The kernel sees every
    tensor per group: ``[batch, G, dim / G, ...]`` views of contiguous copies (the copies are
    skipped for contiguous inputs); absent optional tensors are passed as placeholders the
    kernel does not read."""
    from ..host.launch import build_for, fresh, run_kernel
    from .selective_scan_kernel import selective_scan_consts, selective_scan_kernel

    batch, dim, length = u.shape
    n = A.shape[1]
    g = B.shape[1] if B.dim() == 4 else 1
    dg = dim // g
    out = fresh((batch, dim, length), u.dtype, u.device)
    last_state = fresh((batch, dim, n), A.dtype, u.device)
    if batch == 0 or dim == 0 or length == 0:
        return out, last_state.zero_()

    def per_group(t: Any, inner: tuple[int, ...]) -> Any:
        return t.contiguous().view(*t.shape[: -len(inner) - 1], g, dg, *inner)

    args = (
        per_group(u, (length,)),
        per_group(delta, (length,)),
        per_group(A, (n,)),
        B.contiguous().view(batch, g, n, length),
        C.contiguous().view(batch, g, n, length),
        per_group(D if D is not None else fresh((dim,), A.dtype, u.device), ()),
        per_group(z, (length,)) if z is not None else per_group(u, (length,)),
        per_group(delta_bias if delta_bias is not None else fresh((dim,), A.dtype, u.device), ()),
        out.view(batch, g, dg, length),
        last_state.view(batch, g, dg, n),
    )
    consts = selective_scan_consts(dg, n, length)
    flags = {"HAS_D": D is not None, "HAS_Z": z is not None, "HAS_BIAS": delta_bias is not None}
    consts.update(SOFTPLUS=delta_softplus, LAST=return_last_state, **flags)
    bld = build_for(selective_scan_kernel(kernel_dtype(u.dtype)), u.device, consts)
    run_kernel(bld, args, outputs=(8, 9))
    return out, last_state
