"""hexlayout kernels written in the tile language, and their torch ops.

- ``gemm`` (``hexlayout.ops.gemm``): ``act(scale * a @ B + bias) + residual`` for f16 /
  bf16, sm_80 / sm_89 (multistage cp.async + mma.sync) and sm_90a (warp-specialized,
  persistent TMA + wgmma), with the config space, heuristics and autotuner of
  ``gemm_config`` and the kernels of ``gemm_kernels``.
- ``reshape_and_cache`` (``hexlayout.ops.kv_cache``): new K/V rows scattered into a paged KV
  cache through a slot mapping (NHD and HND layouts).
- ``paged_attention`` (``hexlayout.ops.attention``): varlen attention over a paged KV cache
  (mixed prefill / decode, causal, windows, softcap, GQA, LSE), kernels in ``attention_kernels``.
- ``attention_varlen`` (``hexlayout.ops.attention_varlen``): prefill attention over packed
  variable-length sequences (FlashAttention's varlen interface), kernel in
  ``attention_varlen_kernels``.
- ``fused_moe`` (``hexlayout.ops.moe``): the fused mixture-of-experts layer (vLLM's semantics) for
  bf16 / f16 expert weights, dispatching prepared quantized weights to the ops below; routing
  alignment ``moe_align`` (``hexlayout.ops.moe_align``) and the grouped GEMMs of ``moe_kernels``.
- ``prepare_wna16`` / ``fused_moe_wna16`` (``hexlayout.ops.moe_wna16``): mixture of experts with
  AWQ / GPTQ 4-bit and GPTQ 8-bit expert weights, dequantized in registers before mma.sync
  (kernels in ``moe_wna16_kernels``).
- ``prepare_fp8`` / ``fused_moe_fp8`` (``hexlayout.ops.moe_fp8``): mixture of experts with e4m3
  expert weights (per-expert or 128 x 128 block scales) and activations quantized per token in
  the op, sm_89 / sm_90a (kernels in ``moe_fp8_kernels``, ``moe_fp8_kernels_sm90``).

Importing this package registers ``torch.ops.hexlayout.gemm``,
``torch.ops.hexlayout.reshape_and_cache`` and ``torch.ops.hexlayout.paged_attention`` when
torch is installed;
the kernels and configs work without torch.
"""

try:
    import torch as _torch  # noqa: F401 - registration needs torch
except ImportError:  # pragma: no cover - torch is optional for the kernels themselves
    _torch = None

from . import compile_backend as _compile_backend  # noqa: E402,F401 - registers the fusion anchors
from .moe import fused_moe  # noqa: E402,F401 - hexlayout.ops.fused_moe
from .moe_align import moe_align  # noqa: E402,F401 - hexlayout.ops.moe_align
from .moe_fp8 import Fp8MoEWeights, prepare_fp8  # noqa: E402,F401 - hexlayout.ops.prepare_fp8
from .moe_wna16 import WNA16Weights, prepare_wna16  # noqa: E402,F401 - hexlayout.ops.prepare_wna16

if _torch is not None:
    from .torch_attention import paged_attention_op  # noqa: F401 - torch.ops.hexlayout.paged_attention
    from .torch_attention_varlen import attention_varlen_op  # noqa: F401 - torch.ops.hexlayout.attention_varlen
    from .torch_gemm import gemm_op  # noqa: F401 - registers torch.ops.hexlayout.gemm
    from .torch_kv_cache import reshape_and_cache_op  # noqa: F401 - torch.ops.hexlayout.reshape_and_cache
    from .torch_moe import fused_moe_op  # noqa: F401 - torch.ops.hexlayout.fused_moe
    from .torch_moe_fp8 import fused_moe_fp8_op  # noqa: F401 - torch.ops.hexlayout.fused_moe_fp8
    from .torch_moe_wna16 import fused_moe_wna16_op  # noqa: F401 - torch.ops.hexlayout.fused_moe_wna16
