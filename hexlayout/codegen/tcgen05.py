"""Printers of Blackwell's tensor-core instructions (sm_100a): ``tcgen05.mma`` with its
instruction descriptor, ``tcgen05.commit``, tensor-memory ``alloc`` / ``dealloc`` /
``relinquish_alloc_permit``, ``tcgen05.ld`` / ``st`` / ``wait`` and the tcgen05 fences.

A shared-memory operand is the 64-bit sm_100a descriptor (``hl_umma_desc``: start address,
LBO, SBO, the fixed version 1 at bit 46 and the layout type at bits 61..63 -- 0 none, 2 128B,
4 64B, 6 32B swizzle; ``SmemDesc.swizzle`` keeps wgmma's codes 0..3); its start address field
is the wgmma one, so a window-start descriptor advanced by ``hl_gmma_desc_add`` serves as for
wgmma. The 32-bit instruction descriptor is a constant computed here
(``hexlayout.arch.tcgen05.InstrDescriptor``; for a block-scaled atom
``InstrDescriptorBlockScaled`` of its kind and scale vector, with the scale-factor bytes ``sfa_id``
/ ``sfb_id``, and the factors' TMEM addresses as two more operands). ``tcgen05.cp`` takes a TMEM
address and the sm_100a descriptor of its shared source. A ``tcgen05.st`` of 16- or 8-bit
registers (a register A operand) packs ``32 / bits`` consecutive elements per 32-bit register. The registers a
``tcgen05.ld`` writes are tied to the following ``tcgen05.wait::ld`` by empty ``asm``
statements, so that no use moves above it.
"""

from __future__ import annotations

from hexlayout.arch.mma_atom import MmaAtom
from hexlayout.arch.sm100 import scaled_kind_of
from hexlayout.arch.tcgen05 import InstrDescriptor, InstrDescriptorBlockScaled
from hexlayout.arch.tcgen05_cp import CP_SHAPES
from hexlayout.arch.tcgen05_ops import tcgen05_ptx
from hexlayout.arch.tmem import TMEM_SHAPES, tmem_ld_ptx
from hexlayout.ir.lowered import SharedRef, SmemDesc
from hexlayout.ir.lowered_tcgen05 import (
    Tcgen05Commit,
    Tcgen05Cp,
    Tcgen05Fence,
    Tcgen05Ld,
    Tcgen05Mma,
    Tcgen05St,
    Tcgen05Wait,
    TmemAlloc,
    TmemDealloc,
    TmemRef,
    TmemRelinquish,
)

from .emitter import Emitter, asm, operand_list
from .mma import _atom, _fence_array, _units16

__all__ = ["PRINTERS", "ISSUED"]

#: SmemDesc.swizzle (wgmma layout type) -> sm_100a layout type.
_LAYOUT = {0: 0, 1: 2, 2: 4, 3: 6}


def _need(em: Emitter, what: str) -> None:
    if em.arch != "sm_100a":
        raise em.error(f"{what} needs sm_100a; the kernel is for {em.arch}")


def _desc(em: Emitter, d: SmemDesc, what: str) -> str:
    if d.swizzle not in _LAYOUT:
        raise em.error(f"{what}: descriptor layout type {d.swizzle} is not 0 (none), 1 (128B), 2 (64B) or "
                       "3 (32B)")
    for name, v in (("leading byte offset", d.lbo), ("stride byte offset", d.sbo)):
        if v % 16 or not 0 <= v < 1 << 18:
            raise em.error(f"{what}: descriptor {name} {v} is not a multiple of 16 in [0, 2^18)")
    em.helpers.add("umma_desc")
    start = em.smem_byte_offset(SharedRef(d.buffer, d.offset))
    units = _units16(start)
    if units is not None:
        em.helpers.add("gmma_desc_add")
        return (f"hl_gmma_desc_add(hl_umma_desc(smem_base, {d.lbo}, {d.sbo}, {_LAYOUT[d.swizzle]}), "
                f"{em.expr(units, warp_uniform=True)})")
    addr = em.smem_addr(SharedRef(d.buffer, d.offset))
    return f"hl_umma_desc({addr}, {d.lbo}, {d.sbo}, {_LAYOUT[d.swizzle]})"


#: the single-thread tcgen05 instructions (``_issue``: guarded by ``Emitter.issue_guard``)
ISSUED = (Tcgen05Mma, Tcgen05Commit, Tcgen05Cp)


def _issue(em: Emitter, text: str, inputs: list[str]) -> list[str]:
    """The ``asm`` of a single-thread tcgen05 instruction (the last ``tcgen05.`` line of ``text``);
    with ``em.issue_guard`` (the C condition of an elected branch printed as predicates) that
    instruction is guarded by it (``@q``, one more operand): no branch around the issue, and ptxas
    issues it once, from the elected lane's predicate."""
    guard = em.issue_guard
    if guard is None:
        return asm(text, [], inputs)
    lines = text.split("\n")
    k = max(i for i, line in enumerate(lines) if line.startswith("tcgen05."))
    lines[k] = "@q " + lines[k]
    text = "\n".join(["{", ".reg .pred q;", f"setp.ne.b32 q, %{len(inputs)}, 0;", *lines, "}"])
    return asm(text, [], inputs + [f'"r"(static_cast<int>({guard}))'])


