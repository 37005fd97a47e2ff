"""Lowering of ``AtomicAdd``: the stores of a register -> global copy, made atomic.

The plan is the one of a plain store (``lower_reg_mem``: per thread, runs of elements
adjacent in memory) with runs of at most one red instruction's width (32 bits: one f32, or
two f16 / bf16 as a packed pair); every ``StGlobal`` becomes a ``RedGlobal``.
"""

from __future__ import annotations

from typing import Any

from ..atomic import AtomicAdd, RedGlobal
from ..lowered import Instr, StGlobal
from ..types import Scope
from .copy import lower_reg_mem
from .rules import LOWERING
from .views import GlobalTileView

__all__ = ["lower_atomic_add", "RED_TYPES"]

#: element type -> the architectures whose red.global.add takes it (PTX ISA: .f32 from sm_20,
#: .f16 from sm_70, .bf16 from sm_90)
RED_TYPES = {"f32": ("sm_80", "sm_89", "sm_90a", "sm_100a"), "f16": ("sm_80", "sm_89", "sm_90a", "sm_100a"),
             "bf16": ("sm_90a", "sm_100a")}


@LOWERING.register(AtomicAdd)
def lower_atomic_add(lw: Any, op: AtomicAdd) -> list[Instr]:
    """``RedGlobal`` instructions adding register tile ``op.src`` into global view ``op.dst``."""
    if op.src.scope != Scope.REGISTER or op.dst.scope != Scope.GLOBAL:
        raise ValueError(f"atomic_add adds a register tile into a global view, not %{op.src.name} "
                         f"({op.src.scope}) into %{op.dst.name} ({op.dst.scope})")
    dt = op.src.type.dtype
    if dt != op.dst.type.dtype:
        raise ValueError(f"atomic_add of {dt} values into {op.dst.type.dtype} memory: cast them first")
    archs = RED_TYPES.get(dt.name)
    if archs is None:
        raise ValueError(f"red.global.add takes f32, f16 and bf16 elements, not {dt}")
    if lw.arch.name not in archs:
        raise ValueError(f"red.global.add of {dt} needs {' or '.join(archs)}; the kernel is lowered for "
                         f"{lw.arch.name}")
    src = lw.register_of(op.src, op)
    dst = lw.view(op.dst, op)
    if not isinstance(dst, GlobalTileView):
        raise ValueError(f"%{op.dst.name} is not a global view")
    plan = lower_reg_mem(src, dst, False, lw.gtid, dt.bits, max_bits=32)
    if isinstance(plan, str):
        raise ValueError(plan)
    lw.reqs += plan.requirements
    lw.choices.append((op, f"red.global.add.{dt.name}" + ("x2" if dt.bits == 16 else "")))
    out: list[Instr] = []
    for ins in plan.instrs:
        if isinstance(ins, StGlobal):
            out.append(RedGlobal(ins.dst, ins.src, ins.bits, pred=ins.pred, loc=ins.loc, origin="atomic_add"))
        else:
            out.append(ins)
    gather = dst.gather
    loads = gather.take_loads() if gather is not None else []
    return loads + out
