"""hexlayout's ops: kernels written in the tile language, with their host dispatch and torch ops.

Each op is a Python function ``hexlayout.ops.<name>`` and, where torch is installed, a torch op
``torch.ops.hexlayout.<name>`` (torch.library, with a fake implementation for meta / fake
tensors, ``torch.compile`` and CUDA-graph capture):

- ``gemm``, ``gemm_fp8`` (package ``gemm``): ``act(scale * a @ B + bias) + residual`` for f16 /
  bf16, and the e4m3 GEMM with 128-block scales (block-FP8 checkpoints' linear layers);
- ``paged_attention``, ``attention_varlen``, ``mla_decode``, ``mla_reshape_and_cache`` (package
  ``attention``): attention over a paged KV cache (mixed prefill / decode), over packed
  variable-length sequences, and MLA (DeepSeek) decode over a paged latent cache;
- ``reshape_and_cache`` (package ``kv_cache``): new K/V rows scattered into a paged KV cache;
- ``fused_moe``, ``fused_moe_wna16``, ``fused_moe_fp8``, ``moe_align``, ``prepare_wna16``,
  ``prepare_mxfp4``, ``prepare_fp8`` (package ``moe``): the fused mixture-of-experts layer for
  bf16 / f16, int4 / int8 (AWQ, GPTQ incl. act-order), MXFP4 and fp8 expert weights;
- ``selective_scan``, ``selective_state_update`` (package ``mamba``): the Mamba-1 selective scan
  and the Mamba-1 / Mamba-2 decode-step state update.
- ``causal_conv1d``, ``causal_conv1d_update``, ``ssd_scan`` (package ``mamba``): Mamba's depthwise
  causal convolution, prefill (batched or packed) and decode, and the Mamba-2 SSD scan.

Every op package holds its kernels per architecture, its argument checks, its host dispatch and
its torch registration; ``host`` holds what they share (device facts, checks, build and run),
``row_reduce`` the reduction anchors of the fusion backend (``compile_backend``). The kernels
and configs work without torch; calling an op on tensors needs torch
(``pip install -e '.[torch,cuda]'``).
"""

from . import compile_backend as _compile_backend  # noqa: F401 - registers the fusion anchors
from .attention import attention_varlen, mla_decode, mla_reshape_and_cache, paged_attention
from .gemm import gemm, gemm_fp8
from .kv_cache import reshape_and_cache
from .mamba import causal_conv1d, causal_conv1d_update, selective_scan, selective_state_update, ssd_scan
from .moe import (
    Fp8MoEWeights,
    WNA16Weights,
    fused_moe,
    fused_moe_fp8,
    fused_moe_wna16,
    moe_align,
    prepare_fp8,
    prepare_mxfp4,
    prepare_wna16,
)

__all__ = ["gemm", "gemm_fp8", "paged_attention", "attention_varlen", "mla_decode", "mla_reshape_and_cache",
           "reshape_and_cache", "fused_moe", "fused_moe_wna16",
           "fused_moe_fp8", "moe_align", "prepare_wna16", "prepare_mxfp4",
           "prepare_fp8", "WNA16Weights", "Fp8MoEWeights"]
__all__ += ["selective_scan", "selective_state_update", "causal_conv1d", "causal_conv1d_update", "ssd_scan"]
