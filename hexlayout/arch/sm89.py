"""Ada ``mma.sync`` fp8 atoms (sm_89+): m16n8k32 with e4m3/e5m2 inputs.

The fragments are those of the 8-bit m16n8k32 shape (CuTe reuses the s8 layouts):
A ``((4,8),(4,2,2)):((64,1),(16,8,256))``: lane ``(t, g)`` element ``i`` at
``m = g + 8*((i>>2)&1)``, ``k = 4t + (i&3) + 16*(i>=8)``; B ``((4,8),(4,2)):((32,1),(8,128))``:
``n = g``, ``k = 4t + (i&3) + 16*(i>=4)``; C/D the m16n8 fragment. F32 accumulators
need PTX 8.4 (sm_89); the F16-accumulating variants need PTX 8.7.
"""

from __future__ import annotations

from collections.abc import Callable

from ..layout import Layout
from .dtypes import E4M3, E5M2, F16, F32, DType
from .mma_atom import MmaAtom
from .sm80 import C_16x8, mma_sync_atom

__all__ = ["SM89_MMA"]

_A_16x32_8b = Layout(((4, 8), (4, 2, 2)), ((64, 1), (16, 8, 256)))
_B_8x32_8b = Layout(((4, 8), (4, 2)), ((32, 1), (8, 128)))


def _table() -> dict[str, Callable[[], MmaAtom]]:
    out: dict[str, Callable[[], MmaAtom]] = {}

    def add(da: DType, db: DType, dc: DType) -> None:
        name = f"SM89_16x8x32_{dc.cute}{da.cute}{db.cute}{dc.cute}_TN"
        out[name] = lambda: mma_sync_atom(name, (16, 8, 32), _A_16x32_8b, _B_8x32_8b, C_16x8, da, db, dc,
                                          "sm_89")

    for dc in (F32, F16):
        for da in (E4M3, E5M2):
            for db in (E4M3, E5M2):
                add(da, db, dc)
    return out


#: name -> factory of every sm_89 fp8 mma.sync atom.
SM89_MMA: dict[str, Callable[[], MmaAtom]] = _table()
