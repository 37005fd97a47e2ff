"""``run_fused(spec, anchor_args, extra_inputs)``: build (once per structure) and run a fused
kernel: launched on CUDA tensors, run in the emulator on CPU tensors (``HEXLAYOUT_EMULATE=1``).

The call is planned by ``gemm_plan.plan_call`` (the aten semantics of the anchor, where each
extra input goes, what the host does to the outputs). The build is keyed on the structure
(anchor kernel, architecture, tile constants, the fused program's shape-free plan), never on
sizes: two calls that differ in sizes with the same tile constants share one build. Column
halves take the B operand with its columns re-laid out once per weight (cached). Anything
the mechanism cannot fuse raises ``FusionUnsupported`` with the reason, before any kernel
runs.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .aten import dtype_name, torch_dtype
from .attention import ATTENTION_ANCHORS, run_attention
from .gemm_plan import GemmCall, clear_plans, gemm_binder, output_frames, plan_call, planned
from .launch import LAUNCHERS, check_emulation, kernel_args, launch_args
from .mechanism import FusedProgram, TilePlan, fuse
from .reference import aten_op, reference
from .row_reduction import ROW_REDUCTIONS, clear_row_builds, run_row_reduction
from .spec import FusedSpec, FusionUnsupported

__all__ = ["run_fused", "reference", "fused_build", "gemm_fused_build", "clear_fused_builds", "plan_call",
           "anchor_consts"]

_LOCK = threading.Lock()
_PROGRAMS: dict[tuple, FusedProgram] = {}
_RELAID: dict[tuple, Any] = {}


def gemm_fused_build(arch: str, dtype: Any, b_layout: str, consts: dict[str, Any], plan: TilePlan,
                     name: str, *, anchor: str, prologue_ops: tuple[str, ...] = (),
                     epilogue_ops: tuple[str, ...] = (), staged: bool = False,
                     compile: bool = True, a_layout: str = "mk") -> tuple[Any, FusedProgram]:
    """The GEMM anchor (``dtype``, ``a_layout`` / ``b_layout``: the stored operands, tile
    ``consts``) for ``arch`` with ``plan`` fused, built (the fused program is memoized on the
    structure - no sizes in the key - and its build by the runtime). ``anchor`` /
    ``prologue_ops`` / ``epilogue_ops``: the aten names launch records show.
    Returns ``(build, fused program)``; the program's ``sources`` say what each parameter
    after ``a`` / ``b`` receives."""
    import hexlayout.lang as hl
    from hexlayout.runtime import build
    from hexlayout.runtime.launch_log import describe

    from .anchors import gemm_provider

    dname = dtype_name(dtype)
    key = (arch, dname, a_layout, b_layout, staged, tuple(sorted(consts.items())), plan, name, compile)
    with _LOCK:
        prog = _PROGRAMS.get(key)
    if prog is None:
        kernel = gemm_provider().kernel(arch, getattr(hl, dname), b_layout, staged=staged,
                                        **({} if a_layout == "mk" else {"a_layout": a_layout}))
        tk = kernel.trace(**consts)
        prog = fuse(tk, plan, f"{re.sub(r'[^0-9a-zA-Z_]', '_', name)[:80]}__{tk.name}")
        with _LOCK:
            _PROGRAMS[key] = prog
    # the runtime memoizes the build of this program object (and its disk cache backs that)
    bld = build(prog.kernel, arch, compile=compile)
    describe(bld, anchor=anchor, prologue=prologue_ops, epilogue=epilogue_ops)
    return bld, prog


def anchor_consts(call: GemmCall) -> dict[str, Any]:
    """The GEMM anchor's tile constants for a planned call: the epilogue staged in column
    windows unless it needs the whole tile (the column halves of a gated epilogue pair
    columns ``j`` and ``j + N/2``; outputs permuted into heads store whole tiles)."""
    from .anchors import gemm_provider

    windows = not (call.plan.halves or call.plan.heads)
    return gemm_provider().consts(call.arch, call.m, call.n, call.k, staged=call.staged, windows=windows)


def fused_build(spec: FusedSpec, call: GemmCall, consts: dict[str, Any],
                compile: bool) -> tuple[Any, FusedProgram]:
    """The build of ``call``'s fused program (memoized on its structure)."""
    return gemm_fused_build(call.arch, call.dtype, call.b_layout, consts, call.plan, spec.display_name(),
                            anchor=spec.anchor, prologue_ops=tuple(spec.prologue_ops()),
                            epilogue_ops=tuple(spec.epilogue_ops()), staged=call.staged, compile=compile)


def clear_fused_builds() -> None:
    """Forget the memoized fused builds, launchers and re-laid-out weights."""
    with _LOCK:
        _PROGRAMS.clear()
        LAUNCHERS.clear()
        _RELAID.clear()
        _FAST.clear()
        clear_plans()
    clear_row_builds()


