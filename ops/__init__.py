"""hexlayout kernels written in the tile language, and their torch ops.

- ``gemm`` (``hexlayout.ops.gemm``): ``act(scale * a @ B + bias) + residual`` for f16 /
  bf16, sm_80 / sm_89 (multistage cp.async + mma.sync) and sm_90a (warp-specialized,
  persistent TMA + wgmma), with the config space, heuristics and autotuner of
  ``gemm_config`` and the kernels of ``gemm_kernels``.
- ``reshape_and_cache`` (``hexlayout.ops.kv_cache``): new K/V rows scattered into a paged KV
  cache through a slot mapping (NHD and HND layouts).

Importing this package registers ``torch.ops.hexlayout.gemm`` and
``torch.ops.hexlayout.reshape_and_cache`` when torch is installed;
the kernels and configs work without torch.
"""

try:
    import torch as _torch  # noqa: F401 - registration needs torch
except ImportError:  # pragma: no cover - torch is optional for the kernels themselves
    _torch = None

if _torch is not None:
    from .torch_gemm import gemm_op  # noqa: F401 - registers torch.ops.hexlayout.gemm
    from .torch_kv_cache import reshape_and_cache_op  # noqa: F401 - torch.ops.hexlayout.reshape_and_cache
