"""Register tiles regrouped without leaving the threads: ``Reshape`` and ``Join``.

- ``Reshape(result, src)``: ``result`` has ``src``'s elements in row-major (C, numpy) order
  under another shape: ``result.flat[i] = src.flat[i]``.
- ``Join(result, srcs, axis, interleave)``: ``k`` tiles of one shape ``S`` joined along
  ``axis``. Concatenation (``interleave=False``): element ``c`` of ``srcs[j]`` is
  ``result[c + j * S[axis] * e_axis]``; interleaving (``interleave=True``): it is
  ``result[c']`` with ``c'[axis] = k * c[axis] + j`` (the other coordinates equal).

Both are register-to-register: synthesis gives the result the layout under which every
thread keeps the values it holds (``hexlayout.ir.lower.regroup``), so they lower to register
moves that the compiler removes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .printer import PRINTING, defines
from .tile import Op, Value, _Unary

__all__ = ["Reshape", "Join"]


@dataclass(eq=False)
class Reshape(_Unary):
    """``result.flat[i] = src.flat[i]`` in row-major order (``result``'s shape is the new one)."""


@dataclass(eq=False)
class Join(Op):
    """``srcs`` (one shape) concatenated or interleaved along ``axis`` (module docstring)."""

    INPUTS = ("srcs",)
    OUTPUTS = ("result",)

    result: Value
    srcs: tuple[Value, ...]
    axis: int
    interleave: bool = False


def _join(op: Join) -> str:
    kind = "interleave" if op.interleave else "concat"
    return f"{kind} {', '.join('%' + s.name for s in op.srcs)} axis={op.axis}"


PRINTING.register(Reshape)(defines(lambda op: f"reshape %{op.src.name}"))
PRINTING.register(Join)(defines(_join))
