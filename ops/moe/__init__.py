"""Mixture of experts (vLLM's fused MoE semantics): ``fused_moe`` (bf16 / f16 weights, or
prepared quantized ones), ``fused_moe_wna16`` (AWQ / GPTQ int4 incl. act-order, GPTQ int8,
MXFP4), ``fused_moe_fp8`` (e4m3 with per-expert or block scales), the routing alignment
``moe_align`` and the weight preparation ``prepare_wna16`` / ``prepare_mxfp4`` /
``prepare_fp8`` (``hexlayout.ops.*``, ``torch.ops.hexlayout.*``).

- ``args``: argument checks; ``align``: the routing alignment;
- ``op``, ``wna16``, ``fp8``, ``splitk``: host dispatch per weight kind and split-K;
  ``act_order`` (GPTQ ``g_idx``) and ``mxfp4`` (``prepare_mxfp4``): the formats W4A16 runs;
- ``kernels_sm80`` / ``kernels_sm90``, ``wna16_kernels_sm80`` / ``wna16_kernels_sm90``,
  ``fp8_kernels_sm89`` / ``fp8_kernels_sm90``: the kernels per architecture;
- ``torch_op``: the torch.library registrations;
- ``fusion``: the ``torch.compile`` anchor record (experts written with gathered weights ->
  one ``fused_moe``), ``fusion_loop`` (HF's per-expert loop unrolled in one graph -> one
  ``fused_moe``), ``derived`` (the weights they re-lay out once).
"""

from ..host.torch import HAVE_TORCH
from .align import moe_align
from .fp8 import Fp8MoEWeights, fused_moe_fp8, prepare_fp8
from .mxfp4 import prepare_mxfp4
from .op import fused_moe
from .wna16 import WNA16Weights, fused_moe_wna16, prepare_wna16

if HAVE_TORCH:
    from . import torch_op  # noqa: F401 - register the torch ops

__all__ = ["fused_moe", "fused_moe_wna16", "fused_moe_fp8", "moe_align", "prepare_wna16", "prepare_mxfp4",
           "prepare_fp8", "WNA16Weights", "Fp8MoEWeights"]
