"""Attention as a fusion anchor: ``scaled_dot_product_attention`` in its aten forms runs as
this package's attention kernel (``sdpa_anchor``); importing this module registers the record
``ATTENTION`` with ``hexlayout.fusion.anchors``.

``q[B, H, Sq, D]``, ``k`` / ``v`` ``[B, KVH, Sk, D]`` (torch's SDPA convention; ``H`` a
multiple of ``KVH``: grouped-query heads; the kernel reads them as ``[B, S, heads, D]``,
transposed views the host makes contiguous), f16 or bf16 (one dtype), ``D`` a multiple of 8
(at most 128 on a GPU, 256 in the emulator), no dropout; ``is_causal`` (torch's top-left
alignment, any ``Sq`` and ``Sk``); ``scale`` (default ``1 / sqrt(D)``); an attention mask
(anchor argument 3: ``attn_mask`` / ``attn_bias`` of the aten op), boolean or additive of
the inputs' dtype, broadcastable to ``[B, H, Sq, Sk]`` (not with ``is_causal``). A mask
given as ``where(m, 0, -inf)`` of a boolean ``m`` (how torch's graphs turn a boolean mask
into an additive one: the spec's prologue of argument 3) is read as the boolean ``m``.
``o = softmax(q k^T * scale [+ mask]) v`` is stored as ``[B, Sq, H, D]``, so the attention
output is its transposed view and the usual ``transpose(1, 2).reshape(B, Sq, H * D)`` after
it is free: an epilogue of views (``permute`` / ``transpose`` / ``view`` / ``reshape``, and
the ``clone`` a reshape makes of the transposed output, which is contiguous already) is
applied by the host to the stored output, with eager's shapes; elementwise math of the
output alone (a cast, a scale, ...: no other tensor) before or after those views is computed
in the kernel's store (f32, stored in the result's dtype). Other prologues (RoPE on ``q`` /
``k``), math with other tensors and several outputs are not fused into attention
(``FusionUnsupported``).
"""

from __future__ import annotations

import copy
import math
import re
import threading
from dataclasses import dataclass
from typing import Any

from hexlayout.fusion.anchors import AnchorRecord, AnchorSpec, register_anchor
from hexlayout.fusion.aten import CASTS, ELEMENTWISE, VIEWS, dtype_name, emit_elementwise
from hexlayout.fusion.planning import arch_of
from hexlayout.fusion.reference import aten_op, eval_nodes
from hexlayout.fusion.spec import FusedSpec, FusionUnsupported, Node
from hexlayout.runtime.alloc import fresh

from .index_mask import IndexMask, index_mask_nodes
from .sdpa_anchor import sdpa_anchor, sdpa_consts

__all__ = ["ATTENTION_ANCHORS", "ATTENTION", "attention_refusal", "run_attention"]

#: Attention in its aten forms (after decomposition of ``F.scaled_dot_product_attention``);
#: all but the first return a tuple whose first element is the output.
ATTENTION_ANCHORS = frozenset({
    "aten.scaled_dot_product_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
})

_LOCK = threading.Lock()
_PROGRAMS: dict[tuple, Any] = {}
_LAUNCHERS: dict[int, Any] = {}
_LOG2E = 1.4426950408889634


#: the keyword names of the attention mask in the aten forms
MASK_KWARGS = ("attn_mask", "attn_bias")


def attention_refusal(q: Any, k: Any, v: Any, kwargs: dict[str, Any], *, cuda: bool) -> str | None:
    """Why the attention kernel cannot compute SDPA of these tensors (meta or real) and
    keyword arguments (``is_causal``, ``scale``, ``dropout_p``, ``attn_mask``, ...), or None."""
    import torch

    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return "attention of tensors that are not all 4-D [B, heads, S, D]"
    if q.dtype not in (torch.float16, torch.bfloat16) or {k.dtype, v.dtype} != {q.dtype}:
        return (f"attention in {q.dtype} x {k.dtype} x {v.dtype} (the attention anchor takes f16 or bf16, "
                "one dtype)")
    b, h, sq, d = q.shape
    if tuple(k.shape) != tuple(v.shape) or k.shape[0] != b or k.shape[3] != d or h % k.shape[1]:
        return f"attention of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if d % 8 or d > (128 if cuda else 256):
        return f"head size {d} (a multiple of 8, at most {128 if cuda else 256})"
    mask = next((kwargs[n] for n in MASK_KWARGS if kwargs.get(n) is not None), None)
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            return f"an attention mask that is a {type(mask).__name__}"
        if mask.dtype not in (torch.bool, q.dtype):
            return f"an attention mask of {mask.dtype} (boolean or {q.dtype}, the inputs' dtype)"
        full = (b, h, sq, k.shape[2])
        if mask.dim() > 4 or any(x not in (1, y) for x, y in zip(reversed(mask.shape), reversed(full))):
            return f"an attention mask of shape {tuple(mask.shape)} (broadcastable to {list(full)})"
        if kwargs.get("is_causal"):
            return "an attention mask and is_causal together"
    known = ("is_causal", "scale", "enable_gqa", *MASK_KWARGS)
    odd = {key: val for key, val in kwargs.items() if key not in known and val not in (None, 0, 0.0, False)}
    if odd:
        return f"attention with {odd} (no dropout, no extra outputs)"
    return None


