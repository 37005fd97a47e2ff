"""Argument checks and the run path shared by the serving-attention ops (``reshape_and_cache``,
``paged_attention``, ``attention_varlen``).

Each ``check_*`` is the one check an op runs eagerly and in its fake implementation (meta /
fake tensors, ``torch.compile``, CUDA-graph capture): it raises ``ArgumentTypeError``
(``TypeError``) or ``ArgumentError`` (``ValueError``) naming the argument. Checks that need
tensor contents (slot values, sequence offsets against q / k and the block table) run on CPU tensors
and, on CUDA, only with ``HEXLAYOUT_CHECK=1`` (the fast path never synchronizes).
"""

from __future__ import annotations

import os
from typing import Any

from hexlayout.runtime.args import INT32_MAX, ArgumentError, ArgumentTypeError

__all__ = [
    "check_reshape_and_cache",
    "check_attention_options",
    "check_attention_varlen",
    "check_cu_seqlens",
    "head_dim_tile",
    "lang_dtype",
    "build_for",
    "run_kernel",
    "content_checks",
    "BLOCK_SIZES",
    "KV_LAYOUTS",
    "MAX_HEAD_DIM",
]

KV_LAYOUTS = ("NHD", "HND")
BLOCK_SIZES = (16, 32, 64, 128)
MAX_HEAD_DIM = 256
CHECK_ENV = "HEXLAYOUT_CHECK"


def _kind(x: Any) -> str:
    import torch

    return (
        f"a tensor of shape {tuple(x.shape)}"
        if isinstance(x, torch.Tensor)
        else f"{type(x).__name__} {x!r}"[:80]
    )


def _is_real(t: Any) -> bool:
    return t.device.type in ("cuda", "cpu") and not type(t).__name__.startswith("Fake")


def content_checks(t: Any) -> bool:
    """Whether checks reading tensor contents run: CPU tensors always, CUDA tensors only with
    ``HEXLAYOUT_CHECK=1`` (they synchronize), meta / fake tensors never."""
    if not _is_real(t):
        return False
    return t.device.type == "cpu" or os.environ.get(CHECK_ENV, "") == "1"


def head_dim_tile(d: int) -> int:
    """The kernels' head-dimension tile: ``d`` padded up to 64, 128 or 256."""
    return 64 if d <= 64 else 128 if d <= 128 else 256


def lang_dtype(torch_dtype: Any) -> Any:
    import torch

    from hexlayout.lang import bf16, f16

    return bf16 if torch_dtype == torch.bfloat16 else f16


def check_tensors(op: str, named: list[tuple[str, Any, int]]) -> None:
    """Each ``(name, value, rank)`` is a tensor of that rank."""
    import torch

    for name, t, rank in named:
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(op, name, f"expected a tensor, got {_kind(t)}")
        if t.dim() != rank:
            raise ArgumentError(op, name, f"must have {rank} dimensions, got shape {tuple(t.shape)}")


def check_device(op: str, first: tuple[str, Any], others: list[tuple[str, Any]]) -> None:
    name0, t0 = first
    if t0.device.type not in ("cuda", "cpu", "meta"):
        raise ArgumentError(op, name0, f"is on {t0.device}; supported: CUDA, CPU (HEXLAYOUT_EMULATE=1), meta")
    for name, t in others:
        if t.device != t0.device:
            raise ArgumentError(
                op, name, f"is on {t.device}, {name0} on {t0.device}; all tensors must be on one device"
            )


def check_rows(op: str, name: str, t: Any) -> None:
    """A contiguous last dimension, the other strides multiples of 8 elements and a 16-byte
    aligned start (the kernels move 16-byte vectors), offsets within 32-bit indexing."""
    if t.numel() == 0:
        return
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ArgumentError(
            op, name, f"has strides {tuple(t.stride())}: the last dimension must be contiguous (stride 1)"
        )
    for i, (s, n) in enumerate(zip(t.stride()[:-1], t.shape[:-1])):
        if n > 1 and s % 8:
            raise ArgumentError(
                op,
                name,
                f"stride {i} is {s} elements, expected a multiple of 8 (rows must be "
                "16-byte aligned for the kernels' 16-byte vectors)",
            )
    off = t.data_ptr() % 16 if _is_real(t) else t.storage_offset() * t.element_size() % 16
    if off:
        raise ArgumentError(op, name, f"starts {off} bytes off 16-byte alignment; pass {name}.clone()")
    span = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    if span > INT32_MAX:
        raise ArgumentError(
            op, name, f"spans {span + 1} elements; the kernels index with 32-bit int (< 2^31)"
        )


def check_kv_layout(op: str, kv_layout: Any) -> None:
    if not isinstance(kv_layout, str):
        raise ArgumentTypeError(
            op, "kv_layout", f"expected a string ('NHD' or 'HND'), got {_kind(kv_layout)}"
        )
    if kv_layout not in KV_LAYOUTS:
        raise ArgumentError(
            op,
            "kv_layout",
            f"must be 'NHD' ([num_blocks, block_size, KVH, D]) or 'HND' "
            f"([num_blocks, KVH, block_size, D]), not {kv_layout!r}",
        )


