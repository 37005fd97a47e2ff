"""``hexlayout.ops.selective_scan``: the Mamba-1 selective scan (mamba_ssm's ``selective_scan_fn``).

``selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, *, delta_softplus=False,
initial_states=None, cu_seqlens=None, return_last_state=False)`` with ``u``, ``delta``, ``z``
``[batch, dim, L]``, ``A`` ``[dim, N]`` f32, ``B``, ``C`` ``[batch, N, L]`` or ``[batch, G, N, L]``
(channel ``d`` reads group ``d // (dim / G)``), ``D``, ``delta_bias`` ``[dim]`` f32 computes, for
each sequence ``s`` from ``h_{-1} = initial_states[s]`` (zeros without them)::

    Δ_t = softplus(delta_t + delta_bias)            (delta_t + delta_bias without delta_softplus)
    h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t u_t        (per channel d: h_t[d, :] of N states, f32)
    y_t = C_t · h_t + D u_t                          out_t = y_t · silu(z_t) when z is given

Sequences are the batch rows, or with ``cu_seqlens`` [S+1] int32 (batch 1, or the packed 2-D
forms ``u``, ``delta``, ``z`` ``[dim, T]``, ``B``, ``C`` ``[N, T]`` / ``[G, N, T]``, vLLM's layout)
the position ranges ``cu_seqlens[s]:cu_seqlens[s+1]``: no state crosses a boundary; empty
sequences keep their initial state. ``initial_states`` is ``[S, dim, N]`` f32 (S = batch or
``len(cu_seqlens) - 1``). Returns ``out`` (u's shape and dtype), or ``(out, last_state)`` with
``last_state[s] = h`` at the end of sequence ``s`` ``[S, dim, N]`` f32. The kernel is
``selective_scan_kernel.selective_scan_kernel``. CUDA tensors launch it; CPU tensors run it in
the emulator under ``HEXLAYOUT_EMULATE=1``. No host synchronization and no allocation that
depends on the data (CUDA-graph safe).

Example (CPU, emulator)::

    import os, torch
    os.environ["HEXLAYOUT_EMULATE"] = "1"
    from hexlayout.ops import selective_scan
    u, delta = torch.randn(1, 8, 20), torch.rand(1, 8, 20)
    A, B, C = -torch.rand(8, 4), torch.randn(1, 4, 20), torch.randn(1, 4, 20)
    out, last = selective_scan(u, delta, A, B, C, return_last_state=True)
    assert out.shape == (1, 8, 20) and last.shape == (1, 8, 4)
    cu, h0 = torch.tensor([0, 5, 5, 20], dtype=torch.int32), torch.randn(3, 8, 4)
    out, last = selective_scan(u[0], delta[0], A, B[0], C[0], initial_states=h0, cu_seqlens=cu,
                               return_last_state=True)           # packed: 3 sequences
    assert out.shape == (8, 20) and last.shape == (3, 8, 4)
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


def _batch1(t: Any) -> Any:
    """A packed 2-D tensor (``[dim, T]``, ``[N, T]``) as batch 1; ``B`` / ``C`` ``[G, N, T]`` too."""
    return t if t is None or not hasattr(t, "dim") or t.dim() not in (2, 3) else t.unsqueeze(0)


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
    initial_states: Any = None,
    cu_seqlens: Any = None,
    return_last_state: bool = False,
) -> Any:
    """Mamba-1's selective scan: for each sequence, from ``h_{-1} = initial_states[s]`` (0 without
    them), per channel ``d`` (group ``d // (dim / G)`` of B and C) and step ``t``,
    ``Δ_t = softplus(delta_t + delta_bias)`` (no softplus unless ``delta_softplus``; torch's
    threshold 20), ``h_t = exp(Δ_t A[d]) ⊙ h_{t-1} + Δ_t B_t u_t`` (f32),
    ``y_t = C_t · h_t + D[d] u_t``, ``out_t = y_t · silu(z_t)`` when ``z`` is given.

    Shapes as in the module docstring: batch rows, or with ``cu_seqlens`` [S+1] int32 packed
    sequences of batch 1 (``u`` ``[1, dim, T]`` or ``[dim, T]``). Returns ``out`` (u's shape and
    dtype), or ``(out, last_state)`` (the state at each sequence's end, ``[S, dim, N]`` f32) when
    ``return_last_state``; runs through ``torch.ops.hexlayout.selective_scan``, so it traces
    under ``torch.compile``. Raises ``ArgumentError`` / ``ArgumentTypeError`` naming a bad
    argument.

    Example (CPU tensors, emulator)::

        import os, torch
        os.environ["HEXLAYOUT_EMULATE"] = "1"
        from hexlayout.ops import selective_scan
        u, delta = torch.randn(8, 20), torch.rand(8, 20)          # packed [dim, T]
        A, B, C = -torch.rand(8, 4), torch.randn(4, 20), torch.randn(4, 20)
        cu, h0 = torch.tensor([0, 1, 1, 20], dtype=torch.int32), torch.randn(3, 8, 4)
        out, last = selective_scan(u, delta, A, B, C, delta_softplus=True, initial_states=h0,
                                   cu_seqlens=cu, return_last_state=True)
        assert out.shape == (8, 20) and last.shape == (3, 8, 4)
    """
    require_torch("hexlayout.ops.selective_scan")
    import torch

    packed = cu_seqlens is not None and hasattr(u, "dim") and u.dim() == 2
    if packed:
        u, delta, B, C, z = _batch1(u), _batch1(delta), _batch1(B), _batch1(C), _batch1(z)
    if not torch.compiler.is_compiling():  # the op checks again; here: errors of the Python API's kinds
        check_selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                             initial_states, cu_seqlens)
    out, last = torch.ops.hexlayout.selective_scan(
        u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_states, cu_seqlens
    )
    out = out[0] if packed else out
    return (out, last) if return_last_state else out


def chunk_layout(cu_seqlens: Any, total: int, ch: int) -> tuple[Any, Any, int]:
    """Where the kernel reads packed sequences: each sequence ``s`` (``cu[s]:cu[s+1]`` of
    ``total`` positions) moves to ``pcu[s]``, its length rounded up to a multiple of ``ch``
    summed over the sequences before it, so every chunk starts aligned and stays in its own
    sequence. Returns ``(pcu [S+1] int32, pos [total] int64, width)``: position ``i`` of a
    sequence goes to column ``pos[i]``; positions past ``cu[S]`` go to the spare last column of
    the ``width = ceil(total / ch)·ch + (S + 1)·ch`` columns (a bound known without reading
    ``cu``: no host synchronization)."""
    import torch

    from ..host.launch import zeroed

    cu = cu_seqlens.long()
    seqs = cu.shape[0] - 1
    padded = (cu[1:] - cu[:-1] + ch - 1) // ch * ch
    pcu = torch.cat([zeroed((1,), cu.dtype, cu.device), torch.cumsum(padded, 0)])
    width = -(-total // ch) * ch + (seqs + 1) * ch
    tok = torch.arange(total, device=cu.device)
    sid = torch.searchsorted(cu[1:].contiguous(), tok, right=True).clamp_(max=max(seqs - 1, 0))
    pos = torch.where(tok < cu[-1], pcu[sid] + tok - cu[sid], width - 1)
    return pcu.to(torch.int32), pos, width


def _run_packed(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any, z: Any, delta_bias: Any,
                delta_softplus: bool, return_last_state: bool, initial_states: Any,
                cu_seqlens: Any) -> tuple[Any, Any]:  # fmt: skip
    """``run_selective_scan`` with ``cu_seqlens``: the inputs scattered to the chunk-aligned
    columns of ``chunk_layout``, the scan run there, ``out`` gathered back (0 past ``cu[S]``)."""
    import torch

    from ..host.launch import zeroed
    from .selective_scan_kernel import selective_scan_consts

    g = B.shape[1] if B.dim() == 4 else 1
    ch = selective_scan_consts(u.shape[1] // g, A.shape[1], 1)["CH"]
    pcu, pos, width = chunk_layout(cu_seqlens, u.shape[-1], ch)

    def spread(t: Any) -> Any:
        if t is None:
            return None
        return zeroed((*t.shape[:-1], width), t.dtype, t.device).index_copy_(-1, pos, t)

    out, last = _launch(spread(u), spread(delta), A, spread(B), spread(C), D, spread(z), delta_bias,
                        delta_softplus, return_last_state, initial_states, (pcu, cu_seqlens))
    out = out.index_select(-1, pos)
    return torch.where(torch.arange(u.shape[-1], device=u.device) < cu_seqlens[-1], out, 0), last


def run_selective_scan(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None,
                       delta_bias: Any = None, delta_softplus: bool = False, return_last_state: bool = False,
                       initial_states: Any = None, cu_seqlens: Any = None) -> tuple[Any, Any]:  # fmt: skip
    """``(out, last_state)`` on arguments ``check_selective_scan`` accepted (the torch op's
    implementation: the schema's arguments, by position or name); ``last_state`` is
    ``[S, dim, N]``: S = batch, or ``len(cu_seqlens) - 1``."""
    from ..host.launch import fresh, zeroed

    seqs = u.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if seqs == 0 or u.shape[1] == 0 or u.shape[2] == 0:
        last = fresh((seqs, u.shape[1], A.shape[1]), A.dtype, u.device)
        last = last.copy_(initial_states) if initial_states is not None else last.zero_()
        return zeroed(tuple(u.shape), u.dtype, u.device), last
    if cu_seqlens is not None:
        return _run_packed(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                           initial_states, cu_seqlens)
    return _launch(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_states,
                   None)


def _launch(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any, z: Any, delta_bias: Any,
            delta_softplus: bool, return_last_state: bool, initial_states: Any,
            varlen: tuple[Any, Any] | None) -> tuple[Any, Any]:  # fmt: skip
    """One launch of the kernel: batch rows, or with ``varlen = (pcu, cu_seqlens)`` the
    sequences at the chunk-aligned columns ``pcu`` of batch row 0. The kernel sees every
    tensor per group: ``[batch, G, dim / G, ...]`` views of contiguous copies (the copies are
    skipped for contiguous inputs); absent optional tensors are passed as placeholders the
    kernel does not read."""
    import torch

    from ..host.launch import build_for, fresh, run_kernel, zeroed
    from .selective_scan_kernel import selective_scan_consts, selective_scan_kernel

    batch, dim, length = u.shape
    n = A.shape[1]
    g = B.shape[1] if B.dim() == 4 else 1
    dg = dim // g
    seqs = batch if varlen is None else varlen[1].shape[0] - 1
    out = fresh((batch, dim, length), u.dtype, u.device)
    last_state = fresh((seqs, dim, n), A.dtype, u.device)

    def per_group(t: Any, inner: tuple[int, ...]) -> Any:
        return t.contiguous().view(*t.shape[: -len(inner) - 1], g, dg, *inner)

    init = initial_states if initial_states is not None else last_state
    cu, ln = varlen if varlen is not None else (zeroed((1,), torch.int32, u.device),) * 2
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
        last_state.view(seqs, g, dg, n),
        per_group(init, (n,)),
        cu,
        ln,
    )
    consts = selective_scan_consts(dg, n, length)
    flags = {"HAS_D": D is not None, "HAS_Z": z is not None, "HAS_BIAS": delta_bias is not None,
             "INIT": initial_states is not None, "VARLEN": varlen is not None}
    consts.update(SOFTPLUS=delta_softplus, LAST=return_last_state, **flags)
    bld = build_for(selective_scan_kernel(kernel_dtype(u.dtype)), u.device, consts)
    run_kernel(bld, args, outputs=(8, 9))
    return out, last_state