def _mask_of(spec: FusedSpec, anchor_args: list, extra_inputs: list) -> tuple[str, Any]:
    """The mask's kind (``"none"``, ``"bool"``, ``"add"``, ``"index"``) and tensor (the
    ``IndexMask`` for ``"index"``): anchor argument 3, the boolean tensor of a ``where(m, 0,
    -inf)`` prologue of it (cast to the inputs' dtype or not), or a prologue that computes
    it from positions (``index_mask``)."""
    import torch

    pro = {p.operand: p for p in spec.prologues}
    if set(pro) - {3}:
        raise FusionUnsupported(f"{spec.display_name()}: prologues of q, k or v are not fused into attention")
    if 3 in pro:
        p = pro[3]
        fn = IndexMask.of(p.nodes, p.output)
        if fn is not None:
            return "index", fn
        nodes = p.nodes[: p.output + 1]
        where = nodes[0]
        casts = nodes[1:]
        ok = where.op == "aten.where.Scalar" and len(where.args) == 3 and where.args[0][0] == "input" \
            and where.args[1] == ("const", 0.0) and where.args[2] == ("const", float("-inf")) and \
            all(c.op == "aten._to_copy.default" and c.args == (("node", i),) for i, c in enumerate(casts))
        m = extra_inputs[where.args[0][1]] if ok else None
        if not ok or not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            raise FusionUnsupported(f"{spec.display_name()}: a prologue of the attention mask other than "
                                    "where(boolean mask, 0, -inf)")
        return "bool", m
    mask = anchor_args[3] if len(anchor_args) > 3 else None
    if mask is None:
        return "none", None
    return ("bool" if mask.dtype == torch.bool else "add"), mask


def _build(spec: FusedSpec, consts: dict[str, Any], arch: str, compile: bool, dtype: Any, kind: str,
           align: int, epilogue: Any = None, out_dtype: Any = None, mask_fn: Any = None) -> Any:
    from hexlayout.runtime import build
    from hexlayout.runtime.launch_log import describe

    name = spec.display_name()
    key = (name, tuple(sorted(consts.items())), str(dtype), kind, align, epilogue, str(out_dtype), mask_fn)
    with _LOCK:
        tk = _PROGRAMS.get(key)
    if tk is None:
        kernel = sdpa_anchor(dtype, kind, align, epilogue, out_dtype, mask_fn)
        tk = copy.deepcopy(kernel.trace(**consts))
        tk.name = f"{re.sub(r'[^0-9a-zA-Z_]', '_', name)[:80]}__{tk.name}"
        with _LOCK:
            _PROGRAMS[key] = tk
    bld = build(tk, arch, compile=compile)
    describe(bld, anchor=spec.anchor, prologue=tuple(spec.prologue_ops()),
             epilogue=tuple(spec.epilogue_ops()))
    return bld


def _mask_host(mask: Any, kind: str, b: int, h: int, sq: int, sk: int) -> Any:
    """The mask as the kernel reads it: ``[MB, MH, Sq, Sk]`` contiguous (``MB`` in ``{1, B}``,
    ``MH`` in ``{1, H}``; the query and key modes expanded), a boolean one as bytes."""
    import torch

    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    m = m.expand(m.shape[0], m.shape[1], sq, sk)
    if kind == "bool":
        m = m.contiguous().view(torch.uint8)
    return m.contiguous()


