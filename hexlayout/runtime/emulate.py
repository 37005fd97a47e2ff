"""Run a ``Build`` in the CPU emulator on CPU torch tensors (or numpy arrays).

``emulate(build, *args, **kwargs)`` takes the kernel's arguments as a launch would (tensors
and scalars, positionally in parameter order or by name), applies the same checks as the
GPU launcher (``bind_args`` with ``device="cpu"``: dtypes, ranks, shared sizes, strides, the
lowered program's alignment / vector-width / TMA requirements), views each tensor as a
numpy array sharing its memory (bf16 and fp8 through ``ml_dtypes`` views; strided views -
transposes, slices of bigger tensors - as they are: the emulator addresses them by their
strides), runs
``hexlayout.emulator.run`` on the lowered kernel and so writes the results into the
tensors in place. Returns the ``EmulatorReport`` (bank conflicts, sectors, time).

The emulator runs every thread of every block on the CPU: use it on small problems.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .args import kernel_plan
from .launch_log import _LOGS as _LAUNCH_LOGS
from .launch_log import launched, profiled

__all__ = ["emulate", "as_numpy"]

# torch dtypes numpy cannot hold directly -> the same-width integer torch dtype to view through
_VIEW_THROUGH = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8",
                 "uint16": "int16", "uint32": "int32"}


def as_numpy(t: Any, dtype: Any = None) -> Any:
    """A numpy array sharing the memory of CPU tensor ``t`` (numpy arrays pass through).

    ``dtype``: the hexlayout ``DType`` the data holds (picks the ml_dtypes type of bf16 / fp8).
    """
    import numpy as np

    if isinstance(t, np.ndarray):
        return t
    import torch

    t = t.detach()
    name = str(t.dtype).removeprefix("torch.")
    if name in _VIEW_THROUGH:
        arr = t.view(getattr(torch, _VIEW_THROUGH[name])).numpy()
        want = np.dtype(dtype.numpy()) if dtype is not None else None
        if want is None:
            import ml_dtypes

            want = np.dtype({"bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
                             "float8_e5m2": ml_dtypes.float8_e5m2, "uint16": np.uint16,
                             "uint32": np.uint32}[name])
        return arr.view(want)
    return t.numpy()


def emulate(build: Any, *args: Any, blocks: Iterable[Any] | None = None, check_races: bool = True,
            count: bool = True, **kwargs: Any) -> Any:
    """Run ``build``'s lowered kernel in the CPU emulator; tensors are updated in place.

    ``build``: a ``Build``, or a ``LoweredProgram`` / ``LoweredKernel`` (e.g. from
    ``hexlayout.ir.lower.kernel.lower_kernel``). ``args`` / ``kwargs``: the kernel's parameters
    (CPU torch tensors or numpy arrays, and scalars), positionally in declaration order or by
    name. ``blocks``: only these blocks (default: the whole grid). ``check_races`` /
    ``count``: as ``hexlayout.emulator.run``. Raises ``ArgumentError`` before running when
    an argument does not fit the kernel.
    """
    from hexlayout.emulator import run

    build, kernel = _as_build(build)
    plan = kernel_plan(build)
    vals = plan.collect(args, kwargs)
    bound = plan.bind(vals, "cpu")
    arrays: dict[str, Any] = {}
    for t in plan.tensors:
        arrays[t.param.name] = as_numpy(vals[t.index], t.param.dtype)
    for s in plan.scalars:
        x = vals[s.index]
        arrays[s.param.name] = x.item() if hasattr(x, "item") else x
    if bound.empty:
        from hexlayout.emulator import EmulatorReport

        return EmulatorReport(plan.name)
    if _LAUNCH_LOGS:
        launched(build, plan.name, bound, "cpu")
    with profiled(plan.name):
        return run(kernel, arrays, blocks, check_races=check_races, count=count)


_GENERATED: dict[int, tuple[Any, Any]] = {}


def _as_build(obj: Any) -> tuple[Any, Any]:
    """``(build-like, LoweredKernel)``: a ``Build`` as is; a ``LoweredProgram`` (or
    ``LoweredKernel``) gets its ``GeneratedKernel`` (for the argument order) printed once."""
    if hasattr(obj, "generated") and hasattr(obj, "synthesis"):
        return obj, obj.synthesis.lowered.kernel
    from types import SimpleNamespace

    from hexlayout.codegen import generate
    from hexlayout.ir.lowered import LoweredKernel

    kernel = obj if isinstance(obj, LoweredKernel) else obj.kernel
    hit = _GENERATED.get(id(obj))
    if hit is None or hit[0] is not obj:
        program = obj if not isinstance(obj, LoweredKernel) else SimpleNamespace(kernel=obj, requirements=[])
        hit = (obj, SimpleNamespace(generated=generate(kernel), synthesis=SimpleNamespace(lowered=program)))
        _GENERATED[id(obj)] = hit
    return hit[1], kernel
