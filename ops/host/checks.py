"""Argument checks shared by the ops: each raises ``ArgumentTypeError`` (``TypeError``) or
``ArgumentError`` (``ValueError``) naming the op and the argument."""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.args import INT32_MAX, ArgumentError, ArgumentTypeError

__all__ = ["kind", "is_real", "check_tensors", "check_device", "check_one_device", "check_index_tensors",
           "check_rows", "rows_fit", "check_dtype", "int_arg", "real_arg"]


def kind(x: Any) -> str:
    """How an argument is named in an error: a tensor by its shape, anything else by type and value."""
    import torch

    return (
        f"a tensor of shape {tuple(x.shape)}"
        if isinstance(x, torch.Tensor)
        else f"{type(x).__name__} {x!r}"[:80]
    )


def is_real(t: Any) -> bool:
    """Whether tensor ``t`` has real storage (CUDA or CPU, not meta or fake)."""
    return t.device.type in ("cuda", "cpu") and not type(t).__name__.startswith("Fake")


def check_tensors(op: str, named: list[tuple[str, Any, int]]) -> None:
    """Each ``(name, value, rank)`` is a tensor of that rank."""
    import torch

    for name, t, rank in named:
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(op, name, f"expected a tensor, got {kind(t)}")
        if t.dim() != rank:
            raise ArgumentError(op, name, f"must have {rank} dimensions, got shape {tuple(t.shape)}")


def check_device(op: str, first: tuple[str, Any], others: list[tuple[str, Any]]) -> None:
    name0, t0 = first
    if t0.device.type not in ("cuda", "cpu", "meta"):
        raise ArgumentError(op, name0, f"is on {t0.device}; supported: CUDA, CPU (HEXLAYOUT_EMULATE=1), meta")
    for name, t in others:
        if t.device != t0.device:
            raise ArgumentError(
                op, name, f"is on {t.device}, {name0} on {t0.device}; all tensors must be on one device"
            )


def check_one_device(op: str, named: list[tuple[str, Any, int]]) -> None:
    """``check_device`` over a ``check_tensors`` table: every tensor on the first one's device."""
    check_device(op, (named[0][0], named[0][1]), [(name, t) for name, t, _ in named[1:]])


def check_index_tensors(op: str, named: list[tuple[str, Any]], dtype: Any) -> None:
    """Each ``(name, tensor)`` holds indices of ``dtype`` (``torch.int32`` / ``torch.int64``) with a
    contiguous last dimension (stride 1; any stride when it has at most one element)."""
    for name, t in named:
        if t.dtype != dtype:
            raise ArgumentError(op, name, f"has dtype {t.dtype}, expected {dtype}")
        if t.numel() > 1 and t.stride(-1) != 1:
            raise ArgumentError(
                op, name, f"has strides {tuple(t.stride())}: the last dimension must be contiguous"
            )


def rows_fit(t: Any) -> bool:
    """Whether the kernels' 16-byte row vectors read ``t`` in place: a contiguous last dimension,
    the other strides multiples of 8 elements and a 16-byte aligned start (meta / fake tensors:
    by their storage offset)."""
    if t.numel() == 0:
        return True
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return False
    if any(n > 1 and s % 8 for s, n in zip(t.stride()[:-1], t.shape[:-1])):
        return False
    off = t.data_ptr() % 16 if is_real(t) else t.storage_offset() * t.element_size() % 16
    return off == 0


def check_rows(op: str, name: str, t: Any, *, copied: bool = False) -> None:
    """``rows_fit(t)`` (the kernels move 16-byte vectors; the error says which stride or offset
    breaks it), offsets within 32-bit indexing. ``copied``: ``t`` is an input the op reads from a
    contiguous copy when it does not fit (``host.launch.rows_input``): only the copy's size is
    checked."""
    if t.numel() == 0:
        return
    if copied:
        if t.numel() > INT32_MAX:
            raise ArgumentError(op, name, f"has {t.numel()} elements; the kernels index with 32-bit int "
                                "(< 2^31)")
        return
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ArgumentError(
            op, name, f"has strides {tuple(t.stride())}: the last dimension must be contiguous (stride 1)"
        )
    for i, (s, n) in enumerate(zip(t.stride()[:-1], t.shape[:-1])):
        if n > 1 and s % 8:
            raise ArgumentError(
                op,
                name,
                f"stride {i} is {s} elements, expected a multiple of 8 (rows must be "
                "16-byte aligned for the kernels' 16-byte vectors)",
            )
    off = t.data_ptr() % 16 if is_real(t) else t.storage_offset() * t.element_size() % 16
    if off:
        raise ArgumentError(op, name, f"starts {off} bytes off 16-byte alignment; pass {name}.clone()")
    span = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    if span > INT32_MAX:
        raise ArgumentError(
            op, name, f"spans {span + 1} elements; the kernels index with 32-bit int (< 2^31)"
        )


def check_dtype(op: str, name: str, t: Any) -> None:
    import torch

    if t.dtype not in (torch.float16, torch.bfloat16):
        raise ArgumentError(op, name, f"has dtype {t.dtype}; supported: torch.float16, torch.bfloat16")


def int_arg(op: str, name: str, v: Any) -> int:
    import numbers

    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
        raise ArgumentTypeError(op, name, f"expected an int, got {kind(v)}")
    return int(v)


def real_arg(op: str, name: str, v: Any, optional: bool = False) -> float | None:
    import math
    import numbers

    if v is None and optional:
        return None
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        raise ArgumentTypeError(
            op, name, f"expected a real number{' or None' if optional else ''}, got {kind(v)}"
        )
    if not math.isfinite(float(v)):
        raise ArgumentError(op, name, f"must be finite, got {v}")
    return float(v)
