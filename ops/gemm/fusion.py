"""The GEMM anchors of post-scheduling fusion: the records this package registers with
``hexlayout.fusion.anchors`` (importing this module registers them) and how a fused GEMM
call is built and run.

- ``MATMUL``: the aten matmuls ``mm``, ``addmm``, ``bmm``, ``linear`` (``x @ w.t()`` (+ bias),
  ``nn.Linear`` decomposed to ``mm`` / ``addmm`` of a transposed weight, becomes the spec
  anchor ``aten.linear.default`` reading ``w`` (``N x K``) as it is); planned by
  ``fusion_plan.plan_call``;
- ``HEXLAYOUT_GEMM``: this package's own op ``hexlayout.gemm`` (``act(scale * a @ B + bias) +
  residual``), whose scale, bias, activation and residual become epilogue nodes of the spec
  anchor ``linear`` (``b_layout="nk"``) or ``mm`` (``"kn"``).

The build is keyed on the structure (anchor kernel, architecture, tile constants, the fused
program's shape-free plan), never on sizes. Column halves take the B operand with its columns
re-laid out once per weight (cached).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from hexlayout.fusion.anchors import AnchorRecord, AnchorSpec, register_anchor
from hexlayout.fusion.aten import torch_dtype
from hexlayout.fusion.launch import LAUNCHERS, check_emulation, launch_args
from hexlayout.fusion.mechanism import FusedProgram
from hexlayout.fusion.reference import aten_op
from hexlayout.fusion.spec import FusedSpec, FusionUnsupported, Node
from hexlayout.runtime.alloc import fresh

from .fused_build import clear_fused_programs, gemm_fused_build
from .fusion_horizontal import fuse_gated_pairs
from .fusion_layer_norm import decompose_layer_norms
from .fusion_plan import (
    NORM_MAX_K,
    NORM_REDUCTIONS,
    GemmCall,
    clear_plans,
    gemm_binder,
    norm_consts,
    norm_prologue,
    output_frames,
    planned,
    rope_head_dim,
)
from .fusion_rope import fuse_rope
from .fusion_unstack import unstack_interleaved
from .kernels import gemm_consts, leading_dims
from .op import _ACT_NODES

__all__ = ["MATMUL", "HEXLAYOUT_GEMM", "gemm_fused_build", "anchor_consts", "fused_build", "run_gemm",
           "clear_gemm_builds"]

_LOCK = threading.Lock()
_RELAID: dict[tuple, Any] = {}


def anchor_consts(call: GemmCall) -> dict[str, Any]:
    """The GEMM anchor's tile constants for a planned call: the epilogue staged in column
    windows unless it needs the whole tile (the column halves of a gated epilogue pair
    columns ``j`` and ``j + N/2``; outputs permuted into heads store whole tiles); an A
    prologue that reduces A's rows (a norm) gets tiles of whole rows (``norm_consts``); a
    prologue that gathers per-group / per-position inputs (``InputSpec.group`` / ``period``:
    grouped dequantization, int4 unpacking) gets ``BK <= 32`` (at 64 its gathered tiles spill
    on sm_80 and take twice the non-MMA instructions per MMA: 20 against 10); a RoPE epilogue
    gets a column tile of whole heads (``rope_head_dim``)."""
    hd = rope_head_dim(call.plan)
    windows = not (call.plan.halves or call.plan.heads or hd)
    consts = gemm_consts(call.arch, call.m, call.n, call.k, staged=call.staged, windows=windows)
    if norm_prologue(call.plan) and not call.plan.row_scale:
        consts = norm_consts(consts, call.k)
    elif any(s.group or s.period for s in call.plan.inputs) and consts["BK"] > 32:
        consts = dict(consts, BK=32)
        if consts["BN"] % 32:
            consts.pop("STAGE_EPILOGUE", None)
    if hd and consts["BN"] % hd:           # rope: a column tile of whole heads
        consts = dict(consts, BN=hd * -(-consts["BN"] // hd))
    return consts


def fused_build(spec: FusedSpec, call: GemmCall, consts: dict[str, Any], compile: bool,
                b: Any = None) -> tuple[Any, FusedProgram]:
    """The build of ``call``'s fused program (memoized on its structure) for its operands
    ``call.a`` and ``b`` (default ``call.b``; a re-laid-out B is dense): the anchor variant
    with a free leading stride for those that are not dense (``leading_dims``)."""
    ld = leading_dims(call.a, call.b if b is None else b)
    return gemm_fused_build(call.arch, call.dtype, call.b_layout, consts, call.plan, spec.display_name(),
                            anchor=spec.anchor, prologue_ops=tuple(spec.prologue_ops()),
                            epilogue_ops=tuple(spec.epilogue_ops()), staged=call.staged, compile=compile,
                            ld=ld)


def clear_gemm_builds() -> None:
    """Forget the memoized fused GEMM programs, plans and re-laid-out weights."""
    clear_fused_programs()
    with _LOCK:
        _RELAID.clear()
    clear_plans()


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


def _half_tile(spec: FusedSpec, call: GemmCall, consts: dict[str, Any]) -> int:
    """The column tile of a call with column halves: each tile holds ``BN/2`` columns of each
    half, so ``N/2`` must be whole half tiles."""
    bn = consts["BN"]
    while bn > 16 and (call.n // 2) % (bn // 2):
        bn //= 2
    if (call.n // 2) % (bn // 2):
        raise FusionUnsupported(f"{spec.display_name()}: N/2 = {call.n // 2} is not a multiple of a "
                                "half column tile (8)")
    return bn


def run_gemm(spec: FusedSpec, anchor_args: list[Any], extra_inputs: list[Any]) -> tuple[list, dict | None]:
    """The first call of a GEMM-anchored spec for these shapes: plan, build, launch; its
    outputs and how to repeat it (``run._Prepared``'s fields; None for ``bmm``)."""
    import torch

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
        bn = _half_tile(spec, call, consts)
        consts = dict(consts, BN=bn)
        b = _halves_relaid(b, call.b_layout, bn)
    bld, prog = fused_build(spec, call, consts, compile=cuda, b=b)
    heads = call.plan.heads or (None,) * len(call.plan.outputs)
    frames = output_frames(call)
    out_specs = [(tuple(call.out_shapes[k]) if heads[k] else ((call.batch,) if call.batch else ()) + shape,
                  torch_dtype(dt)) for k, (dt, shape) in enumerate(zip(call.plan.out_dtypes, frames))]
    outs = [fresh(shape, dt, device) for shape, dt in out_specs]
    finish = _gemm_finish(call, prog)
    if call.batch:
        for i in range(call.batch):
            _launch(bld, prog, call, call.a[i], b[i], [o[i] for o in outs], cuda)
        return finish(outs), None
    bound = _launch(bld, prog, call, call.a, b, outs, cuda)
    bind_host = gemm_binder(call, recipe, extra_inputs)
    b_layout = call.b_layout

    def bind(args: list[Any], extra: list[Any]) -> tuple[dict[str, Any], list[Any]]:
        a_, b_, inputs = bind_host(args, extra)
        if bn:
            b_ = _halves_relaid(b_, b_layout, bn)
        return {"a": a_, "b": b_}, inputs

    prep = {"bld": bld, "prog": prog, "cuda": cuda, "device": device, "bind": bind, "outs": out_specs,
            "finish": finish, "bound": bound}
    return finish(outs), prep


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


# --- the records ------------------------------------------------------------------------------
#: the matmuls' aten argument conventions: mm (a[M,K], b[K,N]); addmm (bias, a[M,K], b[K,N];
#: kwargs beta, alpha); linear (x[..., K], w[N,K], bias[N] or absent); bmm (a[B,M,K], b[B,K,N])
MATMULS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.linear.default", "aten.bmm.default"})
#: the matmuls whose B operand (argument index) may be a transposed weight: then ``linear``
_B_OPERAND = {"aten.addmm.default": 2, "aten.mm.default": 1}


def _matmul_spec(g: Any, s: AnchorSpec) -> None:
    """An aten matmul as the spec anchor: itself, or ``linear`` reading ``w`` as it is when its
    B operand is ``w.t()`` (``nn.Linear``: ``x @ w.t()`` (+ bias))."""
    n = g.anchor
    s.kwargs = tuple(sorted((k, g.const(v, n)[1]) for k, v in n.kwargs.items()))
    b_i = _B_OPERAND.get(s.anchor)
    if b_i is not None and not s.kwargs and not s.implied and g.untranspose(s.operands, b_i):
        s.anchor, s.order = "aten.linear.default", ([1, 2, 0] if b_i == 2 else [0, 1])


def _gemm_spec(g: Any, s: AnchorSpec) -> None:
    """``hexlayout.gemm(a, b, bias, residual, activation, scale, b_layout)`` as a spec:
    ``linear(a, b)`` (``"nk"``) or ``mm(a, b)`` (``"kn"``) with its epilogue
    ``act(scale * y + bias) + residual`` in ``s.implied``."""
    get = g.named_args(g.anchor).get
    implied = s.implied
    y: tuple = ("anchor",)

    def add(op: str, args: tuple, kwargs: tuple = ()) -> tuple:
        implied.append(Node(op, args, kwargs))
        return ("node", len(implied) - 1)

    if get("scale") is not None:
        y = add("aten.mul.Tensor", (y, ("const", float(get("scale")))))
    if get("bias") is not None:
        y = add("aten.add.Tensor", (y, s.extra_ref(get("bias"), ())))
    act = get("activation", "none")
    if act != "none":
        op, kw = _ACT_NODES[act]
        y = add(op, (y,), kw)
    if get("residual") is not None:
        add("aten.add.Tensor", (y, s.extra_ref(get("residual"), ())))
    kn = get("b_layout", "nk") == "kn"
    s.anchor, s.order, s.kwargs = ("aten.mm.default" if kn else "aten.linear.default"), [0, 1], ()


def _prepare(gm: Any) -> list[str]:
    """The GEMM record's graph passes: stacked unpacking as one-hot products
    (``unstack_interleaved``), LayerNorms written out (``decompose_layer_norms``), gated pairs
    into one GEMM (``fuse_gated_pairs``), RoPE into the QKV epilogue (``fuse_rope``)."""
    return unstack_interleaved(gm) + decompose_layer_norms(gm) + fuse_gated_pairs(gm) + fuse_rope(gm)


def _clear() -> None:
    clear_gemm_builds()
    LAUNCHERS.clear()


MATMUL = register_anchor(AnchorRecord("matmul", MATMULS, run=run_gemm, to_spec=_matmul_spec, clear=_clear,
                                      row_prologue=NORM_MAX_K, row_reductions=frozenset(NORM_REDUCTIONS),
                                      row_scale=True, prepare=_prepare))
#: ``hexlayout.gemm``: its operands ``a`` and ``b`` take prologues; it runs as an aten matmul spec
HEXLAYOUT_GEMM = register_anchor(AnchorRecord(
    "hexlayout.gemm", frozenset({"hexlayout.gemm.default"}), operands=lambda g, n: n.args[:2],
    to_spec=_gemm_spec, row_prologue=NORM_MAX_K, row_reductions=frozenset(NORM_REDUCTIONS), row_scale=True))
