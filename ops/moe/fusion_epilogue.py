"""The epilogue ``fused_moe`` takes: elementwise math of its output ``[T, H]`` with tensors of
that shape (or broadcast to it: a row ``[H]``, a column ``[T, 1]``, a number) - the residual
add after the experts, a scale, a cast - computed in the kernel that already writes the
output, the sum over the top-k slots (``moe_sum_kernel``: ``out[t] = sum_j y[t, j]`` in f32),
so it adds no launch. ``mechanism.fuse`` rewrites that kernel's store (the epilogue's ops on
its f32 sum, one store per output; extra inputs loaded at the output tile's origin); with
top-1 routing the sum kernel runs too (one slot per token), the epilogue in it.

``moe_sum_epilogue(spec, x, extra)`` plans it for one call and returns ``combine(y)`` for
``run_moe_pipeline`` (``y`` [T, k, H] the weighted down projections), which launches the fused
sum and returns the outputs in the ``T x H`` frame. One build per structure (the plan and k).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from hexlayout.fusion.aten import VIEWS, dtype_name, is_fusible, torch_dtype
from hexlayout.fusion.launch import launch_args
from hexlayout.fusion.mechanism import FusedProgram, TilePlan, fuse
from hexlayout.fusion.planning import arch_of, place
from hexlayout.fusion.spec import FusedSpec, FusionUnsupported, Node
from hexlayout.runtime.alloc import fresh

from .kernels_sm80 import moe_sum_kernel

__all__ = ["moe_sum_epilogue", "clear_moe_epilogues"]

_LOCK = threading.Lock()
_PROGRAMS: dict[tuple, FusedProgram] = {}
_RESHAPES = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"})
#: the sum kernel's tile (rows x columns of ``out``)
_ROWS, _BH = 16, 64


def moe_sum_epilogue(spec: FusedSpec, x: Any, extra: list, out_metas: list) -> Callable[[Any], list]:
    """``combine(y)`` computing ``spec``'s epilogue in the top-k sum of ``fused_moe(x, ...)``
    (``x`` [T, H] the activations; ``out_metas``: the outputs as eager makes them, on meta
    tensors); ``FusionUnsupported`` before anything runs when it does not fit."""
    import torch

    where = spec.display_name()
    t, h = int(x.shape[0]), int(x.shape[1])
    for j, nd in enumerate(spec.epilogue.nodes):
        if not is_fusible(nd.op):
            raise FusionUnsupported(f"{where}: epilogue node {j}: {nd.op} is not an op fusion knows")
        if nd.op in VIEWS and nd.op not in _RESHAPES:
            raise FusionUnsupported(f"{where}: epilogue node {j} ({nd.op}) permutes fused_moe's rows")
    outputs, out_dtypes = [], []
    for o, meta in zip(spec.epilogue.outputs, out_metas):
        while o[0] == "node" and spec.epilogue.nodes[o[1]].op in _RESHAPES:    # the host reshapes
            o = spec.epilogue.nodes[o[1]].args[0]
        if meta.numel() != t * h or meta.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise FusionUnsupported(f"{where}: an epilogue output of shape {tuple(meta.shape)} and "
                                    f"{meta.dtype} (fused_moe's epilogue writes {t} x {h} f16 / bf16 / f32 "
                                    "outputs)")
        outputs.append(o)
        out_dtypes.append(dtype_name(meta.dtype))
    used = {a[1] for nd in spec.epilogue.nodes for a in nd.args
            if isinstance(a, tuple) and a and a[0] == "input"}
    specs, host = [], []
    for i, v in enumerate(extra):
        if i not in used:
            s, hv = place(0.0, (t, h), where, i)
        else:
            s, hv = place(v, (t, h), where, i)
        specs.append(s)
        host.append(hv)
    plan = TilePlan(output_param="out", operands=(), prologues=(),
                    epilogue=tuple(Node(nd.op, nd.args[:1]) if nd.op in VIEWS else nd
                                   for nd in spec.epilogue.nodes),
                    outputs=tuple(outputs), out_dtypes=tuple(out_dtypes), inputs=tuple(specs))
    dev = x.device
    cuda = bool(x.is_cuda)
    arch = arch_of(dev, cuda)

    def combine(y: Any) -> list:
        import hexlayout.lang as hl
        from hexlayout.runtime import build
        from hexlayout.runtime.launch_log import describe

        k = int(y.shape[1])
        dt = getattr(hl, dtype_name(y.dtype))
        key = (dtype_name(y.dtype), k, plan, where)
        with _LOCK:
            prog = _PROGRAMS.get(key)
        if prog is None:
            tk = moe_sum_kernel(dt).trace(ROWS=_ROWS, BH=_BH, TOPK=k)
            prog = fuse(tk, plan, f"{re.sub(r'[^0-9a-zA-Z_]', '_', where)[:80]}__{tk.name}")
            with _LOCK:
                _PROGRAMS[key] = prog
        bld = build(prog.kernel, arch, compile=cuda)
        describe(bld, anchor=spec.anchor, prologue=tuple(spec.prologue_ops()),
                 epilogue=tuple(spec.epilogue_ops()))
        outs = [fresh((t, h), torch_dtype(d), dev) for d in out_dtypes]
        launch_args(bld, prog, {"y": y}, host, outs, cuda)
        return outs

    return combine


def clear_moe_epilogues() -> None:
    """Forget the memoized fused sum programs."""
    with _LOCK:
        _PROGRAMS.clear()
