"""Copies masked by a predicate tile: ``hl.copy(src, dst, mask=pred)``.

``pred`` is a register ``bool_`` tile of the copy's shape; element ``c`` is copied iff
``pred[c]``. One end of the copy is a register tile ``r`` and synthesis gives ``pred`` the
layout of ``r`` (one layout class), so thread ``t`` holds ``pred[c]`` in the same value slot
``v`` as ``r[c]``. The copy is lowered to one access per element (a vector would move
elements of different masks), each predicated by ``in_bounds(c) && pred_reg[v]``:

- register -> global / shared: masked-off elements are not written;
- global -> register: masked-off elements read as 0 (like out-of-bounds elements).

A shared -> register copy under a mask is refused (a masked-off element would keep a stale
value); copy unmasked and select with the mask in registers instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..expr import RegRead, as_expr
from ..lowered import Instr, LdGlobal, LdShared, StGlobal, StShared
from .copy import CopyPlan, lower_reg_mem
from .rejection import Rejection
from .views import GlobalTileView, RegisterTile, SharedTileView

__all__ = ["lower_masked_copy"]


def lower_masked_copy(src: Any, dst: Any, mask: RegisterTile, tid: Any, elem_bits: int,
                      names: tuple[str, str, str]) -> CopyPlan | Rejection:
    """Per-element accesses of the copy ``src -> dst``, each predicated by its mask register.
    ``names``: ``(src, dst, mask)`` value names for messages."""
    s, d, m = names
    if isinstance(src, RegisterTile) and isinstance(dst, (GlobalTileView, SharedTileView)):
        reg, mem, load = src, dst, False
    elif isinstance(dst, RegisterTile) and isinstance(src, GlobalTileView):
        reg, mem, load = dst, src, True
    elif isinstance(dst, RegisterTile) and isinstance(src, SharedTileView):
        return Rejection(f"a shared -> register copy cannot be masked by the tile %{m} (masked-off elements "
                         "would keep stale values): copy it unmasked and select in registers")
    else:
        return Rejection(f"a copy masked by the tile %{m} needs a register end; %{s} -> %{d} has none")
    if mask.threads != reg.threads or not np.array_equal(mask.index_table(), reg.index_table()):
        return Rejection(f"the mask %{m} is not distributed like the register tile it masks",
                         layouts=(("mask", mask.tv), ("register", reg.tv)))
    plan = lower_reg_mem(reg, mem, load, tid, elem_bits, max_bits=elem_bits)
    if isinstance(plan, str):
        return Rejection.of(plan)
    out: list[Instr] = []
    for ins in plan.instrs:
        ref = ins.dst if isinstance(ins, (LdGlobal, LdShared)) else ins.src
        assert isinstance(ins, (LdGlobal, LdShared, StGlobal, StShared)) and ref.count == 1
        on = as_expr(RegRead(mask.array, int(ref.start))).ne(0)
        ins.pred = on if ins.pred is None else as_expr(ins.pred).logical_and(on)
        out.append(ins)
    return CopyPlan(out, plan.instruction + " (masked)", 1, plan.requirements)
