"""Ampere ``mma.sync`` atoms (sm_80): m16n8k8 / m16n8k16 for f16 and bf16, m16n8k32 for
8-bit integers, m16n8k8 for tf32.

Layouts are CuTe's ``MMA_Traits`` (facts of the PTX ISA fragment figures). With
``lane = 4*g + t`` (``g`` = groupID = lane/4, ``t`` = lane%4) the thread mode is
``(4, 8) = (t, g)``. For example ``SM80_16x8_Row = ((4,8),(2,2)):((32,1),(16,8))`` puts
element ``i`` of lane ``(t, g)`` at ``m = g + 8*(i>>1)``, ``n = 2t + (i&1)`` (index ``m + 16n``),
the C/D fragment of every m16n8 shape. 16-bit accumulators use the same element layout with
two elements per 32-bit register.
"""

from __future__ import annotations

from collections.abc import Callable

from ..layout import Layout
from .dtypes import BF16, F16, F32, S8, S32, TF32, U8, DType
from .mma_atom import MmaAtom

__all__ = ["SM80_MMA", "mma_sync_atom", "C_16x8"]

# (T32, V4) -> (M16, N8): the C/D fragment of every m16n8kX mma.sync.
C_16x8 = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))
# 16-bit A and B
_A_16x8_16b = C_16x8                                                      # (m16, k8)
_B_8x8_16b = Layout(((4, 8), 2), ((16, 1), 8))                            # (n8, k8)
_A_16x16_16b = Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))       # (m16, k16)
_B_8x16_16b = Layout(((4, 8), (2, 2)), ((16, 1), (8, 64)))                # (n8, k16)
# 8-bit A and B
_A_16x32_8b = Layout(((4, 8), (4, 2, 2)), ((64, 1), (16, 8, 256)))       # (m16, k32)
_B_8x32_8b = Layout(((4, 8), (4, 2)), ((32, 1), (8, 128)))                # (n8, k32)
# tf32 A and B (m16n8k8)
_A_16x8_tf32 = Layout(((4, 8), (2, 2)), ((16, 1), (8, 64)))               # (m16, k8)
_B_8x8_tf32 = Layout(((4, 8), 2), ((8, 1), 32))                           # (n8, k8)

_WARP = Layout(32)


def _regs(layout: Layout, nthreads: int, dtype: DType) -> int:
    """32-bit registers per thread holding ``size(layout)/nthreads`` elements of ``dtype``."""
    return -(-(layout.size() // nthreads) * dtype.bits // 32)


def mma_sync_atom(name: str, mnk: tuple[int, int, int], a: Layout, b: Layout, c: Layout,
                  da: DType, db: DType, dc: DType, arch: str, suffix: str = "") -> MmaAtom:
    """Build a warp-wide ``mma.sync.aligned.mMnNkK.row.col.<d>.<a>.<b>.<c>`` atom."""
    m, n, k = mnk
    ptx = f"mma.sync.aligned.m{m}n{n}k{k}.row.col.{dc.ptx}.{da.ptx}.{db.ptx}.{dc.ptx}{suffix}"
    ra, rb, rc = _regs(a, 32, da), _regs(b, 32, db), _regs(c, 32, dc)

    def rng(p: str, r: int) -> str:
        return "{" + ", ".join(f"{p}{i}" for i in range(r)) + "}"

    operands = f"{rng('d', rc)}, {rng('a', ra)}, {rng('b', rb)}, {rng('c', rc)}"
    return MmaAtom(name=name, kind="mma.sync", shape_mnk=mnk, thr_id=_WARP, a_layout=a, b_layout=b,
                   c_layout=c, a_dtype=da, b_dtype=db, c_dtype=dc, arch=arch, ptx=ptx,
                   ptx_operands=operands, regs_a=ra, regs_b=rb, regs_c=rc)


def _table() -> dict[str, Callable[[], MmaAtom]]:
    out: dict[str, Callable[[], MmaAtom]] = {}

    def add(mnk: tuple[int, int, int], a: Layout, b: Layout, da: DType, db: DType, dc: DType) -> None:
        m, n, k = mnk
        name = f"SM80_{m}x{n}x{k}_{dc.cute}{da.cute}{db.cute}{dc.cute}_TN"
        out[name] = lambda: mma_sync_atom(name, mnk, a, b, C_16x8, da, db, dc, "sm_80")

    for acc in (F16, F32):
        add((16, 8, 8), _A_16x8_16b, _B_8x8_16b, F16, F16, acc)
        add((16, 8, 16), _A_16x16_16b, _B_8x16_16b, F16, F16, acc)
    add((16, 8, 8), _A_16x8_16b, _B_8x8_16b, BF16, BF16, F32)
    add((16, 8, 16), _A_16x16_16b, _B_8x16_16b, BF16, BF16, F32)
    add((16, 8, 8), _A_16x8_tf32, _B_8x8_tf32, TF32, TF32, F32)
    for da in (S8, U8):
        for db in (S8, U8):
            add((16, 8, 32), _A_16x32_8b, _B_8x32_8b, da, db, S32)
    return out


#: name -> factory of every sm_80 mma.sync atom.
SM80_MMA: dict[str, Callable[[], MmaAtom]] = _table()
