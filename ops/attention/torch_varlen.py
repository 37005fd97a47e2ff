"""``torch.ops.hexlayout.attention_varlen``: varlen attention registered with torch.library.

Schema: ``attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor
cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float? softmax_scale=None, bool
causal=False, int[2] window_size=[-1, -1], float softcap=0.0, Tensor? sinks=None) -> (Tensor out,
Tensor lse)``:
always both outputs (``out`` ``[total_q, H, D]`` in q's dtype, ``lse`` ``[H, total_q]`` fp32;
semantics in ``hexlayout.ops.attention_varlen``). Every path (CUDA, CPU under
``HEXLAYOUT_EMULATE=1``, fake) first runs
``hexlayout.ops.attention_args.check_attention_varlen``; the fake implementation gives the two
outputs' shapes, dtypes and device; the implementation is ``run_attention_varlen``, which takes the
schema's arguments in its order.
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.torch_ops import define_op

from .args import check_attention_varlen
from .varlen import run_attention_varlen

__all__ = ["attention_varlen_op"]

SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, float? softmax_scale=None, bool causal=False, int[2] window_size=[-1, -1], "
    "float softcap=0.0, Tensor? sinks=None) -> (Tensor, Tensor)"
)


def attention_outputs_fake(q: Any, *_: Any, **__: Any) -> tuple[Any, Any]:
    """The fake implementation of both attention ops: ``out`` ``[total_q, H, D]`` in q's dtype
    and ``lse`` ``[H, total_q]`` fp32 on q's device (the other arguments do not matter)."""
    import torch

    tq, h, d = q.shape
    return q.new_empty((tq, h, d)), q.new_empty((h, tq), dtype=torch.float32)


attention_varlen_op = define_op(
    "attention_varlen", SCHEMA, fake=attention_outputs_fake, impl=run_attention_varlen,
    check=check_attention_varlen,
)
