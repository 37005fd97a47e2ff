"""``hexlayout.ops.gemm_fp8``, the public entry of the dense FP8 GEMM with 128-block scales
(``fp8``: the definition, its checks and launch; ``torch_op``: ``torch.ops.hexlayout.gemm_fp8``)."""

from __future__ import annotations

from typing import Any

from ..host.torch import require_torch

__all__ = ["gemm_fp8"]


def gemm_fp8(a: Any, b: Any, a_scale: Any, b_scale: Any, *, out_dtype: Any = None, bias: Any = None,
             scale_format: str = "") -> Any:
    """The dense FP8 GEMM with 128-block scales (the definition: ``fp8``'s module docstring):
    ``torch.ops.hexlayout.gemm_fp8``. ``out_dtype`` ``None`` means ``torch.bfloat16``."""
    require_torch("hexlayout.ops.gemm_fp8")
    from .torch_op import gemm_fp8_op

    # the Op checks each argument's kind first (a named hexlayout error, not torch's binding error)
    return gemm_fp8_op(a, b, a_scale, b_scale, out_dtype=out_dtype, bias=bias, scale_format=scale_format)