def run_attention(spec: FusedSpec, anchor_args: list, extra_inputs: list) -> list:
    """``spec`` (an attention anchor with an epilogue of views) as one kernel launch; its
    outputs with eager's shapes (``FusionUnsupported`` before anything runs otherwise)."""
    import torch

    where = spec.display_name()
    if len(anchor_args) < 3:
        raise FusionUnsupported(f"{where}: attention takes q, k, v")
    q, k, v = anchor_args[:3]
    kw = dict(spec.anchor_kwargs)
    epilogue = _epilogue_of(spec)
    kind, mask = _mask_of(spec, list(anchor_args), list(extra_inputs))
    mask_fn = mask if kind == "index" else None
    mask = None if kind == "index" else mask
    cuda = isinstance(q, torch.Tensor) and q.is_cuda
    why = attention_refusal(q, k, v, {**kw, "attn_mask": mask}, cuda=cuda)
    if why is None and mask_fn is not None and kw.get("is_causal"):
        why = "an attention mask and is_causal together"
    if why is not None:
        raise FusionUnsupported(f"{where}: {why}")
    if {str(t.device) for t in (q, k, v) + ((mask,) if mask is not None else ())} != {str(q.device)}:
        raise FusionUnsupported(f"{where}: q, k, v and the mask on different devices")
    if not cuda:
        from hexlayout.runtime.torch_ops import EmulationDisabledError, emulation_enabled

        if not emulation_enabled():
            raise EmulationDisabledError(f"hexlayout fused kernel {where}: CPU tensors need "
                                         "HEXLAYOUT_EMULATE=1 (the thread-level emulator) or CUDA tensors")
    b, h, sq, d = q.shape
    sk = k.shape[2]
    causal = bool(kw.get("is_causal", False))
    scale = kw.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    consts = sdpa_consts(sq, sk, d, causal, not cuda)
    esize = 1 if kind == "bool" else q.element_size()
    align = min(16, (sk * esize) & -(sk * esize))
    import hexlayout.lang as hl

    out_dtype = q.dtype
    if epilogue is not None:
        try:
            out_dtype = _epilogue_values(spec, torch.empty(tuple(q.shape), dtype=q.dtype, device="meta"),
                                         compute=True)[0].dtype
        except Exception as e:  # noqa: BLE001 - the spec's ops on meta tensors fail: not fusible
            raise FusionUnsupported(f"{where}: the epilogue does not evaluate with torch's ops: "
                                    f"{e}") from None
        if out_dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise FusionUnsupported(f"{where}: an output of {out_dtype} (f16, bf16 or f32)")
    bld = _build(spec, consts, arch_of(q.device, cuda), cuda, getattr(hl, dtype_name(q.dtype)), kind,
                 align, epilogue, getattr(hl, dtype_name(out_dtype)), mask_fn)
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    o = fresh((b, sq, h, d), out_dtype, q.device)
    args = [qs, ks, vs, o]
    if kind in ("bool", "add"):
        args.append(_mask_host(mask, kind, b, h, sq, sk))
    args.append(scale * _LOG2E)
    if cuda:
        from hexlayout.runtime.launch import Launcher

        lau = _LAUNCHERS.get(id(bld))
        if lau is None or lau.build is not bld:
            lau = _LAUNCHERS[id(bld)] = Launcher(bld)
        lau(*args)
    else:
        from hexlayout.runtime.emulate import emulate

        emulate(bld, *args)
    return _epilogue_values(spec, o.transpose(1, 2), compute=False)   # [B, H, Sq, D], as SDPA's


def _epilogue_values(spec: FusedSpec, y: Any, *, compute: bool) -> list:
    """The outputs of ``spec``'s epilogue on attention's output ``y``: its views (``clone``:
    contiguous, a fresh tensor already) and - with ``compute``, else they were computed in
    the kernel - its math."""
    env: list = []
    for n in spec.epilogue.nodes:
        ref = next(a for a in n.args if a[0] in ("anchor", "node"))
        src = y if ref[0] == "anchor" else env[ref[1]]
        if n.op == "aten.clone.default":
            env.append(src.contiguous())
        elif n.op in VIEWS:
            env.append(aten_op(n.op)(src, *[a[1] for a in n.args[1:]], **dict(n.kwargs)))
        elif compute:
            node = Node(n.op, tuple(("anchor",) if a == ref else a for a in n.args), n.kwargs)
            env.append(eval_nodes((node,), src, [])[0])
        else:
            env.append(src)
    return [y if r[0] == "anchor" else env[r[1]] for r in spec.epilogue.outputs]


