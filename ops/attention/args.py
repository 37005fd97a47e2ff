"""Argument checks of the attention ops (``paged_attention``, ``attention_varlen``) and of the
paged KV cache they read (shared with ``reshape_and_cache``).

Each ``check_*`` is the one check an op runs eagerly and in its fake implementation (meta /
fake tensors, ``torch.compile``, CUDA-graph capture): it raises ``ArgumentTypeError``
(``TypeError``) or ``ArgumentError`` (``ValueError``) naming the argument. Checks that need
tensor contents (slot values, sequence offsets against q / k and the block table) run on CPU tensors
and, on CUDA, only with ``HEXLAYOUT_CHECK=1`` (the fast path never synchronizes).
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.args import INT32_MAX, ArgumentError, ArgumentTypeError

from ..host.checks import (
    check_dtype,
    check_index_tensors,
    check_one_device,
    check_rows,
    check_tensors,
    int_arg,
    kind,
    real_arg,
)
from ..host.launch import content_checks

__all__ = [
    "check_attention_options",
    "check_attention_varlen",
    "check_cu_seqlens",
    "check_sinks",
    "check_kv_cache_dtype",
    "check_kv_scale",
    "fp8_format",
    "head_dim_tile",
    "KV_CACHE_DTYPES",
    "BLOCK_SIZES",
    "KV_LAYOUTS",
    "MAX_HEAD_DIM",
]

KV_LAYOUTS = ("NHD", "HND")
BLOCK_SIZES = (16, 32, 64, 128)
MAX_HEAD_DIM = 256
#: The ``kv_cache_dtype`` strings of vLLM the ops take: the caches in the inputs' dtype
#: (``"auto"``), or FP8 E4M3 (``"fp8"``, ``"fp8_e4m3"``) / E5M2 (``"fp8_e5m2"``) values ``x /
#: scale`` stored as ``torch.uint8`` or the matching ``torch.float8_*`` dtype.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def fp8_format(kv_cache_dtype: str) -> str | None:
    """The FP8 format (``"e4m3"`` / ``"e5m2"``) of a checked ``kv_cache_dtype``; None for "auto"."""
    return None if kv_cache_dtype == "auto" else "e5m2" if kv_cache_dtype == "fp8_e5m2" else "e4m3"


def check_kv_cache_dtype(op: str, kv_cache_dtype: Any, dtype: Any) -> tuple[Any, ...]:
    """``kv_cache_dtype`` one of ``KV_CACHE_DTYPES``; returns the torch dtypes the caches may
    have: ``dtype`` (the keys' / queries') for "auto", else uint8 or the format's float8 dtype."""
    import torch

    if not isinstance(kv_cache_dtype, str):
        raise ArgumentTypeError(op, "kv_cache_dtype", f"expected a string, got {kind(kv_cache_dtype)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ArgumentError(
            op, "kv_cache_dtype",
            f"must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, not {kv_cache_dtype!r}",
        )
    fmt = fp8_format(kv_cache_dtype)
    if fmt is None:
        return (dtype,)
    return (torch.uint8, torch.float8_e5m2 if fmt == "e5m2" else torch.float8_e4m3fn)


def check_kv_scale(op: str, name: str, scale: Any, device: Any) -> None:
    """``k_scale`` / ``v_scale``: None (1.0), a positive finite number, or a float32 tensor of
    one element (vLLM's per-layer ``_k_scale`` / ``_v_scale``) on ``device``."""
    import torch

    if scale is None:
        return
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or scale.dtype != torch.float32:
            raise ArgumentError(
                op, name,
                f"is a {scale.dtype} tensor of shape {tuple(scale.shape)}; expected one float32 element",
            )
        if scale.device != device:
            raise ArgumentError(op, name, f"is on {scale.device}, the caches on {device}")
        return
    v = real_arg(op, name, scale)
    if v is not None and v <= 0:
        raise ArgumentError(op, name, f"must be > 0, got {v}")


def head_dim_tile(d: int) -> int:
    """The kernels' head-dimension tile: ``d`` padded up to 64, 128 or 256."""
    return 64 if d <= 64 else 128 if d <= 128 else 256


def check_kv_layout(op: str, kv_layout: Any) -> None:
    if not isinstance(kv_layout, str):
        raise ArgumentTypeError(
            op, "kv_layout", f"expected a string ('NHD' or 'HND'), got {kind(kv_layout)}"
        )
    if kv_layout not in KV_LAYOUTS:
        raise ArgumentError(
            op,
            "kv_layout",
            f"must be 'NHD' ([num_blocks, block_size, KVH, D]) or 'HND' "
            f"([num_blocks, KVH, block_size, D]), not {kv_layout!r}",
        )


