"""Allocating the tensors kernels write: outputs and workspaces.

* ``fresh(shape, dtype, device)``: a tensor the kernel is meant to write before anything reads
  it. Uninitialised (``torch.empty``) on CUDA and meta; on the CPU (the emulator's device) filled
  with a poison value, so that an element a kernel should write but does not is visible in a
  test instead of reading as a plausible 0: NaN for floating dtypes (fp8 included), the most
  negative value for signed integers (never an index, a count or the -1 sentinel), all ones for
  unsigned integers, ``True`` for bool.
* ``fresh_like(t, shape)``: the same with ``t``'s dtype and device (as ``t.new_empty(shape)``).
* ``zeroed(shape, dtype, device)``: a tensor whose contract is that it starts at zero on every
  device - a workspace accumulated into with atomics, an output whose unwritten rows are
  documented as 0. Zeros on CUDA and CPU alike.

Every op in ``ops/`` and every fusion path allocates its outputs and workspaces through one of
the two (``tests/test_structure.py`` checks it), so CPU and GPU differ only in what an element
holds before the kernel writes it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fresh", "fresh_like", "zeroed", "poison_value"]

_TORCH: Any = None


def _torch() -> Any:
    global _TORCH
    if _TORCH is None:
        import torch

        _TORCH = torch
    return _TORCH


def poison_value(dtype: Any) -> float | int | bool:
    """What ``fresh`` fills a CPU tensor of ``dtype`` with (see the module docstring)."""
    torch = _torch()
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    info = torch.iinfo(dtype)
    return info.max if info.min == 0 else info.min


def fresh(shape: Any, dtype: Any, device: Any) -> Any:
    """A tensor for a kernel to write in full: uninitialised on CUDA, poison-filled on the CPU."""
    t = (_TORCH or _torch()).empty(shape, dtype=dtype, device=device)
    if t.is_cuda or t.device.type != "cpu":    # is_cuda first: the cheap test on the hot path
        return t
    return t.fill_(poison_value(dtype))


def fresh_like(t: Any, shape: Any) -> Any:
    """``fresh(shape, t.dtype, t.device)`` at ``t.new_empty``'s cost (the cached gemm's hot path)."""
    out = t.new_empty(shape)
    if out.is_cuda or out.device.type != "cpu":
        return out
    return out.fill_(poison_value(out.dtype))


def zeroed(shape: Any, dtype: Any, device: Any) -> Any:
    """A tensor that starts at zero by contract, on every device (atomics accumulate into it, or
    the op documents its unwritten elements as 0)."""
    return _torch().zeros(shape, dtype=dtype, device=device)
