"""The argument check of ``ssd_scan``, run eagerly and in its fake implementation; each error
names the op and the argument."""

from __future__ import annotations

import math
from typing import Any

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError

from ..host.checks import check_dtype, check_one_device, check_tensors, int_arg, kind
from .conv1d_args import check_cu_seqlens

__all__ = ["check_ssd_scan", "check_dt_limit", "ssd_sequences"]

OP = "hexlayout.ssd_scan"


def check_dt_limit(dt_limit: Any) -> tuple[float, float]:
    """``dt_limit`` is a pair ``(lo, hi)`` of reals with ``lo <= hi`` (``hi`` may be ``inf``)."""
    import numbers

    if (not isinstance(dt_limit, (tuple, list)) or len(dt_limit) != 2
            or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in dt_limit)):
        raise ArgumentTypeError(OP, "dt_limit", f"expected a pair (lo, hi) of numbers, got {kind(dt_limit)}")
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if math.isnan(lo) or math.isnan(hi) or lo > hi or lo == math.inf:
        raise ArgumentError(OP, "dt_limit", f"is {dt_limit!r}: expected lo <= hi, lo finite")
    return lo, hi


def ssd_sequences(x: Any, cu_seqlens: Any) -> int:
    """The number of sequences: ``x``'s batch, or ``len(cu_seqlens) - 1``."""
    return x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _check_float(name: str, t: Any, shapes: list[tuple[int, ...]]) -> None:
    """``t`` is a floating tensor of one of ``shapes``."""
    if not t.is_floating_point():
        raise ArgumentError(OP, name, f"has dtype {t.dtype}; expected a floating dtype")
    if tuple(t.shape) not in shapes:
        raise ArgumentError(OP, name, f"has shape {tuple(t.shape)}: expected "
                            + " or ".join(str(list(s)) for s in shapes))


def check_ssd_scan(x: Any, dt: Any, A: Any, B: Any, C: Any, chunk_size: Any = 256, D: Any = None,
                   z: Any = None, dt_bias: Any = None, dt_softplus: Any = False,
                   dt_limit: Any = (0.0, math.inf), initial_states: Any = None, cu_seqlens: Any = None,
                   return_final_states: Any = False) -> None:
    """The arguments of ``ssd_scan``: ``x`` [batch, L, H, P] f16 / bf16; ``dt`` [batch, L, H];
    ``A`` [H]; ``B``, ``C`` [batch, L, G, N] of x's dtype with ``H % G == 0``; ``D`` [H] or
    [H, P]; ``z`` like ``x``; ``dt_bias`` [H]; ``initial_states`` [S, H, P, N] (S = batch, or
    ``len(cu_seqlens) - 1`` with batch 1)."""
    check_tensors(OP, [("x", x, 4), ("dt", dt, 3), ("A", A, 1), ("B", B, 4), ("C", C, 4)])
    check_dtype(OP, "x", x)
    batch, length, heads, p = x.shape
    _check_float("dt", dt, [(batch, length, heads)])
    _check_float("A", A, [(heads,)])
    groups, n = B.shape[2], B.shape[3]
    for name, t in (("B", B), ("C", C)):
        if t.dtype != x.dtype:
            raise ArgumentError(OP, name, f"has dtype {t.dtype}, x {x.dtype}")
        if tuple(t.shape[:2]) != (batch, length) or groups == 0 or heads % groups or tuple(t.shape) != tuple(
                B.shape):
            raise ArgumentError(OP, name, f"has shape {tuple(t.shape)}: expected [{batch}, {length}, G, N] "
                                f"with {heads} heads a multiple of G (B {tuple(B.shape)})")
    if int_arg(OP, "chunk_size", chunk_size) < 1:
        raise ArgumentError(OP, "chunk_size", f"is {chunk_size}; expected a positive int")
    named = [("x", x, 0), ("dt", dt, 0), ("A", A, 0), ("B", B, 0), ("C", C, 0)]
    for name, t, shapes in (("D", D, [(heads,), (heads, p)]), ("dt_bias", dt_bias, [(heads,)])):
        if t is not None:
            check_tensors(OP, [(name, t, 2 if name == "D" and getattr(t, "ndim", None) == 2 else 1)])
            _check_float(name, t, shapes)
            named.append((name, t, 0))
    if z is not None:
        check_tensors(OP, [("z", z, 4)])
        if z.dtype != x.dtype or z.shape != x.shape:
            raise ArgumentError(OP, "z", f"has {z.dtype} {tuple(z.shape)}: expected x's {x.dtype} "
                                f"{tuple(x.shape)}")
        named.append(("z", z, 0))
    for name, v in (("dt_softplus", dt_softplus), ("return_final_states", return_final_states)):
        if not isinstance(v, bool):
            raise ArgumentTypeError(OP, name, f"expected a bool, got {kind(v)}")
    check_dt_limit(dt_limit)
    if cu_seqlens is not None:
        if batch != 1:
            raise ArgumentError(OP, "cu_seqlens", f"packs sequences along L of batch 1; x has batch {batch}")
        check_cu_seqlens(OP, cu_seqlens, length)
        named.append(("cu_seqlens", cu_seqlens, 0))
    if initial_states is not None:
        check_tensors(OP, [("initial_states", initial_states, 4)])
        _check_float("initial_states", initial_states, [(ssd_sequences(x, cu_seqlens), heads, p, n)])
        named.append(("initial_states", initial_states, 0))
    check_one_device(OP, named)