def check_caches(
    op: str, key_cache: Any, value_cache: Any, kv_layout: str, dtype: Any, kv_cache_dtype: str = "auto"
) -> tuple[int, int, int, int]:
    """The two caches agree and fit the layout, their dtype one ``check_kv_cache_dtype`` allows
    for ``dtype`` (the keys') and ``kv_cache_dtype``: returns ``(num_blocks, block_size, KVH, D)``."""
    shapes = {}
    allowed = check_kv_cache_dtype(op, kv_cache_dtype, dtype)
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        if c.dtype not in allowed:
            want = " or ".join(map(str, allowed))
            raise ArgumentError(
                op, name,
                f"has dtype {c.dtype}, expected {want} (kv_cache_dtype {kv_cache_dtype!r}, keys {dtype})",
            )
        nb, x, y, d = c.shape
        shapes[name] = (nb, x, y, d) if kv_layout == "NHD" else (nb, y, x, d)
    kc, vc = shapes["key_cache"], shapes["value_cache"]
    what = ("num_blocks", "block_size", "KVH", "head size")
    for i in range(4):
        if kc[i] != vc[i]:
            raise ArgumentError(
                op,
                "value_cache",
                f"has {what[i]} {vc[i]}, key_cache {kc[i]} (shapes "
                f"{tuple(value_cache.shape)} and {tuple(key_cache.shape)}, layout {kv_layout})",
            )
    nb, bs, kvh, d = kc
    if bs not in BLOCK_SIZES:
        raise ArgumentError(
            op,
            "key_cache",
            f"has block size {bs} (layout {kv_layout}, shape "
            f"{tuple(key_cache.shape)}); supported: {', '.join(map(str, BLOCK_SIZES))}",
        )
    if d > MAX_HEAD_DIM or d % 8 or d == 0:
        raise ArgumentError(
            op, "key_cache", f"has head size {d}; supported: multiples of 8 up to {MAX_HEAD_DIM}"
        )
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        check_rows(op, name, c)
        if c.element_size() == 1 and (d % 16 or any(st % 16 for st in c.stride()[:-1])):
            raise ArgumentError(
                op, name, f"is an FP8 cache with head size {d} and strides {tuple(c.stride())}: "
                "16-byte rows need the head size and strides multiples of 16 (as vLLM's FP8 caches)"
            )
    return nb, bs, kvh, d


# --- building and running ---------------------------------------------------------------------------


def check_attention_options(
    op: str,
    max_seqlen_q: Any,
    max_seqlen_k: Any,
    softmax_scale: Any,
    causal: Any,
    window_size: Any,
    softcap: Any,
) -> tuple[int, int]:
    """The scalar options the attention ops share; returns ``(max_seqlen_q, max_seqlen_k)``."""
    max_q, max_k = int_arg(op, "max_seqlen_q", max_seqlen_q), int_arg(op, "max_seqlen_k", max_seqlen_k)
    for name, v in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if v < 0:
            raise ArgumentError(op, name, f"must be >= 0, got {v}")
    scale = real_arg(op, "softmax_scale", softmax_scale, optional=True)
    if scale is not None and scale <= 0:
        raise ArgumentError(op, "softmax_scale", f"must be > 0, got {scale}")
    if not isinstance(causal, bool):
        raise ArgumentTypeError(op, "causal", f"expected a bool, got {kind(causal)}")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ArgumentTypeError(op, "window_size", f"expected (left, right) ints, got {kind(window_size)}")
    for w in window_size:
        if int_arg(op, "window_size", w) < -1:
            raise ArgumentError(
                op, "window_size", f"bounds must be >= 0 or -1 (unbounded), got {tuple(window_size)}"
            )
    cap = real_arg(op, "softcap", softcap)
    if cap is not None and cap < 0:
        raise ArgumentError(op, "softcap", f"must be >= 0 (0: no softcap), got {cap}")
    return max_q, max_k


def check_sinks(op: str, sinks: Any, q: Any) -> None:
    """``sinks``: None, or a float32 ``[H]`` tensor (one logit per query head of ``q``
    ``[total_q, H, D]``) on q's device."""
    import torch

    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise ArgumentTypeError(op, "sinks", f"expected None or a float32 tensor [H], got {kind(sinks)}")
    h = q.shape[1]
    if sinks.dim() != 1 or sinks.shape[0] != h:
        raise ArgumentError(op, "sinks", f"has shape {tuple(sinks.shape)}, expected [H] = [{h}] (q's heads)")
    if sinks.dtype != torch.float32:
        raise ArgumentError(op, "sinks", f"has dtype {sinks.dtype}, expected torch.float32")
    if sinks.device != q.device:
        raise ArgumentError(op, "sinks", f"is on {sinks.device}, q on {q.device}")


