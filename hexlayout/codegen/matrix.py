"""Printers of ``ldmatrix`` / ``stmatrix`` (warp-wide 8x8 b16 matrix moves through shared memory)."""

from __future__ import annotations

from hexlayout.ir.lowered import Ldmatrix, RegRef, Stmatrix

from .emitter import Emitter, asm, operand_list

__all__ = ["PRINTERS"]


def _check(em: Emitter, ref: RegRef, num: int) -> None:
    if num not in (1, 2, 4):
        raise em.error(f".x{num}: ldmatrix / stmatrix move 1, 2 or 4 matrices")
    if ref.count * ref.array.dtype.bits != 32 * num:
        raise em.error(f".x{num} moves {num} 32-bit register(s) per thread; the register slice has "
                       f"{ref.count} {ref.array.dtype} element(s)")
    em.check_reg_range(ref)


def ldmatrix(em: Emitter, ins: Ldmatrix) -> list[str]:
    _check(em, ins.dst, ins.num)
    n = ins.num
    trans = ".trans" if ins.trans else ""
    op = f"ldmatrix.sync.aligned.m8n8.x{n}{trans}.shared.b16 {operand_list(0, n)}, [%{n}];"
    outs = [f'"=r"({em.reg_u32(ins.dst, j)})' for j in range(n)]
    return asm(op, outs, [f'"r"({em.smem_addr(ins.src)})'])


def stmatrix(em: Emitter, ins: Stmatrix) -> list[str]:
    if em.arch not in ("sm_90a", "sm_90", "sm_100a"):
        raise em.error(f"stmatrix needs sm_90 or later; the kernel is for {em.arch}")
    _check(em, ins.src, ins.num)
    n = ins.num
    trans = ".trans" if ins.trans else ""
    op = f"stmatrix.sync.aligned.m8n8.x{n}{trans}.shared.b16 [%0], {operand_list(1, n)};"
    ins_ = [f'"r"({em.smem_addr(ins.dst)})'] + [f'"r"({em.reg_u32(ins.src, j)})' for j in range(n)]
    return asm(op, [], ins_)


PRINTERS = {Ldmatrix: ldmatrix, Stmatrix: stmatrix}
