"""``hexlayout.ops.paged_attention``: attention over a paged KV cache (FlashAttention's varlen
semantics), mixed prefill and decode in one call.

``paged_attention(q, key_cache, value_cache, cu_seqlens_q, seqused_k, block_table,
max_seqlen_q, max_seqlen_k, *, softmax_scale=None, causal=True, window_size=(-1, -1),
softcap=0.0, kv_layout="NHD", num_splits=0, sinks=None, kv_cache_dtype="auto", k_scale=None,
v_scale=None, return_lse=False)``:

- ``q`` ``[total_q, H, D]`` (any strides with a contiguous last dimension: a slice of a fused
  QKV output works); sequence ``s`` owns rows ``cu_seqlens_q[s] .. cu_seqlens_q[s+1]``
  (``cu_seqlens_q`` ``[B+1]`` int32) and has ``Sk = seqused_k[s]`` keys (``[B]`` int32, the
  context length including the new tokens);
- caches ``[num_blocks, block_size, KVH, D]`` (``kv_layout="NHD"``) or ``[num_blocks, KVH,
  block_size, D]`` (``"HND"``; e.g. the halves ``[..., :D]`` / ``[..., D:]`` of vLLM's CPU
  ``[num_blocks, KVH, block_size, 2·D]`` tensor); block sizes 16, 32, 64, 128; key ``j`` of
  sequence ``s`` is row ``j % block_size`` of block ``block_table[s, j // block_size]``
  (``[B, max_blocks]`` int32; entries past a sequence's last block are never read);
- ``o_i = sum_j softmax_j(s_ij) v_j`` over the visible keys, ``s_ij = (q_i . k_j) * scale``
  (``scale = softmax_scale`` or ``D^-0.5``; ``softcap > 0``: ``softcap * tanh(s_ij / softcap)``),
  key ``j`` visible from query ``i`` (0-based within its sequence) when ``j < Sk`` and, with
  ``causal``, ``j <= i + Sk - Sq`` (bottom-right aligned), and with ``window_size = (left,
  right)`` (-1 = unbounded) ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``; query head ``h``
  reads KV head ``h // (H / KVH)`` (GQA / MQA, any ratio). A row with no visible key is 0;
  ``lse`` ``[H, total_q]`` fp32 is ``log sum_j exp(s_ij)`` (natural log, -inf for such a row).
- Attention sinks (gpt-oss; vLLM FlashAttention's ``sinks``): ``sinks`` ``[H]`` f32, one
  logit ``t_h`` per query head that joins the softmax denominator only: ``o_i = sum_j
  exp(s_ij) v_j / (sum_j exp(s_ij) + exp(t_h))`` and ``lse_i = log(sum_j exp(s_ij) +
  exp(t_h))`` (a row with no visible key: 0 and ``t_h``). Example (4 heads)::

      sinks = torch.zeros(4)            # each head's denominator gains e^0 = 1
      out = paged_attention(q, kc, vc, cu, seqused_k, table, 1, 40, sinks=sinks)
- FP8 caches (``kv_cache_dtype`` ``"fp8"`` / ``"fp8_e4m3"`` / ``"fp8_e5m2"``, as written by
  ``reshape_and_cache``; ``torch.uint8`` or the format's ``torch.float8_*`` dtype, head size
  and strides multiples of 16): key ``j`` is ``k_scale * key_cache[..]`` and value ``j`` is
  ``v_scale * value_cache[..]`` (scales: one-element float32 tensors read by the kernel,
  numbers, or None = 1.0). The kernels convert the cache rows to q's dtype (exact) on their way
  to shared memory and fold ``k_scale`` into the scores' scale and ``v_scale`` into the output;
  every architecture takes this conversion path (the FP8 MMAs of sm_89 / sm_90a would need Q
  and P rounded to FP8 as well).
- Rows past ``cu_seqlens_q[-1]`` (CUDA-graph padding) are not written: given ``out`` / ``lse``
  keep what they held there; in the ``out`` / ``lse`` the op allocates they are unspecified on
  every device (``host.launch.fresh``: uninitialised on CUDA, NaN on the emulated CPU path).
  Every other row is written, a row with no visible key included.

Returns ``out`` (``[total_q, H, D]``, q's dtype), or ``(out, lse)`` with ``return_lse=True``.
``max_seqlen_q`` sizes the grid (never the tensor contents: no host synchronization), so it
must bound every sequence's query count; the content checks of ``check_paged_attention``
enforce that on CPU and, on CUDA, under ``HEXLAYOUT_CHECK=1``.

Split-KV: ``num_splits > 1`` (at most 16) runs the kernel with each split taking its share of
every sequence's key blocks, writing normalized partial outputs and LSEs (f32 workspaces), and
a combine kernel merging them (``o = sum_sp exp(lse_sp - lse) o_sp``, ``lse = log sum_sp
exp(lse_sp)``); ``num_splits=0`` chooses from the grid's block count, ``max_seqlen_k`` and the
SM count (``choose_splits``; 1 on the CPU), never from tensor contents.

On sm_90a (a Hopper device, or ``HEXLAYOUT_EMULATE_ARCH=sm_90a`` in the emulator) the kernel
is ``attention_kernels_sm90.paged_attention_sm90_kernel`` (wgmma for both products, same
arguments and split-KV partials); on sm_100a the same kernel built with tcgen05
(``paged_attention_sm100_*``, constants ``paged_attention_sm100_consts``) for head sizes padded
to 256 without an FP8 cache (``paged_sm100_tcgen05``: the static numbers), the mma.sync kernel
otherwise; sm_80 / sm_89 run the mma.sync kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.tmem import TMEM_COLUMNS

from ..host.device import kernel_arch, sm_count
from ..host.launch import build_for, fresh, lang_dtype, rows_input, run_kernel
from ..host.torch import require_torch
from .args import check_paged_attention, fp8_format, head_dim_tile
from .kernels_sm90 import paged_attention_sm90_kernel
from .launch_args import attention_outputs, fp8_cache_view, scale_arg, score_scales, sinks_arg
from .paged_kernels_sm80 import paged_attention_combine_kernel, paged_attention_kernel

__all__ = [
    "paged_attention",
    "paged_attention_consts",
    "paged_whole_pages",
    "paged_attention_sm90_consts",
    "paged_attention_sm100_consts",
    "paged_sm100_tcgen05",
    "SM100_TCGEN05_HEADS",
    "run_paged_attention",
]


def paged_attention_consts(
    head_size: int, block_size: int, group: int, max_seqlen_q: int, causal: bool, window: bool, softcap: bool,
    *, heavy: bool = False
) -> dict[str, Any]:
    """The kernel's constants: 64 rows (token, head) and 32 keys per step on 4 warps (16 keys for
    head size 256, S summed over 128-column halves of Q and K: Q's fragment is loaded per half
    instead of held whole, 64 registers fewer, so that every variant - split-KV, window, softcap,
    sinks, an FP8 cache - fits without spills; 64 keys for head size 128, S per 32-key chunk
    summed over 64-column halves of Q and K, so the rescale of O is shared by twice the keys
    without spills, unless a window, a softcap or ``heavy`` (sinks, an FP8 cache) holds more
    registers: then 32); the grid's row tiles from ``max_seqlen_q`` and the group size."""
    bm = 64
    hd = head_dim_tile(head_size)
    wide = hd == 128 and not (window or softcap or heavy)
    chunks = {"CHUNK": 32, "DCHUNK": 64} if wide else {"DCHUNK": 128} if hd == 256 else {}
    return {
        "BM": bm,
        "BN": 16 if hd == 256 else 64 if wide else 32,
        **chunks,
        "HEAD_DIM": hd,
        "BLOCK": block_size,
        "WARPS": 4,
        "CAUSAL": bool(causal),
        "WINDOW": bool(window),
        "SOFTCAP": bool(softcap),
        "TILES": max(1, -(-max_seqlen_q * group // bm)),
    }


def paged_whole_pages(block_size: int, head_size: int) -> tuple[int, int] | None:
    """``paged_attention_kernel``'s ``whole``: ``(block_size, head_size)`` for head sizes 64 and
    128 (no padded column: unmasked key blocks read whole pages as plain windows, a kernel per
    block size), else None (gathered rows; at 256 the windows' addresses would spill)."""
    return (block_size, head_size) if head_size in (64, 128) else None


def paged_attention_sm90_consts(
    head_size: int, block_size: int, group: int, max_seqlen_q: int, causal: bool, window: bool, softcap: bool
) -> dict[str, Any]:
    """The sm_90a kernel's constants: 64 rows, 64 keys per step. Up to head size 128 two consumer
    warp groups take alternate key blocks (``KSPLIT=2``, merged at the end); ``OVERLAP`` (a key
    block's softmax beside the previous block's ``P V``, three K / V buffers per warp group)
    where the shared memory holds it: head size 64 with two warp groups, 128 with one. Head
    size 256: one warp group, each product waited for (the accumulator leaves no registers for
    a second score tile, nor shared memory for a second warp group's buffers)."""
    consts = paged_attention_consts(head_size, block_size, group, max_seqlen_q, causal, window, softcap)
    for name in ("WARPS", "CHUNK", "DCHUNK"):                  # the sm_80 kernel's only
        consts.pop(name, None)
    hd = consts["HEAD_DIM"]
    ksplit = 2 if hd <= 128 else 1
    return {**consts, "BN": 64, "WG": 1, "KSPLIT": ksplit, "OVERLAP": hd <= (64 if ksplit == 2 else 128)}


def paged_attention_sm100_consts(
    head_size: int, block_size: int, group: int, max_seqlen_q: int, causal: bool, window: bool, softcap: bool
) -> dict[str, Any]:
    """The constants of ``paged_attention_sm90_kernel`` built for sm_100a (tcgen05, the same source):
    the sm_90a kernel's (``paged_attention_sm90_consts``) where their accumulators and P fit in
    the 512 TMEM columns, else without ``OVERLAP``, then with one consumer warp group.

    Per consumer warp group the build holds in TMEM (one column per f32 accumulator column, one
    per two 16-bit elements of P) a ``BN``-column score tile per key-loop segment (two; one with a
    window: every block masked) and one more with ``OVERLAP`` (the first block's, issued before
    the loop), the output accumulator (``HEAD_DIM``) and P (``BN / 2``): the lowering gives each
    accumulator its own columns, and where P would not fit synthesis stages it through shared
    memory, whose register layout the S tile's ``tcgen05.ld`` does not give (no build). One warp
    group takes ``OVERLAP`` up to head size 128, as on sm_90a. The tests run every configuration
    this returns in the emulator but head size 256 with a window (the same constants as without)."""
    c = paged_attention_sm90_consts(head_size, block_size, group, max_seqlen_q, causal, window, softcap)

    def columns(ksplit: int, overlap: bool) -> int:
        scores = c["BN"] * ((1 if window else 2) + overlap)
        return ksplit * (scores + c["HEAD_DIM"] + c["BN"] // 2)

    tries = ((c["KSPLIT"], c["OVERLAP"]), (c["KSPLIT"], False), (1, c["HEAD_DIM"] <= 128), (1, False))
    for ksplit, overlap in tries:
        if columns(ksplit, overlap) <= TMEM_COLUMNS:
            return {**c, "KSPLIT": ksplit, "OVERLAP": overlap}
    raise ValueError(f"paged attention on sm_100a: head size {head_size} does not fit in tensor memory")


#: Padded head sizes whose sm_100a paged attention runs the tcgen05 build of
#: ``paged_attention_sm90_kernel`` (``paged_sm100_tcgen05``).
SM100_TCGEN05_HEADS: frozenset[int] = frozenset({256})


def paged_sm100_tcgen05(head_size: int, fp8: bool = False) -> bool:
    """Whether sm_100a paged attention of ``head_size`` (``fp8``: an FP8 cache) runs the tcgen05
    build of the sm_90a kernel (else the mma.sync kernel): padded head sizes in
    ``SM100_TCGEN05_HEADS``, caches of q's type. Both builds match float64 in the emulator and
    compile without spills (``tests/ops/test_attention_sm100.py``); the static numbers decide
    (``hexlayout.runtime.stats``, f16, block size 16, GQA 8, causal): the main loop's non-MMA
    instructions per warp and 64-key block of 64 rows are

    ========= ============== =============== ========================
    head size tcgen05 build  mma.sync kernel  (sm_90a wgmma build)
    ========= ============== =============== ========================
    64        481            312 (2 x 156)    487
    128       760            333              701
    256       1209           1620 (4 x 405)   1104
    ========= ============== =============== ========================

    and the mma.sync kernel's warps issue their HMMAs besides (68, 132 and 260). Below 256 the
    mma.sync kernel reads whole pages as windows in its unmasked blocks where the sm_90a source
    gathers each row through the block table (the wgmma build's counts are of that source too); at
    256 the mma.sync kernel takes 16 keys a step (its registers) and the tcgen05 build 64, with
    S and O in tensor memory. FP8 caches keep the mma.sync kernel (the conversion path of the
    tcgen05 build is not measured)."""
    return not fp8 and head_dim_tile(head_size) in SM100_TCGEN05_HEADS


def paged_attention(
    q: Any,
    key_cache: Any,
    value_cache: Any,
    cu_seqlens_q: Any,
    seqused_k: Any,
    block_table: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    kv_layout: str = "NHD",
    num_splits: int = 0,
    sinks: Any = None,
    kv_cache_dtype: str = "auto",
    k_scale: Any = None,
    v_scale: Any = None,
    return_lse: bool = False,
) -> Any:
    """Paged attention (see the module docstring): ``out`` or ``(out, lse)``."""
    require_torch("hexlayout.ops.paged_attention")
    args = (q, key_cache, value_cache, cu_seqlens_q, seqused_k, block_table, max_seqlen_q, max_seqlen_k,
            softmax_scale, causal, window_size, softcap, kv_layout, num_splits, sinks, kv_cache_dtype,
            k_scale, v_scale)
    check_paged_attention(*args)
    out, lse = run_paged_attention(*args)
    return (out, lse) if return_lse else out


def run_paged_attention(
    q: Any,
    key_cache: Any,
    value_cache: Any,
    cu_seqlens_q: Any,
    seqused_k: Any,
    block_table: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    kv_layout: str = "NHD",
    num_splits: int = 0,
    sinks: Any = None,
    kv_cache_dtype: str = "auto",
    k_scale: Any = None,
    v_scale: Any = None,
    *,
    out: Any = None,
    lse: Any = None,
) -> tuple[Any, Any]:
    """``paged_attention`` on checked arguments, in the order of the op's schema (it is
    ``torch.ops.hexlayout.paged_attention``'s implementation; ``window_size`` a tuple or a list),
    into ``out`` / ``lse`` when given (``q`` read in place, or from a contiguous copy when
    16-byte row vectors cannot)."""
    import torch

    q = rows_input(q)
    tq, h, d = q.shape
    fmt = fp8_format(kv_cache_dtype)
    kc = fp8_cache_view(key_cache if kv_layout == "NHD" else key_cache.transpose(1, 2), fmt)
    vc = fp8_cache_view(value_cache if kv_layout == "NHD" else value_cache.transpose(1, 2), fmt)
    bs, kvh = kc.shape[1], kc.shape[2]
    out, lse = attention_outputs(q, out, lse)
    b = seqused_k.shape[0]
    if b == 0 or tq == 0:
        return out, lse
    left, right = window_size
    window = left >= 0 or right >= 0
    qk_scale, cap_arg = score_scales(softmax_scale, softcap, d)
    arch = kernel_arch(q.device)
    sinks, has_sinks = sinks_arg(sinks, q.device)
    shape = (d, bs, h // kvh, max_seqlen_q, causal, window, cap_arg > 0)
    tc = None                                                  # the wgmma / tcgen05 kernel's constants
    if arch == "sm_90a":
        tc = paged_attention_sm90_consts(*shape)
    elif arch == "sm_100a" and paged_sm100_tcgen05(d, fmt is not None):
        tc = paged_attention_sm100_consts(*shape)
    sm90 = tc is not None
    if sm90:
        consts = tc
        kernel_of = functools.partial(paged_attention_sm90_kernel, arch=arch)
    else:
        kernel_of = paged_attention_kernel
        consts = paged_attention_consts(*shape, heavy=has_sinks or fmt is not None)
    consts["SINKS"] = has_sinks
    splits = num_splits or choose_splits(q.device, b * kvh * consts["TILES"], max_seqlen_k)
    dt = lang_dtype(q.dtype)
    if splits > 1:
        consts["SPLITS"] = splits
        o_part = fresh((splits, tq, h, d), torch.float32, q.device)
        lse_part = fresh((splits, h, tq), torch.float32, q.device)
    else:
        o_part, lse_part = out, lse
    fp8 = getattr(hl, fmt) if fmt else None
    whole = None if sm90 or fp8 is not None else paged_whole_pages(bs, d)   # FP8: converted rows
    kernel = kernel_of(dt, splits > 1, fp8, whole) if whole else kernel_of(dt, splits > 1, fp8)
    bld = build_for(kernel, q.device, consts)
    big = 1 << 30  # an unbounded side of a window
    args = (
        q,
        kc,
        vc,
        cu_seqlens_q,
        seqused_k,
        block_table,
        o_part,
        lse_part,
        sinks,
        scale_arg(k_scale, q.device),
        scale_arg(v_scale, q.device),
        h // kvh,
        qk_scale,
        cap_arg,
        left if left >= 0 else big,
        right if right >= 0 else big,
    )
    run_kernel(bld, args, outputs=(6, 7), strides=(0, 1, 2, 5))
    if splits > 1:
        comb = build_for(
            paged_attention_combine_kernel(dt),
            q.device,
            {"ROWS": 16, "HEAD_DIM": consts["HEAD_DIM"], "SPLITS": splits},
        )
        run_kernel(comb, (o_part, lse_part, cu_seqlens_q, out, lse), outputs=(3, 4))
    return out, lse


#: The largest split count (each count is its own build).
MAX_SPLITS = 16


def choose_splits(device: Any, blocks: int, max_seqlen_k: int) -> int:
    """Split-KV count when the caller leaves it to the op: from the grid's block count, the
    longest context and the device's SM count only (never tensor contents: capture-safe).
    1 on the CPU (emulator) and when the blocks fill the SMs or contexts are short; else as
    many splits as fill the SMs, each with at least 256 keys, at most 8."""
    if device.type != "cuda" or max_seqlen_k <= 256:
        return 1
    sms = sm_count(device)
    if blocks >= sms:
        return 1
    return max(1, min(8, sms // max(blocks, 1), -(-max_seqlen_k // 256)))


