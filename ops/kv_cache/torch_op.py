"""``torch.ops.hexlayout.reshape_and_cache``: the KV-cache scatter registered with torch.library.

Schema: ``reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!)
value_cache, Tensor slot_mapping, str kv_layout="NHD", str kv_cache_dtype="auto", Tensor?
k_scale=None, Tensor? v_scale=None) -> ()``. It mutates the caches in
place and returns nothing. Every path (CUDA, CPU under ``HEXLAYOUT_EMULATE=1``, fake) first
runs ``hexlayout.ops.attention_args.check_reshape_and_cache``, so a bad argument gets the same
error eagerly and while tracing; the fake implementation does nothing else.
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.torch_ops import define_op

from .args import check_reshape_and_cache
from .op import run_reshape_and_cache

__all__ = ["reshape_and_cache_op"]

SCHEMA = (
    "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping, "
    'str kv_layout="NHD", str kv_cache_dtype="auto", Tensor? k_scale=None, Tensor? v_scale=None) -> ()'
)


def _fake(*_: Any, **__: Any) -> None:
    return None


def _impl(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, kv_layout: str = "NHD",
    kv_cache_dtype: str = "auto", k_scale: Any = None, v_scale: Any = None,
) -> None:
    run_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_layout, kv_cache_dtype,
                          k_scale, v_scale)


reshape_and_cache_op = define_op(
    "reshape_and_cache", SCHEMA, fake=_fake, impl=_impl, check=check_reshape_and_cache
)
