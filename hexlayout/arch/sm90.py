"""Hopper warpgroup mma atoms (sm_90a): ``wgmma.mma_async`` m64nNk16 (f16/bf16) and m64nNk32 (fp8).

128 threads (a warpgroup of 4 warps, ``w = thread / 32``) compute a 64 x N tile,
``N in {8, 16, ..., 256}``. CuTe's layouts (facts of the PTX ISA wgmma fragment figures):

* D/C (``CLayout_64xN``): ``((4,8,4),(2,2,N/8)) : ((128,1,16),(64,8,512))`` — thread
  ``(t, g, w)`` element ``i`` at ``m = 16w + g + 8*((i>>1)&1)``, ``n = 8*(i>>2) + 2t + (i&1)``.
* A from registers (RS), 16-bit: ``((4,8,4),(2,2,2)) : ((128,1,16),(64,8,512))`` — each warp's
  m16n8k16 A fragment, rows offset by 16w; 8-bit (k32): ``((4,8,4),(4,2,2)) :
  ((256,1,16),(64,8,1024))``.
* A or B from shared memory (SS): ``(128, (M, K)) : (0, (1, M))`` — the whole tile, read by the
  hardware through a 64-bit matrix descriptor (see ``gmma.py``) whose canonical layout is
  K-major or MN-major (``a_major`` / ``b_major``; PTX ``imm-trans`` 0 or 1). fp8 wgmma supports
  K-major only, and a register A must be K-major.

Names follow CuTe: ``SM90_64x{N}x16_{F16F16F16|F32F16F16|F32BF16BF16}_{SS|RS}`` and
``SM90_64x{N}x32_{F16|F32}{E4M3|E5M2}{E4M3|E5M2}_{SS|RS}_TN``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..layout import Layout
from .dtypes import BF16, E4M3, E5M2, F16, F32, DType
from .mma_atom import MmaAtom

__all__ = ["SM90_GMMA", "gmma_atom", "GMMA_N_VALUES", "c_layout_64xn", "A_RS_64x16", "A_RS_64x32"]

#: The N extents of wgmma (multiples of 8 up to 256).
GMMA_N_VALUES: tuple[int, ...] = tuple(range(8, 257, 8))

A_RS_64x16 = Layout(((4, 8, 4), (2, 2, 2)), ((128, 1, 16), (64, 8, 512)))
A_RS_64x32 = Layout(((4, 8, 4), (4, 2, 2)), ((256, 1, 16), (64, 8, 1024)))
_WARPGROUP = Layout(128)
_MAJORS = ("K", "MN")


def c_layout_64xn(n: int) -> Layout:
    """CuTe's ``CLayout_64xN``: (T128, V N/2) -> m + 64 n."""
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma: N={n} is not a multiple of 8 in [8, 256]")
    return Layout(((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512)))


def ss_layout(mn: int, k: int) -> Layout:
    """CuTe's ``GMMA::ABLayout<MN, K>``: every one of the 128 threads sees the whole tile."""
    return Layout((128, (mn, k)), (0, (1, mn)))


def _list(prefix: str, count: int) -> str:
    if count <= 8:
        return "{" + ", ".join(f"{prefix}{i}" for i in range(count)) + "}"
    return "{" + f"{prefix}0, {prefix}1, ..., {prefix}{count - 1}" + "}"


def gmma_atom(n: int, da: DType, db: DType, dc: DType, a_source: str, a_major: str = "K",
              b_major: str = "K") -> MmaAtom:
    """The wgmma atom ``64 x n x (256 / bits(A))`` with A from ``a_source`` ("smem" or "rmem")."""
    for what, major in (("a_major", a_major), ("b_major", b_major)):
        if major not in _MAJORS:
            raise ValueError(f"wgmma: {what}={major!r} is not one of 'K', 'MN'")
    k = 256 // da.bits
    eight_bit = da.bits == 8
    ss = a_source == "smem"
    name = f"SM90_64x{n}x{k}_{dc.cute}{da.cute}{db.cute}_{'SS' if ss else 'RS'}{'_TN' if eight_bit else ''}"
    if eight_bit and (a_major != "K" or b_major != "K"):
        raise ValueError(f"{name}: 8-bit wgmma supports K-major A and B only (got a_major={a_major!r}, "
                         f"b_major={b_major!r})")
    if not ss and a_major != "K":
        raise ValueError(f"{name}: A from registers must be K-major (got a_major={a_major!r})")
    c = c_layout_64xn(n)
    a = ss_layout(64, k) if ss else (A_RS_64x32 if eight_bit else A_RS_64x16)
    b = ss_layout(n, k)
    regs_c = 64 * n * dc.bits // (128 * 32)
    regs_a = 0 if ss else 64 * k * da.bits // (128 * 32)
    ptx = f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{dc.ptx}.{da.ptx}.{db.ptx}"
    tnsp_a, tnsp_b = int(a_major == "MN"), int(b_major == "MN")
    a_opnd = "desc_a" if ss else _list("a", regs_a)
    trans = "" if eight_bit else (f", {tnsp_a}, {tnsp_b}" if ss else f", {tnsp_b}")
    operands = f"{_list('d', regs_c)}, {a_opnd}, desc_b, scale_d, 1, 1{trans}"
    return MmaAtom(
        name=name, kind="wgmma", shape_mnk=(64, n, k), thr_id=_WARPGROUP, a_layout=a, b_layout=b, c_layout=c,
        a_dtype=da, b_dtype=db, c_dtype=dc, arch="sm_90a", ptx=ptx, ptx_operands=operands, regs_a=regs_a,
        regs_b=0, regs_c=regs_c, a_source=a_source, b_source="smem", a_major=a_major, b_major=b_major,
        options=(("a_major", a_major), ("b_major", b_major)),
    )


def _factory(n: int, da: DType, db: DType, dc: DType, a_source: str) -> Callable[..., MmaAtom]:
    def make(a_major: str = "K", b_major: str = "K") -> MmaAtom:
        return gmma_atom(n, da, db, dc, a_source, a_major, b_major)

    return make


def _table() -> dict[str, Callable[..., MmaAtom]]:
    out: dict[str, Callable[..., MmaAtom]] = {}
    combos16 = [(F16, F16, F16), (F16, F16, F32), (BF16, BF16, F32)]
    combos8 = [(da, db, dc) for dc in (F16, F32) for da in (E4M3, E5M2) for db in (E4M3, E5M2)]
    for n in GMMA_N_VALUES:
        for da, db, dc in combos16 + combos8:
            k = 256 // da.bits
            tn = "_TN" if da.bits == 8 else ""
            stem = f"SM90_64x{n}x{k}_{dc.cute}{da.cute}{db.cute}"
            out[f"{stem}_SS{tn}"] = _factory(n, da, db, dc, "smem")
            out[f"{stem}_RS{tn}"] = _factory(n, da, db, dc, "rmem")
    return out


#: name -> factory (options ``a_major``, ``b_major``) of every sm_90a wgmma atom.
SM90_GMMA: dict[str, Callable[..., MmaAtom]] = _table()
