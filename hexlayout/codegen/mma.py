"""Printers of matrix-multiply instructions: warp-wide ``mma.sync`` and warp-group
``wgmma.mma_async`` with its fence / commit_group / wait_group.

The instruction text comes from the atom (``MmaAtom.ptx``, ``ptx_operands``). Fragment
register ``j`` of a 16- or 8-bit operand is elements ``[j*32/bits, (j+1)*32/bits)`` of its
register slice, passed as an ``unsigned`` view (``hl_u32``); f32 accumulators are passed as
``float`` (``"f"``). A wgmma shared-memory operand is a 64-bit descriptor built from the
``SmemDesc`` (``hl_gmma_desc``: shared address of buffer + offset, LBO, SBO, layout type).
When every term of the operand's byte offset is a provable multiple of 16, the descriptor is
the one of the shared window's start advanced by ``offset / 16`` in its 14-bit address field
(``hl_gmma_desc_add``): a loop-invariant descriptor plus a stage / k-step / warp-group offset,
not 64 bits rebuilt per wgmma.
"""

from __future__ import annotations

from hexlayout.arch import get_atom
from hexlayout.arch.mma_atom import MmaAtom
from hexlayout.ir.expr import BinOp, Const, Expr, const_value, is_const
from hexlayout.ir.lowered import (
    MmaSync,
    RegArray,
    RegRef,
    SharedRef,
    SmemDesc,
    Wgmma,
    WgmmaCommit,
    WgmmaFence,
    WgmmaWait,
)
from hexlayout.ir.passes.algebra import linear_terms, sum_terms

from .emitter import Emitter, asm, operand_list

__all__ = ["PRINTERS", "split_operands"]


