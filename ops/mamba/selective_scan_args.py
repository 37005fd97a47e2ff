"""The argument check of ``selective_scan``, run eagerly and in its fake implementation."""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.args import ArgumentError

from ..host.checks import check_one_device, check_tensors
from .conv1d_args import check_cu_seqlens

__all__ = ["check_selective_scan", "check_float_dtype", "check_f32", "check_shape", "FLOAT_DTYPES"]

OP = "hexlayout.selective_scan"


def _float_dtypes() -> tuple[Any, ...]:
    import torch

    return (torch.float16, torch.bfloat16, torch.float32)


FLOAT_DTYPES = "torch.float16, torch.bfloat16, torch.float32"


def check_float_dtype(op: str, name: str, t: Any, like: tuple[str, Any] | None = None) -> None:
    """``t`` is f16 / bf16 / f32, and of the dtype of ``like = (name, tensor)`` when given."""
    if t.dtype not in _float_dtypes():
        raise ArgumentError(op, name, f"has dtype {t.dtype}; supported: {FLOAT_DTYPES}")
    if like is not None and t.dtype != like[1].dtype:
        raise ArgumentError(op, name, f"has dtype {t.dtype}, {like[0]} {like[1].dtype}; they must agree")


def check_f32(op: str, name: str, t: Any) -> None:
    """``t`` holds f32 (the ops' parameters A, D and the biases, and the scan state)."""
    import torch

    if t.dtype != torch.float32:
        raise ArgumentError(op, name, f"has dtype {t.dtype}, expected torch.float32")


def check_shape(op: str, name: str, t: Any, shape: tuple[int, ...], what: str) -> None:
    """``t`` has ``shape``; ``what`` spells the expected shape in the error (``[batch, dim, L]``)."""
    if tuple(t.shape) != tuple(shape):
        raise ArgumentError(op, name, f"has shape {tuple(t.shape)}, expected {what} = {tuple(shape)}")


def check_selective_scan(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None,
                         delta_bias: Any = None, delta_softplus: bool = False,
                         return_last_state: bool = False, initial_states: Any = None,
                         cu_seqlens: Any = None) -> None:  # fmt: skip
    """The arguments of ``selective_scan`` (``hexlayout.ops.mamba``): u, delta, z ``[batch, dim, L]``
    of one float dtype; A ``[dim, N]`` f32; B, C ``[batch, N, L]`` or ``[batch, G, N, L]`` (G
    divides dim) of u's dtype; D, delta_bias ``[dim]`` f32; ``cu_seqlens`` [S+1] int32 offsets
    into L with batch 1; ``initial_states`` ``[S, dim, N]`` f32 (S = batch without
    ``cu_seqlens``). Raises naming the argument."""
    named = [("u", u, 3), ("delta", delta, 3), ("A", A, 2)]
    check_tensors(OP, named)
    for name, t in (("B", B), ("C", C)):
        check_tensors(OP, [(name, t, t.dim() if getattr(t, "dim", None) and t.dim() == 4 else 3)])
    opt = [
        (n, t, r) for n, t, r in (("D", D, 1), ("z", z, 3), ("delta_bias", delta_bias, 1)) if t is not None
    ]
    check_tensors(OP, opt)
    check_one_device(OP, named + [("B", B, 0), ("C", C, 0)] + opt)
    check_float_dtype(OP, "u", u)
    batch, dim, length = u.shape
    check_float_dtype(OP, "delta", delta, ("u", u))
    check_shape(OP, "delta", delta, (batch, dim, length), "[batch, dim, L] of u")
    check_f32(OP, "A", A)
    if A.shape[0] != dim:
        raise ArgumentError(OP, "A", f"has shape {tuple(A.shape)}, expected [dim, N] with dim = {dim} (u)")
    n = A.shape[1]
    g = B.shape[1] if B.dim() == 4 else 1
    if g < 1 or dim % g:
        raise ArgumentError(OP, "B", f"has {g} groups, which do not split dim = {dim} evenly")
    for name, t in (("B", B), ("C", C)):
        check_float_dtype(OP, name, t, ("u", u))
        if B.dim() == 4:
            check_shape(OP, name, t, (batch, g, n, length), "[batch, G, N, L] (u, A, B)")
        else:
            check_shape(OP, name, t, (batch, n, length), "[batch, N, L] (u, A)")
    if z is not None:
        check_float_dtype(OP, "z", z, ("u", u))
        check_shape(OP, "z", z, (batch, dim, length), "[batch, dim, L] of u")
    for name, t in (("D", D), ("delta_bias", delta_bias)):
        if t is not None:
            check_f32(OP, name, t)
            check_shape(OP, name, t, (dim,), "[dim] of u")
    for name, v in (("delta_softplus", delta_softplus), ("return_last_state", return_last_state)):
        if not isinstance(v, bool):
            raise ArgumentError(OP, name, f"expected a bool, got {type(v).__name__} {v!r}")
    _check_states(u, n, initial_states, cu_seqlens)


def _check_states(u: Any, n: int, initial_states: Any, cu_seqlens: Any) -> None:
    """``cu_seqlens`` [S+1] int32 (batch 1, offsets into u's L) and ``initial_states``
    ``[S, dim, N]`` f32 (S = batch without ``cu_seqlens``), on u's device."""
    batch, dim, length = u.shape
    seqs = batch
    named = []
    if cu_seqlens is not None:
        if batch != 1:
            raise ArgumentError(OP, "cu_seqlens", f"packs sequences along L of batch 1; u has batch {batch}")
        seqs = check_cu_seqlens(OP, cu_seqlens, length)
        named.append(("cu_seqlens", cu_seqlens, 0))
    if initial_states is not None:
        check_tensors(OP, [("initial_states", initial_states, 3)])
        check_f32(OP, "initial_states", initial_states)
        check_shape(OP, "initial_states", initial_states, (seqs, dim, n), "[S, dim, N] (u, A, cu_seqlens)")
        named.append(("initial_states", initial_states, 0))
    if named:
        check_one_device(OP, [("u", u, 0), *named])
