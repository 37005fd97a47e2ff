"""GEMM: ``c = act(scale * a @ B + bias) + residual``, and the FP8 GEMM ``gemm_fp8`` (``hexlayout.ops.gemm``,
``torch.ops.hexlayout.gemm``).

- ``op``: argument checks, host dispatch, the cached launch path;
- ``config``: the tile configs, the heuristic and the autotuner;
- ``fp8`` / ``fp8_kernels``: the dense FP8 GEMM with 128-block scales (``gemm_fp8``) and its
  kernels per architecture;
- ``kernels``: the kernels per architecture (sm_80 / sm_89 multistage cp.async + mma.sync,
  sm_90a warp-specialized TMA + wgmma), the anchor kernels of fusion;
- ``fused_build``: the GEMM kernel with a fusion plan fused, built (``op`` and ``fusion`` share it);
- ``fusion``: the GEMM anchor records (``mm``, ``addmm``, ``bmm``, ``linear``, ``hexlayout.gemm``),
  registered with ``hexlayout.fusion.anchors`` when imported, and how a fused call runs;
  ``fusion_plan``: the planner of a fused GEMM call;
- ``torch_op``: the torch.library registration (fake implementation, autograd).
"""

from ..host.torch import HAVE_TORCH
from .fp8_op import gemm_fp8
from .op import ACTIVATIONS, gemm

if HAVE_TORCH:
    from . import torch_op  # noqa: F401 - registers torch.ops.hexlayout.gemm

__all__ = ["gemm", "gemm_fp8", "ACTIVATIONS"]