def tcgen05_mma(em: Emitter, ins: Tcgen05Mma) -> list[str]:
    _need(em, "tcgen05.mma")
    ts = isinstance(ins.a, TmemRef)
    opts = {"b_major": ins.b.major} if ts else {"a_major": ins.a.major, "b_major": ins.b.major}  # type: ignore
    atom = _atom(em, ins.atom, "tcgen05", **opts)
    if ts != (atom.a_source == "tmem"):
        raise em.error(f"atom {atom.name} takes A from {atom.a_source}")
    if atom.scale_type:
        return _block_scaled_mma(em, ins, atom)
    if ins.sfa is not None or ins.sfb is not None:
        raise em.error(f"{atom.name} is not block-scaled; it takes no scale factors")
    idesc = InstrDescriptor(atom.a_dtype, atom.b_dtype, atom.c_dtype, atom.m, atom.n, atom.a_major,
                            atom.b_major).encode()
    a_op = f'"r"({em.expr(ins.a.addr)})' if ts else f'"l"({_desc(em, ins.a, "A")})'  # type: ignore[union-attr]
    text = ("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
            f"{atom.ptx} [%0], {'[%1]' if ts else '%1'}, %2, %3, p;\n}}")
    return _issue(em, text, [f'"r"({em.expr(ins.d)})', a_op, f'"l"({_desc(em, ins.b, "B")})',
                             f'"r"({idesc:#x}u)', f'"r"({em.expr(ins.accumulate)})'])


def _block_scaled_mma(em: Emitter, ins: Tcgen05Mma, atom: MmaAtom) -> list[str]:
    if ins.sfa is None or ins.sfb is None:
        raise em.error(f"{atom.name}: a block-scaled MMA takes the TMEM addresses of both operands' scale "
                       "factors")
    ts = isinstance(ins.a, TmemRef)
    try:
        idesc = InstrDescriptorBlockScaled(atom.a_dtype, atom.b_dtype, atom.m, atom.n, atom.a_major,
                                           atom.b_major, ins.sfa_id, ins.sfb_id, atom.scale_type,
                                           kind=scaled_kind_of(atom), vs=atom.scale_vec).encode()
    except ValueError as e:
        raise em.error(str(e)) from None
    text = ("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
            f"{atom.ptx} [%0], {'[%1]' if ts else '%1'}, %2, %3, [%5], [%6], p;\n}}")
    a_op = f'"r"({em.expr(ins.a.addr)})' if ts else f'"l"({_desc(em, ins.a, "A")})'  # type: ignore[union-attr]
    return _issue(em, text, [f'"r"({em.expr(ins.d)})', a_op,
                             f'"l"({_desc(em, ins.b, "B")})', f'"r"({idesc:#x}u)',
                             f'"r"({em.expr(ins.accumulate)})', f'"r"({em.expr(ins.sfa)})',
                             f'"r"({em.expr(ins.sfb)})'])


def tcgen05_cp(em: Emitter, ins: Tcgen05Cp) -> list[str]:
    _need(em, "tcgen05.cp")
    if ins.shape not in CP_SHAPES:
        raise em.error(f"tcgen05.cp: shape {ins.shape!r} is not one of {', '.join(CP_SHAPES)}")
    return _issue(em, f"{tcgen05_ptx('cp', 1, ins.shape)} [%0], %1;",
                  [f'"r"({em.expr(ins.taddr)})', f'"l"({_desc(em, ins.src, "tcgen05.cp source")})'])


def _group(em: Emitter, g: int, what: str) -> int:
    if g not in (1, 2):
        raise em.error(f"{what}: cta_group {g} is not 1 or 2")
    return g


def tcgen05_commit(em: Emitter, ins: Tcgen05Commit) -> list[str]:
    _need(em, "tcgen05.commit")
    ptx = tcgen05_ptx("commit", _group(em, ins.cta_group, "tcgen05.commit"))
    if ins.multicast is None:
        return _issue(em, f"{ptx} [%0];", [f'"r"({em.mbar_addr(ins.bar)})'])
    # arrives on the barrier at the same offset in each CTA of the mask
    ptx = ptx.replace(".b64", ".multicast::cluster.b64")
    mask = f'"h"((unsigned short)({em.expr(ins.multicast)}))'
    return _issue(em, f"{ptx} [%0], %1;", [f'"r"({em.mbar_addr(ins.bar)})', mask])


def _ncols(em: Emitter, n: int, what: str) -> None:
    if n < 32 or n > 512 or n & (n - 1):
        raise em.error(f"{what} of {n} columns: not a power of two in [32, 512]")


def tmem_alloc(em: Emitter, ins: TmemAlloc) -> list[str]:
    _need(em, "tcgen05.alloc")
    _ncols(em, ins.ncols, "tcgen05.alloc")
    ptx = tcgen05_ptx("alloc", _group(em, ins.cta_group, "tcgen05.alloc"))
    return asm(f"{ptx} [%0], {int(ins.ncols)};", [], [f'"r"({em.smem_addr(ins.dst)})'])


