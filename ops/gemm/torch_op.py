"""``torch.ops.hexlayout.gemm``: the GEMM registered with torch.library.

Schema: ``gemm(Tensor a, Tensor b, Tensor? bias=None, Tensor? residual=None,
str activation="none", float? scale=None, str b_layout="nk") -> Tensor``. Every path - the
CUDA and CPU kernels and the fake implementation (meta / fake tensors, ``torch.compile``,
CUDA-graph capture) - first runs ``hexlayout.ops.gemm.check_gemm``, so a bad argument
gets the same error eagerly and while tracing. The fake implementation gives the ``M x N``
output of ``a``'s dtype and device; the real one is ``hexlayout.ops.gemm`` (CUDA tensors
launch, CPU tensors need ``HEXLAYOUT_EMULATE=1``).

Autograd: with ``z = scale * (a @ B) + bias`` (``B = b^T`` for ``"nk"``, ``b`` for ``"kn"``)
and ``c = act(z) + residual``, the backward of an incoming ``dc`` is

- ``d residual = dc``; ``dz = dc * act'(z)`` (relu: ``[z > 0]``; gelu (exact), gelu_tanh and
  silu: their derivatives, through ``aten.gelu_backward`` (``approximate`` "none" / "tanh") /
  ``aten.silu_backward``);
- ``d bias = sum over rows of dz``; ``dP = scale * dz`` (the product's gradient);
- ``d a = dP @ B^T``; ``d B = a^T @ dP``, i.e. ``d b = dP^T @ a`` (``"nk"``) or ``a^T @ dP`` (``"kn"``).

It is computed with torch ops in float32 (``z`` recomputed from the saved inputs when the
activation needs it) and returned in the inputs' dtype; ``scale`` is a number and gets no
gradient.

``torch.ops.hexlayout.gemm_fp8`` (``FP8_SCHEMA``): the dense FP8 GEMM with 128-block scales
(``fp8``); its fake implementation runs ``check_gemm_fp8`` as the eager path does and gives the
``M x N`` output in ``out_dtype`` (bf16 when ``None``). No autograd (inputs that require grad
are refused).
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.torch_ops import define_op

from .fp8 import check_gemm_fp8, run_gemm_fp8
from .op import GELU_APPROXIMATE, check_gemm, gemm_cached, run_checked

__all__ = ["gemm_op", "gemm_fp8_op"]

SCHEMA = ("(Tensor a, Tensor b, Tensor? bias=None, Tensor? residual=None, str activation=\"none\", "
          "float? scale=None, str b_layout=\"nk\") -> Tensor")


def _fake(a: Any, b: Any, bias: Any = None, residual: Any = None, activation: str = "none",
          scale: float | None = None, b_layout: str = "nk") -> Any:
    n = b.shape[0] if b_layout == "nk" else b.shape[1]
    return a.new_empty((a.shape[0], n))


def _impl(a: Any, b: Any, bias: Any = None, residual: Any = None, activation: str = "none",
          scale: float | None = None, b_layout: str = "nk") -> Any:
    # check_gemm has run (the Op runs it before every implementation)
    m, k = a.shape
    n = b.shape[0] if b_layout == "nk" else b.shape[1]
    return run_checked(a, b, bias, residual, activation, scale, b_layout, m, n, k)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    a, b, bias, residual, activation, scale, b_layout = inputs
    ctx.save_for_backward(a, b, bias)
    ctx.activation, ctx.scale, ctx.b_layout = activation, scale, b_layout
    ctx.has_residual = residual is not None


def _backward(ctx: Any, dc: Any) -> tuple[Any, ...]:
    """``(d a, d b, d bias, d residual, None, None, None)``: see the module docstring."""
    import torch

    a, b, bias = ctx.saved_tensors
    # one flag per argument given: the dispatcher drops trailing arguments left at their default
    need_a, need_b, need_bias, need_res = (*ctx.needs_input_grad, False, False, False)[:4]
    g = dc.float()
    bmat = b.float().t() if ctx.b_layout == "nk" else b.float()          # B: K x N
    dz = g
    if ctx.activation != "none":
        z = a.float() @ bmat
        if ctx.scale is not None:
            z = z * ctx.scale
        if bias is not None:
            z = z + bias.float()
        if ctx.activation == "relu":
            dz = torch.ops.aten.threshold_backward(g, z, 0.0)
        elif ctx.activation in GELU_APPROXIMATE:
            dz = torch.ops.aten.gelu_backward(g, z, approximate=GELU_APPROXIMATE[ctx.activation])
        else:
            dz = torch.ops.aten.silu_backward(g, z)
    dp = dz * ctx.scale if ctx.scale is not None else dz
    da = (dp @ bmat.t()).to(a.dtype) if need_a else None
    db = None
    if need_b:
        db = (dp.t() @ a.float() if ctx.b_layout == "nk" else a.float().t() @ dp).to(b.dtype)
    dbias = dz.sum(0).to(bias.dtype) if need_bias and bias is not None else None
    dres = dc.to(a.dtype) if need_res and ctx.has_residual else None
    return da, db, dbias, dres, None, None, None


gemm_op = define_op("gemm", SCHEMA, fake=_fake, impl=_impl, check=check_gemm, fast=gemm_cached,
                    backward=_backward, setup_context=_setup_context)


FP8_SCHEMA = ("(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, *, ScalarType? out_dtype=None, "
              "Tensor? bias=None, str scale_format=\"\") -> Tensor")


def _fp8_fake(a: Any, b: Any, a_scale: Any, b_scale: Any, *, out_dtype: Any = None, bias: Any = None,
              scale_format: str = "") -> Any:
    import torch

    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype or torch.bfloat16)


def _fp8_impl(a: Any, b: Any, a_scale: Any, b_scale: Any, *, out_dtype: Any = None, bias: Any = None,
              scale_format: str = "") -> Any:
    # check_gemm_fp8 has run (the Op runs it before every implementation)
    return run_gemm_fp8(a, b, a_scale, b_scale, out_dtype, bias, scale_format)


gemm_fp8_op = define_op("gemm_fp8", FP8_SCHEMA, fake=_fp8_fake, impl=_fp8_impl, check=check_gemm_fp8)
