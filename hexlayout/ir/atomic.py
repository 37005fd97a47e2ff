"""Atomic reductions into global memory: ``AtomicAdd`` (tile op) and ``RedGlobal`` (its
per-thread instruction).

``AtomicAdd(src, dst)``: ``dst[c] += src[c]`` for every element ``c`` of the register tile
``src``, each addition atomic (``red.global.add``), so blocks can combine their partial
results in one tensor (split-K, MoE top-k combine). ``dst`` is a global view, plain or
gathered (a scatter-add); out-of-bounds elements are skipped. f32 elements are added one at
a time (``red.global.add.f32``: round to nearest even, subnormal inputs and results flushed
to zero), f16 / bf16 elements in pairs where two neighbours are adjacent in memory
(``.f16x2`` / ``.bf16x2``, each half rounded on its own, subnormals kept: ``.noftz``), else
one at a time. bf16 needs sm_90.

``RedGlobal`` is an ``StGlobal`` (the same operands: ``dst`` global element, ``src``
register slice of ``bits`` bits) whose store is an atomic ``red`` of the element type of
``src``: every layer that treats stores (written parameters, alignment checks, sector
counts) treats it as one. Atomics do not race with each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from .lowered import StGlobal
from .printer import PRINTING, Printer
from .tile import Op, Value

__all__ = ["AtomicAdd", "RedGlobal"]


@dataclass(eq=False)
class AtomicAdd(Op):
    """``dst[c] += src[c]`` atomically for every element (see the module docstring)."""

    INPUTS = ("src", "dst")
    OUTPUTS = ("dst",)

    src: Value
    dst: Value


@dataclass(eq=False)
class RedGlobal(StGlobal):
    """``red.global.<op>`` of the ``bits`` bits of ``src`` into global memory at ``dst``."""

    op: str = "add"


@PRINTING.register(AtomicAdd)
def _atomic_add(p: Printer, op: AtomicAdd) -> str:
    return f"atomic_add %{op.src.name} -> %{op.dst.name}"
