"""The argument check of ``selective_state_update``, run eagerly and in its fake implementation."""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.args import ArgumentError

from ..host.checks import check_index_tensors, check_one_device, check_tensors
from ..host.launch import content_checks
from .selective_scan_args import check_f32, check_float_dtype, check_shape

__all__ = ["check_selective_state_update", "state_update_form"]

OP = "hexlayout.selective_state_update"


def state_update_form(state: Any, B: Any) -> tuple[int, int, int, int]:
    """``(H, P, N, G)`` of the general form both Mamba forms run as: Mamba-1 (state
    ``[S, dim, N]``) is ``H = G`` heads of ``P = dim / G`` channels; Mamba-2 (state
    ``[S, H, P, N]``) keeps its heads."""
    g = B.shape[1] if B.dim() == 3 else 1
    if state.dim() == 3:
        return g, state.shape[1] // g, state.shape[2], g
    return state.shape[1], state.shape[2], state.shape[3], g


def _tensor_ranks(state: Any, named: list[tuple[str, Any, tuple[int, ...]]]) -> None:
    check_tensors(
        OP, [("state", state, state.dim() if getattr(state, "dim", None) and state.dim() == 4 else 3)]
    )
    for name, t, ranks in named:
        if t is not None or name in ("x", "dt", "A", "B", "C"):  # (None: absent, for the optional ones)
            check_tensors(
                OP, [(name, t, t.dim() if getattr(t, "dim", None) and t.dim() in ranks else ranks[0])]
            )


def check_selective_state_update(state: Any, x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any = None,
                                 z: Any = None, dt_bias: Any = None, dt_softplus: bool = False,
                                 state_batch_indices: Any = None) -> None:  # fmt: skip
    """The arguments of ``selective_state_update`` for both forms (see ``state_update_form``):
    Mamba-1 state ``[S, dim, N]``, x / dt / z ``[batch, dim]``, A ``[dim, N]``, B / C ``[batch, N]``
    or ``[batch, G, N]``, D / dt_bias ``[dim]``; Mamba-2 state ``[S, H, P, N]``, x / z
    ``[batch, H, P]``, dt ``[batch, H, P]`` or ``[batch, H]``, A ``[H]`` or ``[H, P, N]``, B / C
    ``[batch, G, N]`` (G divides H), D / dt_bias ``[H]`` or ``[H, P]``; state_batch_indices
    ``[batch]`` int32 / int64 below S (-1 skips). Raises naming the argument."""
    m2 = getattr(state, "dim", None) is not None and state.dim() == 4
    _tensor_ranks(
        state,
        [
            ("x", x, (3 if m2 else 2,)),
            ("dt", dt, (3, 2) if m2 else (2,)),
            ("A", A, (1, 3) if m2 else (2,)),
            ("B", B, (3,) if m2 else (2, 3)),
            ("C", C, (B.dim() if hasattr(B, "dim") else 3,)),
            ("z", z, (x.dim() if hasattr(x, "dim") else 2,)),
            ("D", D, (1, 2) if m2 else (1,)),
            ("dt_bias", dt_bias, (1, 2) if m2 else (1,)),
            ("state_batch_indices", state_batch_indices, (1,)),
        ],
    )
    named = [
        (n, t, 0)
        for n, t in (
            ("state", state),
            ("x", x),
            ("dt", dt),
            ("A", A),
            ("B", B),
            ("C", C),
            ("D", D),
            ("z", z),
            ("dt_bias", dt_bias),
            ("state_batch_indices", state_batch_indices),
        )
        if t is not None
    ]
    check_one_device(OP, named)
    check_float_dtype(OP, "state", state)
    check_float_dtype(OP, "x", x)
    h, p, n, g = state_update_form(state, B)
    batch = x.shape[0]
    xs = (batch, h, p) if m2 else (batch, h * p)
    what = "[batch, H, P] (state)" if m2 else "[batch, dim] (state)"
    if g < 1 or h % g or (not m2 and state.shape[1] % g):
        raise ArgumentError(
            OP,
            "B",
            f"has {g} groups, which do not split {'H' if m2 else 'dim'} = "
            f"{h if m2 else state.shape[1]} evenly",
        )
    check_shape(OP, "x", x, xs, what)
    for name, t in (("dt", dt), ("z", z)):
        if t is not None:
            check_float_dtype(OP, name, t, ("x", x))
            check_shape(OP, name, t, (batch, h) if name == "dt" and t.dim() == 2 and m2 else xs, what)
    _check_params((m2, h, p, n, g), x, A, B, C, D, dt_bias)
    if not isinstance(dt_softplus, bool):
        raise ArgumentError(
            OP, "dt_softplus", f"expected a bool, got {type(dt_softplus).__name__} {dt_softplus!r}"
        )
    if state.stride(-1) != 1 and n > 1:
        raise ArgumentError(
            OP, "state", f"has strides {tuple(state.stride())}: the last dimension must be contiguous"
        )
    _check_indices(state, batch, state_batch_indices)


def _check_indices(state: Any, batch: int, idx: Any) -> None:
    import torch

    if idx is None:
        if state.shape[0] != batch:
            raise ArgumentError(
                OP,
                "state",
                f"has {state.shape[0]} rows, x {batch}: without state_batch_indices they must agree",
            )
        return
    if idx.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(
            OP, "state_batch_indices", f"has dtype {idx.dtype}, expected torch.int32 or torch.int64"
        )
    check_index_tensors(OP, [("state_batch_indices", idx)], idx.dtype)
    check_shape(OP, "state_batch_indices", idx, (batch,), "[batch] (x)")
    if content_checks(idx) and batch:
        lo, hi = int(idx.min()), int(idx.max())
        if hi >= state.shape[0] or lo < -1:
            raise ArgumentError(
                OP,
                "state_batch_indices",
                f"holds {hi if hi >= state.shape[0] else lo}, outside "
                f"[-1, {state.shape[0]}) (state rows; -1 skips a row)",
            )


def _check_params(
    form: tuple[bool, int, int, int, int], x: Any, A: Any, B: Any, C: Any, D: Any, dt_bias: Any
) -> None:
    """A, B, C, D and dt_bias against the form ``(mamba2, H, P, N, G)`` and ``x``."""
    m2, h, p, n, g = form
    batch = x.shape[0]
    check_f32(OP, "A", A)
    check_shape(
        OP,
        "A",
        A,
        (h,) if m2 and A.dim() == 1 else (h, p, n) if m2 else (h * p, n),
        "[H]" if m2 and A.dim() == 1 else "[H, P, N] (state)" if m2 else "[dim, N] (state)",
    )
    for name, t in (("B", B), ("C", C)):
        check_float_dtype(OP, name, t, ("x", x))
        check_shape(
            OP,
            name,
            t,
            (batch, g, n) if B.dim() == 3 else (batch, n),
            "[batch, G, N] / [batch, N] (x, state)",
        )
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            check_f32(OP, name, t)
            check_shape(
                OP,
                name,
                t,
                (h, p) if m2 and t.dim() == 2 else (h,) if m2 else (h * p,),
                "[H, P]" if m2 and t.dim() == 2 else "[H]" if m2 else "[dim] (state)",
            )
