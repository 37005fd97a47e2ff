"""``torch.ops.hexlayout.mla_decode``: MLA decode registered with torch.library.

Schema: ``mla_decode(Tensor q, Tensor kv_cache, Tensor cu_seqlens_q, Tensor seqused_k, Tensor
block_table, int max_seqlen_q, int max_seqlen_k, float? softmax_scale=None, int
kv_lora_rank=512, str kv_cache_dtype="auto", Tensor? k_scale=None) -> (Tensor out, Tensor lse)``
(``out`` ``[total_q, H, kv_lora_rank]`` in q's dtype, ``lse`` ``[H, total_q]`` f32; semantics in
``hexlayout.ops.attention.mla``). Every path
(CUDA, CPU under ``HEXLAYOUT_EMULATE=1``, fake) first runs ``check_mla_decode``.

``mla_reshape_and_cache(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, str
kv_cache_dtype="auto", Tensor? k_scale=None) -> ()``: the latent cache written in place
(``hexlayout.ops.attention.mla_cache``).
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.torch_ops import define_op

from .mla import check_mla_decode, run_mla_decode
from .mla_cache import check_mla_reshape_and_cache, run_mla_reshape_and_cache

__all__ = ["mla_decode_op", "mla_reshape_and_cache_op"]

SCHEMA = (
    "(Tensor q, Tensor kv_cache, Tensor cu_seqlens_q, Tensor seqused_k, Tensor block_table, "
    "int max_seqlen_q, int max_seqlen_k, float? softmax_scale=None, int kv_lora_rank=512, "
    'str kv_cache_dtype="auto", Tensor? k_scale=None) -> (Tensor, Tensor)'
)


def mla_outputs_fake(q: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``out`` ``[total_q, H, kv_lora_rank]`` in q's dtype and ``lse`` ``[H, total_q]`` f32."""
    import torch

    rank = kwargs.get("kv_lora_rank", args[7] if len(args) > 7 else 512)
    tq, h, _ = q.shape
    return q.new_empty((tq, h, int(rank))), q.new_empty((h, tq), dtype=torch.float32)


mla_decode_op = define_op("mla_decode", SCHEMA, fake=mla_outputs_fake, impl=run_mla_decode,
                          check=check_mla_decode)


def _cache_fake(kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any, kv_cache_dtype: str = "auto",
                k_scale: Any = None) -> None:
    return None


mla_reshape_and_cache_op = define_op(
    "mla_reshape_and_cache",
    '(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, str kv_cache_dtype="auto", '
    "Tensor? k_scale=None) -> ()",
    fake=_cache_fake, impl=run_mla_reshape_and_cache, check=check_mla_reshape_and_cache,
)