def tmem_dealloc(em: Emitter, ins: TmemDealloc) -> list[str]:
    _need(em, "tcgen05.dealloc")
    _ncols(em, ins.ncols, "tcgen05.dealloc")
    ptx = tcgen05_ptx("dealloc", _group(em, ins.cta_group, "tcgen05.dealloc"))
    return asm(f"{ptx} %0, {int(ins.ncols)};", [], [f'"r"({em.expr(ins.taddr)})'])


def tmem_relinquish(em: Emitter, ins: TmemRelinquish) -> list[str]:
    _need(em, "tcgen05.relinquish_alloc_permit")
    g = _group(em, ins.cta_group, "tcgen05.relinquish_alloc_permit")
    return asm(f"{tcgen05_ptx('relinquish_alloc_permit', g)};", [], [])


def _fragment(em: Emitter, ins: Tcgen05Ld | Tcgen05St, what: str) -> tuple[int, str]:
    _need(em, what)
    if ins.shape not in TMEM_SHAPES:
        raise em.error(f"{what}: shape {ins.shape!r} is not one of {', '.join(TMEM_SHAPES)}")
    s = TMEM_SHAPES[ins.shape]
    if ins.num not in s.nums:
        raise em.error(f"{what}.{ins.shape}: .x{ins.num} is not one of {', '.join(f'x{n}' for n in s.nums)}")
    ref = ins.dst if isinstance(ins, Tcgen05Ld) else ins.src
    n = s.regs * ins.num
    bits = ref.array.dtype.bits
    packed = isinstance(ins, Tcgen05St) and bits in (8, 16)   # a register A: 32 / bits elements a register
    if not (bits == 32 or packed) or ref.count * bits != 32 * n:
        raise em.error(f"{what}.{ins.shape}.x{ins.num}: the register slice {ref.array.name} has {ref.count} "
                       f"{ref.array.dtype} element(s), the instruction moves {n} 32-bit registers")
    em.check_reg_range(ref)
    split = "" if ins.shape != "16x32bx2" else f", {ins.num if ins.half_split is None else ins.half_split}"
    return n, split


def _reg_ops(em: Emitter, ref: object, n: int, constraint: str) -> list[str]:
    c = "f" if ref.array.dtype.name == "f32" else "r"  # type: ignore[attr-defined]
    return [f'"{constraint}{c}"({em.reg_index(ref, i)})' for i in range(n)]  # type: ignore[arg-type]


def tcgen05_ld(em: Emitter, ins: Tcgen05Ld) -> list[str]:
    n, split = _fragment(em, ins, "tcgen05.ld")
    if all(ins.dst.array is not x for x in em.wgmma_arrays):
        em.wgmma_arrays.append(ins.dst.array)
    text = f"{tmem_ld_ptx(ins.shape, ins.num)} {operand_list(0, n)}, [%{n}]{split};"
    return asm(text, _reg_ops(em, ins.dst, n, "="), [f'"r"({em.expr(ins.taddr)})'])


def tcgen05_st(em: Emitter, ins: Tcgen05St) -> list[str]:
    n, split = _fragment(em, ins, "tcgen05.st")
    text = f"{tmem_ld_ptx(ins.shape, ins.num, store=True)} [%0]{split}, {operand_list(1, n)};"
    if ins.src.array.dtype.bits < 32:        # packed 16- / 8-bit elements (a register A operand)
        regs = [f'"r"({em.reg_u32(ins.src, j)})' for j in range(n)]
    else:
        regs = _reg_ops(em, ins.src, n, "")
    return asm(text, [], [f'"r"({em.expr(ins.taddr)})'] + regs)


def tcgen05_wait(em: Emitter, ins: Tcgen05Wait) -> list[str]:
    _need(em, "tcgen05.wait")
    if ins.kind not in ("ld", "st"):
        raise em.error(f"tcgen05.wait::{ins.kind} is not wait::ld or wait::st")
    lines = asm(tcgen05_ptx(f"wait_{ins.kind}") + ";", [], [])
    for arr in em.wgmma_arrays if ins.kind == "ld" else ():
        lines += _fence_array(em, arr)
    return lines


def tcgen05_fence(em: Emitter, ins: Tcgen05Fence) -> list[str]:
    _need(em, "tcgen05.fence")
    kinds = {"before_thread_sync": "fence_before", "after_thread_sync": "fence_after"}
    if ins.kind not in kinds:
        raise em.error(f"tcgen05.fence::{ins.kind} is not before_thread_sync or after_thread_sync")
    return asm(tcgen05_ptx(kinds[ins.kind]) + ";", [], [])


PRINTERS = {Tcgen05Mma: tcgen05_mma, Tcgen05Cp: tcgen05_cp, Tcgen05Commit: tcgen05_commit,
            TmemAlloc: tmem_alloc, TmemDealloc: tmem_dealloc, TmemRelinquish: tmem_relinquish,
            Tcgen05Ld: tcgen05_ld, Tcgen05St: tcgen05_st, Tcgen05Wait: tcgen05_wait,
            Tcgen05Fence: tcgen05_fence}
