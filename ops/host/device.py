"""The architecture kernels are built for, and the device facts the host paths read
(compute capability -> hexlayout target, SM count), cached per device."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["device_arch", "kernel_arch", "sm_count", "EMULATE_ARCH_ENV"]

#: the architecture the emulator stands in for on CPU tensors (default sm_80)
EMULATE_ARCH_ENV = "HEXLAYOUT_EMULATE_ARCH"


def device_arch(capability: tuple[int, int]) -> str:
    """The hexlayout target for a CUDA compute capability: 8.0-8.8 sm_80, 8.9 sm_89, 9.0 sm_90a,
    10.0 sm_100a (B200 / GB200: the tcgen05 kernels where an op has them, its mma.sync kernels
    otherwise, which sm_100a runs)."""
    major, minor = capability
    if (major, minor) == (10, 0):
        return "sm_100a"
    if major == 9:
        return "sm_90a"
    if (major, minor) == (8, 9):
        return "sm_89"
    if major == 8:
        return "sm_80"
    raise ValueError(f"hexlayout: compute capability {major}.{minor} is not supported "
                     "(supported: 8.0-8.9 (sm_80, sm_89), 9.0 (sm_90a) and 10.0 (sm_100a))")


def kernel_arch(device: Any) -> str:
    """The architecture kernels are built for on ``device``: a CUDA device's own, else the
    emulated one (``HEXLAYOUT_EMULATE_ARCH``, default sm_80)."""
    if device.type == "cuda":
        arch = _ARCH.get(device)
        if arch is None:
            import torch

            arch = _ARCH[device] = device_arch(torch.cuda.get_device_capability(device))
        return arch
    return os.environ.get(EMULATE_ARCH_ENV, "sm_80")


_ARCH: dict[Any, str] = {}
_SMS: dict[Any, int] = {}


def sm_count(device: Any) -> int:
    """The number of SMs of a CUDA ``device`` (read once per device)."""
    n = _SMS.get(device)
    if n is None:
        import torch

        n = _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n
