"""Building a kernel for a tensor's device and running it: compiled and launched on torch's
current stream for CUDA tensors, synthesized and run in the emulator for CPU tensors. Outputs and
workspaces are allocated with ``fresh`` (uninitialised on CUDA, NaN / poison-filled on the CPU)
or, where the contract says they start at zero on every device, ``zeroed``
(``hexlayout.runtime.alloc``, shared with the fusion layer)."""

from __future__ import annotations

import os
from typing import Any

from hexlayout.runtime.alloc import fresh, fresh_like, zeroed

from .checks import is_real, rows_fit
from .device import kernel_arch

__all__ = ["build_for", "run_kernel", "lang_dtype", "content_checks", "rows_input", "fresh", "fresh_like",
           "zeroed", "CHECK_ENV"]

CHECK_ENV = "HEXLAYOUT_CHECK"


def content_checks(t: Any) -> bool:
    """Whether checks reading tensor contents run: CPU tensors always, CUDA tensors only with
    ``HEXLAYOUT_CHECK=1`` (they synchronize), meta / fake tensors and CUDA-graph captures
    (``hexlayout.runtime.capturing``) never."""
    from hexlayout.runtime import capturing

    if not is_real(t) or capturing():
        return False
    return t.device.type == "cpu" or os.environ.get(CHECK_ENV, "") == "1"


def lang_dtype(torch_dtype: Any) -> Any:
    import torch

    from hexlayout.lang import bf16, f16

    return bf16 if torch_dtype == torch.bfloat16 else f16


def build_for(kernel: Any, device: Any, consts: dict[str, Any]) -> Any:
    """``kernel`` built for ``device``: compiled for a CUDA device's architecture
    (``kernel_arch``: sm_100a on compute capability 10.0), synthesized only (for the emulator,
    ``HEXLAYOUT_EMULATE_ARCH``, default sm_80) for a CPU one."""
    from hexlayout.runtime import build

    arch = kernel_arch(device)
    if device.type == "cuda":
        return build(kernel, arch, **consts)
    return build(kernel, arch, compile=False, **consts)


def run_kernel(
    bld: Any, args: tuple[Any, ...], outputs: tuple[int, ...], strides: tuple[int, ...] = ()
) -> None:
    """Run ``bld`` on ``args`` (tensors and scalars) followed by the leading strides (all but
    the last) of the tensors ``strides`` indexes, as scalar arguments. CUDA tensors launch on
    torch's current stream with their own strides; CPU tensors run in the emulator, which needs
    C-contiguous arrays, so strided tensors go as contiguous copies (with their contiguous
    strides) and the ``outputs`` (indices into ``args``) are copied back."""
    import torch

    from hexlayout.runtime.torch_ops import run_build

    t0 = next(a for a in args if isinstance(a, torch.Tensor))
    if t0.device.type != "cuda":
        conv = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
    else:
        conv = list(args)
    extra = [int(s) for i in strides for s in conv[i].stride()[:-1]]
    run_build(bld, *conv, *extra)
    for i in outputs:
        if conv[i] is not args[i]:
            args[i].copy_(conv[i])


def rows_input(t: Any) -> Any:
    """An input tensor as the kernels read it: ``t`` itself when its rows fit 16-byte vectors
    in place (``checks.rows_fit``), else a contiguous copy in fresh (16-byte aligned) storage -
    a strided or offset view is never refused for its layout."""
    if rows_fit(t):
        return t
    import torch

    return t.clone(memory_format=torch.contiguous_format)
