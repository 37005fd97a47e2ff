"""``hexlayout.ops.attention_varlen``: attention over packed variable-length sequences
(prefill; FlashAttention's ``flash_attn_varlen_func`` semantics).

``attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, sinks=None, return_lse=False)``:

- ``q`` ``[total_q, H, D]``, ``k`` / ``v`` ``[total_k, KVH, D]`` (any strides with a contiguous
  last dimension, e.g. slices of a fused QKV output; strides multiples of 8 elements);
  sequence ``s`` owns query rows ``cu_seqlens_q[s] .. cu_seqlens_q[s+1]`` (``Sq`` of them) and
  key / value rows ``cu_seqlens_k[s] .. cu_seqlens_k[s+1]`` (``Sk``); ``cu_seqlens_*``
  ``[B+1]`` int32;
- ``o_i = sum_j softmax_j(s_ij) v_j`` over the visible keys, ``s_ij = (q_i . k_j) * scale``
  (``scale = softmax_scale`` or ``D^-0.5``; ``softcap > 0``: ``softcap * tanh(s_ij /
  softcap)``); key ``j`` (0-based within its sequence) is visible from query ``i`` when ``j <
  Sk`` and, with ``causal``, ``j <= i + Sk - Sq`` (bottom-right aligned), and with
  ``window_size = (left, right)`` (-1 = unbounded) ``i + Sk - Sq - left <= j <= i + Sk - Sq +
  right`` (intersected with the causal bound); query head ``h`` reads KV head ``h // (H /
  KVH)`` (GQA / MQA, any ratio). A row with no visible key is 0; ``lse`` ``[H, total_q]`` fp32
  is ``log sum_j exp(s_ij)`` (natural log; -inf for such a row).
- Attention sinks: ``sinks`` ``[H]`` f32, one logit ``t_h`` per query head joining the softmax
  denominator only (as ``paged_attention``'s): ``o_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij)
  + exp(t_h))``, ``lse_i = log(sum_j exp(s_ij) + exp(t_h))``. Example::

      out = attention_varlen(q, k, v, cu, cu, 5, 5, causal=True, sinks=torch.zeros(q.shape[1]))
- Rows past ``cu_seqlens_q[-1]`` (CUDA-graph padding) are not written: given ``out`` / ``lse``
  keep what they held there; in the ``out`` / ``lse`` the op allocates they are unspecified on
  every device (``host.launch.fresh``: uninitialised on CUDA, NaN on the emulated CPU path).
  Every other row is written, a row with no visible key included.

Returns ``out`` (``[total_q, H, D]``, q's dtype), or ``(out, lse)`` with ``return_lse=True``.
``max_seqlen_q`` sizes the grid (``B x H x ceil(max_seqlen_q / BM)`` thread blocks, never
the tensor contents: no host synchronization); it must bound every sequence's query count,
which the content checks of ``check_attention_varlen`` enforce on CPU and, on CUDA, under
``HEXLAYOUT_CHECK=1``. Head sizes up to 256 (multiples of 8) run the kernel built for 64,
128 or 256. The kernel: ``attention_varlen_kernels``; on sm_90a (a Hopper device, or
``HEXLAYOUT_EMULATE_ARCH=sm_90a`` in the emulator) with TMA-compatible q / k / v (16-byte
aligned data and row strides) ``attention_kernels_sm90.attention_varlen_sm90_kernel``
(FlashAttention-3's structure: a TMA producer warp group, two wgmma consumer warp groups).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..host.device import kernel_arch
from ..host.launch import build_for, lang_dtype, rows_input, run_kernel
from ..host.torch import require_torch
from .args import check_attention_varlen, head_dim_tile
from .kernels_sm90 import attention_varlen_sm90_consts, attention_varlen_sm90_kernel, tma_compatible
from .launch_args import attention_outputs, score_scales, sinks_arg
from .varlen_kernels_sm80 import attention_varlen_kernel

__all__ = ["attention_varlen", "attention_varlen_consts", "run_attention_varlen", "VARLEN_CONFIGS"]

#: Per padded head size: query rows (BM) and keys (BN) per step, warps, register blocking
#: (CHUNK keys x DCHUNK head columns per S sub-tile). Each compiles without spills for
#: sm_80 and sm_90a (``tests/ops/test_attention_varlen_compile.py``).
VARLEN_CONFIGS: dict[int, dict[str, int]] = {
    64: {"BM": 128, "BN": 64, "WARPS": 8, "CHUNK": 64, "DCHUNK": 64},
    128: {"BM": 128, "BN": 64, "WARPS": 8, "CHUNK": 32, "DCHUNK": 64},
    256: {"BM": 64, "BN": 16, "WARPS": 4, "CHUNK": 16, "DCHUNK": 32},
}
#: Changes for a left window bound or a softcap (more live registers: head size 128 with both
#: spilled 16 registers on sm_90a with DCHUNK 64).
VARLEN_HEAVY: dict[int, dict[str, int]] = {128: {"DCHUNK": 32}}


def attention_varlen_consts(head_size: int, left: bool, right: bool, softcap: bool) -> dict[str, Any]:
    """The kernel's constants for ``head_size`` (padded to 64 / 128 / 256): the tile config of
    ``VARLEN_CONFIGS`` (with ``VARLEN_HEAVY``'s changes for a left bound or a softcap), ``LEFT``
    / ``RIGHT`` (a window's left bound; causal or a window's right bound) and ``SOFTCAP``."""
    hd = head_dim_tile(head_size)
    cfg = VARLEN_CONFIGS[hd]
    if left or softcap:
        cfg = {**cfg, **VARLEN_HEAVY.get(hd, {})}
    return {
        **cfg,
        "HEAD_DIM": hd,
        "LEFT": bool(left),
        "RIGHT": bool(right),
        "SOFTCAP": bool(softcap),
    }


def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Any = None,
    return_lse: bool = False,
) -> Any:
    """Varlen attention (see the module docstring): ``out`` or ``(out, lse)``."""
    require_torch("hexlayout.ops.attention_varlen")
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale, causal, window_size, softcap, sinks)
    check_attention_varlen(*args, return_lse)
    out, lse = run_attention_varlen(*args)
    return (out, lse) if return_lse else out


def run_attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Any = None,
    *,
    out: Any = None,
    lse: Any = None,
) -> tuple[Any, Any]:
    """``attention_varlen`` on checked arguments, in the order of the op's schema (it is
    ``torch.ops.hexlayout.attention_varlen``'s implementation; ``window_size`` a tuple or a list;
    ``max_seqlen_k`` is not needed: the kernels bound keys by ``cu_seqlens_k``), into ``out`` /
    ``lse`` when given. The mask goes to the kernel as key bounds relative to each row's aligned
    key ``i + Sk - Sq``: ``[-left, right]``, causal making ``right = min(right, 0)``, an unbounded
    side ``2^30``."""
    q, k, v = rows_input(q), rows_input(k), rows_input(v)   # in place, or copies 16-byte vectors can read
    tq, h, d = q.shape
    out, lse = attention_outputs(q, out, lse)
    b = cu_seqlens_q.shape[0] - 1
    if b <= 0 or tq == 0 or h == 0 or max_seqlen_q == 0:
        return out, lse
    big = 1 << 30  # an unbounded side
    left, right = window_size
    left = left if left >= 0 else big
    right = right if right >= 0 else big
    if causal:
        right = min(right, 0)
    qk_scale, cap_arg = score_scales(softmax_scale, softcap, d)
    sinks, has_sinks = sinks_arg(sinks, q.device)
    if kernel_arch(q.device) == "sm_90a" and tma_compatible(q, k, v):  # wgmma + TMA (FA3 structure)
        consts = attention_varlen_sm90_consts(head_dim_tile(d), left < big, right < big, cap_arg > 0)
        bld = build_for(attention_varlen_sm90_kernel(lang_dtype(q.dtype)), q.device,
                        {**consts, "SINKS": has_sinks})
    else:
        consts = attention_varlen_consts(d, left < big, right < big, cap_arg > 0)
        consts["SINKS"] = has_sinks
        bld = build_for(attention_varlen_kernel(lang_dtype(q.dtype)), q.device, consts)
    tiles = -(-max_seqlen_q // consts["BM"])
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, sinks, qk_scale, cap_arg, left, right, tiles)
    run_kernel(bld, args, outputs=(5, 6), strides=(0, 1, 2))
    return out, lse
