"""GEMM: ``c = act(scale * a @ B + bias) + residual`` (``hexlayout.ops.gemm``,
``torch.ops.hexlayout.gemm``).

- ``op``: argument checks, host dispatch, the cached launch path;
- ``config``: the tile configs, the heuristic and the autotuner;
- ``kernels``: the kernels per architecture (sm_80 / sm_89 multistage cp.async + mma.sync,
  sm_90a warp-specialized TMA + wgmma) and the GEMM fusion anchors;
- ``torch_op``: the torch.library registration (fake implementation, autograd).
"""

from ..host.torch import HAVE_TORCH
from .op import ACTIVATIONS, gemm

if HAVE_TORCH:
    from . import torch_op  # noqa: F401 - registers torch.ops.hexlayout.gemm

__all__ = ["gemm", "ACTIVATIONS"]