def split_operands(s: str) -> list[str]:
    """Top-level comma-separated items of an atom's operand template (braces kept whole)."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def _regs(em: Emitter, ref: RegRef, count: int, dtype_bits: int, what: str) -> None:
    if ref.count * ref.array.dtype.bits != count * 32 and not (count == 0):
        raise em.error(f"{what}: the atom takes {count} 32-bit register(s) per thread, the register slice "
                       f"{ref.array.name} has {ref.count} {ref.array.dtype} element(s)")
    if ref.array.dtype.bits != dtype_bits:
        raise em.error(f"{what}: register array {ref.array.name} holds {ref.array.dtype}, the atom "
                       f"{dtype_bits}-bit elements")
    em.check_reg_range(ref)


def _acc_operands(em: Emitter, ref: RegRef, regs: int, constraint: str) -> list[str]:
    """Constraint strings of accumulator registers (``"+f"`` / ``"=f"`` / ``"f"`` ...)."""
    dt = ref.array.dtype
    if dt.name == "f32":
        return [f'"{constraint}f"({em.reg_index(ref, i)})' for i in range(regs)]
    if dt.name in ("s32", "u32"):
        return [f'"{constraint}r"({em.reg_index(ref, i)})' for i in range(regs)]
    return [f'"{constraint}r"({em.reg_u32(ref, j)})' for j in range(regs)]


def _same(em: Emitter, a: RegRef, b: RegRef) -> bool:
    return a is b or (a.array is b.array and a.count == b.count and em.expr(a.start) == em.expr(b.start))


def _atom(em: Emitter, name: str, kind: str, **options: str) -> MmaAtom:
    try:
        atom = get_atom(name, **options)
    except ValueError as e:
        raise em.error(str(e)) from None
    if not isinstance(atom, MmaAtom) or atom.kind != kind:
        raise em.error(f"atom {name} is not a {kind} atom")
    return atom


def mma_sync(em: Emitter, ins: MmaSync) -> list[str]:
    atom = _atom(em, ins.atom, "mma.sync")
    _regs(em, ins.a, atom.regs_a, atom.a_dtype.bits, "A")
    _regs(em, ins.b, atom.regs_b, atom.b_dtype.bits, "B")
    _regs(em, ins.d, atom.regs_c, atom.c_dtype.bits, "D")
    _regs(em, ins.c, atom.regs_c, atom.c_dtype.bits, "C")
    ra, rb, rc = atom.regs_a, atom.regs_b, atom.regs_c
    same = _same(em, ins.d, ins.c)
    outs = _acc_operands(em, ins.d, rc, "+" if same else "=")
    ins_ = [f'"r"({em.reg_u32(ins.a, j)})' for j in range(ra)] + [f'"r"({em.reg_u32(ins.b, j)})'
                                                                   for j in range(rb)]
    c_ops = operand_list(0, rc)
    if not same:
        c_ops = operand_list(rc + ra + rb, rc)
        ins_ += _acc_operands(em, ins.c, rc, "")
    text = (f"{atom.ptx} {operand_list(0, rc)}, {operand_list(rc, ra)}, {operand_list(rc + ra, rb)}, "
            f"{c_ops};")
    return asm(text, outs, ins_, memory=False)


def _desc_expr(em: Emitter, d: SmemDesc, what: str) -> str:
    if d.swizzle not in (0, 1, 2, 3):
        raise em.error(f"{what}: descriptor layout type {d.swizzle} is not 0 (none), 1 (128B), 2 (64B) "
                       "or 3 (32B)")
    for name, v in (("leading byte offset", d.lbo), ("stride byte offset", d.sbo)):
        if v % 16 or not 0 <= v < 1 << 18:
            raise em.error(f"{what}: descriptor {name} {v} is not a multiple of 16 in [0, 2^18)")
    start = em.smem_byte_offset(SharedRef(d.buffer, d.offset))
    if is_const(start) and const_value(start) % 16:
        raise em.error(f"{what}: descriptor start byte {const_value(start)} is not a multiple of 16")
    em.helpers.add("gmma_desc")
    units = _units16(start)
    if units is not None:
        # the descriptor of the shared window's start (a kernel constant the compiler keeps)
        # advanced by the operand's offset: no rebuilding of the 64 bits per k-tile
        em.helpers.add("gmma_desc_add")
        return (f"hl_gmma_desc_add(hl_gmma_desc(smem_base, {d.lbo}, {d.sbo}, {d.swizzle}), "
                f"{em.expr(units, warp_uniform=True)})")
    addr = em.smem_addr(SharedRef(d.buffer, d.offset))
    return f"hl_gmma_desc({addr}, {d.lbo}, {d.sbo}, {d.swizzle})"


def _units16(start: Expr) -> Expr | None:
    """``start / 16`` written term by term (each term of the byte offset ``start`` a provable
    multiple of 16: constants, products with such a constant), else ``None``."""
    out: list[Expr] = []
    for t in linear_terms(start):
        if isinstance(t, Const):
            if t.value % 16:
                return None
            out.append(Const(t.value // 16))
        elif isinstance(t, BinOp) and t.op == "*" and isinstance(t.b, Const) and t.b.value % 16 == 0:
            out.append(t.a * (t.b.value // 16))
        elif isinstance(t, BinOp) and t.op == "*" and isinstance(t.a, Const) and t.a.value % 16 == 0:
            out.append(t.b * (t.a.value // 16))
        else:
            return None
    return sum_terms(out)


def wgmma(em: Emitter, ins: Wgmma) -> list[str]:
    if em.arch != "sm_90a":
        raise em.error(f"wgmma needs sm_90a; the kernel is for {em.arch}")
    ss = isinstance(ins.a, SmemDesc)
    opts = {"b_major": ins.b.major}
    if ss:
        opts["a_major"] = ins.a.major  # type: ignore[union-attr]
    atom = _atom(em, ins.atom, "wgmma", **opts)
    if ss != (atom.a_source == "smem"):
        raise em.error(f"atom {atom.name} takes A from {atom.a_source}, the instruction gives "
                       f"{'a descriptor' if ss else 'registers'}")
    rc = atom.regs_c
    _regs(em, ins.d, rc, atom.c_dtype.bits, "D")
    outs = _acc_operands(em, ins.d, rc, "+")
    for arr in (ins.d.array,) + (() if ss else (ins.a.array,)):  # type: ignore[union-attr]
        if all(arr is not x for x in em.wgmma_arrays):
            em.wgmma_arrays.append(arr)
    if ss:
        a_ops = [f'"l"({_desc_expr(em, ins.a, "A")})']  # type: ignore[arg-type]
        a_text = f"%{rc}"
    else:
        _regs(em, ins.a, atom.regs_a, atom.a_dtype.bits, "A")  # type: ignore[arg-type]
        a_ops = [f'"r"({em.reg_u32(ins.a, j)})' for j in range(atom.regs_a)]  # type: ignore[arg-type]
        a_text = operand_list(rc, atom.regs_a)
    nb = rc + len(a_ops)
    ins_ = a_ops + [f'"l"({_desc_expr(em, ins.b, "B")})', f'"r"({em.expr(ins.scale_d)})']
    imms = split_operands(atom.ptx_operands)[4:]
    text = ("{\n.reg .pred p;\n"
            f"setp.ne.b32 p, %{nb + 1}, 0;\n"
            f"{atom.ptx} {operand_list(0, rc)}, {a_text}, %{nb}, p, {', '.join(imms)};\n}}")
    return asm(text, outs, ins_, memory=False)


def wgmma_fence(em: Emitter, ins: WgmmaFence) -> list[str]:
    if em.arch != "sm_90a":
        raise em.error(f"wgmma.fence needs sm_90a; the kernel is for {em.arch}")
    return fence_operands(em) + asm("wgmma.fence.sync.aligned;", [], [])


def wgmma_commit(em: Emitter, ins: WgmmaCommit) -> list[str]:
    if em.arch != "sm_90a":
        raise em.error(f"wgmma.commit_group needs sm_90a; the kernel is for {em.arch}")
    return asm("wgmma.commit_group.sync.aligned;", [], [])


def wgmma_wait(em: Emitter, ins: WgmmaWait) -> list[str]:
    if em.arch != "sm_90a":
        raise em.error(f"wgmma.wait_group needs sm_90a; the kernel is for {em.arch}")
    if not 0 <= ins.pending <= 7:
        raise em.error(f"wgmma.wait_group {ins.pending}: the count must be in [0, 7]")
    before: list[str] = []
    for arr in em.overlap.get(id(ins), ()):          # work placed beside the in-flight groups
        before += _fence_array(em, arr)
    lines = asm(f"wgmma.wait_group.sync.aligned {int(ins.pending)};", [], [])
    return before + lines + fence_operands(em)


def fence_operands(em: Emitter) -> list[str]:
    """Empty ``asm`` statements that tie every register array wgmma accesses asynchronously
    to this point, so that the compiler moves no access of them across a fence or wait
    (what CUTLASS's ``warpgroup_fence_operand`` does)."""
    out: list[str] = []
    for arr in em.wgmma_arrays:
        out += _fence_array(em, arr)
    return out


def _fence_array(em: Emitter, arr: RegArray) -> list[str]:
    name = em.reg_name(arr)
    if arr.dtype.bits == 32:
        c = "f" if arr.dtype.name == "f32" else "r"
        n, op = arr.count, f'"+{c}"({name}[v])'
    else:
        em.helpers.add("u32")
        per = 32 // arr.dtype.bits
        n, op = arr.count // per, f'"+r"(hl_u32({name}[v * {per}]))'
    return ["#pragma unroll", f'for (int v = 0; v < {n}; ++v) asm volatile("" : {op} :: "memory");']


PRINTERS = {MmaSync: mma_sync, Wgmma: wgmma, WgmmaFence: wgmma_fence, WgmmaCommit: wgmma_commit,
            WgmmaWait: wgmma_wait}