def check_caches(
    op: str, key_cache: Any, value_cache: Any, kv_layout: str, dtype: Any
) -> tuple[int, int, int, int]:
    """The two caches agree and fit the layout: returns ``(num_blocks, block_size, KVH, D)``."""
    shapes = {}
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        if c.dtype != dtype:
            raise ArgumentError(op, name, f"has dtype {c.dtype}, expected {dtype} (the dtype of the keys)")
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
    return nb, bs, kvh, d


def check_dtype(op: str, name: str, t: Any) -> None:
    import torch

    if t.dtype not in (torch.float16, torch.bfloat16):
        raise ArgumentError(op, name, f"has dtype {t.dtype}; supported: torch.float16, torch.bfloat16")


def check_reshape_and_cache(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, kv_layout: str = "NHD"
) -> None:
    """The arguments of ``reshape_and_cache`` (``hexlayout.ops.kv_cache``); raises naming the argument."""
    import torch

    op = "hexlayout.reshape_and_cache"
    check_tensors(
        op,
        [
            ("key", key, 3),
            ("value", value, 3),
            ("key_cache", key_cache, 4),
            ("value_cache", value_cache, 4),
            ("slot_mapping", slot_mapping, 1),
        ],
    )
    check_kv_layout(op, kv_layout)
    check_dtype(op, "key", key)
    check_device(
        op,
        ("key", key),
        [
            ("value", value),
            ("key_cache", key_cache),
            ("value_cache", value_cache),
            ("slot_mapping", slot_mapping),
        ],
    )
    if value.dtype != key.dtype:
        raise ArgumentError(op, "value", f"has dtype {value.dtype}, key {key.dtype}")
    if slot_mapping.dtype != torch.int64:
        raise ArgumentError(op, "slot_mapping", f"has dtype {slot_mapping.dtype}, expected torch.int64")
    if tuple(value.shape) != tuple(key.shape):
        raise ArgumentError(op, "value", f"has shape {tuple(value.shape)}, key {tuple(key.shape)}")
    nb, bs, kvh, d = check_caches(op, key_cache, value_cache, kv_layout, key.dtype)
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
        check_rows(op, name, x)
    if slot_mapping.numel() > 1 and slot_mapping.stride(0) != 1:
        raise ArgumentError(
            op, "slot_mapping", f"has stride {slot_mapping.stride(0)}, expected contiguous (1)"
        )
    if content_checks(slot_mapping) and t:
        hi = int(slot_mapping.max())
        if hi >= nb * bs:
            raise ArgumentError(
                op, "slot_mapping", f"holds slot {hi}, past the caches' {nb} blocks x {bs} slots"
            )


# --- building and running ---------------------------------------------------------------------------

_ARCHS: dict[Any, str] = {}


def build_for(kernel: Any, device: Any, consts: dict[str, Any]) -> Any:
    """``kernel`` built for ``device``: compiled for a CUDA device's architecture, synthesized
    only (for the emulator, ``HEXLAYOUT_EMULATE_ARCH``, default sm_80) for a CPU one."""
    from hexlayout.runtime import build

    if device.type == "cuda":
        import torch

        from .gemm import device_arch

        arch = _ARCHS.get(device)
        if arch is None:
            arch = _ARCHS[device] = device_arch(torch.cuda.get_device_capability(device))
        return build(kernel, arch, **consts)
    arch = os.environ.get("HEXLAYOUT_EMULATE_ARCH", "sm_80")
    return build(kernel, arch, compile=False, **consts)


def run_kernel(
    bld: Any, args: tuple[Any, ...], outputs: tuple[int, ...], strides: tuple[int, ...] = ()
) -> None:
    """Run ``bld`` on ``args`` (tensors and scalars) followed by the leading strides (all but
    the last) of the tensors ``strides`` indexes, as scalar arguments. CUDA tensors launch on
    torch's current stream with their own strides; CPU tensors run in the emulator, which needs
    C-contiguous arrays, so strided tensors go as contiguous copies (with their contiguous
    strides) and the ``outputs`` (indices into ``args``) are copied back."""
    import torch

    from hexlayout.runtime.torch_ops import run_build

    t0 = next(a for a in args if isinstance(a, torch.Tensor))
    if t0.device.type != "cuda":
        conv = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
    else:
        conv = list(args)
    extra = [int(s) for i in strides for s in conv[i].stride()[:-1]]
    run_build(bld, *conv, *extra)
    for i in outputs:
        if conv[i] is not args[i]:
            args[i].copy_(conv[i])


def _int(op: str, name: str, v: Any) -> int:
    import numbers

    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
        raise ArgumentTypeError(op, name, f"expected an int, got {_kind(v)}")
    return int(v)


