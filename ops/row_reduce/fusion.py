"""Fused row reductions: ``run_row_reduction(spec, anchor_args, extra_inputs)`` for a spec
whose anchor is a reduction over the last dimension (``ROW_REDUCTIONS``; importing this module
registers the record ``ROW_REDUCTION`` with ``hexlayout.fusion.anchors``):

- ``aten.mean.dim`` / ``aten.sum.dim_IntList`` / ``aten.amax.default`` with keyword
  arguments ``dim`` (the last dimension: ``-1`` or ``rank - 1``) and ``keepdim`` (``True``
  when the epilogue reads the reduced value: eager broadcasts ``[..., 1]`` over the row);
  ``x`` (or the prologue's result) is seen as ``M x N`` rows (leading dims flattened);
  ``1 <= N <= MAX_ROW`` (one register tile of a power of two ``>= N`` columns holds whole
  rows, its tail masked; rows of lengths with one such tile share one build);
- the prologue computes ``x`` from the extra inputs in the row load (``x = xf ** 2`` of
  ``xf = x16.float()``); the epilogue runs on the rows with the reduced ``M x 1`` column
  broadcast (``xf * rsqrt(mean + eps) * w``); extra inputs broadcast against ``M x N``
  (full rows, a row ``[N]``, a column ``[M, 1]``, a scalar); every output is ``M x N`` or
  ``M x 1`` and is given back with eager's shape.

The anchor kernel (``kernels.row_reduce_anchor``) is traced alone and
``mechanism.fuse`` rewrites its load and its store (``TilePlan.row``); one build per
structure (no sizes in the key but the row tile ``BN``, a tile constant).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

from hexlayout.fusion.anchors import AnchorRecord, AnchorSpec, register_anchor
from hexlayout.fusion.aten import VIEWS, dtype_name, is_fusible, torch_dtype
from hexlayout.fusion.launch import check_emulation, launch_args
from hexlayout.fusion.mechanism import FusedProgram, InputSpec, TilePlan, fuse
from hexlayout.fusion.partition import rows, static_int
from hexlayout.fusion.planning import arch_of, bind_inputs, host_shapes, meta_eval, meta_tensors, place, sig
from hexlayout.fusion.reference import eval_nodes, reference
from hexlayout.fusion.spec import FusedSpec, FusionUnsupported, Node
from hexlayout.runtime.alloc import fresh

from .kernels import MAX_ROW, row_reduce_anchor, row_reduce_consts

__all__ = ["ROW_REDUCTIONS", "ROW_REDUCTION", "run_row_reduction", "row_fused_build", "clear_row_builds"]

#: Row-reduction anchors (over the last dimension; keyword arguments ``dim``, ``keepdim``), with
#: the reduction their anchor kernel computes.
ROW_REDUCTIONS = {"aten.mean.dim": "mean", "aten.sum.dim_IntList": "sum", "aten.amax.default": "max"}


_RESHAPES = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"})
_LOCK = threading.Lock()
_PROGRAMS: dict[tuple, FusedProgram] = {}


@dataclass
class _RowCall:
    arch: str
    dtype: Any                   # torch dtype of the reduced operand
    fn: str
    m: int
    n: int
    plan: TilePlan
    x: Any                       # M x N, None when a prologue computes it
    inputs: list                 # host values of the plan's inputs
    out_frames: list             # per output (rows, cols) the kernel stores
    out_shapes: list             # per output eager's shape
    used: frozenset = frozenset()  # the extra inputs the kernel reads


def _plan(spec: FusedSpec, anchor_args: list, extra: list) -> _RowCall:
    import torch

    where = spec.display_name()
    fn = ROW_REDUCTIONS.get(spec.anchor)
    if fn is None:
        raise FusionUnsupported(f"{where}: {spec.anchor} is not a row-reduction anchor")
    kw = dict(spec.anchor_kwargs)
    dims, keepdim = kw.pop("dim", None), bool(kw.pop("keepdim", False))
    if kw.get("dtype") is None:
        kw.pop("dtype", None)
    if kw:
        raise FusionUnsupported(f"{where}: {spec.anchor} with {kw} is not fused")
    if any(p.operand != 0 for p in spec.prologues):
        raise FusionUnsupported(f"{where}: only the reduced operand takes a prologue")
    if spec.prologues:
        p = spec.prologues[0]
        try:
            x = meta_eval(("row prologue", spec, sig(extra)),
                           lambda: eval_nodes(p.nodes, None, meta_tensors(extra))[p.output])
        except Exception as e:  # noqa: BLE001 - any failure of the prologue's ops on meta tensors
            raise FusionUnsupported(f"{where}: the prologue does not evaluate: {e}") from None
    else:
        x = anchor_args[0] if anchor_args else None
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise FusionUnsupported(f"{where}: the reduced operand is not a tensor of rank >= 1")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise FusionUnsupported(f"{where}: a reduction of {x.dtype} (fused reductions take f16, bf16, f32)")
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(dims) != 1 or dims[0] is None or dims[0] % x.dim() != x.dim() - 1:
        raise FusionUnsupported(f"{where}: {spec.anchor} over dims {list(dims)} of a rank-{x.dim()} tensor "
                                "(fused reductions are over the last dimension)")
    if spec.epilogue.nodes and not keepdim:
        raise FusionUnsupported(f"{where}: an epilogue of a reduction without keepdim is not fused")
    n = int(x.shape[-1])
    m = x.numel() // n if n else 0
    if not 1 <= n <= MAX_ROW or m == 0:
        raise FusionUnsupported(f"{where}: rows of {n} (fused row reductions take rows of 1 to {MAX_ROW}, "
                                "at least one row)")
    for j, nd in enumerate(spec.epilogue.nodes):
        if not is_fusible(nd.op):
            raise FusionUnsupported(f"{where}: epilogue node {j}: {nd.op} is not an op fusion knows")
    for p in spec.prologues:
        for j, nd in enumerate(p.nodes):
            if not is_fusible(nd.op):
                raise FusionUnsupported(f"{where}: prologue node {j}: {nd.op} is not an op fusion knows")
    first = next((t for t in [*anchor_args, *extra] if isinstance(t, torch.Tensor)), None)
    others = {str(t.device) for t in [*anchor_args, *extra] if isinstance(t, torch.Tensor)}
    if first is None or len(others) != 1 or first.device.type not in ("cuda", "cpu"):
        raise FusionUnsupported(f"{where}: tensors on {sorted(others)} (one device: CUDA, or CPU with "
                                "HEXLAYOUT_EMULATE=1)")
    used = {a[1] for nodes in [spec.epilogue.nodes, *(p.nodes for p in spec.prologues)] for nd in nodes
            for a in nd.args if isinstance(a, tuple) and a and a[0] == "input"}
    specs, host = [], []
    for i, t in enumerate(extra):
        if i not in used:
            specs.append(InputSpec("scalar"))
            host.append(0.0)
            continue
        s, h = place(t, (m, n), where, i)
        specs.append(s)
        host.append(h)
    x2 = None if spec.prologues else anchor_args[0].reshape(m, n)
    try:
        metas = meta_eval(("row outputs", spec, sig(anchor_args), sig(extra)),
                           lambda: reference(spec, meta_tensors(anchor_args), meta_tensors(extra)))
    except Exception as e:  # noqa: BLE001 - the spec's ops on meta tensors fail: not fusible
        raise FusionUnsupported(f"{where}: the spec does not evaluate with torch's ops: {e}") from None
    out_dtypes, frames = [], []
    for t in metas:
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise FusionUnsupported(f"{where}: an output of dtype {t.dtype} (fused outputs are f16, bf16 "
                                    "or f32)")
        last = int(t.shape[-1]) if t.dim() else 1
        if t.numel() not in (m, m * n) or (t.numel() == m * n and last != n) or \
                (t.numel() == m and m != m * n and t.dim() and last not in (1, m)):
            raise FusionUnsupported(f"{where}: an output of shape {tuple(t.shape)} is neither the rows "
                                    f"({m} x {n}) nor one value per row")
        out_dtypes.append(dtype_name(t.dtype))
        frames.append((m, n) if t.numel() == m * n and n != 1 else (m, 1))
    outputs = []
    for o in spec.epilogue.outputs:
        # trailing reshapes keep the row-major order: the host gives the stored rows eager's shape
        while o[0] == "node" and spec.epilogue.nodes[o[1]].op in _RESHAPES:
            o = spec.epilogue.nodes[o[1]].args[0]
        if o[0] == "node" and spec.epilogue.nodes[o[1]].op in VIEWS:
            view = spec.epilogue.nodes[o[1]].op
            raise FusionUnsupported(f"{where}: an output that is a {view} view is not fused into a reduction")
        outputs.append(o)
    for j, nd in enumerate(spec.epilogue.nodes):
        if nd.op in VIEWS and nd.op not in _RESHAPES:
            raise FusionUnsupported(f"{where}: epilogue node {j} ({nd.op}) permutes the rows")
    plan = TilePlan(output_param="c", operands=((0, "x"),),
                    prologues=tuple((0, p.nodes, p.output) for p in spec.prologues),
                    epilogue=tuple(Node(nd.op, nd.args[:1]) if nd.op in VIEWS else nd
                                   for nd in spec.epilogue.nodes), outputs=tuple(outputs),
                    out_dtypes=tuple(out_dtypes), inputs=tuple(specs), row=True,
                    row_align=n & -n if n % 16 else 16)
    return _RowCall(arch_of(first.device, first.is_cuda), x.dtype, fn, m, n, plan, x2, host, frames,
                    [tuple(t.shape) for t in metas], frozenset(used))


def _build(call: _RowCall, spec: FusedSpec, compile: bool) -> tuple[Any, FusedProgram]:
    import hexlayout.lang as hl
    from hexlayout.runtime import build
    from hexlayout.runtime.launch_log import describe

    consts = row_reduce_consts(call.m, call.n)
    dname = dtype_name(call.dtype)
    name = spec.display_name()
    key = (dname, call.fn, tuple(sorted(consts.items())), call.plan, name)
    with _LOCK:
        prog = _PROGRAMS.get(key)
    if prog is None:
        align = min(16, call.plan.row_align * getattr(hl, dname).bits // 8)
        tk = row_reduce_anchor(getattr(hl, dname), call.fn, align).trace(**consts)
        prog = fuse(tk, call.plan, f"{re.sub(r'[^0-9a-zA-Z_]', '_', name)[:80]}__{tk.name}")
        with _LOCK:
            _PROGRAMS[key] = prog
    bld = build(prog.kernel, call.arch, compile=compile)
    describe(bld, anchor=spec.anchor, prologue=tuple(spec.prologue_ops()),
             epilogue=tuple(spec.epilogue_ops()))
    return bld, prog


def row_fused_build(spec: FusedSpec, anchor_args: list, extra_inputs: list, *, compile: bool = True) -> Any:
    """The build of ``spec`` (a row-reduction anchor) for these arguments, on their device's
    architecture (CPU: ``HEXLAYOUT_EMULATE_ARCH``), compiled unless ``compile=False``."""
    return _build(_plan(spec, list(anchor_args), list(extra_inputs)), spec, compile)[0]


def clear_row_builds() -> None:
    """Forget the memoized fused reduction programs."""
    with _LOCK:
        _PROGRAMS.clear()


def run_row_reduction(spec: FusedSpec, anchor_args: list, extra_inputs: list) -> tuple[list, dict[str, Any]]:
    """``spec`` (a row-reduction anchor) as one fused kernel: its outputs with eager's shapes
    and dtypes (raises ``FusionUnsupported`` before anything runs when it cannot fuse), and
    how to repeat the call for arguments of the same shapes (``run._Prepared``'s fields)."""
    import torch

    call = _plan(spec, list(anchor_args), list(extra_inputs))
    first = next(t for t in [*anchor_args, *extra_inputs] if isinstance(t, torch.Tensor))
    cuda = first.is_cuda
    if not cuda:
        check_emulation(spec)
    bld, prog = _build(call, spec, compile=cuda)
    out_specs = [(f, torch_dtype(dt)) for f, dt in zip(call.out_frames, call.plan.out_dtypes)]
    outs = [fresh(f, dt, first.device) for f, dt in out_specs]
    bound = launch_args(bld, prog, {"x": call.x}, call.inputs, outs, cuda)
    shapes = tuple(sh if i in call.used else None for i, sh in enumerate(host_shapes(call.inputs)))
    m, n, prologue = call.m, call.n, bool(spec.prologues)
    out_shapes = [tuple(s) for s in call.out_shapes]

    def bind(args: list, extra: list) -> tuple[dict[str, Any], list]:
        return {"x": None if prologue else args[0].reshape(m, n)}, bind_inputs(shapes, extra)

    def finish(outs: list) -> list:
        return [o.reshape(s) for o, s in zip(outs, out_shapes)]

    prep = {"bld": bld, "prog": prog, "cuda": cuda, "device": first.device, "bind": bind, "outs": out_specs,
            "finish": finish, "bound": bound}
    return finish(outs), prep


# --- the record ---------------------------------------------------------------------------------
def _admit(g: Any, n: Any) -> str | None:
    """Why reduction ``n`` is not an anchor (None when it is): over the last dimension of a
    tensor, rows of a static length up to ``MAX_ROW``, with ``keepdim``, no ``dtype``."""
    import torch

    given = g.named_args(n)
    x = given.get("self")
    rank = len(g.shape(x)) if hasattr(x, "op") and isinstance(g.value(x), torch.Tensor) else 0
    dims = given.get("dim")
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    if rank == 0 or len(dims) != 1 or not isinstance(dims[0], int) or dims[0] % rank != rank - 1:
        return (f"a reduction over dims {dims} of a rank-{rank} tensor (row reductions fuse over "
                "the last dimension)")
    cols = static_int(g.shape(x)[-1])
    if cols is None or not 1 <= cols <= MAX_ROW:
        return (f"a reduction of rows of {g.shape(x)[-1]} (row reductions fuse rows of a static "
                f"length from 1 to {MAX_ROW})")
    if not given.get("keepdim", False) or given.get("dtype") is not None:
        return "a row reduction without keepdim or with a dtype (fused with keepdim=True only)"
    return None


def _to_spec(g: Any, s: AnchorSpec) -> None:
    """The reduction over the last dimension with ``keepdim``; an input of rank > 2 is seen
    as its rows by the host."""
    s.kwargs = (("dim", (-1,)), ("keepdim", True))
    s.order = [0]
    x = g.named_args(g.anchor)["self"]
    if s.operands[0][0] == "ext" and len(g.shape(x)) > 2:
        s.operands[0] = ("ext", s.operands[0][1], s.operands[0][2] + ((rows, ()),))


def _softmax_decompositions() -> dict[Any, Any]:
    """``aten._softmax`` over the last dimension of rows of a static length up to ``MAX_ROW``
    (what the row-reduction anchors fuse) as torch's own decomposition (``amax``,
    ``exp(x - max)``, ``sum``, divide; f32 computation); any other softmax stays one op."""
    import torch
    from torch._decomp import decomposition_table

    aten = torch.ops.aten
    decomp = decomposition_table.get(aten._softmax.default)
    if decomp is None:                       # pragma: no cover - torch without the decomposition
        return {}

    def softmax(x: Any, dim: int, half_to_float: bool) -> Any:
        cols = x.shape[-1] if x.dim() else 0
        if x.dim() and dim % x.dim() == x.dim() - 1 and isinstance(cols, int) and 1 <= cols <= MAX_ROW:
            return decomp(x, dim, half_to_float)
        return NotImplemented

    return {aten._softmax.default: softmax}


ROW_REDUCTION = register_anchor(AnchorRecord(
    "row reduction", frozenset(ROW_REDUCTIONS), run=run_row_reduction, admit=_admit,
    operands=lambda g, n: n.args[:1], to_spec=_to_spec, decompositions=_softmax_decompositions,
    clear=clear_row_builds, rows=True))
