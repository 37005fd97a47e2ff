"""Printer of ``red.global.add`` (``RedGlobal``): inline PTX on the element's address.

f32: ``red.global.add.f32 [p], f;``; one f16 / bf16: ``red.global.add.noftz.f16 [p], h;``
(a 16-bit register); two adjacent ones: ``red.global.add.noftz.f16x2 [p], r;`` (the pair's
32 bits, each half added on its own). The predicate, if any, guards the statement.
"""

from __future__ import annotations

from hexlayout.ir.atomic import RedGlobal

from .ctypes_map import vector_type
from .emitter import Emitter, asm

__all__ = ["PRINTERS"]


def red_global(em: Emitter, ins: RedGlobal) -> list[str]:
    dt = ins.src.array.dtype.name
    if ins.op != "add" or dt not in ("f32", "f16", "bf16"):
        raise em.error(f"red.global.{ins.op} of {dt} is not an instruction")
    if ins.src.count * ins.src.array.dtype.bits != ins.bits or ins.bits not in (16, 32) \
            or (dt == "f32" and ins.bits != 32):
        raise em.error(f"red.global.add.{dt} of {ins.bits} bits from {ins.src.count} element(s)")
    em.check_reg_range(ins.src)
    ptr = em.gmem_ptr(ins.dst)
    if dt == "f32":
        return asm("red.global.add.f32 [%0], %1;", [], [f'"l"({ptr})', f'"f"({em.reg_index(ins.src)})'])
    vt = vector_type(ins.bits)
    val = f"*reinterpret_cast<const {vt}*>(&{em.reg_index(ins.src)})"
    kind = dt + ("x2" if ins.bits == 32 else "")
    reg = '"r"' if ins.bits == 32 else '"h"'
    return asm(f"red.global.add.noftz.{kind} [%0], %1;", [], [f'"l"({ptr})', f"{reg}({val})"])


PRINTERS = {RedGlobal: red_global}
