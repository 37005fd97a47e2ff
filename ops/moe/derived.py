"""Derived parameters of the MoE fusion passes: weights re-laid out once (concatenated,
stacked, transposed) for ``fused_moe``, cached per source tensors and recomputed only after
one of them is modified in place."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["cached_derived"]

_LOCK = threading.Lock()
_DERIVED: dict[tuple, Any] = {}


def cached_derived(key_tensors: tuple, tag: Any, make: Callable[[], Any]) -> Any:
    """``make()`` (a derived parameter), cached per tensors (the same objects at the same
    versions: again after an in-place update) and ``tag``."""
    key = (tag, *((w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype, w.device) for w in key_tensors))
    with _LOCK:
        hit = _DERIVED.get(key)
    if hit is not None and all(r() is w for r, w in zip(hit[0], key_tensors)) and \
            hit[1] == tuple(w._version for w in key_tensors):
        return hit[2]
    out = make()
    with _LOCK:
        if len(_DERIVED) > 64:
            _DERIVED.clear()
        _DERIVED[key] = (tuple(weakref.ref(w) for w in key_tensors), tuple(w._version for w in key_tensors),
                         out)
    return out
