"""The argument check of ``reshape_and_cache``, run eagerly and in its fake implementation."""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.args import ArgumentError

from ..attention.args import check_caches, check_kv_layout, check_kv_scale
from ..host.checks import check_dtype, check_index_tensors, check_one_device, check_rows, check_tensors
from ..host.launch import content_checks

__all__ = ["check_reshape_and_cache"]


def check_reshape_and_cache(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, kv_layout: str = "NHD",
    kv_cache_dtype: str = "auto", k_scale: Any = None, v_scale: Any = None,
) -> None:
    """The arguments of ``reshape_and_cache`` (``hexlayout.ops.kv_cache``); raises naming the argument."""
    import torch

    op = "hexlayout.reshape_and_cache"
    tensors = [
        ("key", key, 3),
        ("value", value, 3),
        ("key_cache", key_cache, 4),
        ("value_cache", value_cache, 4),
        ("slot_mapping", slot_mapping, 1),
    ]
    check_tensors(op, tensors)
    check_kv_layout(op, kv_layout)
    check_dtype(op, "key", key)
    check_one_device(op, tensors)
    if value.dtype != key.dtype:
        raise ArgumentError(op, "value", f"has dtype {value.dtype}, key {key.dtype}")
    check_index_tensors(op, [("slot_mapping", slot_mapping)], torch.int64)
    if tuple(value.shape) != tuple(key.shape):
        raise ArgumentError(op, "value", f"has shape {tuple(value.shape)}, key {tuple(key.shape)}")
    nb, bs, kvh, d = check_caches(op, key_cache, value_cache, kv_layout, key.dtype, kv_cache_dtype)
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        check_kv_scale(op, name, sc, key.device)
    t = key.shape[0]
    if tuple(key.shape[1:]) != (kvh, d):
        raise ArgumentError(
            op,
            "key",
            f"has shape {tuple(key.shape)}: expected [T, {kvh}, {d}] (KVH and head "
            f"size of the caches, shape {tuple(key_cache.shape)}, layout {kv_layout})",
        )
    if slot_mapping.shape[0] != t:
        raise ArgumentError(op, "slot_mapping", f"has {slot_mapping.shape[0]} entries, key {t} tokens")
    for name, x in (("key", key), ("value", value)):
        check_rows(op, name, x, copied=True)
    if content_checks(slot_mapping) and t:
        hi = int(slot_mapping.max())
        if hi >= nb * bs:
            raise ArgumentError(
                op, "slot_mapping", f"holds slot {hi}, past the caches' {nb} blocks x {bs} slots"
            )
