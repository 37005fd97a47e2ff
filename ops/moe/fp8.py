"""FP8 (e4m3) expert weights for ``hexlayout.ops.fused_moe``: ``prepare_fp8`` and the run path.

``prepare_fp8(w, scale, *, block=None)`` takes ``w`` ``[E, N, K]`` float8_e4m3fn (the
orientation of the bf16 ``w13`` ``[E, 2I, H]`` / ``w2`` ``[E, H, I]``) and fp32 ``scale``:
``[E]`` (one scale per expert, ``W[e] = w[e] * scale[e]``) or, with ``block=(128, 128)``,
``[E, ceil(N / 128), ceil(K / 128)]`` (``W[e, n, c] = w[e, n, c] * scale[e, n // 128, c //
128]``). It returns an ``Fp8MoEWeights``: a plain container of those tensors (no copy) and, for block
scales that are all powers of two in ``[2^-127, 2^127]`` (exactly UE8M0: DeepSeek-V3.1's UE8M0
checkpoints, MXFP8), ``scale_format="ue8m0"`` (checked once, on the scales' values; ``""``
otherwise, and for meta / fake tensors, whose values are unknown).

``fused_moe(x, w13, w2, topk_weights, topk_ids, ...)`` with two prepared fp8 objects computes
(``torch.ops.hexlayout.fused_moe_fp8``; ``e = topk_ids[t, j]`` mapped through ``expert_map``,
choices of remote experts skipped)::

    s_t  = max_c |x[t, c]| / 448,          xq[t] = e4m3(x[t] / s_t)           (per token, in the op)
    g, u = s_t * (W13[e, :I] @ xq[t]),  s_t * (W13[e, I:] @ xq[t])
    h    = dtype(act(g) * u)                                                   (act: SiLU or exact GELU)
    s_h  = max |h| / 448,                  hq = e4m3(h / s_h)                  (per routed row, the same way)
    out[t] = dtype(sum_j topk_weights[t, j] * s_h * (W2[e] @ hq))

``e4m3`` rounds to nearest even and saturates at +-448; a row of zeros has scale 0 and quantizes
to zeros. With ``apply_router_weight_on_input=True`` (k = 1) ``x[t]`` is multiplied by
``topk_weights[t, 0]`` before its quantization and the output is not weighted.

The pipeline is ``moe.run_moe_pipeline``'s (``moe_align``, gate-up, down, ``moe_sum`` of the k
contributions) with fp8 launches (``moe_fp8_kernels``): the per-row quantization before each
GEMM, the gate-up and down grouped GEMMs (rows gathered through the sorted slots, scales in the
epilogue or per 128-column k-tile for block scales; sm_89: e4m3 ``mma.sync.m16n8k32``, sm_90a:
e4m3 ``wgmma`` m64nNk32 with swapped operands, ``moe_fp8_kernels_sm90``; prefill on sm_90a, more
than 64 routed rows per expert on average: blocks of 128 rows on the wgmma M side, warp-specialized
with TMA weight loads, ``fp8_block_m``; sm_100a: the same sources with e4m3 ``tcgen05.mma``, and
for ``scale_format="ue8m0"`` weights ``fp8_kernels_sm100``'s kernels, whose block-scaled
``tcgen05.mma`` applies the weight scales inside the MMA instead of scaling a partial product
per k-tile in registers, in blocks of at most 64 token rows, split-K only up to 32). No
torch op runs between them except allocations; no host synchronization (buffers are sized from
T, k, E and the block size). Targets sm_89 and sm_90a (CPU tensors: the emulator under
``HEXLAYOUT_EMULATE=1`` with ``HEXLAYOUT_EMULATE_ARCH=sm_89`` or ``sm_90a``); sm_80 has no fp8
mma: a clear error.

Split-K (decode): where a GEMM's grid of ``BM x 64`` tiles is smaller than a wave,
``moe_splitk.choose_split_k`` (sizes and SM count only, with the fp8 tiles: ``BK = 128``) gives it
``SPLIT_K`` blocks per tile (the DeepSeek-V3 TP8 slice at T = 1: 32 gate-up tiles x 7 splits of
8 k-tiles of the 56). The split kernels (``split=True`` of the same kernels, sm_89 and sm_90a
swap-AB; never the large-token ones) add their scaled f32 partials atomically into a zeroed
workspace by slot (gate-up: ``[2, T * k, I]``, then ``moe_splitk_act_kernel(slot_rows=True)``
writes ``h``; down: ``[T * k, H]``, then ``moe_splitk_cast_kernel`` writes ``y``).
``HEXLAYOUT_MOE_SPLIT_K=n`` forces ``SPLIT_K = n`` (1: off) for both GEMMs, on CPU tensors too;
otherwise CPU tensors never split. The order of the atomic additions is not defined (the last
bits of the f32 sums may differ from run to run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError

from ..host.device import kernel_arch, sm_count
from ..host.torch import require_torch
from .fp8_kernels_sm89 import (
    SCALE_BLOCK,
    moe_fp8_down_kernel,
    moe_fp8_gate_up_kernel,
    moe_fp8_quant_kernel,
)
from .fp8_kernels_sm90 import (
    moe_fp8_down_sm90_kernel,
    moe_fp8_down_sm90_ws_kernel,
    moe_fp8_gate_up_sm90_kernel,
    moe_fp8_gate_up_sm90_ws_kernel,
)
from .fp8_kernels_sm100 import BN_BS, MAX_BM, moe_fp8_down_sm100_kernel, moe_fp8_gate_up_sm100_kernel
from .kernels_sm80 import MoeConfig
from .pipeline import prepared_fused_moe
from .splitk import (
    _forced,
    choose_split_k,
    moe_splitk_act_kernel,
    moe_splitk_cast_kernel,
)

__all__ = [
    "Fp8MoEWeights",
    "prepare_fp8",
    "check_fused_moe_fp8",
    "run_fused_moe_fp8",
    "fused_moe_fp8",
    "FP8_ARCHS",
    "fp8_block_m",
    "fp8_split_k",
]

OP = "hexlayout.fused_moe_fp8"
#: architectures with e4m3 mma
FP8_ARCHS = ("sm_89", "sm_90a", "sm_100a")


@dataclass(frozen=True)
class Fp8MoEWeights:
    """FP8 expert weights: ``w`` ``[E, N, K]`` float8_e4m3fn and fp32 ``scale`` (``[E]`` with
    ``block=None``, ``[E, ceil(N/128), ceil(K/128)]`` with ``block=(128, 128)``); ``W = w * scale``
    broadcast over its block; ``layout_key`` ``"natural"`` (``prepare_fp8``: no re-layout);
    ``scale_format`` ``"ue8m0"`` when every block scale is a power of two (``prepare_fp8``)."""

    w: Any
    scale: Any
    block: tuple[int, int] | None = None
    layout_key: str = "natural"
    scale_format: str = ""

    @property
    def num_experts(self) -> int:
        return int(self.w.shape[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(E, N, K)``."""
        return tuple(int(s) for s in self.w.shape)  # type: ignore[return-value]

    @property
    def block_list(self) -> list[int]:
        """``block`` as the torch op's ``int[]`` argument (``[]``: one scale per expert)."""
        return list(self.block) if self.block else []

    def mismatch(self, w2: Fp8MoEWeights) -> str | None:
        """Why ``w2`` cannot be the down projection of these gate-up weights, or ``None``."""
        if self.block != w2.block:
            return f"has block {w2.block}, w13 has {self.block}: both must use one scale form"
        return None

    def op_args(self, w2: Fp8MoEWeights) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """``fused_moe_fp8``'s weight tensors (these as ``w13``, then ``w2``) and constants."""
        return (self.w, self.scale, w2.w, w2.scale), (self.block_list,)

    def op_kwargs(self, w2: Fp8MoEWeights) -> dict[str, Any]:
        """``scale_format="ue8m0"`` when both projections' block scales are UE8M0 (else none)."""
        return {"scale_format": "ue8m0"} if self.scale_format == w2.scale_format == "ue8m0" else {}


