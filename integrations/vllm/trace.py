"""``HEXLAYOUT_VLLM_TRACE=<dir>``: one JSON line per hexlayout kernel call made through the plugin.

Each call appends ``{"pid": int, "kernel": str, "shapes": {...}, "dtype": str}`` to
``<dir>/hexlayout-vllm.<pid>.jsonl`` (one file per process, so processes never interleave
lines). ``kernel`` is one of :data:`TRACE_KERNELS` (``moe_prepare``: a layer's quantized
experts prepared once at load, ``shapes`` its parameter bytes before and after). Unset or
empty: nothing is written and no shape is computed (callers check :func:`trace_dir` first, so
the fast path never reads tensor contents).
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["TRACE_ENV", "TRACE_KERNELS", "trace_dir", "trace_path", "record", "record_attention"]

TRACE_ENV = "HEXLAYOUT_VLLM_TRACE"
TRACE_KERNELS: tuple[str, ...] = (
    "moe", "moe_w4a16", "moe_w8a16", "moe_prepare", "attention_prefill", "attention_decode", "mla_decode",
    "mamba_prefill", "mamba_decode", "conv1d",
)


def trace_dir() -> str | None:
    """The trace directory, or ``None`` when tracing is off."""
    return os.environ.get(TRACE_ENV) or None


def trace_path(directory: str, pid: int | None = None) -> str:
    """This process's trace file in ``directory``."""
    return os.path.join(directory, f"hexlayout-vllm.{os.getpid() if pid is None else pid}.jsonl")


def record(kernel: str, shapes: dict[str, Any], dtype: Any) -> None:
    """Append one call of ``kernel`` (with its ``shapes``: names to ints, int lists or strings) to this
    process's trace file; nothing when tracing is off."""
    directory = trace_dir()
    if directory is None:
        return
    if kernel not in TRACE_KERNELS:
        raise ValueError(f"hexlayout vLLM trace: unknown kernel {kernel!r}; expected one of {TRACE_KERNELS}")
    line = json.dumps(
        {"pid": os.getpid(), "kernel": kernel, "shapes": shapes, "dtype": str(dtype).removeprefix("torch.")}
    )
    os.makedirs(directory, exist_ok=True)
    with open(trace_path(directory), "a", encoding="utf-8") as f:
        f.write(line + "\n")


def record_attention(query: Any, num_kv_heads: int, block_size: int, md: Any,
                     features: dict[str, Any] | None = None) -> None:
    """One trace line per part of an attention call's batch (``query [T, H, D]``, metadata ``md``
    with ``query_start_loc`` and ``seq_lens``): decode sequences (one query token) and prefill
    sequences (several). ``features`` (e.g. ``{"sinks": 1, "window": 7, "kv_cache_dtype":
    "fp8"}``: what the call computed beyond plain causal attention) joins every line's shapes."""
    qlens = (md.query_start_loc[1:] - md.query_start_loc[:-1]).tolist()
    klens = md.seq_lens.tolist()
    _, h, d = query.shape
    for kernel, keep in (("attention_decode", lambda q: q == 1), ("attention_prefill", lambda q: q > 1)):
        part = [i for i, q in enumerate(qlens) if keep(q)]
        if part:
            shapes = {
                "num_seqs": len(part),
                "num_tokens": sum(qlens[i] for i in part),
                "max_seqlen_k": max(klens[i] for i in part),
                "num_heads": h,
                "num_kv_heads": num_kv_heads,
                "head_size": d,
                "block_size": block_size,
                **(features or {}),
            }
            record(kernel, shapes, query.dtype)
