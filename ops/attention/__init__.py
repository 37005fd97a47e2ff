"""Attention: ``paged_attention`` over a paged KV cache and ``attention_varlen`` over packed
variable-length sequences (``hexlayout.ops.*``, ``torch.ops.hexlayout.*``), and the
``scaled_dot_product_attention`` anchor of the fusion backend.

- ``mla`` / ``mla_kernels`` / ``mla_cache`` / ``torch_mla``: MLA decode over a paged latent cache
  and the latent cache's writer (ops, kernels, registrations);
- ``args``: argument checks (also of the KV cache layout ``reshape_and_cache`` writes);
- ``paged`` / ``varlen``: host dispatch; ``launch_args``: the outputs and score scales both
  hand their kernels; ``paged_kernels_sm80``, ``varlen_kernels_sm80``, ``kernels_sm90``: the
  kernels per architecture; ``tiles``: the block index arithmetic and masks those kernels share;
- ``torch_paged`` / ``torch_varlen``: the torch.library registrations;
- ``sdpa_anchor``: the fusion anchor kernel; ``sdpa_fusion``: its anchor record (registered
  with ``hexlayout.fusion.anchors`` when imported) and how a fused call runs; ``index_mask``:
  masks built from query / key positions (a sliding window), computed by that kernel.
"""

from ..host.torch import HAVE_TORCH
from .mla import mla_decode
from .mla_cache import mla_reshape_and_cache
from .paged import paged_attention
from .varlen import attention_varlen

if HAVE_TORCH:
    from . import torch_mla, torch_paged, torch_varlen  # noqa: F401 - register the torch ops

__all__ = ["paged_attention", "attention_varlen", "mla_decode", "mla_reshape_and_cache"]
