"""W4A16 / W8A16 fused mixture of experts: ``prepare_wna16`` and the run function of
``torch.ops.hexlayout.fused_moe_wna16`` (``hexlayout.ops.fused_moe`` dispatches here when ``w13``
/ ``w2`` are ``WNA16Weights``).

``prepare_wna16(qweight, scales, qzeros=None, *, quant_format, bits, group_size, gate_up=False,
arch=None)`` takes the
quantized expert weights of a projection ``y = x @ W`` (input dim ``K``, output dim ``N``;
``w13``: ``K = H``, ``N = 2I``, columns ``[gate | up]``; ``w2``: ``K = I``, ``N = H``) stacked
over ``E`` experts as checkpoints store them:

- ``quant_format="awq"`` (``bits=4``): ``qweight`` ``[E, K, N/8]`` int32, nibble ``i`` of word
  ``w`` holding column ``8w + [0,2,4,6,1,3,5,7][i]``; ``qzeros`` ``[E, K/G, N/8]`` packed the
  same way; ``W[k, n] = (q[k, n] - z[k/G, n]) * s[k/G, n]``.
- ``quant_format="gptq"`` (symmetric; ``bits`` 4 or 8): ``qweight`` ``[E, K*bits/32, N]`` int32,
  value ``i`` of word ``r`` (bits ``[bits*i, bits*(i+1))``) holding row ``(32/bits) r + i``; no
  ``qzeros``; ``W[k, n] = (q[k, n] - 2^(bits-1)) * s[k/G, n]``; with act-order (``g_idx``
  ``[E, K]``) ``s[g_idx[e, k], n]`` instead, the rows permuted once into group order and the
  activations gathered by the recorded ``perm`` in the op (``act_order``).
- ``quant_format="mxfp4"``: made by ``prepare_mxfp4`` (``mxfp4``), e2m1 codes as 4-bit values,
  group 32, no zero point (``ZERO = -1``): ``W[k, n] = e2m1(q[k, n]) * s[k/32, n]``.
- ``scales`` ``[E, K/G, N]`` f16 / bf16 (the activations' dtype); ``group_size`` ``G`` 32, 64,
  128 or -1 (one group over K).

It re-lays the weights out once (torch ops, at load time) into what the kernels load: the
kernels declare ``q`` ``hl.offline`` and synthesis chooses its storage order with the register
fragment each weight tile feeds (``wna16_layout``, ``hexlayout.ir.offline``), so
``prepare_wna16`` synthesizes the kernel for the target (``arch=``, default the device's, or
``HEXLAYOUT_EMULATE_ARCH`` for CPU tensors; sm_80 / sm_89 run ``moe_wna16_kernels``, mma.sync,
sm_90a ``moe_wna16_kernels_sm90``, swap-AB wgmma with the dequantized weights as its register
A operand, sm_100a (compute capability 10.0) ``moe_wna16_kernels_sm100``, swap-AB tcgen05 with
the dequantized weights stored to a shared tile the MMA reads, the accumulator in tensor
memory) and applies its permutation: ``q`` uint8 ``[E*NP, KP*bits/8]`` (column ``n`` of
expert ``e`` is logical row ``e*NP + n``; ``NP``, ``KP`` padded to whole tiles with zeros; 4-bit:
two values per byte, even k in the low nibble); the scales and AWQ's zero points (unpacked to
one ``uint8`` byte per 4-bit zero point: with f16 / bf16 scales the prepared tensors hold ``1 +
1 / (G + 5)`` of the checkpoint's bytes, 1.027 at ``G = 32``; the kernels convert them once per
group) are offline tensors too, ``[E*NP, K/G]`` (row ``e*NP + n`` as ``q``'s, column the group)
in the order synthesis gives the register column that consumes them (``wna16_layout.
relayout_groups``: a thread's columns one run), held as their ``[E, K/G, N]`` views (strides
``(NP*K/G, NP, 1)``: the op reads ``E``, ``K/G`` and ``N`` from them). The result is a
``WNA16Weights``, a plain container of those tensors, the format constants and the layouts' key
(``wna16_layout.offline_key``); the op refuses weights whose key is not the one of the kernel it
runs.

Split-K (decode): ``wna16_split_k`` (``moe_splitk.choose_split_k`` on the kernels' tiles, from
the sizes and the SM count only: capture-safe) gives each GEMM's tiles ``SPLIT_K`` blocks over
disjoint whole k-tiles when the grid is below a wave (the DeepSeek-V3 TP8 slice at T = 1: 32
gate-up tiles x 8 splits of 14 of the 112 k-tiles); their f32 partials go atomically into a
zeroed workspace (gate-up ``[2, EM, I]`` by sorted position, then ``moe_splitk_act_kernel``
writes ``h``; down ``[T * k, H]``, then ``moe_splitk_cast_kernel`` writes ``y``).
``HEXLAYOUT_MOE_SPLIT_K=n`` forces ``SPLIT_K = n`` (1: off) for both GEMMs, on CPU tensors too;
otherwise CPU tensors never split. The order of the atomic additions is not defined (f32 results
may differ in their last bits from run to run before the rounding to the dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError

from ..host.device import kernel_arch, sm_count
from ..host.torch import require_torch
from .act_order import (
    act_order_perm,
    check_perm,
    check_perm_content,
    permute_rows,
    permuted_inter,
    permuted_tokens,
)
from .pipeline import prepared_fused_moe
from .wna16_layout import k_tile

__all__ = [
    "WNA16Weights",
    "prepare_wna16",
    "fused_moe_wna16",
    "check_fused_moe_wna16",
    "run_fused_moe_wna16",
    "wna16_config",
    "wna16_sm90_config",
    "wna16_split_k",
    "AWQ_ORDER",
]

OP = "hexlayout.prepare_wna16"
RUN_OP = "hexlayout.fused_moe_wna16"
#: AWQ's nibble order: nibble ``i`` of a word holds column ``8w + AWQ_ORDER[i]``
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
GROUP_SIZES = (32, 64, 128, -1)
#: the architectures with W4A16 / W8A16 kernels: mma.sync (sm_80, sm_89), register-A wgmma
#: (sm_90a), tcgen05 with the dequantized weights staged in shared memory (sm_100a)
ARCHS = ("sm_80", "sm_89", "sm_90a", "sm_100a")
#: the kernels' ``GROUP`` for ``group_size=-1`` (every k-tile in group 0)
ONE_GROUP = 1 << 30


@dataclass(frozen=True)
class WNA16Weights:
    """Quantized expert weights re-laid out for the W4A16 / W8A16 kernels (``prepare_wna16``).

    ``qweight`` uint8 ``[E*NP, KP*bits/8]``: the logical rows ``e*NP + n`` (column ``n`` of
    expert ``e``'s ``W`` along K, padded: ``wna16_layout``) in the synthesized offline order
    ``layout_key`` (``hexlayout.ir.offline``; ``gate_up``: gate and up padded apart);
    ``scales`` f16 / bf16 (MXFP4: uint8 e8m0 exponents, ``s = 2^(b - 127)``), ``zeros`` uint8
    (AWQ) or None (GPTQ: ``2^(bits-1)``; MXFP4: e2m1 codes, no zero point), both the ``[E, G,
    N]`` views of offline ``[E*NP, G]`` tensors (``wna16_layout.relayout_groups``; their order is
    in ``layout_key`` too); ``W[e, k, n] = (q - z) * s``
    with the group ``k // group_size`` (one group for -1). ``perm`` int32 ``[E, K]`` (GPTQ
    act-order) or None: the rows of K were permuted by it (``q``'s row ``k`` is the checkpoint's
    row ``perm[e, k]``), and the op gathers the activations' columns by it. ``act_dtype``: the
    activations' dtype where the scales are not in it (MXFP4's e8m0 bytes), else None."""

    qweight: Any
    scales: Any
    zeros: Any
    quant_format: str
    bits: int
    group_size: int
    num_experts: int
    size_k: int
    size_n: int
    layout_key: str = ""
    gate_up: bool = False
    perm: Any = None
    act_dtype: Any = None

    @property
    def dtype(self) -> Any:
        """The activations' dtype (the scales' unless they are e8m0 bytes: ``act_dtype``)."""
        return self.scales.dtype if self.act_dtype is None else self.act_dtype

    def mismatch(self, w2: WNA16Weights) -> str | None:
        """Why ``w2`` cannot be the down projection of these gate-up weights, or ``None``."""
        if (w2.quant_format, w2.bits) != (self.quant_format, self.bits):
            return (f"is {w2.quant_format} {w2.bits}-bit, w13 {self.quant_format} {self.bits}-bit: both must "
                    "share one format")
        return None

    def op_args(self, w2: WNA16Weights) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """``fused_moe_wna16``'s weight tensors (these as ``w13``, then ``w2``) and constants."""
        return ((self.qweight, self.scales, self.zeros, w2.qweight, w2.scales, w2.zeros),
                (self.quant_format, self.bits, self.group_size, w2.group_size))

    def op_kwargs(self, w2: WNA16Weights) -> dict[str, Any]:
        """``fused_moe_wna16``'s keyword arguments: the offline layout keys the op checks
        (``w13_layout``, ``w2_layout``) and the act-order permutations, when there are any."""
        kw: dict[str, Any] = {"w13_layout": self.layout_key, "w2_layout": w2.layout_key}
        if self.perm is not None or w2.perm is not None:
            kw.update(w13_perm=self.perm, w2_perm=w2.perm)
        return kw