def _halves_relaid(b: Any, b_layout: str, bn: int) -> Any:
    """``b`` with its N columns ordered in tiles of ``bn``: the first ``bn/2`` of tile ``t``
    are columns ``t*bn/2 ...`` of the first half, the last ``bn/2`` the same of the second
    (``N/2`` is a multiple of ``bn/2``; cached per tensor - the same object owning the
    storage, the same view of it - and version)."""
    import torch

    # the cache holds the tensor that owns the storage weakly and checks it is the same object
    # (a freed weight's address is reused by the next allocation) at the same version
    owner = b if b._base is None else b._base
    key = (b.data_ptr(), tuple(b.shape), tuple(b.stride()), b.dtype, b_layout, bn, b.device)
    with _LOCK:
        hit = _RELAID.get(key)
    if hit is not None and hit[0]() is owner and hit[1] == owner._version:
        return hit[2]
    hb = bn // 2
    if b_layout == "nk":                       # N x K: rows are columns of B
        n, k = b.shape
        tiles = (n // 2) // hb
        out = torch.stack([b[: n // 2].reshape(tiles, hb, k), b[n // 2:].reshape(tiles, hb, k)], 1)
        out = out.reshape(n, k)
    else:                                      # K x N
        k, n = b.shape
        tiles = (n // 2) // hb
        out = torch.stack([b[:, : n // 2].reshape(k, tiles, hb), b[:, n // 2:].reshape(k, tiles, hb)], 2)
        out = out.reshape(k, n)
    out = out.contiguous()
    with _LOCK:
        if len(_RELAID) > 64:
            _RELAID.clear()
        _RELAID[key] = (weakref.ref(owner), owner._version, out)
    return out


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
    if spec.anchor in ROW_REDUCTIONS:
        outs, prep = run_row_reduction(spec, list(anchor_args), list(extra_inputs))
        if prep.pop("cuda_bound", None) is not None:
            prep["launcher"] = LAUNCHERS[id(prep["bld"])]
            prep["template"] = bound = prep.pop("bound")
            prep["go"] = prep["launcher"].prepared(bound)
        prep.pop("bound", None)
        _remember(key, _Prepared(spec, **prep))
        return outs
    if spec.anchor in ATTENTION_ANCHORS:
        return run_attention(spec, list(anchor_args), list(extra_inputs))
    return _run_gemm(spec, key, list(anchor_args), list(extra_inputs))


def _run_gemm(spec: FusedSpec, key: tuple, anchor_args: list[Any], extra_inputs: list[Any]) -> list[Any]:
    """The first call of a GEMM-anchored spec for these shapes: plan, build, launch, and
    remember how to repeat it."""
    import torch

    from hexlayout.runtime.alloc import fresh

    call, recipe = planned(spec, anchor_args, extra_inputs)
    first = next(x for x in [*anchor_args, *extra_inputs]
                 if isinstance(x, torch.Tensor) and x.device.type != "meta")
    device, cuda = first.device, first.is_cuda
    if not cuda:
        check_emulation(spec)
    consts = anchor_consts(call)
    b = call.b
    bn = 0
    if call.plan.halves:
        # each column tile holds BN/2 columns of each half: N/2 must be whole half tiles
        bn = consts["BN"]
        while bn > 16 and (call.n // 2) % (bn // 2):
            bn //= 2
        if (call.n // 2) % (bn // 2):
            raise FusionUnsupported(f"{spec.display_name()}: N/2 = {call.n // 2} is not a multiple of a "
                                    "half column tile (8)")
        consts = dict(consts, BN=bn)
        b = _halves_relaid(b, call.b_layout, bn)
    bld, prog = fused_build(spec, call, consts, compile=cuda)
    heads = call.plan.heads or (None,) * len(call.plan.outputs)
    frames = output_frames(call)
    out_specs = [(tuple(call.out_shapes[k]) if heads[k] else ((call.batch,) if call.batch else ()) + shape,
                  torch_dtype(dt)) for k, (dt, shape) in enumerate(zip(call.plan.out_dtypes, frames))]
    outs = [fresh(shape, dt, device) for shape, dt in out_specs]
    finish = _gemm_finish(call, prog)
    if call.batch:
        for i in range(call.batch):
            _launch(bld, prog, call, call.a[i], b[i], [o[i] for o in outs], cuda)
        return finish(outs)
    bound = _launch(bld, prog, call, call.a, b, outs, cuda)
    bind_host = gemm_binder(call, recipe, extra_inputs)
    b_layout = call.b_layout

    def bind(args: list[Any], extra: list[Any]) -> tuple[dict[str, Any], list[Any]]:
        a_, b_, inputs = bind_host(args, extra)
        if bn:
            b_ = _halves_relaid(b_, b_layout, bn)
        return {"a": a_, "b": b_}, inputs

    prep = _Prepared(spec, bld, prog, cuda, device, bind, out_specs, finish)
    if cuda and bound is not None:
        prep.launcher, prep.template = LAUNCHERS[id(bld)], bound
        prep.go = prep.launcher.prepared(bound)
    _remember(key, prep)
    return finish(outs)


def _gemm_finish(call: GemmCall, prog: FusedProgram) -> Callable[[list[Any]], list[Any]]:
    """The host's part after the kernel: the leading dims of a linear and the outputs'
    trailing views, as eager's."""
    lead = call.lead
    chains = [[(aten_op(node.op), [x[1] for x in node.args[1:]], dict(node.kwargs)) for node in chain]
              for chain in call.out_views]
    shapes = [tuple(s) for s in call.out_shapes]
    heads = call.plan.heads or (None,) * len(shapes)

    def finish(outs: list[Any]) -> list[Any]:
        results = []
        for o, chain, shape, hd in zip(outs, chains, shapes, heads):
            if lead and hd is None:     # (an output stored into heads has eager's shape already)
                o = o.reshape(*lead, o.shape[-1])
            for fn, args, kwargs in chain:     # the outputs' trailing views, as eager's
                o = fn(o, *args, **kwargs)
            if tuple(o.shape) != shape:        # pragma: no cover - a planning bug, not a user error
                raise RuntimeError(f"hexlayout fused kernel {prog.kernel.name}: output of shape "
                                   f"{tuple(o.shape)}, torch gives {shape}")
            results.append(o)
        return results

    return finish


def _launch(bld: Any, prog: FusedProgram, call: GemmCall, a: Any, b: Any, outs: list[Any],
            cuda: bool) -> Any:
    """One launch (or emulation) of the fused GEMM build (the bound arguments on CUDA)."""
    return launch_args(bld, prog, {"a": a, "b": b}, call.inputs, outs, cuda)


