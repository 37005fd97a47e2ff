"""``hexlayout.ops.gemm_fp8``: the dense FP8 (e4m3) GEMM with 128-block scales.

``gemm_fp8(a, b, a_scale, b_scale, *, out_dtype=torch.bfloat16, bias=None)`` returns ``c``
``[M, N]`` in ``out_dtype`` (bf16 or f16)::

    c[m, n] = sum_k a[m, k] * a_scale[m, k // 128] * b[n, k] * b_scale[n // 128, k // 128]  (+ bias[n])

- ``a`` ``[M, K]`` float8_e4m3fn, ``a_scale`` ``[M, ceil(K / 128)]`` float32: one scale per row
  and group of 128 columns (vLLM's ``per_token_group_quant_fp8`` with group 128), row-major or
  column-major (strides ``(1, M)``: ``column_major_scales=True``, DeepGEMM's layout, which the
  kernels read; a row-major one is transposed into a copy first);
- ``b`` ``[N, K]`` float8_e4m3fn (a linear layer's weight), ``b_scale`` ``[ceil(N / 128),
  ceil(K / 128)]`` float32: one scale per 128 x 128 block (a block-FP8 checkpoint's
  ``weight_scale_inv``: DeepSeek-V3, Qwen3-FP8);
- ``bias`` ``[N]`` (``out_dtype`` or float32) or ``None``.

The products are summed per 128-wide k-tile in f32 and each k-tile's partial is multiplied by
its two scales (or, see below, the scales are applied inside the MMA); the result is rounded
once to ``out_dtype``. Any ``M, N >= 1``; ``K`` a positive multiple of 16 (e4m3 rows move in
16-byte vectors). Tensors contiguous (``a_scale``: or column-major) and 16-byte aligned, on one
device.

Kernels (``fp8_kernels``), by the architecture (CUDA: the device's; CPU tensors: the emulator
under ``HEXLAYOUT_EMULATE=1`` with ``HEXLAYOUT_EMULATE_ARCH``):

- sm_89: ``gemm_fp8_sm89_*``, e4m3 ``mma.sync``, per-k-tile partials scaled in registers;
- sm_90a: up to 64 rows ``gemm_fp8_sm90_*``, swap-AB e4m3 ``wgmma`` (weights on the MMA's M side,
  16 / 32 / 64 rows of ``a`` on its N side); more rows ``gemm_fp8_sm90_ws_*``, 128 x 128 tiles,
  warp-specialized (TMA weight tiles, two consumer warp groups); partials scaled in registers;
- sm_100a: when every scale of ``a_scale`` and ``b_scale`` is a power of two in ``[2^-127,
  2^127]`` (UE8M0), ``gemm_fp8_sm100_ue8m0_*``: the block-scaled ``tcgen05.mma`` applies both
  scales inside the MMA; otherwise ``gemm_fp8_sm100_*`` / ``gemm_fp8_sm100_ws_*``, the sm_90a
  sources with ``tcgen05.mma`` (registers scale the partials). Which one is ``scale_format``'s:
  ``""`` (the default: general scales, the register path), ``"ue8m0"`` (the caller vouches that
  every scale is a power of two: the block-scaled MMA; checked on CPU tensors and on CUDA under
  ``HEXLAYOUT_CHECK=1``) or ``"auto"`` (read from the values, ``moe.fp8.is_ue8m0``: one
  synchronization on CUDA; ``""`` while capturing a CUDA graph and for fake tensors).

sm_80 has no e4m3 MMA: a clear error. ``torch.ops.hexlayout.gemm_fp8`` is the torch op (fake
implementation for meta / fake tensors and ``torch.compile``, running the same check).
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.args import GRID_LIMITS, INT32_MAX, ArgumentError, ArgumentTypeError

from ..host.checks import check_device, is_real, kind
from ..host.device import kernel_arch
from ..moe.fp8 import is_ue8m0
from .fp8_kernels import (
    BN_BS,
    MAX_BM_BS,
    SCALE_BLOCK,
    gemm_fp8_sm89_kernel,
    gemm_fp8_sm90_kernel,
    gemm_fp8_sm90_ws_kernel,
    gemm_fp8_sm100_ue8m0_kernel,
)

__all__ = ["check_gemm_fp8", "run_gemm_fp8", "fp8_gemm_config", "rows_per_launch", "FP8_ARCHS",
           "SCALE_FORMATS"]

OP = "hexlayout.gemm_fp8"
#: architectures with an e4m3 MMA
FP8_ARCHS = ("sm_89", "sm_90a", "sm_100a")
#: ``scale_format`` values: general scales, powers of two vouched for, read from the values
SCALE_FORMATS = ("", "ue8m0", "auto")
#: shared stages of the swap-AB / block-scaled kernels (loaded 2 k-tiles ahead)
STAGES = 4
#: stages of the many-row warp-specialized kernel: 32 KiB each (128 rows of a, 128 of b), 192 KiB
WS_STAGES = 6
#: rows of ``a`` above which sm_90a / sm_100a (general scales) take the warp-specialized kernel
WS_MIN_M = 64


def _layout(name: str, t: Any) -> None:
    """``t`` contiguous (``a_scale``: or column-major) and 16-byte aligned (tensors without storage:
    by their storage offset, so eager and fake agree)."""
    if name == "a_scale" and not t.is_contiguous() and t.t().is_contiguous():
        t = t.t()                                       # column-major scales: contiguous [K / 128, M]
    if not t.is_contiguous():
        raise ArgumentError(OP, name, f"has strides {tuple(t.stride())}; it must be contiguous: "
                            f"pass {name}.contiguous()")
    off = t.data_ptr() % 16 if is_real(t) else t.storage_offset() * t.element_size() % 16
    if off and t.numel():
        raise ArgumentError(OP, name, f"starts {off} bytes off 16-byte alignment; pass {name}.clone()")


def _tensor(name: str, t: Any, dtype: Any, what: str, ndim: int) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(OP, name, f"expected a {what} tensor, got {kind(t)}")
    if t.dtype != dtype:
        raise ArgumentTypeError(OP, name, f"must be {what}, got {t.dtype}")
    if t.dim() != ndim:
        raise ArgumentError(OP, name, f"must have {ndim} dimension{'s' if ndim > 1 else ''}, got shape "
                            f"{list(t.shape)}")


def check_gemm_fp8(a: Any, b: Any, a_scale: Any, b_scale: Any, out_dtype: Any = None, bias: Any = None,
                   scale_format: Any = "") -> tuple[int, int, int]:
    """The one check of ``gemm_fp8`` (eager, torch op, fake): returns ``(M, N, K)``; every bad
    argument is an ``ArgumentTypeError`` / ``ArgumentError`` naming it (see the module docstring)."""
    import torch

    _tensor("a", a, torch.float8_e4m3fn, "float8_e4m3fn", 2)
    _tensor("b", b, torch.float8_e4m3fn, "float8_e4m3fn", 2)
    _tensor("a_scale", a_scale, torch.float32, "float32", 2)
    _tensor("b_scale", b_scale, torch.float32, "float32", 2)
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ArgumentTypeError(OP, "out_dtype",
                                f"must be torch.bfloat16 or torch.float16, got {out_dtype!r:.60}")
    m, k = a.shape
    n, kb_ = b.shape
    if kb_ != k:
        raise ArgumentError(OP, "b", f"must be [N, K] with K = {k} (a's columns), got {list(b.shape)}")
    if k == 0 or k % 16:
        raise ArgumentError(OP, "a", f"K ({k}) must be a positive multiple of 16 (e4m3 rows move in 16-byte "
                            "vectors)")
    if m == 0 or n == 0:
        raise ArgumentError(OP, "a" if m == 0 else "b", f"M ({m}) and N ({n}) must be at least 1")
    if n * k > INT32_MAX:
        raise ArgumentError(OP, "b", f"has {n} x {k} elements, more than 32-bit indices address (2^31 - 1): "
                            "split N")
    kb = -(-k // SCALE_BLOCK)
    if tuple(a_scale.shape) != (m, kb):
        raise ArgumentError(OP, "a_scale", f"must have shape {[m, kb]} (one scale per row of a and group of "
                            f"{SCALE_BLOCK} columns), got {list(a_scale.shape)}")
    nb = -(-n // SCALE_BLOCK)
    if tuple(b_scale.shape) != (nb, kb):
        raise ArgumentError(OP, "b_scale", f"must have shape {[nb, kb]} (one scale per {SCALE_BLOCK} x "
                            f"{SCALE_BLOCK} block of b {list(b.shape)}), got {list(b_scale.shape)}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise ArgumentTypeError(OP, "bias", f"expected a tensor or None, got {kind(bias)}")
        if bias.dtype not in (out_dtype, torch.float32):
            raise ArgumentTypeError(OP, "bias",
                                    f"must be {out_dtype} (out_dtype) or float32, got {bias.dtype}")
        if tuple(bias.shape) != (n,):
            raise ArgumentError(OP, "bias", f"must have shape [{n}] (N), got {list(bias.shape)}")
    named = [(x, t) for x, t in (("b", b), ("a_scale", a_scale), ("b_scale", b_scale), ("bias", bias))
             if t is not None]
    check_device(OP, ("a", a), named)
    for name, t in [("a", a), *named]:
        _layout(name, t)
    _check_scale_format(scale_format, a_scale, b_scale)
    if a.device.type in ("cuda", "cpu"):
        arch = kernel_arch(a.device)
        if arch not in FP8_ARCHS:
            where = "the GPU is" if a.device.type == "cuda" else "HEXLAYOUT_EMULATE_ARCH is"
            raise ArgumentError(OP, "a", f"the fp8 GEMM needs e4m3 mma (sm_89, sm_90a or sm_100a); {where} "
                                f"{arch} (for CPU tensors set HEXLAYOUT_EMULATE_ARCH=sm_89, sm_90a or "
                                "sm_100a)")
    return m, n, k


def _check_scale_format(fmt: Any, a_scale: Any, b_scale: Any) -> None:
    from ..host.launch import content_checks

    if not isinstance(fmt, str) or fmt not in SCALE_FORMATS:
        raise ArgumentError(OP, "scale_format", f"must be '', 'ue8m0' or 'auto', got {fmt!r:.60}")
    if fmt == "ue8m0":
        for name, s in (("a_scale", a_scale), ("b_scale", b_scale)):
            if content_checks(s) and not is_ue8m0(s):
                raise ArgumentError(OP, name, "scale_format='ue8m0' but a scale is not a power of two in "
                                    "[2^-127, 2^127]")


def _ue8m0(fmt: str, a_scale: Any, b_scale: Any) -> bool:
    """Whether the block-scaled MMA may take these scales (``scale_format``: see the module docstring)."""
    from hexlayout.runtime import capturing

    if fmt == "ue8m0":
        return True
    if fmt == "auto" and not capturing() and is_real(a_scale) and is_real(b_scale):
        return is_ue8m0(a_scale) and is_ue8m0(b_scale)
    return False


def fp8_gemm_config(m: int, arch: str, ue8m0: bool = False) -> tuple[Any, dict[str, int]]:
    """``(kernel factory, constants)`` for ``m`` rows on ``arch`` (sizes only, capture-safe): rows of
    ``a`` per tile ``BM`` = 16 (m <= 16), 32 (m <= 32), else 64; sm_89 ``64 x BM``-row tiles of
    ``mma.sync`` with 2 cp.async stages, sm_90a / sm_100a swap-AB tiles of 64 weight rows (4
    stages) or, above ``WS_MIN_M`` rows, the warp-specialized 128 x 128 tiles (two consumer warp
    groups, ``WS_STAGES``), sm_100a with UE8M0 scales block-scaled tiles of 128 weight rows
    (``STAGES`` 4, at most 64 rows of ``a``)."""
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    if arch == "sm_100a" and ue8m0:
        return gemm_fp8_sm100_ue8m0_kernel, {"BM": min(bm, MAX_BM_BS), "BN": BN_BS, "BK": SCALE_BLOCK,
                                             "STAGES": STAGES}
    if arch in ("sm_90a", "sm_100a") and m > WS_MIN_M:
        return (lambda dt: gemm_fp8_sm90_ws_kernel(dt, arch)), {"BM": 128, "BN": 128, "BK": SCALE_BLOCK,
                                                                "STAGES": WS_STAGES, "CONSUMERS": 2}
    if arch in ("sm_90a", "sm_100a"):
        return (lambda dt: gemm_fp8_sm90_kernel(dt, arch)), {"BM": bm, "BN": 64, "BK": SCALE_BLOCK,
                                                             "STAGES": STAGES}
    return gemm_fp8_sm89_kernel, {"BM": bm, "BN": 64, "BK": SCALE_BLOCK, "STAGES": 2, "WARPS": 4}


def rows_per_launch(bm: int, n: int, k: int) -> int:
    """The most rows of ``a`` one launch takes: ``cdiv(M, BM)`` row tiles in ``grid.y`` (at most
    65,535) and the row slices of ``a`` and ``c``, with a tile of slack, addressable with 32-bit
    indices; a multiple of ``bm``."""
    rows = min(GRID_LIMITS[1] * bm, INT32_MAX // max(k, n, 1) - bm)
    return max(rows - rows % bm, bm)


def run_gemm_fp8(a: Any, b: Any, a_scale: Any, b_scale: Any, out_dtype: Any = None, bias: Any = None,
                 scale_format: str = "") -> Any:
    """``gemm_fp8`` on arguments ``check_gemm_fp8`` accepted: one kernel launch (and, for a bias
    not in float32, its cast to float32; for a row-major ``a_scale``, its transposed copy); more
    than ``rows_per_launch`` rows run as row slices, one launch each."""
    import torch

    from ..host.launch import build_for, fresh, lang_dtype, run_kernel

    odt = torch.bfloat16 if out_dtype is None else out_dtype
    m, n = a.shape[0], b.shape[0]
    dev = a.device
    arch = kernel_arch(dev)
    factory, consts = fp8_gemm_config(m, arch, _ue8m0(scale_format, a_scale, b_scale))
    c = fresh((m, n), odt, dev)
    has_bias = bias is not None
    bias32 = bias.float() if has_bias else a_scale.reshape(-1)[:1]   # a one-element dummy without bias
    as_t = a_scale.t()                                  # the kernels read [K / 128, M]
    if not as_t.is_contiguous():
        as_t = as_t.contiguous()                        # row-major a_scale: one transposed copy
    bld = build_for(factory(lang_dtype(odt)), dev, {**consts, "HAS_BIAS": has_bias})
    bk = b[None] if "CONSUMERS" in consts else b         # the warp-specialized kernel's TMA view: [1, N, K]
    rows = rows_per_launch(consts["BM"], n, a.shape[1])
    for r0 in range(0, m, rows):            # one launch unless the grid or 32-bit indices need more
        r1 = min(m, r0 + rows)
        sl = as_t if (r0, r1) == (0, m) else as_t[:, r0:r1].contiguous()
        run_kernel(bld, (a[r0:r1], sl, bk, b_scale, bias32, c[r0:r1]), outputs=(5,))
    return c
