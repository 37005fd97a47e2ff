"""Printers of memory instructions: vector loads / stores between registers and global or
shared memory, and ``cp.async`` global -> shared copies with their groups.

Vector accesses are plain C++ reinterpretations (``*reinterpret_cast<const uint4*>(p)``),
which nvcc turns into ``LDG.E.128`` / ``STS.128`` and so on; ``cp.async`` is inline PTX.
"""

from __future__ import annotations

from hexlayout.ir.lowered import (
    CpAsync,
    CpAsyncCommit,
    CpAsyncWait,
    LdGlobal,
    LdShared,
    RegRef,
    StGlobal,
    StShared,
)

from .ctypes_map import vector_type
from .emitter import Emitter, asm, wait_group

__all__ = ["PRINTERS", "SELF_PREDICATED"]


def _vector(em: Emitter, ref: RegRef, bits: int) -> str:
    if ref.count * ref.array.dtype.bits != bits:
        raise em.error(f"a {bits}-bit access moves {ref.count} {ref.array.dtype} element(s) "
                       f"({ref.count * ref.array.dtype.bits} bits)")
    em.check_reg_range(ref)
    try:
        return vector_type(bits)
    except ValueError as e:
        raise em.error(str(e)) from None


def _reg_lvalue(em: Emitter, ref: RegRef, vt: str) -> str:
    return f"*reinterpret_cast<{vt}*>(&{em.reg_index(ref)})"


def ld_global(em: Emitter, ins: LdGlobal) -> list[str]:
    vt = _vector(em, ins.dst, ins.bits)
    dst = _reg_lvalue(em, ins.dst, vt)
    src = f"*reinterpret_cast<const {vt}*>({em.gmem_ptr(ins.src)})"
    if ins.pred is None:
        return [f"{dst} = {src};"]
    pred = em.expr(ins.pred)
    if ins.zero_fill:
        zero = f"static_cast<{vt}>(0)" if " " in vt else f"{vt}{{}}"   # `unsigned short{}` is not C++
        return [f"{dst} = ({pred}) ? {src} : {zero};"]
    return [f"if ({pred}) {dst} = {src};"]


def st_global(em: Emitter, ins: StGlobal) -> list[str]:
    vt = _vector(em, ins.src, ins.bits)
    return [f"*reinterpret_cast<{vt}*>({em.gmem_ptr(ins.dst)}) = {_reg_lvalue(em, ins.src, vt)};"]


def ld_shared(em: Emitter, ins: LdShared) -> list[str]:
    vt = _vector(em, ins.dst, ins.bits)
    return [f"{_reg_lvalue(em, ins.dst, vt)} = *reinterpret_cast<const {vt}*>({em.smem_ptr(ins.src)});"]


def st_shared(em: Emitter, ins: StShared) -> list[str]:
    vt = _vector(em, ins.src, ins.bits)
    return [f"*reinterpret_cast<{vt}*>({em.smem_ptr(ins.dst)}) = {_reg_lvalue(em, ins.src, vt)};"]


def cp_async(em: Emitter, ins: CpAsync) -> list[str]:
    if ins.nbytes not in (4, 8, 16):
        raise em.error(f"cp.async moves 4, 8 or 16 bytes, not {ins.nbytes}")
    cache = ins.cache if ins.nbytes == 16 else "ca"
    if cache not in ("ca", "cg"):
        raise em.error(f"cp.async cache hint {ins.cache!r} is not 'ca' or 'cg'")
    dst, src = em.smem_addr(ins.dst), em.gmem_ptr(ins.src)
    op = f"cp.async.{cache}.shared.global [%0], [%1], {ins.nbytes}"
    if ins.pred is None:
        return asm(op + ";", [], [f'"r"({dst})', f'"l"({src})'])
    # predicated off: src-size 0 zero-fills the destination and reads nothing, so the source
    # address is not accessed and needs no select (as CUTLASS's SM80_CP_ASYNC_CACHEGLOBAL_ZFILL)
    lines = ["{", f"  const bool in = {em.expr(ins.pred)};"]
    lines += ["  " + s for s in asm(op + ", %2;", [], [f'"r"({dst})', f'"l"({src})',
                                                       f'"r"(in ? {ins.nbytes} : 0)'])]
    return lines + ["}"]


def cp_async_commit(em: Emitter, ins: CpAsyncCommit) -> list[str]:
    return asm("cp.async.commit_group;", [], [])


def cp_async_wait(em: Emitter, ins: CpAsyncWait) -> list[str]:
    return wait_group(em, "cp.async.wait_group", ins.pending)


PRINTERS = {LdGlobal: ld_global, StGlobal: st_global, LdShared: ld_shared, StShared: st_shared,
            CpAsync: cp_async, CpAsyncCommit: cp_async_commit, CpAsyncWait: cp_async_wait}
#: printers that handle ``pred`` themselves (zero fill of predicated-off threads)
SELF_PREDICATED = {LdGlobal, CpAsync}
