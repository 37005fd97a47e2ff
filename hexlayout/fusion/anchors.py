"""Where fusion finds its anchor kernels.

The anchor kernels live in the kernels layer (``hexlayout.ops``), above fusion; that layer
registers them here when it is imported (``register_gemm``), and ``gemm_provider()``
imports ``hexlayout.ops`` by name the first time an anchor is needed (as a plugin is
loaded), so fusion never imports the layer above it statically.

A GEMM provider is two functions:

- ``kernel(arch, dtype, b_layout, staged) -> hl.Kernel``: the anchor ``c[M, N] = a[M, K] @ B``
  with parameters ``a``, ``b`` (``N x K`` for ``"nk"``, ``K x N`` for ``"kn"``), ``c``;
  ``staged=True`` asks for a kernel whose operand loads are plain copies (a computing
  prologue needs them);
- ``consts(arch, m, n, k, staged) -> dict``: the kernel's tile constants for a problem.

A row-reduction provider (``register_reduction``) is two functions too:

- ``kernel(dtype, fn) -> hl.Kernel``: the anchor ``c[M, 1] = fn_j x[M, j]`` (f32) with
  parameters ``x``, ``c``, ``fn`` in ``"sum"``, ``"mean"``, ``"max"``; its one load of ``x``
  (whole rows into a register tile) and its one store of ``c`` are the fusion points;
- ``consts(m, n) -> dict``: its tile constants for ``m`` rows of ``n``.

The attention provider (``register_attention``): ``kernel() -> hl.Kernel`` (parameters
``q``, ``k``, ``v``, ``o`` in ``[B, S, heads, D]``, f16, and ``qk_scale``; constant
``CAUSAL``) and ``consts(sq, sk, d, causal, emulated) -> dict``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .spec import FusionUnsupported

__all__ = ["GemmProvider", "register_gemm", "gemm_provider", "ReductionProvider", "register_reduction",
           "reduction_provider", "AttentionProvider", "register_attention",
           "attention_provider"]


@dataclass(frozen=True)
class GemmProvider:
    """The GEMM anchor kernels of the kernels layer (see the module docstring)."""

    kernel: Callable[..., Any]
    consts: Callable[..., dict[str, Any]]


_GEMM: list[GemmProvider] = []


def register_gemm(kernel: Callable[..., Any], consts: Callable[..., dict[str, Any]]) -> None:
    """Register the GEMM anchor provider (the latest registration wins)."""
    _GEMM[:] = [GemmProvider(kernel, consts)]


def gemm_provider() -> GemmProvider:
    """The registered GEMM provider (importing ``hexlayout.ops`` once if none is yet)."""
    if not _GEMM:
        try:
            importlib.import_module("hexlayout.ops.gemm_kernels")
        except ImportError as e:                   # pragma: no cover - a broken install
            raise FusionUnsupported(f"no GEMM anchor kernels: importing hexlayout.ops failed ({e})") from None
    if not _GEMM:                                  # pragma: no cover
        raise FusionUnsupported("no GEMM anchor kernels are registered")
    return _GEMM[0]


@dataclass(frozen=True)
class ReductionProvider:
    """The row-reduction anchor kernels of the kernels layer (see the module docstring)."""

    kernel: Callable[..., Any]
    consts: Callable[..., dict[str, Any]]


_REDUCTION: list[ReductionProvider] = []


def register_reduction(kernel: Callable[..., Any], consts: Callable[..., dict[str, Any]]) -> None:
    """Register the row-reduction anchor provider (the latest registration wins)."""
    _REDUCTION[:] = [ReductionProvider(kernel, consts)]


def reduction_provider() -> ReductionProvider:
    """The registered row-reduction provider (importing it from ``hexlayout.ops`` once)."""
    if not _REDUCTION:
        try:
            importlib.import_module("hexlayout.ops.row_reduce_kernels")
        except ImportError as e:                   # pragma: no cover - a broken install
            raise FusionUnsupported(f"no row-reduction anchor kernels: importing hexlayout.ops failed "
                                    f"({e})") from None
    if not _REDUCTION:                             # pragma: no cover
        raise FusionUnsupported("no row-reduction anchor kernels are registered")
    return _REDUCTION[0]


@dataclass(frozen=True)
class AttentionProvider:
    """The attention anchor kernel of the kernels layer (see the module docstring)."""

    kernel: Callable[..., Any]
    consts: Callable[..., dict[str, Any]]


_ATTENTION: list[AttentionProvider] = []


def register_attention(kernel: Callable[..., Any], consts: Callable[..., dict[str, Any]]) -> None:
    """Register the attention anchor provider (the latest registration wins)."""
    _ATTENTION[:] = [AttentionProvider(kernel, consts)]


def attention_provider() -> AttentionProvider:
    """The registered attention provider (importing it from ``hexlayout.ops`` once)."""
    if not _ATTENTION:
        try:
            importlib.import_module("hexlayout.ops.sdpa_anchor")
        except ImportError as e:                   # pragma: no cover - a broken install
            raise FusionUnsupported(f"no attention anchor kernel: importing hexlayout.ops failed "
                                    f"({e})") from None
    if not _ATTENTION:                             # pragma: no cover
        raise FusionUnsupported("no attention anchor kernel is registered")
    return _ATTENTION[0]