def check_cu_seqlens(
    op: str, name: str, cu_seqlens: Any, max_name: str, max_len: int, rows_name: str, rows: int, what: str
) -> None:
    """Content check of one ``cu_seqlens`` (CPU, or CUDA under ``HEXLAYOUT_CHECK=1``): starts at
    >= 0, never decreases, each sequence at most ``max_len`` long, ends within ``rows``."""
    cu = cu_seqlens.tolist()
    if cu and cu[0] < 0:
        raise ArgumentError(op, name, f"starts at {cu[0]} < 0")
    for i in range(len(cu) - 1):
        if cu[i + 1] < cu[i]:
            raise ArgumentError(op, name, f"decreases at {i}: {cu[i]} then {cu[i + 1]}")
    for i in range(len(cu) - 1):
        if cu[i + 1] - cu[i] > max_len:
            raise ArgumentError(
                op, max_name, f"is {max_len}, but sequence {i} has {cu[i + 1] - cu[i]} {what}"
            )
    if len(cu) > 1 and cu[-1] > rows:
        raise ArgumentError(op, name, f"ends at {cu[-1]}, past {rows_name}'s {rows} tokens")


def check_paged_attention(
    q: Any,
    key_cache: Any,
    value_cache: Any,
    cu_seqlens_q: Any,
    seqused_k: Any,
    block_table: Any,
    max_seqlen_q: Any,
    max_seqlen_k: Any,
    softmax_scale: Any = None,
    causal: Any = True,
    window_size: Any = (-1, -1),
    softcap: Any = 0.0,
    kv_layout: Any = "NHD",
    num_splits: Any = 0,
    sinks: Any = None,
    kv_cache_dtype: Any = "auto",
    k_scale: Any = None,
    v_scale: Any = None,
) -> tuple[int, int, int, int, int, int]:
    """The arguments of ``paged_attention`` (``hexlayout.ops.attention``); raises naming the
    argument. Returns ``(B, H, KVH, D, block_size, max_blocks)``."""
    import torch

    op = "hexlayout.paged_attention"
    tensors = [
        ("q", q, 3),
        ("key_cache", key_cache, 4),
        ("value_cache", value_cache, 4),
        ("cu_seqlens_q", cu_seqlens_q, 1),
        ("seqused_k", seqused_k, 1),
        ("block_table", block_table, 2),
    ]
    check_tensors(op, tensors)
    check_kv_layout(op, kv_layout)
    max_q, max_k = check_attention_options(
        op, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap
    )
    _check_num_splits(op, num_splits)
    check_dtype(op, "q", q)
    check_one_device(op, tensors)
    check_index_tensors(op, [(name, t) for name, t, _ in tensors[3:]], torch.int32)
    nb, bs, kvh, d = check_caches(op, key_cache, value_cache, kv_layout, q.dtype, kv_cache_dtype)
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        check_kv_scale(op, name, sc, q.device)
    tq, h, dq = q.shape
    if dq != d:
        raise ArgumentError(op, "q", f"has head size {dq}, the caches {d}")
    if h % kvh:
        raise ArgumentError(op, "q", f"has {h} heads, not a multiple of the caches' {kvh} KV heads")
    check_rows(op, "q", q, copied=True)
    check_sinks(op, sinks, q)
    b = seqused_k.shape[0]
    if cu_seqlens_q.shape[0] != b + 1:
        raise ArgumentError(
            op,
            "cu_seqlens_q",
            f"has {cu_seqlens_q.shape[0]} entries, expected B + 1 = {b + 1} (seqused_k has B = {b})",
        )
    if block_table.shape[0] != b:
        raise ArgumentError(op, "block_table", f"has {block_table.shape[0]} rows, expected B = {b}")
    if tq * h > INT32_MAX:
        raise ArgumentError(op, "q", f"has {tq} x {h} rows; the kernels index with 32-bit int")
    maxb = block_table.shape[1]
    if content_checks(cu_seqlens_q):
        check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, "max_seqlen_q", max_q, "q", tq, "queries")
        _check_paged_contents(op, seqused_k, block_table, max_k, bs, nb)
    return b, h, kvh, d, bs, maxb


