"""``ldmatrix`` (sm_75+) and ``stmatrix`` (sm_90+) atoms: warp-wide 8x8 b16 matrix moves.

Semantics (PTX ISA, ``ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16``): lanes
``8j .. 8j+7`` give the 16-byte row addresses of matrix ``j`` (``j < N``); lane ``l``
receives in register ``j`` the two 16-bit elements ``(row l/4, cols 2(l%4), 2(l%4)+1)`` of
matrix ``j``. With ``.trans`` it receives ``(rows 2(l%4), 2(l%4)+1, col l/4)`` instead.
``stmatrix`` is the inverse movement (registers to rows in shared memory).

CuTe's traits express this in bits over a reference tile of ``N`` matrices, each 8 rows of
128 bits stored one after the other (bit ``128*r + 1024*j + b``):

* source (row addresses): thread ``r + 8j`` holds the 128 bits of row ``r`` of matrix ``j``;
  lanes beyond ``8N`` repeat (stride 0), their addresses are ignored;
* destination, non-transposed ``U32xN_LDSM_N``: ``(32, (32, N)) : (32, (1, 1024))``, thread
  ``l`` holds bits ``[32l, 32l+32)`` of each matrix;
* destination, transposed ``U16x{2N}_LDSM_T``: ``((4,8),(16,2,N)) : ((256,16),(1,128,1024))``,
  thread ``(t, g)`` holds the 16-bit column ``g`` of rows ``2t`` and ``2t+1``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from ..layout import Layout
from .copy_atom import CopyAtom

__all__ = ["LDSM_STSM", "ldsm_layouts"]

_WARP = Layout(32)


def ldsm_layouts(num: int, trans: bool) -> tuple[Layout, Layout]:
    """``(row_layout, reg_layout)`` in bits for ``num`` in {1, 2, 4} matrices.

    ``row_layout`` maps (thread, bit) to the row each thread addresses, ``reg_layout``
    (thread, bit) to the register bits each thread holds (CuTe's LDSM Src/Dst layouts).
    """
    if num not in (1, 2, 4):
        raise ValueError(f"ldmatrix/stmatrix: .x{num} is not one of .x1, .x2, .x4")
    if num == 4:
        rows = Layout((32, 128), (128, 1))
    else:
        rows = Layout(((8 * num, 4 // num), 128), ((128, 0), 1))
    if not trans:
        regs = Layout((32, 32), (32, 1)) if num == 1 else Layout((32, (32, num)), (32, (1, 1024)))
    elif num == 1:
        regs = Layout(((4, 8), (16, 2)), ((256, 16), (1, 128)))
    else:
        regs = Layout(((4, 8), (16, 2, num)), ((256, 16), (1, 128, 1024)))
    return rows, regs


def _name(store: bool, num: int, trans: bool) -> str:
    """CuTe's name of the ldmatrix (``store`` False) or stmatrix atom."""
    arch, op = ("SM90", "STSM") if store else ("SM75", "LDSM")
    return f"{arch}_U16x{2 * num}_{op}_T" if trans else f"{arch}_U32x{num}_{op}_N"


def _matrix_atom(store: bool, num: int, trans: bool) -> CopyAtom:
    """The ldmatrix atom (rows in shared memory -> registers) or, ``store``, the stmatrix one
    (registers -> rows): the same layouts, source and destination exchanged."""
    rows, regs = ldsm_layouts(num, trans)
    regs_list = "{" + ", ".join(f"r{i}" for i in range(num)) + "}"
    src, dst = (regs, rows) if store else (rows, regs)
    return CopyAtom(
        name=_name(store, num, trans), kind="stmatrix" if store else "ldmatrix", thr_id=_WARP, src_layout=src,
        dst_layout=dst, ref_layout=regs, access_bits=128, src_space="rmem" if store else "smem",
        dst_space="smem" if store else "rmem", arch="sm_90" if store else "sm_75",
        ptx=f"{'st' if store else 'ld'}matrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16",
        ptx_operands=f"[row_addr], {regs_list}" if store else f"{regs_list}, [row_addr]", alignment=16,
        constraints=(f"lanes 0..{8 * num - 1} give 16-byte-aligned shared-memory row addresses",
                     "all 32 lanes execute it (.sync.aligned)"),
    )


def _table() -> dict[str, Callable[[], CopyAtom]]:
    out: dict[str, Callable[[], CopyAtom]] = {}
    for num in (1, 2, 4):
        for trans in (False, True):
            for store in (False, True):
                out[_name(store, num, trans)] = partial(_matrix_atom, store, num, trans)
    return out


#: name -> factory of every ldmatrix / stmatrix atom.
LDSM_STSM: dict[str, Callable[[], CopyAtom]] = _table()
