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

Arguments are checked in one place for every path: ``check=`` (or ``@op.check``) is called
with the op's arguments before the fake implementation (meta / fake tensors, torch.compile)
and before the CUDA or CPU implementation, so a bad argument gets the same error eagerly
and while tracing (raise ``hexlayout.runtime.args.ArgumentError`` / ``ArgumentTypeError``
naming the argument). Calling the ``Op`` object (``op(a, b)``) also checks each argument's
kind against the schema first (a string for a ``Tensor`` or a ``float`` is an
``ArgumentTypeError`` naming it); ``torch.ops.hexlayout.<name>`` leaves that to torch's own
schema binding (a ``RuntimeError`` naming the argument).

A cached-call path: ``fast=`` (or ``@op.fast``) is tried first by the CPU (emulation on) and
CUDA kernels and by the Autograd kernel when no grad is needed: it returns the result of a
call whose arguments the check has accepted before (the check's verdict memoized by the op),
or ``None`` for the usual check-then-implementation path; it never raises an argument error.

Autograd: ``backward=`` and ``setup_context=`` register a backward with
``torch.library.register_autograd``. An op without one refuses, eagerly and while tracing,
inputs that require grad when grad mode is on (``ArgumentError`` naming the argument:
call it under ``torch.no_grad()`` or pass ``.detach()``-ed tensors), so a backward never
silently leaves gradients ``None``.

Defining an op again with the same schema returns the existing ``Op`` and replaces the
implementations given (the registered torch kernels call through the ``Op``); a different
schema for a defined name is an error. ``defined_ops()`` lists every ``Op`` defined here.

``run_build(build, *args, **kwargs)`` runs a ``Build`` on the arguments' device: a cached
``Launcher`` for CUDA tensors, ``emulate`` for CPU tensors.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

from hexlayout.errors import HexlayoutError

from .args import ArgumentError, ArgumentTypeError
from .capture import prebuilding
from .emulation import EMULATE_ENV, emulation_enabled, emulation_mode

__all__ = ["define_op", "defined_ops", "Op", "run_build", "launcher_for", "emulation_enabled",
           "EmulationDisabledError", "EMULATE_ENV", "NAMESPACE", "emulation_mode"]

#: The environment variable that enables the CPU (emulator) implementations.
#: The torch.library namespace of hexlayout ops.
NAMESPACE = "hexlayout"

Fn = Callable[..., Any]


class EmulationDisabledError(HexlayoutError, RuntimeError):
    """A hexlayout op got CPU tensors while ``HEXLAYOUT_EMULATE`` is not ``1``."""


def _keeps(attr: str, doc: str) -> Callable[[Op, Fn], Fn]:
    """A decorator method of ``Op``: it keeps the function it decorates as ``op.<attr>`` and
    returns it unchanged; ``doc`` says what the function is."""

    def keep(self: Op, fn: Fn) -> Fn:
        setattr(self, attr, fn)
        return fn

    keep.__name__, keep.__doc__ = attr.lstrip("_"), doc
    return keep


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
        self.label = f"{namespace}.{name}"
        self._lib = lib
        self._fake: Fn | None = None
        self._impl: Fn | None = None
        self._cuda: Fn | None = None
        self._cpu: Fn | None = None
        self._check: Fn | None = None
        self._fast: Fn | None = None
        self._backward: Fn | None = None
        self._setup_context: Fn | None = None
        self._autograd_registered = False
        self._torch_autograd: Fn | None = None
        self._args: list[tuple[str, str, bool]] | None = None     # (name, type, has default)
        self.module = ""          # the module of the first implementation given (who defined the op)

    # --- decorators ---------------------------------------------------------------------------
    fake = _keeps("_fake", "The fake / meta implementation: output tensors of the right shape, dtype "
                  "and device.")
    impl = _keeps("_impl", "The implementation for both CUDA and (with ``HEXLAYOUT_EMULATE=1``) CPU tensors.")
    cuda = _keeps("_cuda", "The CUDA implementation (takes precedence over ``impl``).")
    cpu = _keeps("_cpu", "The CPU implementation (runs only with ``HEXLAYOUT_EMULATE=1``; precedence over "
                 "``impl``).")
    check = _keeps("_check", "The argument check run before every implementation (fake, CUDA, CPU): raises "
                   "a hexlayout error naming the argument, or returns.")
    fast = _keeps("_fast", """The cached-call path of the CUDA and CPU kernels: ``fn(*args, **kwargs)``
        returns the op's result for a call it knows (arguments the check has accepted before, a
        kernel ready), or ``None`` to take the usual path (check, then implementation). It must
        return exactly what check + implementation would, and raise nothing the check would; it
        runs only where the check could not fail differently: before the CPU kernel's emulation
        check only when emulation is on, and for an op without a backward only when no input
        requires grad (or grad mode is off).""")

    def autograd(self, backward: Fn, setup_context: Fn | None = None) -> None:
        """Register the backward (``torch.library.register_autograd``): ``setup_context(ctx,
        inputs, output)`` saves what ``backward(ctx, *grads)`` needs; ``backward`` returns
        one gradient (or ``None``) per input."""
        import torch

        self._backward, self._setup_context = backward, setup_context
        if not self._autograd_registered:
            self._torch_autograd = _torch_autograd_kernel(self.op.default, self._run_backward,
                                                          self._run_setup_context)
            if self._torch_autograd is None:
                torch.library.register_autograd(self.qualname, self._run_backward,
                                                setup_context=self._run_setup_context, lib=self._lib)
            else:
                self._lib.impl(self.name, self._run_autograd, "Autograd", with_keyset=True)
            self._autograd_registered = True

    # --- calling --------------------------------------------------------------------------------
    @property
    def op(self) -> Any:
        """``torch.ops.<namespace>.<name>`` (the overload packet)."""
        import torch

        return getattr(getattr(torch.ops, self.namespace), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``torch.ops.<namespace>.<name>(*args, **kwargs)`` after checking each argument's
        kind against the schema (``ArgumentTypeError`` naming the argument)."""
        self.check_kinds(args, kwargs)
        return self.op(*args, **kwargs)

    def arguments(self) -> list[tuple[str, str, bool]]:
        """``(name, type, has_default)`` of each schema argument (types as torch prints them:
        ``Tensor``, ``Optional[Tensor]``, ``str``, ``Optional[float]``, ...; as declared, so a
        ``ScalarType`` is ``ScalarType``, not the ``int`` torch stores it as)."""
        if self._args is None:
            schema = self.op.default._schema
            self._args = [(a.name, str(getattr(a, "real_type", a.type)), a.has_default_value())
                          for a in schema.arguments]
        return self._args

    def check_kinds(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Bind ``args`` / ``kwargs`` to the schema and check each value's kind."""
        spec = self.arguments()
        names = [n for n, _, _ in spec]
        if len(args) > len(spec):
            raise ArgumentTypeError(self.label, None, f"takes {len(spec)} arguments ({', '.join(names)}), "
                                    f"got {len(args)} positional")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise ArgumentTypeError(self.label, k, f"no such argument; arguments: {', '.join(names)}")
            if k in given:
                raise ArgumentTypeError(self.label, k, "given twice (positionally and by name)")
            given[k] = v
        for name, typ, has_default in spec:
            if name not in given:
                if not has_default:
                    raise ArgumentTypeError(self.label, name, "missing")
                continue
            _check_kind(self.label, name, typ, given[name])

    def __repr__(self) -> str:
        return f"Op({self.qualname}{self.schema})"

    def _named(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
        names = [n for n, _, _ in self.arguments()]
        return list(zip(names, args)) + list(kwargs.items())

    def _prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """What runs before every implementation: the op's check, then (for an op without a
        backward) the refusal of inputs that require grad."""
        if self._check is not None:
            self._check(*args, **kwargs)
        if self._backward is None:
            import torch

            if torch.is_grad_enabled():
                for name, v in self._named(args, kwargs):
                    if isinstance(v, torch.Tensor) and v.requires_grad:
                        raise ArgumentError(self.label, name, f"requires grad, but {self.label} has no "
                                            "backward; call it under torch.no_grad() or pass "
                                            f"{name}.detach()")

    # --- the registered kernels -----------------------------------------------------------------
    def _fast_allowed(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether ``fast`` may run: there is one, and the refusal of inputs that require grad
        (ops without a backward) cannot fire."""
        if self._fast is None:
            return False
        if self._backward is not None:
            return True
        import torch

        return not (torch.is_grad_enabled() and torch._C._any_requires_grad(*args, **kwargs))

    def _fast_or(self, try_fast: bool, checked: Fn, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``fast``'s result when ``try_fast`` and it knows the call, else ``checked(args, kwargs)``
        (the check, then the implementation)."""
        if try_fast:
            out = self._fast(*args, **kwargs)
            if out is not None:
                return out
        return checked(args, kwargs)

    def _run_cuda(self, *args: Any, **kwargs: Any) -> Any:
        return self._fast_or(self._fast_allowed(args, kwargs), self._cuda_checked, args, kwargs)

    def _cuda_checked(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._prepare(args, kwargs)
        fn = self._cuda or self._impl
        if fn is None:
            raise NotImplementedError(f"{self.namespace}.{self.name}: no CUDA implementation registered")
        return fn(*args, **kwargs)

    def _run_cpu(self, *args: Any, **kwargs: Any) -> Any:
        try_fast = self._fast is not None and emulation_enabled() and self._fast_allowed(args, kwargs)
        return self._fast_or(try_fast, self._cpu_checked, args, kwargs)

    def _cpu_checked(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._prepare(args, kwargs)
        if not emulation_enabled():
            raise EmulationDisabledError(f"{self.namespace}.{self.name}: CPU tensors need {EMULATE_ENV}=1 "
                                         "(emulator, small sizes) or a CUDA device")
        fn = self._cpu or self._impl
        if fn is None:
            raise NotImplementedError(f"{self.namespace}.{self.name}: no CPU (emulator) implementation "
                                      "registered")
        return fn(*args, **kwargs)

    def _run_fake(self, *args: Any, **kwargs: Any) -> Any:
        self._prepare(args, kwargs)
        if self._fake is None:
            raise NotImplementedError(f"{self.namespace}.{self.name}: no fake implementation registered "
                                      "(needed for torch.compile and meta tensors)")
        return self._fake(*args, **kwargs)

    def _run_autograd(self, keyset: Any, *args: Any, **kwargs: Any) -> Any:
        """The op's Autograd kernel: torch's ``register_autograd`` kernel (``autograd.Function``
        with the registered backward) when grad mode is on and an input requires grad; else,
        for plain CPU / CUDA tensors (nothing but the backend below autograd), the CPU / CUDA
        kernel's work done here instead of redispatched (the same functions the dispatcher
        would reach, without a second trip through it; ``fast`` first, the refusal of inputs
        that require grad being moot); anything else (fake, functionalized, batched tensors,
        ...) redispatches as torch's kernel does. Which of these a dispatch key set is, is
        worked out once per key set (``_BELOW``)."""
        torch_c = _KEYS[3]
        if not (torch_c.is_grad_enabled() and torch_c._any_requires_grad(*args, **kwargs)):
            below = _BELOW.get(keyset.raw_repr())
            if below is None:
                below = _below_autograd(keyset)
            if below == _CUDA:
                return self._fast_or(self._fast is not None, self._cuda_checked, args, kwargs)
            if below == _CPU:
                return self._fast_or(self._fast is not None and emulation_enabled(), self._cpu_checked, args,
                                     kwargs)
        return self._torch_autograd(keyset, *args, **kwargs)

    def _run_setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        if self._setup_context is not None:
            self._setup_context(ctx, inputs, output)

    def _run_backward(self, ctx: Any, *grads: Any) -> Any:
        assert self._backward is not None
        return self._backward(ctx, *grads)


_KEYS: tuple[Any, ...] = ()          # (ADInplaceOrView, CUDA, CPU dispatch keys, torch._C)
_OTHER, _CUDA, _CPU = 0, 1, 2
#: A dispatch key set's ``raw_repr()`` -> what lies below autograd for the Autograd kernel:
#: ``_CUDA`` / ``_CPU`` (the backend alone, besides ADInplaceOrView) or ``_OTHER``.
_BELOW: dict[int, int] = {}


def _below_autograd(keyset: Any) -> int:
    """``_BELOW``'s entry for ``keyset``, worked out and stored."""
    torch_c = _KEYS[3]
    top = (keyset & torch_c._after_autograd_keyset).remove(_KEYS[0]).highestPriorityTypeId()
    below = _CUDA if top == _KEYS[1] else _CPU if top == _KEYS[2] else _OTHER
    if len(_BELOW) < 4096:
        _BELOW[keyset.raw_repr()] = below
    return below


def _torch_autograd_kernel(op: Any, backward: Fn, setup_context: Fn) -> Fn | None:
    """The Autograd kernel ``torch.library.register_autograd`` registers for ``op`` (made by
    torch's ``make_autograd_impl``), or ``None`` where that is not available or the schema is
    not one it accepts (``register_autograd`` then registers, or refuses, as usual)."""
    global _KEYS
    import torch

    try:
        from torch._library import utils
        from torch._library.autograd import Info, make_autograd_impl

        if utils.is_out(op) or not utils.is_functional_schema(op._schema) or \
                utils.has_kwarg_only_tensors(op._schema):
            return None
        keys = torch._C.DispatchKey
        torch._C.DispatchKeySet.raw_repr  # noqa: B018 - the key sets' identity (_BELOW)
        _KEYS = (keys.ADInplaceOrView, keys.CUDA, keys.CPU, torch._C)
        return make_autograd_impl(op, Info(backward, setup_context))
    except (ImportError, AttributeError):  # pragma: no cover - depends on the torch version
        return None


def _check_kind(op: str, name: str, typ: str, v: Any) -> None:
    """``v`` fits schema type ``typ`` (checked: Tensor, str, float, int, bool, ScalarType (a
    ``torch.dtype``), int lists and their Optional forms; other types are left to torch), else
    ``ArgumentTypeError`` naming ``name``."""
    import torch

    if typ.startswith("Optional[") and typ.endswith("]"):
        if v is None:
            return
        typ = typ[len("Optional["):-1]
    if typ == "Tensor":
        ok = isinstance(v, torch.Tensor)
    elif typ == "str":
        ok = isinstance(v, str)
    elif typ == "float":
        ok = isinstance(v, numbers.Real) and not isinstance(v, bool)
    elif typ in ("int", "SymInt"):
        ok = isinstance(v, numbers.Integral) and not isinstance(v, bool)
    elif typ == "bool":
        ok = isinstance(v, bool)
    elif typ == "ScalarType":
        ok = isinstance(v, torch.dtype)
    elif typ == "List[int]":
        ok = isinstance(v, (list, tuple)) and all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                                                   for x in v)
    else:
        return
    if not ok:
        got = f"a tensor of shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else \
            f"{type(v).__name__} {v!r}"[:80]
        raise ArgumentTypeError(op, name, f"expected {typ}, got {got}")


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


def defined_ops() -> list[Op]:
    """Every ``Op`` defined with ``define_op`` in this process."""
    return list(_OPS.values())


def define_op(name: str, schema: str, *, fake: Fn | None = None, impl: Fn | None = None,
              cuda: Fn | None = None, cpu: Fn | None = None, check: Fn | None = None,
              fast: Fn | None = None, backward: Fn | None = None, setup_context: Fn | None = None,
              namespace: str = NAMESPACE) -> Op:
    """Register ``torch.ops.<namespace>.<name>`` with ``schema`` (``"(Tensor a, Tensor b) -> Tensor"``;
    mutated arguments annotated as ``Tensor(a!) out``) and return its ``Op``.

    ``fake``: shapes / dtypes of the outputs (torch.compile, meta and fake tensors). ``impl``:
    for CUDA and CPU tensors; ``cuda`` / ``cpu``: per device (CPU kernels run only with
    ``HEXLAYOUT_EMULATE=1``). ``check``: the argument check run before each of them.
    ``fast``: an optional cached-call path tried first (see ``Op.fast``).
    ``backward`` / ``setup_context``: the autograd formula (without one, inputs that require
    grad are refused). Each may also be given later with the ``Op``'s decorators.
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
    for fn, setter in ((fake, op.fake), (impl, op.impl), (cuda, op.cuda), (cpu, op.cpu), (check, op.check),
                      (fast, op.fast)):
        if fn is not None:
            setter(fn)
            op.module = op.module or getattr(fn, "__module__", "") or ""
    if backward is not None:
        op.autograd(backward, setup_context)
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
    cached ``Launcher`` (torch's current stream), CPU tensors through ``emulate``. Under
    ``capture.prebuild()``: CUDA builds loaded but not launched, CPU ones not emulated."""
    t = _first_tensor(args, kwargs)
    if t is not None and t.device.type == "cuda":
        return launcher_for(build)(*args, **kwargs)
    if prebuilding():
        return None
    from .emulate import emulate

    return emulate(build, *args, **kwargs)