def _kind(x: Any) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {x!r}"[:80]


def _check_block(op: str, block: Any) -> tuple[int, int] | None:
    if block is None or (isinstance(block, (list, tuple)) and len(block) == 0):
        return None
    if (
        not isinstance(block, (list, tuple))
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) for b in block)
    ):
        raise ArgumentTypeError(
            op, "block", f"expected None or a pair of ints (128, 128), got {_kind(block)}"
        )
    if tuple(block) != (SCALE_BLOCK, SCALE_BLOCK):
        raise ArgumentError(
            op,
            "block",
            f"must be ({SCALE_BLOCK}, {SCALE_BLOCK}) (scale blocks of 128 x 128 weights), got {tuple(block)}",
        )
    return (SCALE_BLOCK, SCALE_BLOCK)


def _check_fp8_weight(
    op: str, name: str, w: Any, scale: Any, block: tuple[int, int] | None, scale_name: str
) -> None:
    import torch

    if not isinstance(w, torch.Tensor):
        raise ArgumentTypeError(op, name, f"expected a float8_e4m3fn tensor, got {_kind(w)}")
    if w.dtype != torch.float8_e4m3fn:
        raise ArgumentTypeError(op, name, f"must be float8_e4m3fn, got {w.dtype}")
    if w.dim() != 3:
        raise ArgumentError(op, name, f"must be [E, N, K], got shape {tuple(w.shape)}")
    if not isinstance(scale, torch.Tensor):
        raise ArgumentTypeError(op, scale_name, f"expected a float32 tensor, got {_kind(scale)}")
    if scale.dtype != torch.float32:
        raise ArgumentTypeError(op, scale_name, f"must be float32, got {scale.dtype}")
    e, n, k = w.shape
    want = (e,) if block is None else (e, -(-n // SCALE_BLOCK), -(-k // SCALE_BLOCK))
    if tuple(scale.shape) != want:
        what = "one scale per expert" if block is None else "one scale per 128 x 128 block"
        raise ArgumentError(
            op,
            scale_name,
            f"must have shape {list(want)} ({what} of {name} {list(w.shape)}), got {list(scale.shape)}",
        )
    if w.device != scale.device:
        raise ArgumentError(op, scale_name, f"is on {scale.device}, {name} on {w.device}")


def prepare_fp8(w: Any, scale: Any, *, block: tuple[int, int] | None = None) -> Fp8MoEWeights:
    """FP8 expert weights for ``fused_moe`` (see the module docstring): ``w`` ``[E, N, K]``
    float8_e4m3fn, ``scale`` fp32 ``[E]`` or, with ``block=(128, 128)``, ``[E, ceil(N/128),
    ceil(K/128)]``. Raises ``ArgumentTypeError`` / ``ArgumentError`` naming the argument.

    No re-layout: the FP8 kernels copy the weights global -> shared memory (TMA boxes on sm_90a,
    16-byte cp.async on sm_89) and read them from there with ldmatrix / wgmma, so synthesis
    chooses the *shared* layout and swizzle; on the global side every copy reads whole 16-byte
    rows of K, already coalesced, and no register fragment fixes a global order (an
    ``hl.offline`` tensor is only copied into registers). The offline layout is therefore the
    natural one, row-major ``[E, N, K]``; its key ``"natural"`` is recorded (``layout_key``) so
    every prepared weight names its layout. Block scales that are all exact UE8M0 values give
    ``scale_format="ue8m0"`` (``is_ue8m0``; one look at the values, a synchronization on CUDA)."""
    require_torch("hexlayout.ops.prepare_fp8")
    op = "hexlayout.prepare_fp8"
    blk = _check_block(op, block)
    _check_fp8_weight(op, "w", w, scale, blk, "scale")
    fmt = "ue8m0" if blk is not None and _known(scale) and is_ue8m0(scale) else ""
    return Fp8MoEWeights(w, scale, blk, scale_format=fmt)


def _known(t: Any) -> bool:
    """Whether ``t``'s values can be read (not a meta / fake tensor)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return t.device.type != "meta" and not isinstance(t, FakeTensor)


def is_ue8m0(scale: Any) -> bool:
    """Whether every value of the f32 tensor ``scale`` is a power of two in ``[2^-127, 2^127]``
    (exactly a UE8M0 factor ``2^(e - 127)``, e in 0..254)."""
    import torch

    if scale.numel() == 0:
        return True
    m, e = torch.frexp(scale.double())
    return bool(((m == 0.5) & (e - 1 >= -127) & (e - 1 <= 127)).all())


def _contiguous_aligned(op: str, name: str, t: Any) -> None:
    """Contiguous and 16-byte aligned (fake / meta tensors: by their storage offset, so eager and
    fake agree)."""
    from .args import _aligned, _contiguous

    _contiguous(op, name, t)
    _aligned(op, name, t)


def check_fused_moe_fp8(
    hidden_states: Any,
    w13: Any,
    w13_scale: Any,
    w2: Any,
    w2_scale: Any,
    topk_weights: Any,
    topk_ids: Any,
    block: Any = (),
    activation: Any = "silu",
    apply_router_weight_on_input: Any = False,
    expert_map: Any = None,
    global_num_experts: Any = None,
    scale_format: Any = "",
) -> None:
    """The one check of ``torch.ops.hexlayout.fused_moe_fp8`` (eager and fake): every bad argument
    is an ``ArgumentTypeError`` / ``ArgumentError`` naming it. The routing arguments go through
    ``moe_args.check_routing`` (shared with the other MoE ops; its content checks, expert ids in
    range, run on CPU tensors and on CUDA under ``HEXLAYOUT_CHECK=1``); so does the one of
    ``scale_format="ue8m0"`` (every block scale a power of two)."""
    from .args import check_routing

    op = OP
    blk = _check_block(op, block)
    _check_fp8_weight(op, "w13", w13, w13_scale, blk, "w13_scale")
    _check_fp8_weight(op, "w2", w2, w2_scale, blk, "w2_scale")
    e, n2, k13 = w13.shape
    check_routing(
        op,
        hidden_states,
        topk_weights,
        topk_ids,
        e,
        activation,
        apply_router_weight_on_input,
        expert_map,
        global_num_experts,
    )
    x = hidden_states
    h = x.shape[1]
    if w2.shape[0] != e:
        raise ArgumentError(op, "w2", f"has {w2.shape[0]} experts, w13 has {e}")
    if n2 % 2:
        raise ArgumentError(op, "w13", f"must be [E, 2I, H] (gate rows, then up rows), got an odd {n2} rows")
    inter = n2 // 2
    if k13 != h:
        raise ArgumentError(
            op, "w13", f"must be [E, 2I, H] with H = {h} (hidden_states' columns), got {list(w13.shape)}"
        )
    if tuple(w2.shape[1:]) != (h, inter):
        raise ArgumentError(op, "w2", f"must be [E, H, I] = {[e, h, inter]}, got {list(w2.shape)}")
    if h % 16 or inter % 16:
        raise ArgumentError(
            op,
            "w13" if h % 16 else "w2",
            f"H ({h}) and I ({inter}) must be multiples of 16 (fp8 rows move in 16-byte vectors)",
        )
    for name, v in (("w13", w13), ("w13_scale", w13_scale), ("w2", w2), ("w2_scale", w2_scale)):
        if v.device != x.device:
            raise ArgumentError(
                op, name, f"is on {v.device}, hidden_states on {x.device}; all tensors must be on one device"
            )
        _contiguous_aligned(op, name, v)
    _check_scale_format(op, scale_format, blk, w13_scale, w2_scale)
    if x.device.type in ("cuda", "cpu"):
        arch = kernel_arch(x.device)
        if arch not in FP8_ARCHS:
            where = "the GPU is" if x.device.type == "cuda" else "HEXLAYOUT_EMULATE_ARCH is"
            raise ArgumentError(
                op,
                "w13",
                f"fp8 experts need e4m3 mma (sm_89, sm_90a or sm_100a); {where} {arch} (for CPU "
                "tensors set HEXLAYOUT_EMULATE_ARCH=sm_89, sm_90a or sm_100a)",
            )


def _check_scale_format(op: str, fmt: Any, blk: Any, s13: Any, s2: Any) -> None:
    from ..host.launch import content_checks

    if not isinstance(fmt, str) or fmt not in ("", "ue8m0"):
        raise ArgumentError(op, "scale_format", f"must be '' or 'ue8m0', got {fmt!r:.60}")
    if fmt and blk is None:
        raise ArgumentError(op, "scale_format", "'ue8m0' describes block scales (block=[128, 128])")
    if fmt:
        for name, s in (("w13_scale", s13), ("w2_scale", s2)):
            if content_checks(s) and not is_ue8m0(s):
                raise ArgumentError(op, name, "scale_format='ue8m0' but a block scale is not a power of two "
                                    "in [2^-127, 2^127] (prepare_fp8 records the format from the values)")


#: stages of the sm_90a large-token kernels' ring: 32 KiB each (128 token rows + 2 x 64 weight rows
#: of 128 e4m3 columns), 192 KiB of the 227 KiB a block may use
WS_STAGES = 6
#: stages of the sm_90a swap-AB kernels: (BM + 128) x 128 bytes each (18-20 KiB), loaded 2 k-tiles
#: ahead so that one more stage stays free for the wgmma group in flight
SWAP_STAGES = 4


def fp8_block_m(num_slots: int, num_experts: int, arch: str = "sm_89") -> int:
    """Sorted rows per GEMM block, from the sizes only (capture-safe): 16 (decode: at most 16
    slots per expert on average) up to 64; on sm_90a / sm_100a more than 64 slots per expert take
    the large-token kernels' 128 (two consumer warp groups of 64 rows)."""
    per = num_slots / max(num_experts, 1)
    if arch in ("sm_90a", "sm_100a") and per > 64:
        return 128
    return 16 if per <= 16 else 32 if per <= 64 else 64


def fp8_split_k(num_tokens: int, topk: int, num_experts: int, hidden: int, inter: int, sm_count: int,
                block_m: int, gemm: str = "gate_up") -> int:
    """``SPLIT_K`` of an fp8 grouped GEMM (``gemm``: ``"gate_up"`` or ``"down"``) from the sizes
    only: 1 for the large-token kernels (``block_m`` 128), else ``moe_splitk.choose_split_k`` with
    the fp8 tiles ``block_m x 64 x 128`` (tiles = row blocks x ``ceil(N / 64)``; below
    ``sm_count`` tiles: ``min(16, 2 * sm_count // tiles, ceil(K / 128) // 8)`` if >= 2)."""
    if block_m == 128:
        return 1
    tiles = MoeConfig(BM=block_m, BN=64, BK=SCALE_BLOCK)
    return choose_split_k(num_tokens, topk, num_experts, hidden, inter, sm_count, tiles, gemm)


def _fp8_kernels(dt: Any, arch: str, bm: int, common: dict[str, Any],
                 ue8m0: bool = False) -> tuple[Any, Any, Any, Any, int]:
    """``(gate-up, down, split gate-up, split down kernels, down BN)`` for ``arch`` and block
    ``bm``; ``common`` (the shared constants) gets the architecture's additions. ``ue8m0`` on
    sm_100a: the block-scaled-MMA kernels (``fp8_kernels_sm100``, ``BN`` 128, every ``bm``)."""
    if ue8m0 and arch == "sm_100a":
        common.update(STAGES=SWAP_STAGES, BN=BN_BS)
        del common["BLOCK_SCALE"]
        return (moe_fp8_gate_up_sm100_kernel(dt), moe_fp8_down_sm100_kernel(dt),
                moe_fp8_gate_up_sm100_kernel(dt, True), moe_fp8_down_sm100_kernel(dt, True), BN_BS)
    if bm == 128:  # sm_90a prefill: tokens on the wgmma M side, warp-specialized, TMA weights
        common.update(STAGES=WS_STAGES, CONSUMERS=2)
        # large T: never split
        return (moe_fp8_gate_up_sm90_ws_kernel(dt, arch), moe_fp8_down_sm90_ws_kernel(dt, arch), None, None,
                128)
    if arch in ("sm_90a", "sm_100a"):  # e4m3 wgmma / tcgen05, swap-AB (ptxas emulates e4m3 mma.sync on sm_90)
        common["STAGES"] = SWAP_STAGES
        return (moe_fp8_gate_up_sm90_kernel(dt, False, arch), moe_fp8_down_sm90_kernel(dt, False, arch),
                moe_fp8_gate_up_sm90_kernel(dt, True, arch), moe_fp8_down_sm90_kernel(dt, True, arch), 64)
    common["WARPS"] = 4
    return (moe_fp8_gate_up_kernel(dt), moe_fp8_down_kernel(dt), moe_fp8_gate_up_kernel(dt, True),
            moe_fp8_down_kernel(dt, True), 64)


def _quantize(src: Any, rows_w: Any, dt: Any, dev: Any) -> tuple[Any, Any]:
    """Per-row e4m3 quantization of ``src`` [R, C] (rows scaled by ``rows_w`` first when given):
    ``(q, scale)``."""
    import torch

    from ..host.launch import build_for, fresh, run_kernel

    r, c = src.shape
    q = fresh((r, c), torch.float8_e4m3fn, dev)
    s = fresh((r,), torch.float32, dev)
    consts = {"ROWS": 4, "BK": 256 if c >= 256 else 128, "WARPS": 4, "ROUTER": rows_w is not None}
    args = (src, s if rows_w is None else rows_w, q, s)
    run_kernel(build_for(moe_fp8_quant_kernel(dt), dev, consts), args, outputs=(2, 3))
    return q, s


def run_fused_moe_fp8(*args: Any, **kwargs: Any) -> Any:
    """The fp8 fused MoE on checked arguments, those of ``check_fused_moe_fp8`` (see the module
    docstring): ``moe.run_moe_pipeline`` (alignment, then these gate-up / down launches, then its
    ``moe_sum``), each GEMM launch preceded by the per-row quantization of its input."""
    import torch

    from ..host.launch import build_for, lang_dtype, run_kernel, zeroed
    from .args import bind_args
    from .pipeline import MoeRun, run_moe_pipeline

    a = bind_args(check_fused_moe_fp8, args, kwargs)
    x, w13, w2 = a.hidden_states, a.w13, a.w2
    t = x.shape[0]
    e, n2, _ = w13.shape
    k = a.topk_ids.shape[1]
    dev = x.device
    blk = bool(_check_block(OP, a.block))
    s13 = a.w13_scale if blk else a.w13_scale.reshape(e, 1, 1)
    s2 = a.w2_scale if blk else a.w2_scale.reshape(e, 1, 1)
    dt = lang_dtype(x.dtype)
    arch = kernel_arch(dev)
    ue8m0 = a.scale_format == "ue8m0" and arch == "sm_100a"
    bm = fp8_block_m(t * k, e, arch)
    if ue8m0:              # the block-scaled-MMA kernels take up to 64 token rows per block
        bm = min(bm, MAX_BM)
    common: dict[str, Any] = {"BM": bm, "BN": 64, "BK": SCALE_BLOCK, "STAGES": 2, "BLOCK_SCALE": blk}
    gate_up_k, down_k, gate_up_split, down_split, down_bn = _fp8_kernels(dt, arch, bm, common, ue8m0)

    def quant(src: Any, rows_w: Any) -> tuple[Any, Any]:
        return _quantize(src, rows_w, dt, dev)

    forced = _forced(None)   # HEXLAYOUT_MOE_SPLIT_K (a clear error when it is not an integer >= 1)

    def split_k(gemm: str) -> int:
        """``SPLIT_K`` of ``gemm``: 1 for the large-token kernels, else forced, else 1 off CUDA,
        else ``fp8_split_k`` with the device's SM count."""
        if bm == 128:
            return 1
        if forced is not None:
            return forced
        if dev.type != "cuda" or (ue8m0 and bm > 32):   # the split UE8M0 gate-up of 64 rows spills
            return 1
        return fp8_split_k(t, k, e, x.shape[1], n2 // 2, sm_count(dev), bm, gemm)

    def gate_up(run: MoeRun, inter: Any) -> None:
        # inter [EM, I]: rows by slot t * k + j here (EM >= T * k)
        xq, xs = quant(run.x, run.topk_w if run.scale_in else None)
        uniform = blk and (n2 // 2) % common["BN"] == 0   # gate / up tiles each in one scale block
        consts = {**common, "TOPK": k, "GELU": run.activation == "gelu"}
        if not ue8m0:                                     # the block-scaled MMA takes every row's scale
            consts["UNIFORM"] = uniform
        split = split_k("gate_up")
        if split == 1:
            args = (xq, xs, w13, s13, run.sorted_ids, run.expert_ids, inter)
            run_kernel(build_for(gate_up_k, dev, consts), args, outputs=(6,))
            return
        ws = zeroed((2, t * k, n2 // 2), torch.float32, dev)     # atomics add into it
        args = (xq, xs, w13, s13, run.sorted_ids, run.expert_ids, ws)
        consts.update(GELU=False, SPLIT_K=split)         # the activation is the act kernel's
        run_kernel(build_for(gate_up_split, dev, consts), args, outputs=(6,))
        act = build_for(moe_splitk_act_kernel(dt, run.activation, slot_rows=True), dev, {"BM": bm})
        run_kernel(act, (ws[0], ws[1], run.sorted_ids, run.expert_ids, run.topk_w, inter), outputs=(5,))

    def down(run: MoeRun, inter: Any, y: Any) -> None:
        hq, hs = quant(inter[: t * k], None)
        consts = {**common, "BN": down_bn, "ROUTER": run.scale_in}
        split = split_k("down")
        if split == 1:
            args = (hq, hs, w2, s2, run.topk_w, run.sorted_ids, run.expert_ids, y)
            run_kernel(build_for(down_k, dev, consts), args, outputs=(7,))
            return
        ws = zeroed(y.shape, torch.float32, dev)                 # atomics add into it
        args = (hq, hs, w2, s2, run.topk_w, run.sorted_ids, run.expert_ids, ws)
        run_kernel(build_for(down_split, dev, {**consts, "SPLIT_K": split}), args, outputs=(7,))
        run_kernel(build_for(moe_splitk_cast_kernel(dt), dev, {}), (ws, y), outputs=(1,))

    return run_moe_pipeline(x, a.topk_weights, a.topk_ids, e, n2 // 2, a.activation,
                            a.apply_router_weight_on_input, a.expert_map, gate_up, down, cfg=MoeConfig(BM=bm))


fused_moe_fp8 = prepared_fused_moe(
    Fp8MoEWeights, "fused_moe_fp8", "prepare_fp8",
    """``fused_moe`` for prepared fp8 weights (``w13`` and ``w2`` from ``prepare_fp8``, one scale
    form): ``torch.ops.hexlayout.fused_moe_fp8`` (see the module docstring).""")
