"""``run_fused(spec, anchor_args, extra_inputs)``: build (once per structure) and run a fused
kernel: launched on CUDA tensors, run in the emulator on CPU tensors (``HEXLAYOUT_EMULATE=1``).

The spec's anchor names the ``AnchorRecord`` (``fusion.anchors``) whose ``run`` plans the
call (the aten semantics of the anchor, where each extra input goes, what the host does to
the outputs), builds and launches it. Builds are keyed on the structure (anchor kernel,
architecture, tile constants, the fused program's shape-free plan), never on sizes. Anything
the mechanism cannot fuse raises ``FusionUnsupported`` with the reason, before any kernel
runs. A later call of the same spec object with arguments of the same shapes repeats the
first call's plan and build (``_Prepared``) when the record said how.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .anchors import anchor_records, record_of_spec
from .launch import LAUNCHERS, check_emulation, kernel_args
from .mechanism import FusedProgram
from .planning import clear_meta
from .reference import reference
from .spec import FusedSpec, FusionUnsupported

__all__ = ["run_fused", "reference", "clear_fused_builds"]

_LOCK = threading.Lock()


def clear_fused_builds() -> None:
    """Forget the memoized fused builds, launchers, plans (every record's ``clear``)."""
    with _LOCK:
        LAUNCHERS.clear()
        _FAST.clear()
    clear_meta()
    for record in anchor_records():
        if record.clear is not None:
            record.clear()


@dataclass
class _Prepared:
    """A planned and built call, repeated by later calls with the same spec object and the
    same argument shapes, strides, dtypes and devices: ``bind(anchor_args, extra_inputs)``
    gives the kept anchor parameters (by name) and the extra inputs' host values; outputs
    are allocated as ``outs`` (shape, torch dtype) and handed to ``finish``; on CUDA the
    launcher's pre-packed launch (``go``) of the first call's arguments."""

    spec: FusedSpec
    bld: Any
    prog: FusedProgram
    cuda: bool
    device: Any
    bind: Callable[[list, list], tuple[dict[str, Any], list[Any]]]
    outs: list[tuple[tuple[int, ...], Any]]
    finish: Callable[[list[Any]], list[Any]]
    launcher: Any = None
    template: Any = None
    go: Any = None
    emulated_arch: str | None = field(default_factory=lambda: _emulated_arch())


def _emulated_arch() -> str | None:
    """What CPU tensors are emulated as (``HEXLAYOUT_EMULATE_ARCH``; a prepared CPU call is for one)."""
    return os.environ.get("HEXLAYOUT_EMULATE_ARCH")


_FAST: dict[tuple, _Prepared] = {}


def _fast_sig(xs: list[Any]) -> tuple:
    """The part of arguments a prepared call depends on (numbers by type only: they are
    runtime parameters)."""
    out = []
    for x in xs:
        shape = getattr(x, "shape", None)
        if shape is not None and hasattr(x, "stride"):
            out.append((shape, x.stride(), x.dtype, x.device))
        else:
            out.append(type(x))
    return tuple(out)


def _fast_key(spec: FusedSpec, anchor_args: list[Any], extra_inputs: list[Any]) -> tuple:
    return (id(spec), _fast_sig(anchor_args), _fast_sig(extra_inputs))


def _remember(key: tuple, prep: _Prepared) -> None:
    with _LOCK:
        if len(_FAST) > 1024:
            _FAST.clear()
        _FAST[key] = prep


def _run_prepared(p: _Prepared, anchor_args: list[Any], extra_inputs: list[Any]) -> list[Any]:
    """A later call of a prepared one: bind, allocate, launch (or emulate), finish."""
    from hexlayout.runtime.alloc import fresh

    if not p.cuda:
        check_emulation(p.spec)
    named, inputs = p.bind(anchor_args, extra_inputs)
    outs = [fresh(shape, dt, p.device) for shape, dt in p.outs]
    args = kernel_args(p.prog, named, inputs, outs)
    if p.cuda:
        if p.go is None or not p.go(args):
            p.launcher.call_like(p.template, args)
    else:
        from hexlayout.runtime.emulate import emulate

        emulate(p.bld, *args)
    return p.finish(outs)


def run_fused(spec: FusedSpec, anchor_args: list[Any], extra_inputs: list[Any]) -> list[Any]:
    """Run ``spec`` as one fused hexlayout kernel (see the module docstring); its outputs,
    in the order of ``spec.epilogue.outputs``, with eager's shapes and dtypes.

    Raises ``FusionUnsupported`` (nothing ran) when the spec, the shapes or the device cannot
    be fused, ``EmulationDisabledError`` for CPU tensors without ``HEXLAYOUT_EMULATE=1``.
    A call like an earlier one (the same spec object; arguments of the same shapes, strides,
    dtypes and devices) repeats its plan and build: it only binds its tensors and numbers,
    allocates the outputs and launches."""
    key = _fast_key(spec, anchor_args, extra_inputs)
    hit = _FAST.get(key)
    if hit is not None and hit.spec is spec and (hit.cuda or hit.emulated_arch == _emulated_arch()):
        return _run_prepared(hit, anchor_args, extra_inputs)
    if not isinstance(spec, FusedSpec):
        raise FusionUnsupported(f"run_fused takes a FusedSpec, not {type(spec).__name__}")
    run = record_of_spec(spec.anchor).run
    assert run is not None
    outs, prep = run(spec, list(anchor_args), list(extra_inputs))
    if prep is not None:
        bound = prep.pop("bound", None)
        p = _Prepared(spec, **prep)
        if p.cuda and bound is not None:
            p.launcher, p.template = LAUNCHERS[id(p.bld)], bound
            p.go = p.launcher.prepared(bound)
        _remember(key, p)
    return outs