def _fail(name: str, msg: str) -> ArgumentError:
    return ArgumentError(OP, name, msg)


def _int32_3d(name: str, t: Any) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(OP, name, f"expected a tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise _fail(name, f"must be int32 (packed words), got {t.dtype}")
    if t.dim() != 3:
        raise _fail(name, f"must have 3 dimensions [E, ., .], got shape {tuple(t.shape)}")


def _unpack(words: Any, bits: int, dim: int) -> Any:
    """The ``32/bits`` values of each int32 word, value ``i`` at position ``(32/bits) w + i``
    along ``dim`` (sequential order), as int32 in ``[0, 2^bits)``."""
    import torch

    per = 32 // bits
    shifts = torch.arange(per, device=words.device, dtype=torch.int32) * bits
    v = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., per] along the last dim
    v = v.movedim(-1, dim + 1) if dim != words.dim() - 1 else v
    shape = list(words.shape)
    shape[dim] *= per
    return v.reshape(shape)


def _awq_columns(words: Any) -> Any:
    """AWQ words ``[..., N/8]`` -> values ``[..., N]`` (column ``8w + AWQ_ORDER[i]`` from nibble ``i``)."""
    seq = _unpack(words, 4, words.dim() - 1)  # column 8w + i holds nibble i
    perm = [0] * 8
    for i, j in enumerate(AWQ_ORDER):
        perm[j] = i
    n = seq.shape[-1]
    return seq.reshape(*seq.shape[:-1], n // 8, 8)[..., perm].reshape(seq.shape)


def prepare_wna16(
    qweight: Any, scales: Any, qzeros: Any = None, *, quant_format: str, bits: int, group_size: int,
    gate_up: bool = False, arch: str | None = None, g_idx: Any = None,
) -> WNA16Weights:
    """Re-lay AWQ / GPTQ expert weights out for ``fused_moe`` (see the module docstring).

    The order is the offline layouts synthesis chooses for the kernel that will run
    (``wna16_layout.wna16_offline_layouts``: the weights', the scales' and AWQ's zero points')
    on ``arch`` (default: the device's, or ``HEXLAYOUT_EMULATE_ARCH`` for CPU tensors);
    ``gate_up=True`` for the ``w13`` projection (``N = 2I``: gate and up padded to whole tiles
    apart; needed when ``I`` is not a multiple of the tile rows, 64). The result records the
    layouts' key; the op refuses weights prepared for other layouts.

    ``g_idx`` (GPTQ act-order, ``desc_act=True``): int32 ``[E, K]``, row ``k`` of ``W[e]`` in
    group ``g_idx[e, k]``; the rows of K are permuted once by ``perm[e] = argsort(g_idx[e])``
    (stable) so that group ``j`` is rows ``[G j, G (j + 1))`` (``ops/moe/act_order.py``), and
    ``perm`` is recorded for the op, which gathers the activations' columns by it.

    Raises ``ArgumentError`` / ``ArgumentTypeError`` (``HexlayoutError``, ``ValueError`` /
    ``TypeError``) naming the argument: an unknown format, bits or group size; wrong dtypes,
    ranks or shapes (packing that does not match the others' sizes); a group size that does not
    divide K; ``qzeros`` given for GPTQ or missing for AWQ; ``g_idx`` for AWQ, of the wrong
    type or shape, with ids out of range or a group without exactly ``group_size`` rows."""
    require_torch("hexlayout.ops.prepare_wna16")
    import torch

    if quant_format not in ("awq", "gptq"):
        raise _fail("quant_format", f"must be 'awq' or 'gptq', got {quant_format!r}")
    if (
        not isinstance(bits, int)
        or isinstance(bits, bool)
        or bits not in ((4,) if quant_format == "awq" else (4, 8))
    ):
        ok = "4" if quant_format == "awq" else "4 or 8"
        raise _fail("bits", f"must be {ok} for {quant_format}, got {bits!r}")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise _fail("group_size", f"must be one of 32, 64, 128, -1, got {group_size!r}")
    _int32_3d("qweight", qweight)
    if not isinstance(scales, torch.Tensor):
        raise ArgumentTypeError(OP, "scales", f"expected a tensor, got {type(scales).__name__}")
    if scales.dtype not in (torch.float16, torch.bfloat16):
        raise _fail("scales", f"must be float16 or bfloat16 (the activations' dtype), got {scales.dtype}")
    if scales.dim() != 3:
        raise _fail("scales", f"must have 3 dimensions [E, K/G, N], got shape {tuple(scales.shape)}")
    per = 32 // bits
    e = qweight.shape[0]
    if quant_format == "awq":
        if qzeros is None:
            raise _fail("qzeros", "AWQ weights need their zero points [E, K/G, N/8] (int32)")
        k, n = qweight.shape[1], qweight.shape[2] * per
    else:
        if qzeros is not None:
            raise _fail("qzeros", "GPTQ weights are symmetric (zero point 2^(bits-1)): pass no qzeros")
        k, n = qweight.shape[1] * per, qweight.shape[2]
    if e == 0 or k == 0 or n == 0:
        raise _fail("qweight", f"has an empty dimension: shape {tuple(qweight.shape)}")
    if group_size != -1 and k % group_size:
        raise _fail("group_size", f"{group_size} does not divide K = {k} (the input dimension of qweight)")
    if k % 8 or n % 8:
        raise _fail("qweight", f"K = {k} and N = {n} must be multiples of 8 (16-byte rows)")
    if gate_up and n % 16:
        raise _fail("gate_up", f"the gate-up projection has N = 2I columns, I a multiple of 8; got N = {n}")
    groups = 1 if group_size == -1 else k // group_size
    if tuple(scales.shape) != (e, groups, n):
        raise _fail(
            "scales",
            f"must have shape [E, K/G, N] = {[e, groups, n]} for qweight {tuple(qweight.shape)} "
            f"({quant_format}, {bits}-bit, group_size {group_size}), got {list(scales.shape)}",
        )
    if scales.device != qweight.device:
        raise _fail("scales", f"is on {scales.device}, qweight on {qweight.device}")
    zeros = None
    if quant_format == "awq":
        _int32_3d("qzeros", qzeros)
        if tuple(qzeros.shape) != (e, groups, n // 8):
            raise _fail(
                "qzeros", f"must have shape [E, K/G, N/8] = {[e, groups, n // 8]}, got {list(qzeros.shape)}"
            )
        if qzeros.device != qweight.device:
            raise _fail("qzeros", f"is on {qzeros.device}, qweight on {qweight.device}")
        q = _awq_columns(qweight)  # [E, K, N]
        zeros = _awq_columns(qzeros).to(torch.uint8).contiguous()  # [E, G, N], one byte per zero point
    else:
        q = _unpack(qweight, bits, 1)  # [E, K, N]
    perm = None
    if g_idx is not None:  # act-order: rows of K in group order, the activations gathered by perm
        perm = act_order_perm(OP, g_idx, quant_format, e, k, group_size, qweight.device)
        q = permute_rows(q, perm)
    return _relayout(q, scales.contiguous(), zeros, quant_format, bits, group_size, gate_up, arch, perm)


def _relayout(q_ekn: Any, scales: Any, zeros: Any, quant_format: str, bits: int, group_size: int,
              gate_up: bool, arch: str | None, perm: Any = None, act_dtype: Any = None) -> WNA16Weights:
    """The final re-layout step of ``prepare_wna16`` / ``prepare_mxfp4``: the integer values
    ``q_ekn`` ``[E, K, N]`` in the offline order synthesized for ``arch``'s kernel
    (``wna16_layout.relayout``); ``act_dtype`` the activations' dtype when the scales are not
    in it (MXFP4's e8m0 bytes)."""
    from ..host.launch import lang_dtype
    from .wna16_layout import offline_key, relayout, relayout_groups, wna16_offline_layouts

    e, k, n = q_ekn.shape
    if arch is None:
        arch = kernel_arch(q_ekn.device)
    if arch not in ARCHS:
        raise _fail("arch", f"must be one of {', '.join(ARCHS)}, got {arch!r}")
    dtype = scales.dtype if act_dtype is None else act_dtype
    lays = wna16_offline_layouts(arch, lang_dtype(dtype), bits, k, group_size, gate_up,
                                 weight_dtype(quant_format, bits), zero_point(quant_format, bits))
    q = relayout(q_ekn, lays["q"], gate_up)
    scales = relayout_groups(scales, lays["s"], gate_up)
    if zeros is not None:
        zeros = relayout_groups(zeros, lays["z"], gate_up)
    return WNA16Weights(q, scales, zeros, quant_format, bits, group_size, e, k, n, offline_key(lays), gate_up,
                        perm, act_dtype)


def zero_point(quant_format: str, bits: int) -> int:
    """The kernels' ``ZERO`` of a format: 0 for AWQ (zero points loaded), -1 for MXFP4 (none),
    ``2^(bits-1)`` for GPTQ (symmetric)."""
    return {"awq": 0, "mxfp4": -1}.get(quant_format, 1 << (bits - 1))


def wna16_config(num_slots: int, num_experts: int, size_k: int, group_size: int) -> dict[str, Any]:
    """Kernel constants from the sizes only (capture-safe): ``BM`` 16 while experts average
    fewer than 64 routed rows (decode, medium), else 64; ``BN`` 64; ``BK`` ``k_tile``; activation
    rows gathered 2 k-tiles ahead (``STAGES`` 3); 4 warps;
    ``GROUP`` the group size (``ONE_GROUP`` for -1)."""
    bm = 64 if num_slots >= 64 * num_experts else 16
    return {
        "BM": bm,
        "BN": 64,
        "BK": k_tile(size_k, group_size),
        "STAGES": 3,
        "WARPS": 4,
        "GROUP": ONE_GROUP if group_size == -1 else group_size,
    }


def wna16_sm90_config(num_slots: int, num_experts: int, size_n: int) -> dict[str, Any]:
    """The swap-AB kernels' (sm_90a ``moe_wna16_kernels_sm90``, wgmma; sm_100a
    ``moe_wna16_kernels_sm100``, tcgen05) ``BM`` / ``WG`` from the
    sizes only (capture-safe), by the average routed rows per expert ``T * k / E``: below 32
    (decode) ``BM`` 16, below 64 ``BM`` 32, from 64 on (prefill) ``BM`` 64; always one consumer
    warp group (64 output columns: the prepared weights' offline layout is the one of a 64-row
    tile, ``wna16_layout``; ``size_n`` is kept for the signature).
    ``BM`` 128 spills the down kernel's registers (a 64 x 128 f32 accumulator per warp group
    next to the dequantized tile); the gate-up and down share ``BM`` (the alignment's block)."""
    avg = num_slots / max(num_experts, 1)
    if avg < 32:
        return {"BM": 16, "WG": 1}
    if avg < 64:
        return {"BM": 32, "WG": 1}
    # one warp group: the weights' offline layout is that of a 64-row tile (wna16_layout); two
    # would copy 128-row tiles, another storage order
    return {"BM": 64, "WG": 1}


def wna16_split_k(num_tokens: int, topk: int, num_experts: int, size_k: int, size_n: int, sm_count: int,
                  tiles: dict[str, Any]) -> int:
    """``SPLIT_K`` of a W4A16 / W8A16 grouped GEMM (input dim ``size_k``, output dim ``size_n``)
    from the sizes only: ``moe_splitk.choose_split_k`` with the kernel's tiles ``tiles`` (``BM``,
    ``BN``, ``BK``): with ``M`` row blocks holding an expert, ``tiles = M * ceil(N / BN)``; below
    ``sm_count`` tiles ``min(16, 2 * sm_count // tiles, ceil(K / BK) // 8)`` if >= 2, else 1."""
    from .kernels_sm80 import MoeConfig
    from .splitk import choose_split_k

    cfg = MoeConfig(BM=tiles["BM"], BN=tiles["BN"], BK=tiles["BK"])
    # "gate_up" takes (N, K) = (inter, hidden) and the tiles as given: pass this GEMM's own
    return choose_split_k(num_tokens, topk, num_experts, size_k, size_n, sm_count, cfg, "gate_up")


def _kind(x: Any) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def _contiguous_aligned(name: str, t: Any) -> None:
    """Contiguous and 16-byte aligned: the data pointer of a real tensor, the storage offset of
    a fake / meta one (torch.compile, FakeTensorMode), so both paths refuse a misaligned view."""
    from .args import _aligned, _contiguous

    _contiguous(RUN_OP, name, t)
    _aligned(RUN_OP, name, t)


def _check_weight(
    pre: str,
    qweight: Any,
    scales: Any,
    zeros: Any,
    quant_format: str,
    bits: int,
    group_size: int,
    dtype: Any,
    k: int,
    n: int | None,
    layout_key: str = "",
) -> tuple[int, int]:
    """The tensors of one prepared projection (input dim ``k``, output dim ``n`` or any): ``(E, N)``."""
    import torch

    for name, v in ((f"{pre}_qweight", qweight), (f"{pre}_scales", scales)):
        if not isinstance(v, torch.Tensor):
            raise ArgumentTypeError(RUN_OP, name, f"expected a tensor, got {_kind(v)}")
    sdt, what = (torch.uint8, "uint8 (e8m0 exponents)") if quant_format == "mxfp4" else (
        dtype, f"the activations' dtype {dtype}")
    if scales.dim() != 3 or scales.dtype != sdt:
        raise ArgumentError(RUN_OP, f"{pre}_scales", f"must be [E, K/G, N] of {what}, got {_kind(scales)}")
    e, groups, nn = scales.shape
    if n is not None and nn != n:
        raise ArgumentError(RUN_OP, f"{pre}_scales", f"has N = {nn} columns, expected {n}")
    want_g = 1 if group_size == -1 else k // max(group_size, 1)
    if group_size != -1 and k % group_size or groups != want_g:
        raise ArgumentError(
            RUN_OP,
            f"{pre}_group_size",
            f"{group_size} does not match K = {k} and {pre}_scales' {groups} groups",
        )
    np_ = _check_layout(pre, qweight, layout_key, dtype, quant_format, bits, group_size, k, e, nn)
    _group_strides(f"{pre}_scales", scales, np_)
    if quant_format == "awq":
        if not isinstance(zeros, torch.Tensor) or zeros.shape != scales.shape or zeros.dtype != torch.uint8:
            raise ArgumentError(
                RUN_OP,
                f"{pre}_zeros",
                f"AWQ needs uint8 zero points shaped like "
                f"{pre}_scales {tuple(scales.shape)}, got {_kind(zeros)}",
            )
        _group_strides(f"{pre}_zeros", zeros, np_)
    elif zeros is not None:
        raise ArgumentError(RUN_OP, f"{pre}_zeros", f"{quant_format} weights have no zero points: pass None")
    return e, nn


def _group_strides(name: str, t: Any, np_: int) -> None:
    """``t`` (prepared scales or zero points, ``[E, G, N]``) is the view ``relayout_groups`` makes
    of the offline ``[E * NP, G]`` tensor: strides ``(NP * G, NP, 1)``."""
    e, g, _ = t.shape
    want = (np_ * g, np_, 1)
    if tuple(t.stride()) != want and not (g == 1 and t.stride(0) == np_ and t.stride(2) == 1):
        raise ArgumentError(RUN_OP, name, f"must be prepare_wna16's view of the offline [E*NP, G] tensor "
                            f"(strides {list(want)}, NP = {np_}), got strides {list(t.stride())}")


def _check_layout(pre: str, qweight: Any, layout_key: str, dtype: Any, quant_format: str, bits: int,
                  group_size: int, k: int, e: int, n: int) -> int:
    """``{pre}_qweight`` is in the offline layout of the kernel that will run on the device's
    architecture (``wna16_layout``): its key (when the weights name one: ``layout_key``) and
    its shape ``[E*NP, KP*bits/8]`` uint8."""
    import torch

    from ..host.launch import lang_dtype
    from .wna16_layout import offline_key, padded_rows, wna16_offline_layouts

    arch = kernel_arch(qweight.device)
    gate_up = pre == "w13"
    wt = weight_dtype(quant_format, bits)
    lays = wna16_offline_layouts(arch, lang_dtype(dtype), bits, k, group_size, gate_up, wt,
                                 zero_point(quant_format, bits))
    lay = lays["q"]
    if layout_key and layout_key != offline_key(lays):
        raise ArgumentError(
            RUN_OP, f"{pre}_qweight",
            f"was prepared in the offline layouts {layout_key}, but the {arch} kernel that runs here reads "
            f"{offline_key(lays)}: call prepare_wna16 for this device (arch={arch!r})")
    tr, tk = lay.tile
    np_ = padded_rows(n, tr, gate_up)
    want = (e * np_, -(-k // tk) * tk * bits // 8)
    if qweight.dtype != torch.uint8 or tuple(qweight.shape) != want:
        hint = " (prepare w13 with gate_up=True)" if gate_up else ""
        raise ArgumentError(
            RUN_OP, f"{pre}_qweight",
            f"must be prepare_wna16's uint8 [E*NP, KP*bits/8] = {list(want)} (tiles {tr}x{tk}){hint}, "
            f"got {_kind(qweight)}")
    return np_


def check_fused_moe_wna16(
    hidden_states: Any,
    w13_qweight: Any,
    w13_scales: Any,
    w13_zeros: Any,
    w2_qweight: Any,
    w2_scales: Any,
    w2_zeros: Any,
    topk_weights: Any,
    topk_ids: Any,
    quant_format: Any,
    bits: Any,
    w13_group_size: Any,
    w2_group_size: Any,
    activation: Any = "silu",
    apply_router_weight_on_input: Any = False,
    expert_map: Any = None,
    global_num_experts: Any = None,
    w13_perm: Any = None,
    w2_perm: Any = None,
    w13_layout: Any = "",
    w2_layout: Any = "",
) -> None:
    """The one check of ``torch.ops.hexlayout.fused_moe_wna16`` (eager and fake): every bad argument
    is an ``ArgumentTypeError`` / ``ArgumentError`` naming it; ``w13_layout`` / ``w2_layout`` (the
    prepared weights' offline layout keys; "": not named) must be the layout the kernel for the
    device's architecture reads (else an error naming ``w13_qweight`` / ``w2_qweight``); the
    content checks (expert ids in range, act-order permutations ``w13_perm`` [E, H] / ``w2_perm``
    [E, I] that permute) run on CPU tensors and on CUDA under ``HEXLAYOUT_CHECK=1``."""
    from ..host.launch import content_checks

    op, x = RUN_OP, hidden_states
    _check_wna16_format(x, quant_format, bits, w13_group_size, w2_group_size)
    t, h = x.shape
    e, n2 = _check_weight(
        "w13", w13_qweight, w13_scales, w13_zeros, quant_format, bits, w13_group_size, x.dtype, h, None,
        w13_layout)
    if n2 % 2:
        raise ArgumentError(op, "w13_scales", f"must have N = 2I columns (gate, then up), got {n2}")
    inter = n2 // 2
    e2, _ = _check_weight(
        "w2", w2_qweight, w2_scales, w2_zeros, quant_format, bits, w2_group_size, x.dtype, inter, h,
        w2_layout)
    if e2 != e:
        raise ArgumentError(op, "w2_scales", f"has {e2} experts, w13 has {e}")
    check_perm(op, "w13_perm", w13_perm, quant_format, e, h)
    check_perm(op, "w2_perm", w2_perm, quant_format, e, inter)
    gne = _check_wna16_routing(t, e, topk_weights, topk_ids, activation, apply_router_weight_on_input,
                               expert_map, global_num_experts)
    named = [
        ("hidden_states", x),
        ("w13_qweight", w13_qweight),
        ("w13_scales", w13_scales),
        ("w13_zeros", w13_zeros),
        ("w2_qweight", w2_qweight),
        ("w2_scales", w2_scales),
        ("w2_zeros", w2_zeros),
        ("topk_weights", topk_weights),
        ("topk_ids", topk_ids),
        ("expert_map", expert_map),
        ("w13_perm", w13_perm),
        ("w2_perm", w2_perm),
    ]
    for name, v in named:
        if v is None:
            continue
        if v.device != x.device:
            raise ArgumentError(
                op, name, f"is on {v.device}, hidden_states on {x.device}; all tensors must be on one device"
            )
        if name.endswith(("_scales", "_zeros")):  # views of the offline tensors (_group_strides)
            from .args import _aligned

            _aligned(op, name, v)
        else:
            _contiguous_aligned(name, v)
    if h % 8:
        raise ArgumentError(op, "hidden_states", f"H = {h} must be a multiple of 8 (16-byte rows)")
    if content_checks(topk_ids) and topk_ids.numel():
        _check_wna16_expert_ids(topk_ids, expert_map, gne, e)
    for name, perm in (("w13_perm", w13_perm), ("w2_perm", w2_perm)):
        if perm is not None and content_checks(perm):
            check_perm_content(op, name, perm)


def _check_wna16_format(x: Any, quant_format: Any, bits: Any, w13_group_size: Any,
                        w2_group_size: Any) -> None:
    """``hidden_states`` a float16 / bfloat16 [T, H] tensor; the quantization format, bits and
    group sizes supported."""
    import torch

    op = RUN_OP
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(op, "hidden_states", f"expected a tensor, got {_kind(x)}")
    if x.dtype not in (torch.float16, torch.bfloat16) or x.dim() != 2:
        raise ArgumentError(
            op, "hidden_states", f"must be a float16 / bfloat16 [T, H] tensor, got {_kind(x)}"
        )
    if quant_format not in ("awq", "gptq", "mxfp4"):
        raise ArgumentError(op, "quant_format", f"must be 'awq', 'gptq' or 'mxfp4', got {quant_format!r}")
    if bits not in ((4, 8) if quant_format == "gptq" else (4,)) or isinstance(bits, bool):
        raise ArgumentError(op, "bits", f"must be 4 (AWQ, MXFP4) or 4 / 8 (GPTQ), got {bits!r}")
    sizes = (32,) if quant_format == "mxfp4" else GROUP_SIZES
    for name, gs in (("w13_group_size", w13_group_size), ("w2_group_size", w2_group_size)):
        if gs not in sizes or isinstance(gs, bool):
            raise ArgumentError(op, name, f"must be one of {', '.join(map(str, sizes))} for {quant_format}, "
                                f"got {gs!r}")


def _check_wna16_routing(t: int, e: int, topk_weights: Any, topk_ids: Any, activation: Any,
                         apply_router_weight_on_input: Any, expert_map: Any, global_num_experts: Any) -> int:
    """``topk_weights`` [T, k] float32 and ``topk_ids`` int32 of its shape, the activation, the
    router option, ``expert_map`` and ``global_num_experts``; returns the number of global experts."""
    import torch

    from .args import _int32

    op = RUN_OP
    for name, v in (("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if not isinstance(v, torch.Tensor):
            raise ArgumentTypeError(op, name, f"expected a tensor, got {_kind(v)}")
        if v.dim() != 2 or v.shape[0] != t or v.shape[1] < 1:
            raise ArgumentError(op, name, f"must be [T, k] with T = {t}, k >= 1, got shape {tuple(v.shape)}")
    if topk_weights.dtype != torch.float32:
        raise ArgumentTypeError(op, "topk_weights", f"must be float32, got {topk_weights.dtype}")
    _int32(op, "topk_ids", topk_ids)
    if topk_ids.shape != topk_weights.shape:
        raise ArgumentError(
            op,
            "topk_ids",
            f"must be shaped like topk_weights {tuple(topk_weights.shape)}, got {_kind(topk_ids)}",
        )
    k = topk_ids.shape[1]
    if activation not in ("silu", "gelu"):
        raise ArgumentError(op, "activation", f"must be 'silu' or 'gelu', got {activation!r}")
    if not isinstance(apply_router_weight_on_input, bool):
        raise ArgumentTypeError(
            op, "apply_router_weight_on_input", f"expected a bool, got {_kind(apply_router_weight_on_input)}"
        )
    if apply_router_weight_on_input and k != 1:
        raise ArgumentError(
            op, "apply_router_weight_on_input", f"requires k = 1 choice per token, got k = {k}"
        )
    if expert_map is not None and (
        not isinstance(expert_map, torch.Tensor) or expert_map.dtype != torch.int32 or expert_map.dim() != 1
    ):
        raise ArgumentError(op, "expert_map", f"must be a 1-d int32 tensor or None, got {_kind(expert_map)}")
    if global_num_experts is not None and (
        not isinstance(global_num_experts, int) or isinstance(global_num_experts, bool)
    ):
        raise ArgumentTypeError(
            op, "global_num_experts", f"expected an int or None, got {_kind(global_num_experts)}"
        )
    gne = global_num_experts if global_num_experts is not None and global_num_experts >= 0 else None
    if gne is None:
        gne = e if expert_map is None else expert_map.shape[0]
    if expert_map is not None and expert_map.shape[0] != gne:
        raise ArgumentError(
            op, "expert_map", f"has {expert_map.shape[0]} entries, global_num_experts is {gne}"
        )
    if expert_map is None and gne != e:
        raise ArgumentError(
            op, "global_num_experts", f"is {gne} but w13 has {e} experts and no expert_map is given"
        )
    return gne


def _check_wna16_expert_ids(topk_ids: Any, expert_map: Any, gne: int, e: int) -> None:
    """Content check: expert ids in [0, ``gne``), ``expert_map`` entries -1 or a local expert."""
    op = RUN_OP
    lo, hi = int(topk_ids.min()), int(topk_ids.max())
    if lo < 0 or hi >= gne:
        raise ArgumentError(op, "topk_ids", f"holds expert ids in [{lo}, {hi}], expected 0 <= id < {gne}")
    if expert_map is not None and expert_map.numel():
        mlo, mhi = int(expert_map.min()), int(expert_map.max())
        if mlo < -1 or mhi >= e:
            raise ArgumentError(
                op, "expert_map", f"holds [{mlo}, {mhi}], expected -1 (remote) or a local expert id < {e}"
            )


def _zeros_arg(scales: Any, zeros: Any) -> Any:
    """The kernels' ``z`` argument: AWQ's ``uint8`` zero points (the offline ``[E * NP, G]``
    tensor behind the prepared view), else (GPTQ, MXFP4: ``ZERO != 0``, ``z`` not read) a
    ``uint8`` view of the offline scales' first bytes shaped like them, no allocation."""
    import torch

    from .wna16_layout import group_view

    if zeros is not None:
        return group_view(zeros)
    if scales.dtype == torch.uint8:   # MXFP4's e8m0 bytes
        return scales
    return scales.view(torch.uint8).reshape(-1)[: scales.numel()].view(scales.shape)


def run_fused_moe_wna16(*args: Any, **kwargs: Any) -> Any:
    """The fused MoE on checked arguments, those of ``check_fused_moe_wna16``:
    ``hexlayout.ops.moe``'s pipeline (alignment, then the two GEMM launches here, then moe_sum;
    nothing but allocations between the kernels)."""
    from ..host.launch import build_for, lang_dtype, run_kernel, zeroed
    from .args import bind_args
    from .kernels_sm80 import MoeConfig
    from .pipeline import MoeRun, run_moe_pipeline
    from .splitk import _forced, moe_splitk_act_kernel, moe_splitk_cast_kernel
    from .wna16_kernels_sm80 import column_tiles, moe_wna16_down_kernel
    from .wna16_kernels_sm90 import moe_wna16_down_sm90_kernel
    from .wna16_layout import group_view

    a = bind_args(check_fused_moe_wna16, args, kwargs)
    bits = a.bits
    t, hdim = a.hidden_states.shape
    k = a.topk_ids.shape[1]
    e, inter = a.w13_scales.shape[0], a.w13_scales.shape[2] // 2
    dt = lang_dtype(a.hidden_states.dtype)
    dev = a.hidden_states.device
    cfg13, cfg2, gate_up_kernel, down_kernel = _wna16_kernels(dev, t * k, e, hdim, inter,
                                                              a.w13_group_size, a.w2_group_size)
    forced = _forced(None)  # HEXLAYOUT_MOE_SPLIT_K (a clear error when it is not an integer >= 1)

    def split_k(cfg: dict[str, Any], size_k: int, size_n: int) -> int:
        return _wna16_split(forced, dev, cfg, t, k, e, size_k, size_n)

    wt = weight_dtype(a.quant_format, bits)
    common = {
        "ZERO": zero_point(a.quant_format, bits),  # -1: no zero point
        "TOPK": k,
        "ROUTER": bool(a.apply_router_weight_on_input),
    }
    s13, s2 = group_view(a.w13_scales), group_view(a.w2_scales)  # the offline [E * NP, G] tensors
    z13 = _zeros_arg(s13, a.w13_zeros)
    z2 = _zeros_arg(s2, a.w2_zeros)

    def gate_up(run: MoeRun, h: Any) -> None:
        import torch

        consts = {**cfg13, **common, "GELU": run.activation == "gelu"}
        x = run.x
        if a.w13_perm is not None:  # act-order: x[t, perm13[e]] per routed slot, one row each
            x = permuted_tokens(run.x, a.topk_ids, a.expert_map, a.w13_perm)
            consts["TOPK"] = 1
        split = split_k(cfg13, hdim, inter)
        out = h
        if split > 1:  # f32 partials of g / u, then the activation kernel writes h
            out = zeroed((2, h.shape[0], inter), torch.float32, dev)    # atomics add into it
            consts.update(GELU=False, SPLIT_K=split)
        bld = build_for(gate_up_kernel(dt, bits, cfg13["BK"], split > 1, wt), dev, consts)
        _same_layout(bld, a.w13_layout, "w13_qweight")
        args = (x, a.w13_qweight, s13, z13, run.sorted_ids, run.expert_ids, run.topk_w, out)
        run_kernel(bld, args, outputs=(7,))
        if split > 1:  # the router weight is already in g / u (ROUTER): no SCALE_IN
            act = build_for(moe_splitk_act_kernel(dt, run.activation), dev, {"BM": cfg13["BM"]})
            run_kernel(act, (out[0], out[1], run.sorted_ids, run.expert_ids, run.topk_w, h), outputs=(5,))

    def down(run: MoeRun, h: Any, y: Any) -> None:
        import torch

        consts = {c: v for c, v in common.items() if c != "TOPK" or down_kernel is moe_wna16_down_kernel}
        consts = {**cfg2, **consts}
        # the sm_80 and sm_90a down kernels' blocks take column_tiles(BM) tiles of BN columns
        wide = cfg2
        if down_kernel is moe_wna16_down_kernel:
            wide = {**cfg2, "BN": cfg2["BN"] * column_tiles(cfg2["BM"])}
        elif down_kernel is moe_wna16_down_sm90_kernel:
            wide = {**cfg2, "BN": 64 * cfg2["WG"] * column_tiles(cfg2["BM"])}
        split = split_k(wide, inter, hdim)
        out = y
        if split > 1:  # f32 partials, then rounded once into y
            out = zeroed(y.shape, torch.float32, dev)                   # atomics add into it
            consts["SPLIT_K"] = split
        bld = build_for(down_kernel(dt, bits, cfg2["BK"], split > 1, wt), dev, consts)
        _same_layout(bld, a.w2_layout, "w2_qweight")
        if a.w2_perm is not None:  # act-order: h[p, perm2[e]], e the expert of p's block
            h = permuted_inter(h, run.expert_ids, run.cfg["BM"], a.w2_perm)
        args = (h, a.w2_qweight, s2, z2, run.sorted_ids, run.expert_ids, run.topk_w, out)
        run_kernel(bld, args, outputs=(7,))
        if split > 1:
            run_kernel(build_for(moe_splitk_cast_kernel(dt), dev, {}), (out, y), outputs=(1,))

    return run_moe_pipeline(a.hidden_states, a.topk_weights, a.topk_ids, e, inter, a.activation,
                            a.apply_router_weight_on_input, a.expert_map, gate_up, down, MoeConfig(cfg13))


def _same_layout(bld: Any, key: str, name: str) -> None:
    """The build about to run reads its weights in the offline layout ``key`` (when named): every
    config (decode, prefill, split-K) must share the prepared layout."""
    from .wna16_layout import offline_key

    if not key or not hasattr(bld, "offline_layouts"):  # no key named, or a recorded (not built) launch
        return
    lays = bld.offline_layouts
    if lays and offline_key(lays) != key:
        raise ArgumentError(RUN_OP, name, f"was prepared in the offline layouts {key}, but kernel "
                            f"{bld.tile_kernel.name} reads {offline_key(lays)}")


def weight_dtype(quant_format: str, bits: int) -> Any:
    """The kernels' weight element type of a format: ``e2m1`` (MXFP4), else ``u4`` / ``u8``."""
    from hexlayout.lang import e2m1, u4, u8

    if quant_format == "mxfp4":
        return e2m1
    return u4 if bits == 4 else u8


def _wna16_kernels(dev: Any, rows: int, e: int, hdim: int, inter: int, w13_group_size: int,
                   w2_group_size: int) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
    """The constants of the gate-up and the down GEMM for ``rows`` = T * k routed rows, and
    their kernel factories for the device's architecture (sm_90a: wgmma, swap-AB, dequantized
    weights as register A; sm_100a: tcgen05, swap-AB, the dequantized weights staged in shared
    memory, the same configs)."""
    from .wna16_kernels_sm80 import moe_wna16_down_kernel, moe_wna16_gate_up_kernel
    from .wna16_kernels_sm90 import SM90_STAGES, moe_wna16_down_sm90_kernel, moe_wna16_gate_up_sm90_kernel
    from .wna16_kernels_sm100 import SM100_STAGES, moe_wna16_down_sm100_kernel, moe_wna16_gate_up_sm100_kernel

    cfg13 = wna16_config(rows, e, hdim, w13_group_size)
    cfg2 = wna16_config(rows, e, inter, w2_group_size)
    gate_up_kernel, down_kernel = moe_wna16_gate_up_kernel, moe_wna16_down_kernel
    arch = kernel_arch(dev)
    if arch in ("sm_90a", "sm_100a"):  # swap-AB; the weights as register A (wgmma) or via shared (tcgen05)
        if arch == "sm_90a":
            gate_up_kernel, down_kernel = moe_wna16_gate_up_sm90_kernel, moe_wna16_down_sm90_kernel
            stages = SM90_STAGES
        else:
            gate_up_kernel, down_kernel = moe_wna16_gate_up_sm100_kernel, moe_wna16_down_sm100_kernel
            stages = SM100_STAGES
        for cfg, n in ((cfg13, inter), (cfg2, hdim)):
            del cfg["BN"], cfg["WARPS"]
            cfg.update(wna16_sm90_config(rows, e, n), STAGES=stages)
    return cfg13, cfg2, gate_up_kernel, down_kernel


def _wna16_split(forced: int | None, dev: Any, cfg: dict[str, Any], t: int, k: int, e: int,
                 size_k: int, size_n: int) -> int:
    """The split-K count of one GEMM: forced, else 1 off CUDA, else ``wna16_split_k`` with the
    device's SM count."""
    if forced is not None:
        return forced
    if dev.type != "cuda":
        return 1
    bn = cfg["BN"] if "BN" in cfg else 64 * cfg["WG"]   # (a block's columns: BN given first)
    tiles = {"BN": bn, "BM": cfg["BM"], "BK": cfg["BK"]}
    return wna16_split_k(t, k, e, size_k, size_n, sm_count(dev), tiles)


fused_moe_wna16 = prepared_fused_moe(
    WNA16Weights, "fused_moe_wna16", "prepare_wna16",
    """``fused_moe`` for ``prepare_wna16`` weights (``w13`` and ``w2`` of one format and bit
    width): ``torch.ops.hexlayout.fused_moe_wna16`` on their tensors and format constants
    (semantics: ``hexlayout.ops.fused_moe``)::

        out[t] = sum_j tw[t, j] * W2[e]^T (act(W13[e, :, :I]^T x_t) * (W13[e, :, I:]^T x_t)),  e = ids[t, j]

    with the dequantized ``W`` of the module docstring; remote experts (``expert_map`` -1) skipped.""")
