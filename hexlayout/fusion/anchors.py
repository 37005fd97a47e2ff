"""Where fusion finds its anchor kernels.

The anchor kernels live in the kernels layer (``hexlayout.ops``), above fusion: each of its
anchor modules registers itself here when it is imported (``register_gemm``,
``register_reduction``, ``register_attention``); importing ``hexlayout.ops`` - or its
``compile_backend``, which torch's ``torch_dynamo_backends`` entry point names - registers
them all. Fusion never imports that layer (statically or by name): an anchor nobody
registered is ``FusionUnsupported`` with that reason.

A GEMM provider is two functions:

- ``kernel(arch, dtype, b_layout, staged, a_layout="mk") -> hl.Kernel``: the anchor
  ``c[M, N] = A @ B`` with parameters ``a`` (``M x K`` for ``"mk"``, ``K x M`` for ``"km"``),
  ``b`` (``N x K`` for ``"nk"``, ``K x N`` for ``"kn"``), ``c``;
  ``staged=True`` asks for a kernel whose operand loads are plain copies (a computing
  prologue needs them);
- ``consts(arch, m, n, k, staged, windows) -> dict``: the kernel's tile constants for a
  problem; ``windows=True`` allows the epilogue to be applied per column window of the
  tile (an epilogue that pairs columns, the column halves and the head permutes, needs
  the whole tile and passes ``False``).

A row-reduction provider (``register_reduction``) is two functions too:

- ``kernel(dtype, fn, align_bytes) -> hl.Kernel``: the anchor ``c[M, 1] = fn_j x[M, j]``
  (f32) with parameters ``x`` (rows ``align_bytes``-aligned), ``c``, ``fn`` in ``"sum"``,
  ``"mean"``, ``"max"``; its one load of ``x`` (whole rows into a register tile, the tail
  past ``N`` masked) and its one store of ``c`` are the fusion points;
- ``consts(m, n) -> dict``: its tile constants for ``m`` rows of ``n`` (``n <= MAX_ROW``).

The attention provider (``register_attention``): ``kernel() -> hl.Kernel`` (parameters
``q``, ``k``, ``v``, ``o`` in ``[B, S, heads, D]``, f16, and ``qk_scale``; constant
``CAUSAL``) and ``consts(sq, sk, d, causal, emulated) -> dict``.
"""

from __future__ import annotations

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

#: kind -> what it is called in errors
_KINDS = {"gemm": "GEMM anchor kernels", "reduction": "row-reduction anchor kernels",
          "attention": "attention anchor kernel"}
_REGISTERED: dict[str, AnchorProvider] = {}


def _provider(kind: str) -> AnchorProvider:
    """The registered provider of ``kind`` (``FusionUnsupported`` when there is none)."""
    hit = _REGISTERED.get(kind)
    if hit is None:
        raise FusionUnsupported(f"no {_KINDS[kind]} registered: the kernels layer registers them when it "
                                "is imported (import hexlayout.ops; torch.compile(backend='hexlayout') "
                                "does)")
    return hit


def register_gemm(kernel: Callable[..., Any], consts: Callable[..., dict[str, Any]]) -> None:
    """Register the GEMM anchor provider (the latest registration wins)."""
    _REGISTERED["gemm"] = AnchorProvider(kernel, consts)


def gemm_provider() -> AnchorProvider:
    """The registered GEMM provider."""
    return _provider("gemm")


def register_reduction(kernel: Callable[..., Any], consts: Callable[..., dict[str, Any]]) -> None:
    """Register the row-reduction anchor provider (the latest registration wins)."""
    _REGISTERED["reduction"] = AnchorProvider(kernel, consts)


def reduction_provider() -> AnchorProvider:
    """The registered row-reduction provider."""
    return _provider("reduction")


def register_attention(kernel: Callable[..., Any], consts: Callable[..., dict[str, Any]]) -> None:
    """Register the attention anchor provider (the latest registration wins)."""
    _REGISTERED["attention"] = AnchorProvider(kernel, consts)


def attention_provider() -> AnchorProvider:
    """The registered attention provider."""
    return _provider("attention")
