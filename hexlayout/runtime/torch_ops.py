"""hexlayout kernels as torch ops: ``torch.ops.hexlayout.<name>``.

``define_op`` registers an operator with ``torch.library`` (a ``Library("hexlayout",
"FRAGMENT")``): its schema, a CUDA kernel, a CPU kernel and a fake (meta) implementation,
so the op works eagerly, under ``torch.compile`` (fullgraph), with meta / fake tensors and
inside CUDA-graph capture (the CUDA kernel launches on torch's current stream)::

    from hexlayout.runtime.torch_ops import define_op, run_build

    gemm = define_op("gemm", "(Tensor a, Tensor b) -> Tensor")

    @gemm.fake                       # shapes and dtypes only; never touches data
    def _(a, b):
        return a.new_empty((a.shape[0], b.shape[0]))

    @gemm.impl                       # CUDA tensors, and CPU tensors under HEXLAYOUT_EMULATE=1
    def _(a, b):
        c = a.new_empty((a.shape[0], b.shape[0]))
        run_build(build_for(a.dtype, a.device), a, b, c)   # launch on CUDA, emulate on CPU
        return c

    torch.ops.hexlayout.gemm(a, b)   # or gemm(a, b)

The same in one call: ``define_op("gemm", schema, fake=..., impl=...)``; ``cuda=`` / ``cpu=``
give device-specific implementations instead of (or overriding) ``impl``.

CPU kernels run only when the environment has ``HEXLAYOUT_EMULATE=1`` (read at each call):
the CPU path is the thread-level emulator, meant for tests on small sizes; otherwise the op
raises ``EmulationDisabledError`` ("hexlayout.gemm: CPU tensors need HEXLAYOUT_EMULATE=1
(emulator, small sizes) or a CUDA device").

Defining an op again with the same schema returns the existing ``Op`` and replaces the
implementations given (the registered torch kernels call through the ``Op``); a different
schema for a defined name is an error. No autograd formula is registered.

``run_build(build, *args, **kwargs)`` runs a ``Build`` on the arguments' device: a cached
``Launcher`` for CUDA tensors, ``emulate`` for CPU tensors.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hexlayout.errors import HexlayoutError

__all__ = ["define_op", "Op", "run_build", "launcher_for", "emulation_enabled", "EmulationDisabledError",
           "EMULATE_ENV", "NAMESPACE"]

#: The environment variable that enables the CPU (emulator) implementations.
EMULATE_ENV = "HEXLAYOUT_EMULATE"
#: The torch.library namespace of hexlayout ops.
NAMESPACE = "hexlayout"

Fn = Callable[..., Any]


class EmulationDisabledError(HexlayoutError, RuntimeError):
    """A hexlayout op got CPU tensors while ``HEXLAYOUT_EMULATE`` is not ``1``."""


def emulation_enabled() -> bool:
    """Whether CPU tensors may run through the emulator (``HEXLAYOUT_EMULATE=1``)."""
    return os.environ.get(EMULATE_ENV, "") == "1"


class Op:
    """A registered ``torch.ops.<namespace>.<name>`` with replaceable implementations.

    Decorators ``fake``, ``impl`` (CUDA and CPU), ``cuda``, ``cpu`` set the Python functions
    the registered torch kernels call; each returns the function unchanged.
    """

    def __init__(self, name: str, schema: str, namespace: str, lib: Any) -> None:
        self.name = name
        self.schema = schema
        self.namespace = namespace
        self.qualname = f"{namespace}::{name}"
        self._lib = lib
        self._fake: Fn | None = None
        self._impl: Fn | None = None
        self._cuda: Fn | None = None
        self._cpu: Fn | None = None

    # --- decorators ---------------------------------------------------------------------------
    def fake(self, fn: Fn) -> Fn:
        """The fake / meta implementation: output tensors of the right shape, dtype and device."""
        self._fake = fn
        return fn

    def impl(self, fn: Fn) -> Fn:
        """The implementation for both CUDA and (with ``HEXLAYOUT_EMULATE=1``) CPU tensors."""
        self._impl = fn
        return fn

    def cuda(self, fn: Fn) -> Fn:
        """The CUDA implementation (takes precedence over ``impl``)."""
        self._cuda = fn
        return fn

    def cpu(self, fn: Fn) -> Fn:
        """The CPU implementation (runs only with ``HEXLAYOUT_EMULATE=1``; precedence over ``impl``)."""
        self._cpu = fn
        return fn

    # --- calling --------------------------------------------------------------------------------
    @property
    def op(self) -> Any:
        """``torch.ops.<namespace>.<name>`` (the overload packet)."""
        import torch

        return getattr(getattr(torch.ops, self.namespace), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.op(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Op({self.qualname}{self.schema})"

    # --- the registered kernels -----------------------------------------------------------------
    def _run_cuda(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._cuda or self._impl
        if fn is None:
            raise NotImplementedError(f"{self.namespace}.{self.name}: no CUDA implementation registered")
        return fn(*args, **kwargs)

    def _run_cpu(self, *args: Any, **kwargs: Any) -> Any:
        if not emulation_enabled():
            raise EmulationDisabledError(f"{self.namespace}.{self.name}: CPU tensors need {EMULATE_ENV}=1 "
                                         "(emulator, small sizes) or a CUDA device")
        fn = self._cpu or self._impl
        if fn is None:
            raise NotImplementedError(f"{self.namespace}.{self.name}: no CPU (emulator) implementation "
                                      "registered")
        return fn(*args, **kwargs)

    def _run_fake(self, *args: Any, **kwargs: Any) -> Any:
        if self._fake is None:
            raise NotImplementedError(f"{self.namespace}.{self.name}: no fake implementation registered "
                                      "(needed for torch.compile and meta tensors)")
        return self._fake(*args, **kwargs)


_LIBS: dict[str, Any] = {}
_OPS: dict[str, Op] = {}


def _library(namespace: str) -> Any:
    import torch

    lib = _LIBS.get(namespace)
    if lib is None:
        lib = _LIBS[namespace] = torch.library.Library(namespace, "FRAGMENT")
    return lib


def _normalize(schema: str) -> str:
    return " ".join(schema.split())


def define_op(name: str, schema: str, *, fake: Fn | None = None, impl: Fn | None = None,
              cuda: Fn | None = None, cpu: Fn | None = None, namespace: str = NAMESPACE) -> Op:
    """Register ``torch.ops.<namespace>.<name>`` with ``schema`` (``"(Tensor a, Tensor b) -> Tensor"``;
    mutated arguments annotated as ``Tensor(a!) out``) and return its ``Op``.

    ``fake``: shapes / dtypes of the outputs (torch.compile, meta and fake tensors). ``impl``:
    for CUDA and CPU tensors; ``cuda`` / ``cpu``: per device (CPU kernels run only with
    ``HEXLAYOUT_EMULATE=1``). Each may also be given later with the ``Op``'s decorators.
    """
    import torch

    if not name.isidentifier():
        raise ValueError(f"op name {name!r} is not an identifier")
    schema = _normalize(schema)
    if not schema.startswith("("):
        raise ValueError(f"schema {schema!r} must start with the argument list, e.g. '(Tensor a) -> Tensor'")
    key = f"{namespace}::{name}"
    op = _OPS.get(key)
    if op is not None:
        if op.schema != schema:
            raise ValueError(f"{namespace}.{name} is already defined as {op.schema}, not {schema}")
    else:
        lib = _library(namespace)
        lib.define(name + schema)
        op = Op(name, schema, namespace, lib)
        lib.impl(name, op._run_cuda, "CUDA")
        lib.impl(name, op._run_cpu, "CPU")
        torch.library.register_fake(key, op._run_fake, lib=lib)
        _OPS[key] = op
    for fn, setter in ((fake, op.fake), (impl, op.impl), (cuda, op.cuda), (cpu, op.cpu)):
        if fn is not None:
            setter(fn)
    return op


# --- running a build on the arguments' device -------------------------------------------------------

_LAUNCHERS: dict[int, tuple[Any, Any]] = {}


def launcher_for(build: Any) -> Any:
    """The cached ``Launcher`` of ``build``."""
    hit = _LAUNCHERS.get(id(build))
    if hit is None or hit[0] is not build:
        from .launch import Launcher

        hit = (build, Launcher(build))
        _LAUNCHERS[id(build)] = hit
    return hit[1]


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import torch

    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            return x
    return None


def run_build(build: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``build`` with the kernel's arguments on their device: CUDA tensors through the
    cached ``Launcher`` (torch's current stream), CPU tensors through ``emulate``."""
    t = _first_tensor(args, kwargs)
    if t is not None and t.device.type == "cuda":
        return launcher_for(build)(*args, **kwargs)
    from .emulate import emulate

    return emulate(build, *args, **kwargs)
