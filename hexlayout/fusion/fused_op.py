"""``torch.ops.hexlayout.fused_kernel``: one fused group of a compiled graph, as a torch op.

Schema ``fused_kernel(str key, Tensor[] tensors, SymInt[] ints) -> Tensor[]``: ``key``
names a ``FusedKernel`` registered by the graph front end; ``tensors`` / ``ints`` are the
group's external inputs. The real implementation calls ``run_fused(spec, anchor_args,
extra_inputs)`` (the fused hexlayout kernel: CUDA launch, or the emulator for CPU tensors
under ``HEXLAYOUT_EMULATE=1``); when the mechanism answers ``FusionUnsupported`` - or the
tensors are on the CPU without emulation - the group's own aten ops run in torch instead,
and the reason is kept (``FusedKernel.unsupported``, per shapes, dtypes and device - on the
CPU also per ``HEXLAYOUT_EMULATE`` / ``HEXLAYOUT_EMULATE_ARCH``, read at each call, so that
turning the emulator on runs the kernel) for ``explain`` and the compile report. Any other hexlayout
error while building the kernel does the same with a ``FusionWarning`` (a model never
fails because a kernel could not be fused; the warning makes the failure visible). The fake
implementation runs the aten ops on fake tensors, so shapes (symbolic ones included) and
dtypes are torch's. Outputs have the strides eager gives them (the rest of the graph was
traced with those), and none aliases an input or another output.
"""

from __future__ import annotations

import itertools
import logging
import threading
import warnings
from typing import Any

from hexlayout.errors import HexlayoutError

from .partition import Group
from .spec import FusionUnsupported

__all__ = ["FusedKernel", "FusionWarning", "register_kernel", "kernel", "fused_kernel_op"]

log = logging.getLogger("hexlayout.fusion")

_KERNELS: dict[str, FusedKernel] = {}
_IDS = itertools.count()
_LOCK = threading.Lock()
_LIB: list = []


class FusionWarning(UserWarning):
    """A fused kernel could not be built (a hexlayout error other than ``FusionUnsupported``)
    and torch computed its ops instead; the message has the error."""


class FusedKernel:
    """A fused group at run time: its spec, how its inputs map to ``run_fused``'s
    arguments, and the torch program that computes the same when it cannot be fused."""

    def __init__(self, group: Group) -> None:
        self.spec = group.spec
        self.anchor_args = list(group.anchor_args)
        self.extra_inputs = list(group.extra_inputs)
        self.kernel_inputs = list(group.kernel_inputs)
        self.out_shapes = list(group.out_shapes)
        self.clone_outputs = list(group.clone_outputs)
        #: (anchor, prologue, epilogue) aten op names of the graph ops this kernel replaces
        self.ops = group.ops
        self.n_tensors = group.n_tensors
        self.steps = list(group.steps)
        self.out_slots = list(group.out_slots)
        #: ``kernel_inputs`` with each host view as the Tensor method that makes it (no dispatch
        #: through the aten op: the same view, a few microseconds less per call)
        self._kernel_inputs = [(i, tuple(_as_method(target, args) for target, args in steps))
                               for i, steps in self.kernel_inputs]
        #: (shapes, dtypes, device type; on the CPU the emulation mode and architecture) -> why
        #: the fused kernel did not run for them
        self.unsupported: dict[tuple, str] = {}
        #: why the latest call ran in torch (None: it ran the fused kernel, or no call yet)
        self.latest_reason: str | None = None
        #: how many calls ran the fused kernel / the torch fallback
        self.fused_calls = 0
        self.torch_calls = 0

    def fallback_reason(self) -> str | None:
        """Why the latest call ran the group's ops in torch (None if it ran the fused kernel,
        or before the first call)."""
        return self.latest_reason

    def torch_program(self, values: list) -> list:
        """The group's aten ops in torch on ``values`` (tensors, then ints)."""
        env = list(values)

        def get(a: Any) -> Any:
            if isinstance(a, tuple) and len(a) == 2 and a[0] == "slot":
                return env[a[1]]
            if isinstance(a, (list, tuple)):
                return type(a)(get(x) for x in a)
            if isinstance(a, dict):
                return {k: get(v) for k, v in a.items()}
            return a

        for s in self.steps:
            env.append(s.target(*get(s.args), **get(s.kwargs)))
        return [env[k] for k in self.out_slots]

    def __call__(self, tensors: list, ints: list) -> list:
        values = list(tensors) + list(ints)
        sig = tuple((t.shape, t.dtype) for t in tensors) + ((tensors[0].device.type,) if tensors else ())
        if tensors and sig[-1] == "cpu":   # whether and as what CPU tensors are emulated, read per call
            sig += _emulation()
        reason = self.unsupported.get(sig)
        if reason is None:
            try:
                outs = self._run_fused(values)
            except FusionUnsupported as e:
                reason = self.unsupported[sig] = e.reason
                log.info("hexlayout fused kernel %s runs in torch: %s", self.spec.name, e.reason)
            except HexlayoutError as e:       # a failure to build it: torch computes it, with a warning
                first = str(e).splitlines()[0] if str(e) else ""
                reason = self.unsupported[sig] = f"building the kernel failed: {type(e).__name__}: {first}"
                warnings.warn(f"hexlayout fused kernel {self.spec.name} runs in torch: {reason}",
                              FusionWarning, stacklevel=2)
            else:
                self.fused_calls += 1
                self.latest_reason = None
                return self._unaliased(outs)
        self.torch_calls += 1
        self.latest_reason = reason
        return self._unaliased(self.torch_program(values))

    def _unaliased(self, outs: list) -> list:
        """The outputs with their strides (as the graph was traced with), each a copy where it
        views an earlier output (a torch op's outputs never alias one another)."""
        return [o.clone() if c else o for o, c in zip(outs, self.clone_outputs)]

    def _run_fused(self, values: list) -> list:
        from hexlayout.runtime.torch_ops import EMULATE_ENV, emulation_enabled

        devices = {v.device.type for v in values[:self.n_tensors]}
        if devices == {"cpu"} and not emulation_enabled():
            raise FusionUnsupported(f"CPU tensors run hexlayout kernels only in the emulator "
                                    f"({EMULATE_ENV}=1)")
        try:
            from .run import run_fused
        except ImportError as e:  # the mechanism is not installed in this tree
            raise FusionUnsupported(f"the fusion mechanism is not available ({e})") from None
        kin = [_host_views(values[i], steps) for i, steps in self._kernel_inputs]
        anchor_args = [None if k is None else kin[k] for k in self.anchor_args]
        extra = [kin[k] for k in self.extra_inputs]
        outs = list(run_fused(self.spec, anchor_args, extra))
        if len(outs) != len(self.out_slots):
            raise RuntimeError(f"hexlayout fused kernel {self.spec.name}: run_fused returned {len(outs)} "
                               f"tensors for {len(self.out_slots)} outputs")
        return [o if shape is None else o.reshape(shape) for o, shape in zip(outs, self.out_shapes)]


