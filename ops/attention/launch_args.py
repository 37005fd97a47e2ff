"""What the attention ops' hosts hand both kinds of kernels (paged and varlen): the outputs
(given, else fresh) and the scores' scale arguments in the log2 domain.

The kernels compute ``exp2`` of scaled scores: with ``scale = softmax_scale`` (or ``D^-0.5``)
the score ``s_ij = (q_i . k_j) * scale`` enters the softmax as ``s_ij * log2(e)``, so they take
``qk_scale = scale * log2(e)`` and ``cap = 0``; with a softcap ``c > 0`` the score is ``c *
tanh((q_i . k_j) * scale / c)``, which they compute as ``tanh((q_i . k_j) * qk_scale) * cap``
with ``qk_scale = scale / c`` and ``cap = c * log2(e)``.
"""

from __future__ import annotations

import math
from typing import Any

from ..host.launch import fresh, zeroed

__all__ = ["LOG2E", "attention_outputs", "score_scales", "sinks_arg", "scale_arg", "fp8_cache_view"]

LOG2E = 1.4426950408889634


def attention_outputs(q: Any, out: Any, lse: Any) -> tuple[Any, Any]:
    """``out`` (``[total_q, H, D]``, q's dtype) and ``lse`` (``[H, total_q]``, f32) on q's device:
    the given ones, else fresh (``host.launch.fresh``: rows the kernels do not write are
    unspecified)."""
    import torch

    tq, h, d = q.shape
    if out is None:
        out = fresh((tq, h, d), q.dtype, q.device)
    if lse is None:
        lse = fresh((h, tq), torch.float32, q.device)
    return out, lse


def score_scales(softmax_scale: float | None, softcap: float, head_size: int) -> tuple[float, float]:
    """The kernels' ``(qk_scale, cap)`` (see the module docstring); ``cap > 0`` exactly when
    ``softcap > 0``."""
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_size)
    cap = float(softcap)
    return (scale / cap, cap * LOG2E) if cap > 0 else (scale * LOG2E, 0.0)


_NO_SINKS: dict[Any, Any] = {}


def sinks_arg(sinks: Any, device: Any) -> tuple[Any, bool]:
    """The kernels' ``sinks`` argument and their ``SINKS`` constant: the given ``[H]`` f32
    tensor and True, else one f32 zero per device (allocated once, never read) and False."""
    if sinks is not None:
        return sinks, True
    if device not in _NO_SINKS:
        import torch

        _NO_SINKS[device] = zeroed((1,), torch.float32, device)
    return _NO_SINKS[device], False


def scale_arg(scale: Any, device: Any) -> Any:
    """An FP8 cache's ``k_scale`` / ``v_scale`` as the kernels read it: a one-element float32
    tensor (the given one, viewed as ``[1]``, or one made from a number; None is 1.0)."""
    import torch

    if isinstance(scale, torch.Tensor):
        return scale.reshape(1)
    return torch.tensor([1.0 if scale is None else float(scale)], dtype=torch.float32, device=device)


def fp8_cache_view(cache: Any, fmt: str | None) -> Any:
    """A cache as the kernels type it: itself (``fmt`` None: the inputs' dtype), or its
    ``torch.float8_e4m3fn`` / ``float8_e5m2`` view (``fmt`` "e4m3" / "e5m2"; a uint8 cache, as
    vLLM allocates FP8 caches, is the same bytes)."""
    import torch

    if fmt is None:
        return cache
    return cache.view(torch.float8_e5m2 if fmt == "e5m2" else torch.float8_e4m3fn)
