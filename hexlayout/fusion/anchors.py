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

__all__ = ["AnchorProvider", "GemmProvider", "register_gemm", "gemm_provider", "ReductionProvider",
           "register_reduction", "reduction_provider", "AttentionProvider", "register_attention",
           "attention_provider"]


@dataclass(frozen=True)
class AnchorProvider:
    """Anchor kernels of the kernels layer: ``kernel`` and ``consts`` (see the module
    docstring for each kind's signatures)."""

    kernel: Callable[..., Any]
    consts: Callable[..., dict[str, Any]]


#: the GEMM, row-reduction and attention providers are the same record
GemmProvider = ReductionProvider = AttentionProvider = AnchorProvider

#: kind -> (the hexlayout.ops module that registers it, what it is called in errors)
_KINDS = {"gemm": ("hexlayout.ops.gemm_kernels", "GEMM anchor kernels"),
          "reduction": ("hexlayout.ops.row_reduce_kernels", "row-reduction anchor kernels"),
          "attention": ("hexlayout.ops.sdpa_anchor", "attention anchor kernel")}
_REGISTERED: dict[str, AnchorProvider] = {}


def _provider(kind: str) -> AnchorProvider:
    """The registered provider of ``kind`` (importing its ``hexlayout.ops`` module once)."""
    module, what = _KINDS[kind]
    if kind not in _REGISTERED:
        try:
            importlib.import_module(module)
        except ImportError as e:                   # pragma: no cover - a broken install
            raise FusionUnsupported(f"no {what}: importing hexlayout.ops failed ({e})") from None
    if kind not in _REGISTERED:                    # pragma: no cover
        raise FusionUnsupported(f"no {what} registered")
    return _REGISTERED[kind]


def register_gemm(kernel: Callable[..., Any], consts: Callable[..., dict[str, Any]]) -> None:
    """Register the GEMM anchor provider (the latest registration wins)."""
    _REGISTERED["gemm"] = AnchorProvider(kernel, consts)


def gemm_provider() -> AnchorProvider:
    """The registered GEMM provider (importing ``hexlayout.ops`` once if none is yet)."""
    return _provider("gemm")


def register_reduction(kernel: Callable[..., Any], consts: Callable[..., dict[str, Any]]) -> None:
    """Register the row-reduction anchor provider (the latest registration wins)."""
    _REGISTERED["reduction"] = AnchorProvider(kernel, consts)


def reduction_provider() -> AnchorProvider:
    """The registered row-reduction provider (importing it from ``hexlayout.ops`` once)."""
    return _provider("reduction")


def register_attention(kernel: Callable[..., Any], consts: Callable[..., dict[str, Any]]) -> None:
    """Register the attention anchor provider (the latest registration wins)."""
    _REGISTERED["attention"] = AnchorProvider(kernel, consts)


def attention_provider() -> AnchorProvider:
    """The registered attention provider (importing it from ``hexlayout.ops`` once)."""
    return _provider("attention")