def _check_num_splits(op: str, num_splits: Any) -> int:
    """``num_splits``: an int in [0, 16] (0: chosen by the op)."""
    splits = int_arg(op, "num_splits", num_splits)
    if splits < 0:
        raise ArgumentError(op, "num_splits", f"must be >= 0 (0: chosen by the op), got {splits}")
    if splits > 16:
        raise ArgumentError(op, "num_splits", f"must be at most 16 (each count is a build), got {splits}")
    return splits


def _check_paged_contents(op: str, seqused_k: Any, block_table: Any, max_k: int, bs: int, nb: int) -> None:
    """Content check of ``seqused_k`` and ``block_table`` (CPU, or CUDA under ``HEXLAYOUT_CHECK=1``):
    every key count in [0, ``max_k``] with enough blocks per sequence, every used block id one
    of the caches' ``nb`` blocks."""
    import torch

    b, maxb = block_table.shape[0], block_table.shape[1]
    ks = seqused_k.tolist()
    for i in range(b):
        if ks[i] < 0:
            raise ArgumentError(op, "seqused_k", f"holds {ks[i]} < 0 for sequence {i}")
        if ks[i] > max_k:
            raise ArgumentError(op, "max_seqlen_k", f"is {max_k}, but sequence {i} has {ks[i]} keys")
        if -(-ks[i] // bs) > maxb:
            raise ArgumentError(
                op,
                "block_table",
                f"has {maxb} blocks per sequence, sequence {i} needs "
                f"{-(-ks[i] // bs)} for {ks[i]} keys of block size {bs}",
            )
    if b and ks:
        used = [block_table[i, : -(-ks[i] // bs)] for i in range(b) if ks[i]]
        if used:
            ids = torch.cat(used)
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= nb:
                raise ArgumentError(
                    op,
                    "block_table",
                    f"holds block {lo if lo < 0 else hi} for a used key, outside the caches' {nb} blocks",
                )


def check_attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: Any,
    max_seqlen_k: Any,
    softmax_scale: Any = None,
    causal: Any = False,
    window_size: Any = (-1, -1),
    softcap: Any = 0.0,
    sinks: Any = None,
    return_lse: Any = False,
) -> tuple[int, int, int, int]:
    """The arguments of ``attention_varlen`` (``hexlayout.ops.attention_varlen``); raises
    naming the argument. Returns ``(B, H, KVH, D)``."""
    import torch

    op = "hexlayout.attention_varlen"
    tensors = [
        ("q", q, 3),
        ("k", k, 3),
        ("v", v, 3),
        ("cu_seqlens_q", cu_seqlens_q, 1),
        ("cu_seqlens_k", cu_seqlens_k, 1),
    ]
    check_tensors(op, tensors)
    max_q, max_k = check_attention_options(
        op, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap
    )
    if not isinstance(return_lse, bool):
        raise ArgumentTypeError(op, "return_lse", f"expected a bool, got {kind(return_lse)}")
    check_dtype(op, "q", q)
    check_one_device(op, tensors)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ArgumentError(op, name, f"has dtype {t.dtype}, q {q.dtype}")
    check_index_tensors(op, [(name, t) for name, t, _ in tensors[3:]], torch.int32)
    if cu_seqlens_q.shape[0] < 1:
        raise ArgumentError(op, "cu_seqlens_q", "is empty; expected B + 1 >= 1 entries")
    b = cu_seqlens_q.shape[0] - 1
    if cu_seqlens_k.shape[0] != b + 1:
        raise ArgumentError(
            op,
            "cu_seqlens_k",
            f"has {cu_seqlens_k.shape[0]} entries, cu_seqlens_q {b + 1} (both are [B + 1])",
        )
    tq, h, d = q.shape
    tk, kvh, dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ArgumentError(
            op, "v", f"has shape {tuple(v.shape)}, k {tuple(k.shape)} (both [total_k, KVH, D])"
        )
    if dk != d:
        raise ArgumentError(op, "k", f"has head size {dk}, q {d}")
    if d > MAX_HEAD_DIM or d % 8 or d == 0:
        raise ArgumentError(op, "q", f"has head size {d}; supported: multiples of 8 up to {MAX_HEAD_DIM}")
    if kvh == 0 or h % kvh:
        raise ArgumentError(op, "q", f"has {h} heads, not a multiple of k's {kvh} KV heads")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rows(op, name, t, copied=True)
    check_sinks(op, sinks, q)
    if tq * h > INT32_MAX:
        raise ArgumentError(op, "q", f"has {tq} x {h} rows; the kernels index with 32-bit int")
    if content_checks(cu_seqlens_q):
        check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, "max_seqlen_q", max_q, "q", tq, "queries")
        check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, "max_seqlen_k", max_k, "k", tk, "keys")
    return b, h, kvh, d