@dataclass(frozen=True)
class _Epilogue:
    """Elementwise math of attention's output alone (casts, scales; views and ``clone`` are
    the identity on values), traced on the kernel's f32 output tile before its store: the
    value of the spec's one output."""

    nodes: tuple[Node, ...]
    output: tuple

    def __call__(self, y: Any) -> Any:
        env: list = []
        for n in self.nodes:
            if n.op in VIEWS or n.op == "aten.clone.default":
                ref = n.args[0]
                env.append(y if ref[0] == "anchor" else env[ref[1]])
                continue
            args = [y if a[0] == "anchor" else env[a[1]] if a[0] == "node" else
                    (float(a[1]) if isinstance(a[1], (int, float)) and not isinstance(a[1], bool) else a[1])
                    for a in n.args]
            env.append(emit_elementwise(n.op, args, dict(n.kwargs)))
        return y if self.output[0] == "anchor" else env[self.output[1]]


#: keyword arguments of the output's math that do not change what the kernel computes
_NEUTRAL = frozenset({"dtype", "memory_format", "layout", "device", "pin_memory", "non_blocking", "copy",
                      "approximate", "alpha"})


def _epilogue_of(spec: FusedSpec) -> _Epilogue | None:
    """The kernel's part of ``spec``'s epilogue (None: views only), or ``FusionUnsupported``."""
    where = spec.display_name()
    nodes = spec.epilogue.nodes
    computing = [j for j, n in enumerate(nodes) if n.op not in VIEWS and n.op != "aten.clone.default"]
    if not computing:
        return None
    if len(spec.epilogue.outputs) != 1:
        raise FusionUnsupported(f"{where}: math of attention's output with {len(spec.epilogue.outputs)} "
                                "outputs (one is fused)")
    for j in computing:
        n = nodes[j]
        if n.op not in ELEMENTWISE and n.op not in CASTS:
            raise FusionUnsupported(f"{where}: epilogue node {j}: {n.op} (views and elementwise math of "
                                    "attention's output are fused)")
        refs = {a for a in n.args if a[0] in ("anchor", "node")}
        if any(a[0] == "input" for a in n.args) or len(refs) != 1:
            raise FusionUnsupported(f"{where}: epilogue node {j}: {n.op} of another tensor (math of "
                                    "attention's output alone is fused)")
        odd = {k: v for k, v in n.kwargs if k not in _NEUTRAL and v is not None}
        if odd:
            raise FusionUnsupported(f"{where}: epilogue node {j}: {n.op} with {odd}")
    return _Epilogue(tuple(nodes), spec.epilogue.outputs[0])


# --- the record ---------------------------------------------------------------------------------
def _mask_node(g: Any, n: Any) -> Any:
    """Attention's mask argument (``attn_mask`` / ``attn_bias``) when it is a tensor node."""
    given = g.named_args(n)
    mask = next((given[k] for k in MASK_KWARGS if given.get(k) is not None), None)
    return mask if hasattr(mask, "op") else None


def _admit(g: Any, n: Any) -> str | None:
    """Why attention ``n`` is not an anchor (None when it is)."""
    given = g.named_args(n)
    names = [a.name for a in n.target._schema.arguments]
    q, k, v = (g.value(given.get(x)) if hasattr(given.get(x), "op") else None for x in names[:3])
    kw = {key: (g.value(val) if hasattr(val, "op") else val) for key, val in given.items()
          if key not in names[:3]}
    if q is None or k is None or v is None:
        why: str | None = "attention of arguments that are not tensors"
    else:
        why = attention_refusal(q, k, v, kw, cuda=q.device.type == "cuda")
    import torch

    extra = [u for u in n.users if not (g.op(u) == "getitem" and u.args[1] == 0)]
    if why is None and not isinstance(g.value(n), torch.Tensor) and extra:
        why = "attention's extra outputs (logsumexp, ...) are used"
    return None if why is None else f"attention anchor not fused: {why}"


def _operands(g: Any, n: Any) -> tuple:
    mask = _mask_node(g, n)
    return (*n.args[:3], *(() if mask is None else (mask,)))


#: keyword arguments of a mask program's ops that do not change its values
_PLACEMENT = frozenset({"device", "layout", "pin_memory", "memory_format", "non_blocking"})


def _index_program(g: Any, nodes: list) -> tuple[list[Node], int]:
    """The spec nodes of a mask program of positions (``index_mask``) and its output; raises
    when an argument is not a constant a spec holds or the program is not one."""
    import torch

    pos = {p: i for i, p in enumerate(nodes)}
    out: list[Node] = []

    def arg(a: Any, p: Any) -> tuple:
        if hasattr(a, "op") and a in pos:
            return ("node", pos[a])
        if _symbolic(g, a):                   # a size of a dynamic shape: the kernel needs none
            return ("const", None)
        if isinstance(a, (list, tuple)) and any(_symbolic(g, x) for x in a):
            return ("const", tuple(None if _symbolic(g, x) else g.const(x, p)[1] for x in a))
        return g.const(a, p)

    for p in nodes:
        args = tuple(arg(a, p) for a in p.args)
        kwargs = tuple(sorted((k, g.const(v, p)[1]) for k, v in p.kwargs.items()
                              if k not in _PLACEMENT and not isinstance(v, (torch.device, torch.layout))))
        out.append(Node(g.op(p), args, kwargs))
    if IndexMask.of(tuple(out), len(out) - 1) is None:
        raise FusionUnsupported("not a mask program of positions")
    return out, len(out) - 1