def _emulation() -> tuple[str | None, str | None]:
    """What decides whether a CPU call can run the fused kernel besides its tensors: the
    emulation mode (``HEXLAYOUT_EMULATE``) and the emulated architecture
    (``HEXLAYOUT_EMULATE_ARCH``), so that a refusal without the emulator is not kept once it
    is on."""
    import os

    from hexlayout.runtime.emulation import emulation_mode

    return emulation_mode(), os.environ.get("HEXLAYOUT_EMULATE_ARCH")


#: aten views -> the Tensor method that makes the same view
_METHODS = {"aten.view.default": "view", "aten._unsafe_view.default": "reshape", "aten.t.default": "t",
            "aten.transpose.int": "transpose", "aten.permute.default": "permute",
            "aten.unsqueeze.default": "unsqueeze", "aten.squeeze.dim": "squeeze",
            "aten.expand.default": "expand"}


def _as_method(target: Any, args: tuple) -> tuple[Any, tuple]:
    """``(fn, args)`` with ``fn(t, *args)`` the view ``target(t, *args)`` makes."""
    name = _METHODS.get(str(target)) if hasattr(target, "_schema") else None
    if name is None:
        return target, args
    import torch

    return getattr(torch.Tensor, name), args


def _host_views(t: Any, steps: tuple) -> Any:
    """``t`` with the views the host applies before the kernel reads it."""
    for target, args in steps:
        t = target(t, *args)
    return t


def register_kernel(k: FusedKernel) -> str:
    """Register ``k`` and return its key for ``fused_kernel``."""
    fused_kernel_op()
    with _LOCK:
        key = f"{next(_IDS)}:{k.spec.name}"
        _KERNELS[key] = k
    return key


def kernel(key: str) -> FusedKernel:
    """The registered ``FusedKernel`` of ``key``."""
    try:
        return _KERNELS[key]
    except KeyError:
        raise KeyError(f"hexlayout.fused_kernel: no fused kernel {key!r} is registered in this "
                       "process") from None


def _impl(key: str, tensors: list, ints: list) -> list:
    return kernel(key)(tensors, ints)


def _fake(key: str, tensors: list, ints: list) -> list:
    k = kernel(key)
    return k._unaliased(k.torch_program(list(tensors) + list(ints)))


def fused_kernel_op() -> Any:
    """Register (once) and return ``torch.ops.hexlayout.fused_kernel.default``."""
    import torch

    with _LOCK:
        if not _LIB:
            lib = torch.library.Library("hexlayout", "FRAGMENT")
            lib.define("fused_kernel(str key, Tensor[] tensors, SymInt[] ints) -> Tensor[]")
            lib.impl("fused_kernel", _impl, "CompositeExplicitAutograd")
            torch.library.register_fake("hexlayout::fused_kernel", _fake, lib=lib)
            _LIB.append(lib)
    return torch.ops.hexlayout.fused_kernel.default
