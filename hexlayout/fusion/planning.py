"""What every anchor's planner shares (the anchors' planners live in the op packages that
register them, ``hexlayout.fusion.anchors``): the target architecture of a device, extra
inputs placed against a rank-2 tile frame and bound again for later calls, and memoized
meta evaluations of a spec's ops (shapes and dtypes).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .aten import dtype_name
from .mechanism import InputSpec
from .spec import FusionUnsupported

__all__ = ["arch_of", "place", "sig", "meta_tensors", "meta_eval", "bind_inputs", "host_shapes", "clear_meta"]

#: The architectures the anchors are built for (sm_100a: the GEMM anchors' tcgen05 kernel).
GEMM_ARCHS = ("sm_80", "sm_89", "sm_90a", "sm_100a")

_LOCK = threading.Lock()
_ARCHS: dict[Any, str] = {}


def arch_of(device: Any, cuda: bool) -> str:
    """The hexlayout target of ``device`` (CUDA: by compute capability, cached; CPU: the
    emulated architecture, ``HEXLAYOUT_EMULATE_ARCH`` or sm_80)."""
    if cuda:
        hit = _ARCHS.get(device)
        if hit is not None:
            return hit
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        arch = {(10, 0): "sm_100a", (9, 0): "sm_90a", (8, 9): "sm_89"}.get((major, minor),
                                                                           "sm_80" if major == 8 else None)
        if arch is None:
            raise FusionUnsupported(f"compute capability {major}.{minor} has no hexlayout GEMM "
                                    "(sm_80-sm_89, sm_90a, sm_100a)")
        _ARCHS[device] = arch
        return arch
    arch = os.environ.get("HEXLAYOUT_EMULATE_ARCH", "sm_80")
    if arch not in GEMM_ARCHS:
        raise FusionUnsupported(f"HEXLAYOUT_EMULATE_ARCH={arch!r} is not a GEMM architecture (sm_80, sm_89, "
                                "sm_90a, sm_100a)")
    return arch


def place(t: Any, frame: tuple, where: str, i: int) -> tuple[InputSpec, Any]:
    """Extra input ``t`` against a rank-2 frame ``(rows, cols)`` (leading dims flattened); of a
    frame ``(rows, 1, "per_row")``, any tensor of ``rows`` elements (one value per row: the
    position ids of a rope)."""
    import numbers

    import torch

    if isinstance(t, numbers.Number) and not isinstance(t, bool):
        return InputSpec("scalar"), float(t)
    if not isinstance(t, torch.Tensor):
        raise FusionUnsupported(f"{where}: extra input {i} is {type(t).__name__}, not a tensor or a number")
    rows, cols = frame[:2]
    shape = tuple(t.shape)
    last = shape[-1] if shape else 1
    lead = shape[:-1]
    nlead = 1
    for s in lead:
        nlead *= s
    if len(frame) > 2 and frame[2] == "per_row" and t.numel() == rows:   # one value per row (an id)
        last, nlead = 1, rows
    if last not in (cols, 1):
        raise FusionUnsupported(f"{where}: extra input {i} of shape {shape} does not broadcast to the "
                                f"{rows} x {cols} tile frame (last dim must be {cols} or 1)")
    if nlead == rows:
        brow = False
    elif nlead == 1:
        brow = True
    else:
        raise FusionUnsupported(f"{where}: extra input {i} of shape {shape}: its leading dims hold {nlead} "
                                f"rows, the frame {rows} (only full rows or a broadcast row fuse)")
    bcol = last == 1 and cols != 1
    host = t.reshape(1 if brow else rows, 1 if bcol else cols)
    if not host.is_contiguous() or host.data_ptr() % 16:
        host = host.clone(memory_format=torch.contiguous_format)     # a fresh, aligned allocation
    return InputSpec("tensor", dtype_name(t.dtype), (brow, bcol)), host


def sig(xs: list[Any]) -> tuple:
    """What the meta evaluation of a spec depends on: tensors' shapes, strides and dtypes."""
    out = []
    for x in xs:
        if hasattr(x, "shape") and hasattr(x, "stride"):
            out.append((tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device), bool(x.is_cuda)))
        else:
            out.append(type(x).__name__)
    return tuple(out)


def meta_tensors(xs: list[Any]) -> list[Any]:
    import torch

    return [torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
            if isinstance(x, torch.Tensor) else x for x in xs]


_META: dict[tuple, Any] = {}


def meta_eval(key: tuple, fn: Any) -> Any:
    """``fn()`` (torch's ops on meta tensors: shapes and dtypes), memoized on ``key``."""
    try:
        hit = _META.get(key)
    except TypeError:                    # an unhashable constant in the spec
        return fn()
    if hit is None:
        hit = fn()
        with _LOCK:
            if len(_META) > 4096:
                _META.clear()
            _META[key] = hit
    return hit


def bind_inputs(shapes: tuple, inputs: list[Any]) -> list[Any]:
    """The host values of extra inputs placed before (``place``) with these results: per
    input ``None`` (unused: ``0.0``), ``"scalar"`` (a number) or the rank-2 shape it was
    given as (a contiguous, 16-byte aligned tensor: a copy when the view is not)."""
    import torch

    out: list[Any] = []
    for t, shape in zip(inputs, shapes):
        if shape is None:
            out.append(0.0)
        elif shape == "scalar":
            out.append(float(t))
        else:
            h = t.reshape(shape)
            if not h.is_contiguous() or h.data_ptr() % 16:
                h = h.clone(memory_format=torch.contiguous_format)
            out.append(h)
    return out


def host_shapes(inputs: list[Any]) -> tuple:
    """What ``bind_inputs`` repeats of a call's placed ``inputs`` (``GemmCall.inputs``)."""
    import torch

    return tuple(tuple(h.shape) if isinstance(h, torch.Tensor) else "scalar" for h in inputs)


def clear_meta() -> None:
    """Forget the memoized meta evaluations."""
    with _LOCK:
        _META.clear()
