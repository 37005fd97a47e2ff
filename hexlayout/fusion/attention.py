"""Attention as a fusion anchor: ``scaled_dot_product_attention`` in its aten forms runs as
the FlashAttention-2 kernel (``hexlayout.fusion.anchors.attention_provider``).

``q[B, H, Sq, D]``, ``k`` / ``v`` ``[B, KVH, Sk, D]`` (torch's SDPA convention; the kernel
reads them as ``[B, S, heads, D]``, transposed views the host makes contiguous), f16,
``D`` a multiple of 8 (at most 128 on a GPU, 256 in the emulator), no mask, no dropout;
``is_causal`` only with ``Sq == Sk`` (torch aligns the causal mask top-left, the kernel
bottom-right: the same then); ``scale`` (default ``1 / sqrt(D)``).
``o = softmax(q k^T * scale [+ causal mask]) v`` is stored as ``[B, Sq, H, D]``, so the
attention output is its transposed view and the usual ``transpose(1, 2).reshape(B, Sq, H * D)``
after it is free: an epilogue of views (``permute`` / ``transpose`` / ``view`` /
``reshape``, and the ``clone`` a reshape makes of the transposed output, which is contiguous
already) is applied by the host to the stored output, with eager's shapes.
Computing epilogues and prologues are not fused into attention (``FusionUnsupported``).
"""

from __future__ import annotations

import copy
import math
import re
import threading
from typing import Any

from .aten import VIEWS
from .reference import aten_op
from .spec import FusedSpec, FusionUnsupported

__all__ = ["ATTENTION_ANCHORS", "attention_refusal", "run_attention"]

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
_LOG2E = 1.4426950408889634


def attention_refusal(q: Any, k: Any, v: Any, kwargs: dict[str, Any], *, cuda: bool) -> str | None:
    """Why the attention kernel cannot compute SDPA of these tensors (meta or real) and
    keyword arguments (``is_causal``, ``scale``, ``dropout_p``, ``attn_mask``, ...), or None."""
    import torch

    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return "attention of tensors that are not all 4-D [B, heads, S, D]"
    if {q.dtype, k.dtype, v.dtype} != {torch.float16}:
        return f"attention in {q.dtype} (the FlashAttention anchor takes f16)"
    b, h, sq, d = q.shape
    if tuple(k.shape) != tuple(v.shape) or k.shape[0] != b or k.shape[3] != d or h % k.shape[1]:
        return f"attention of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if d % 8 or d > (128 if cuda else 256):
        return f"head size {d} (a multiple of 8, at most {128 if cuda else 256})"
    odd = {key: val for key, val in kwargs.items() if key not in ("is_causal", "scale", "enable_gqa")
           and val not in (None, 0, 0.0, False)}
    if odd:
        return f"attention with {odd} (no mask, no dropout, no extra outputs)"
    if kwargs.get("is_causal") and sq != k.shape[2]:
        return f"causal attention of {sq} queries over {k.shape[2]} keys (fused only when they are equal)"
    return None


def _build(spec: FusedSpec, consts: dict[str, Any], arch: str, compile: bool) -> Any:
    from hexlayout.runtime import build
    from hexlayout.runtime.launch_log import describe

    from .anchors import attention_provider

    name = spec.display_name()
    key = (name, tuple(sorted(consts.items())))
    with _LOCK:
        tk = _PROGRAMS.get(key)
    if tk is None:
        tk = copy.deepcopy(attention_provider().kernel().trace(**consts))
        tk.name = f"{re.sub(r'[^0-9a-zA-Z_]', '_', name)[:80]}__{tk.name}"
        with _LOCK:
            _PROGRAMS[key] = tk
    bld = build(tk, arch, compile=compile)
    describe(bld, anchor=spec.anchor, prologue=(), epilogue=tuple(spec.epilogue_ops()))
    return bld


def run_attention(spec: FusedSpec, anchor_args: list, extra_inputs: list) -> list:
    """``spec`` (an attention anchor with an epilogue of views) as one kernel launch; its
    outputs with eager's shapes (``FusionUnsupported`` before anything runs otherwise)."""
    import torch

    from .gemm_plan import _arch_of

    where = spec.display_name()
    if len(anchor_args) < 3:
        raise FusionUnsupported(f"{where}: attention takes q, k, v")
    q, k, v = anchor_args[:3]
    kw = dict(spec.anchor_kwargs)
    if spec.prologues:
        raise FusionUnsupported(f"{where}: prologues of attention are not fused")
    for j, n in enumerate(spec.epilogue.nodes):
        if n.op not in VIEWS and n.op != "aten.clone.default":
            raise FusionUnsupported(f"{where}: epilogue node {j}: {n.op} (only views of attention's output "
                                    "are fused)")
    cuda = isinstance(q, torch.Tensor) and q.is_cuda
    why = attention_refusal(q, k, v, kw, cuda=cuda)
    if why is not None:
        raise FusionUnsupported(f"{where}: {why}")
    if {str(t.device) for t in (q, k, v)} != {str(q.device)}:
        raise FusionUnsupported(f"{where}: q, k, v on different devices")
    if not cuda:
        from hexlayout.runtime.torch_ops import EmulationDisabledError, emulation_enabled

        if not emulation_enabled():
            raise EmulationDisabledError(f"hexlayout fused kernel {where}: CPU tensors need "
                                         "HEXLAYOUT_EMULATE=1 (the thread-level emulator) or CUDA tensors")
    from .anchors import attention_provider

    b, h, sq, d = q.shape
    sk = k.shape[2]
    causal = bool(kw.get("is_causal", False))
    scale = kw.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    consts = attention_provider().consts(sq, sk, d, causal, not cuda)
    bld = _build(spec, consts, _arch_of(q.device, cuda), cuda)
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    o = torch.empty(b, sq, h, d, dtype=q.dtype, device=q.device)
    if cuda:
        from hexlayout.runtime.launch import Launcher

        Launcher(bld)(qs, ks, vs, o, scale * _LOG2E)
    else:
        from hexlayout.runtime.emulate import emulate

        emulate(bld, qs, ks, vs, o, scale * _LOG2E)
    y = o.transpose(1, 2)                               # [B, H, Sq, D], as SDPA returns it
    env: list = []
    for n in spec.epilogue.nodes:
        src = y if n.args[0][0] == "anchor" else env[n.args[0][1]]
        if n.op == "aten.clone.default":       # a fresh tensor already: a copy only if not contiguous
            env.append(src.contiguous())
            continue
        env.append(aten_op(n.op)(src, *[a[1] for a in n.args[1:]], **dict(n.kwargs)))
    return [y if r[0] == "anchor" else env[r[1]] for r in spec.epilogue.outputs]