def _real(op: str, name: str, v: Any, optional: bool = False) -> float | None:
    import math
    import numbers

    if v is None and optional:
        return None
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        raise ArgumentTypeError(
            op, name, f"expected a real number{' or None' if optional else ''}, got {_kind(v)}"
        )
    if not math.isfinite(float(v)):
        raise ArgumentError(op, name, f"must be finite, got {v}")
    return float(v)


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
    max_q, max_k = _int(op, "max_seqlen_q", max_seqlen_q), _int(op, "max_seqlen_k", max_seqlen_k)
    for name, v in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if v < 0:
            raise ArgumentError(op, name, f"must be >= 0, got {v}")
    scale = _real(op, "softmax_scale", softmax_scale, optional=True)
    if scale is not None and scale <= 0:
        raise ArgumentError(op, "softmax_scale", f"must be > 0, got {scale}")
    if not isinstance(causal, bool):
        raise ArgumentTypeError(op, "causal", f"expected a bool, got {_kind(causal)}")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ArgumentTypeError(op, "window_size", f"expected (left, right) ints, got {_kind(window_size)}")
    for w in window_size:
        if _int(op, "window_size", w) < -1:
            raise ArgumentError(
                op, "window_size", f"bounds must be >= 0 or -1 (unbounded), got {tuple(window_size)}"
            )
    cap = _real(op, "softcap", softcap)
    if cap is not None and cap < 0:
        raise ArgumentError(op, "softcap", f"must be >= 0 (0: no softcap), got {cap}")
    return max_q, max_k


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
) -> tuple[int, int, int, int, int, int]:
    """The arguments of ``paged_attention`` (``hexlayout.ops.attention``); raises naming the
    argument. Returns ``(B, H, KVH, D, block_size, max_blocks)``."""
    import torch

    op = "hexlayout.paged_attention"
    check_tensors(
        op,
        [
            ("q", q, 3),
            ("key_cache", key_cache, 4),
            ("value_cache", value_cache, 4),
            ("cu_seqlens_q", cu_seqlens_q, 1),
            ("seqused_k", seqused_k, 1),
            ("block_table", block_table, 2),
        ],
    )
    check_kv_layout(op, kv_layout)
    max_q, max_k = check_attention_options(
        op, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap
    )
    splits = _int(op, "num_splits", num_splits)
    if splits < 0:
        raise ArgumentError(op, "num_splits", f"must be >= 0 (0: chosen by the op), got {splits}")
    if splits > 16:
        raise ArgumentError(op, "num_splits", f"must be at most 16 (each count is a build), got {splits}")
    check_dtype(op, "q", q)
    check_device(
        op,
        ("q", q),
        [
            ("key_cache", key_cache),
            ("value_cache", value_cache),
            ("cu_seqlens_q", cu_seqlens_q),
            ("seqused_k", seqused_k),
            ("block_table", block_table),
        ],
    )
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("seqused_k", seqused_k), ("block_table", block_table)):
        if t.dtype != torch.int32:
            raise ArgumentError(op, name, f"has dtype {t.dtype}, expected torch.int32")
        if t.numel() > 1 and t.stride(-1) != 1:
            raise ArgumentError(
                op, name, f"has strides {tuple(t.stride())}: the last dimension must be contiguous"
            )
    nb, bs, kvh, d = check_caches(op, key_cache, value_cache, kv_layout, q.dtype)
    tq, h, dq = q.shape
    if dq != d:
        raise ArgumentError(op, "q", f"has head size {dq}, the caches {d}")
    if h % kvh:
        raise ArgumentError(op, "q", f"has {h} heads, not a multiple of the caches' {kvh} KV heads")
    check_rows(op, "q", q)
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
    return b, h, kvh, d, bs, maxb


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
    return_lse: Any = False,
) -> tuple[int, int, int, int]:
    """The arguments of ``attention_varlen`` (``hexlayout.ops.attention_varlen``); raises
    naming the argument. Returns ``(B, H, KVH, D)``."""
    import torch

    op = "hexlayout.attention_varlen"
    check_tensors(
        op,
        [
            ("q", q, 3),
            ("k", k, 3),
            ("v", v, 3),
            ("cu_seqlens_q", cu_seqlens_q, 1),
            ("cu_seqlens_k", cu_seqlens_k, 1),
        ],
    )
    max_q, max_k = check_attention_options(
        op, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap
    )
    if not isinstance(return_lse, bool):
        raise ArgumentTypeError(op, "return_lse", f"expected a bool, got {_kind(return_lse)}")
    check_dtype(op, "q", q)
    check_device(
        op, ("q", q), [("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)]
    )
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ArgumentError(op, name, f"has dtype {t.dtype}, q {q.dtype}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.dtype != torch.int32:
            raise ArgumentError(op, name, f"has dtype {t.dtype}, expected torch.int32")
        if t.numel() > 1 and t.stride(0) != 1:
            raise ArgumentError(op, name, f"has stride {t.stride(0)}, expected contiguous (1)")
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
        check_rows(op, name, t)
    if tq * h > INT32_MAX:
        raise ArgumentError(op, "q", f"has {tq} x {h} rows; the kernels index with 32-bit int")
    if content_checks(cu_seqlens_q):
        check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, "max_seqlen_q", max_q, "q", tq, "queries")
        check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, "max_seqlen_k", max_k, "k", tk, "keys")
    return b, h, kvh, d
