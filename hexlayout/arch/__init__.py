"""The hardware layer: mma and copy atoms as CuTe TV layouts, shared-memory banks, limits.

* ``get_atom(name, **options)`` / ``list_atoms(arch, kind)``: atoms by CuTe name
  (``SM80_16x8x16_F32F16F16F32_TN``, ``SM90_64x128x16_F32BF16BF16_SS``, ``SM75_U32x4_LDSM_N``,
  ``UniversalCopy_U128``, ``SM80_CP_ASYNC_CACHEGLOBAL_U128``, ``SM90_TMA_LOAD`` ...).
  ``MmaAtom`` layouts are in elements, ``CopyAtom`` layouts in bits, thread mode first.
* ``get_arch(name)``: facts of sm_80, sm_89, sm_90a, sm_100a (``ArchInfo``).
* ``bank_conflicts(addresses, width)``: wavefronts of one warp-wide shared-memory request.
* ``check_tma(...)``: the legality rules of a TMA tensor map and box.
* ``gmma``: wgmma shared-memory layout atoms and matrix descriptors.
* ``sm100`` (tcgen05.mma atoms ``SM100_128x256x16_F32BF16BF16_SS`` ...), ``tcgen05`` (their
  instruction and shared-memory descriptors), ``tmem`` (tensor memory: accumulator layouts,
  tcgen05.ld/st shapes, allocation rules), ``tcgen05_ops`` (alloc, commit, fence, wait PTX),
  ``tcgen05_cp`` (tcgen05.cp shapes: shared memory -> TMEM), ``block_scale`` (UE8M0 / UE4M3 block
  scale factors of the block-scaled tcgen05.mma: scale vectors, shared-memory and TMEM layouts),
  ``fp4`` (e2m1 values and their packed shared-memory format, kind::mxf4 / mxf4nvf4).

Importing this package loads neither torch nor CUDA; atom tables are built on first use.
"""

from .arch import ArchInfo, get_arch
from .banks import BankReport, bank_conflicts, ldmatrix_bank_conflicts
from .copy_atom import CopyAtom
from .dtypes import DType, get_dtype
from .mma_atom import MmaAtom
from .registry import atom_spec, get_atom, list_atoms
from .targets import SUPPORTED_ARCHS
from .tma import check_tma

__all__ = [
    "get_atom", "list_atoms", "atom_spec", "MmaAtom", "CopyAtom", "DType", "get_dtype", "get_arch",
    "ArchInfo", "SUPPORTED_ARCHS", "bank_conflicts", "ldmatrix_bank_conflicts", "BankReport", "check_tma",
]
