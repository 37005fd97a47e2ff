"""``torch.ops.hexlayout.gemm``: the GEMM registered with torch.library.

Schema: ``gemm(Tensor a, Tensor b, Tensor? bias=None, Tensor? residual=None,
str activation="none", float? scale=None, str b_layout="nk") -> Tensor``. The fake
implementation gives the ``M x N`` output of ``a``'s dtype and device, so the op traces
under ``torch.compile`` and CUDA-graph capture; the real one is ``hexlayout.ops.gemm.gemm``
(CUDA tensors launch, CPU tensors need ``HEXLAYOUT_EMULATE=1``).
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.torch_ops import define_op

from .gemm import gemm

__all__ = ["gemm_op"]

SCHEMA = ("(Tensor a, Tensor b, Tensor? bias=None, Tensor? residual=None, str activation=\"none\", "
          "float? scale=None, str b_layout=\"nk\") -> Tensor")


def _fake(a: Any, b: Any, bias: Any = None, residual: Any = None, activation: str = "none",
          scale: float | None = None, b_layout: str = "nk") -> Any:
    n = b.shape[0] if b_layout == "nk" else b.shape[1]
    return a.new_empty((a.shape[0], n))


def _impl(a: Any, b: Any, bias: Any = None, residual: Any = None, activation: str = "none",
          scale: float | None = None, b_layout: str = "nk") -> Any:
    return gemm(a, b, bias, residual, activation, scale, b_layout)


gemm_op = define_op("gemm", SCHEMA, fake=_fake, impl=_impl)