def _symbolic(g: Any, a: Any) -> bool:
    """Whether ``a`` is a symbolic size (a ``SymInt`` or a node computing one)."""
    import torch

    from hexlayout.fusion.partition import static_int

    v = g.value(a) if hasattr(a, "op") else a
    return isinstance(v, torch.SymInt) and static_int(v) is None


def _prologues(g: Any, n: Any) -> dict[int, list]:
    """The nodes that compute the mask from query and key positions (``index_mask``: aranges,
    comparisons, views; the kernel computes it from its indices), when only the attention
    reads them; else no prologue but the nodes ``where(m, scalar_tensor(0),
    scalar_tensor(-inf))`` that turn a boolean ``m`` into attention's additive mask (torch's
    graphs do), when only the attention reads them (they join its kernel: it reads ``m``)."""
    where = _mask_node(g, n)
    program = index_mask_nodes(g, n, where) if where is not None else None
    if program is not None:
        try:
            _index_program(g, program)
            return {3: program}
        except Exception:  # noqa: BLE001 - not expressible (symbolic sizes, not a program): the generic path
            pass
    if where is None or g.op(where) != "aten.where.self" or len(where.args) != 3 or \
            not g.unclaimed(where) or set(where.users) != {n}:
        return {}
    cond, zero, ninf = where.args
    consts = []
    for st in (zero, ninf):
        if not hasattr(st, "op") or g.op(st) != "aten.scalar_tensor.default" or \
                set(st.users) != {where} or not g.unclaimed(st):
            return {}
        consts.append(st.args[0] if st.args else None)
    import torch

    if consts != [0.0, float("-inf")] or not hasattr(cond, "op") or \
            not isinstance(g.value(cond), torch.Tensor) or g.value(cond).dtype != torch.bool:
        return {}
    return {3: sorted([zero, ninf, where], key=g.order.__getitem__)}


def _lower_prologue(g: Any, n: Any, i: int, nodes: list, extra_ref: Any) -> tuple:
    """``where(m, 0, -inf)``: the boolean ``m``, cast as eager casts it; a mask program of
    positions: its nodes."""
    if nodes[-1].args[0] in nodes or g.op(nodes[-1]) != "aten.where.self":      # a program of positions
        prog, out = _index_program(g, nodes)
        return ("spec", prog, out)
    m, a = nodes[-1].args[0], nodes[-1]
    cast = (("dtype", dtype_name(g.value(a).dtype)),)
    return ("spec", [Node("aten.where.Scalar", (extra_ref(m, ()), ("const", 0.0), ("const", float("-inf")))),
                     Node("aten._to_copy.default", (("node", 0),), cast)], 1)


def _to_spec(g: Any, s: AnchorSpec) -> None:
    n = g.anchor
    given = g.named_args(n)
    names = [a.name for a in n.target._schema.arguments]
    mask = _mask_node(g, n)
    s.kwargs = tuple(sorted((k, g.const(v, n)[1]) for k, v in given.items()
                            if k not in names[:3] and not (mask is not None and v is mask)))
    s.order = [0, 1, 2] if mask is None else [0, 1, 2, 3]


def _eager(anchor: str, args: list, kwargs: dict) -> Any:
    """SDPA's aten form with argument 3 - the mask - as its ``attn_mask`` / ``attn_bias``."""
    if len(args) > 3:
        names = [a.name for a in aten_op(anchor)._schema.arguments]
        kwargs = dict(kwargs, **{"attn_mask" if "attn_mask" in names else "attn_bias": args[3]})
        args = args[:3]
    return aten_op(anchor)(*args, **kwargs)


def _run(spec: FusedSpec, anchor_args: list, extra_inputs: list) -> tuple[list, None]:
    return run_attention(spec, anchor_args, extra_inputs), None


ATTENTION = register_anchor(AnchorRecord(
    "attention", ATTENTION_ANCHORS, run=_run, admit=_admit, operands=_operands, prologues=_prologues,
    lower_prologue=_lower_prologue, to_spec=_to_spec, eager=_eager, tuple_output=True))
