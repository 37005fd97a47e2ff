"""``torch.ops.hexlayout.paged_attention``: paged attention registered with torch.library.

Schema: ``paged_attention(Tensor q, Tensor key_cache, Tensor value_cache, Tensor cu_seqlens_q,
Tensor seqused_k, Tensor block_table, int max_seqlen_q, int max_seqlen_k, float?
softmax_scale=None, bool causal=True, int[2] window_size=[-1, -1], float softcap=0.0, str
kv_layout="NHD", int num_splits=0, Tensor? sinks=None, str kv_cache_dtype="auto", Tensor?
k_scale=None, Tensor? v_scale=None) -> (Tensor out, Tensor lse)``: always both
(``out`` ``[total_q, H, D]`` in q's dtype, ``lse`` ``[H, total_q]`` fp32; semantics in
``hexlayout.ops.attention``). Every path (CUDA, CPU under ``HEXLAYOUT_EMULATE=1``, fake) first
runs ``hexlayout.ops.attention_args.check_paged_attention``; the fake implementation gives the
two outputs' shapes, dtypes and device; the implementation is ``run_paged_attention``, which takes
the schema's arguments in its order.
"""

from __future__ import annotations

from hexlayout.runtime.torch_ops import define_op

from .args import check_paged_attention
from .paged import run_paged_attention
from .torch_varlen import attention_outputs_fake

__all__ = ["paged_attention_op"]

SCHEMA = (
    "(Tensor q, Tensor key_cache, Tensor value_cache, Tensor cu_seqlens_q, Tensor seqused_k, "
    "Tensor block_table, int max_seqlen_q, int max_seqlen_k, float? softmax_scale=None, bool causal=True, "
    'int[2] window_size=[-1, -1], float softcap=0.0, str kv_layout="NHD", int num_splits=0, '
    'Tensor? sinks=None, str kv_cache_dtype="auto", Tensor? k_scale=None, Tensor? v_scale=None) '
    "-> (Tensor, Tensor)"
)


paged_attention_op = define_op(
    "paged_attention", SCHEMA, fake=attention_outputs_fake, impl=run_paged_attention,
    check=check_paged_attention,
)
