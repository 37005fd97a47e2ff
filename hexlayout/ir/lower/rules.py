"""``LOWERING``: the lowering rule of every tile-op class.

``rule(lowering, op) -> instructions``: the per-thread instructions of ``op`` under the
assigned layouts (``lowering`` is the ``hexlayout.ir.lower.kernel.Lowering`` of the kernel:
its views, registers and shared buffers). Each rule is registered where the op's lowering is
written (``Lowering.op_<Class>`` in ``kernel.py``; ``atomic.py``, ``indirect.py``,
``regroup.py`` for theirs), and found like the op's printing (``hexlayout.ir.printer.PRINTING``)
and layout relation (``hexlayout.synth.graph.RELATIONS``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..lowered import Instr
from ..registry import OpRegistry

__all__ = ["LOWERING"]

LOWERING: OpRegistry[Callable[[Any, Any], list[Instr]]] = OpRegistry("lowering")
