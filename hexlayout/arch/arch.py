"""Per-architecture facts: ``get_arch("sm_80" | "sm_89" | "sm_90a" | "sm_100a")``.

Limits are those of the CUDA C++ Programming Guide's compute-capability table: 32 banks
of 4 bytes; shared memory per SM and the opt-in maximum per block (the default static
limit is 48 KiB; the driver reserves 1 KiB per block, included in the per-SM figure);
65536 32-bit registers per SM, at most 255 per thread; 1024 threads per block. Which
instructions exist follows from the PTX ISA targets: ldmatrix sm_75, cp.async and bf16
mma sm_80, fp8 mma.sync sm_89, stmatrix / TMA / clusters sm_90, wgmma sm_90a, tcgen05 and
tensor memory (128 lanes x 512 columns of 32 bits per CTA, ``arch.tmem``) sm_100a, which has
no wgmma.
"""

from __future__ import annotations

from dataclasses import dataclass

from .targets import SUPPORTED_ARCHS, check_arch_name

__all__ = ["ArchInfo", "get_arch"]

KiB = 1024


@dataclass(frozen=True)
class ArchInfo:
    """What one GPU architecture offers. Sizes in bytes, counts per SM unless noted."""

    name: str
    compute_capability: tuple[int, int]
    example_gpus: tuple[str, ...]
    num_banks: int
    bank_bytes: int
    smem_per_sm: int
    smem_per_block_max: int
    smem_per_block_default: int
    regs_per_sm: int
    regs_per_block_max: int
    max_regs_per_thread: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    warp_size: int
    max_cluster_size: int
    has_cp_async: bool
    has_ldmatrix: bool
    has_stmatrix: bool
    has_wgmma: bool
    has_tma: bool
    has_fp8_mma: bool
    has_clusters: bool
    has_tcgen05: bool = False

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size

    def mma_atoms(self) -> list[str]:
        """Names of the mma atoms this architecture runs (sm_90a includes the sm_80 ones)."""
        from .registry import list_atoms

        return list_atoms(self.name, "mma")

    def copy_atoms(self) -> list[str]:
        from .registry import list_atoms

        return list_atoms(self.name, "copy")

    def offers(self, atom_name: str, **options: object) -> bool:
        """Whether the atom ``atom_name`` runs on this architecture."""
        from .registry import get_atom

        return self.name in get_atom(atom_name, **options).archs


_COMMON = dict(num_banks=32, bank_bytes=4, smem_per_block_default=48 * KiB, regs_per_sm=65536,
               regs_per_block_max=65536, max_regs_per_thread=255, max_threads_per_block=1024, warp_size=32,
               has_cp_async=True, has_ldmatrix=True)

_ARCHS: dict[str, ArchInfo] = {
    "sm_80": ArchInfo(name="sm_80", compute_capability=(8, 0), example_gpus=("A100", "A30"),
                      smem_per_sm=164 * KiB, smem_per_block_max=163 * KiB, max_threads_per_sm=2048,
                      max_blocks_per_sm=32, max_cluster_size=1, has_stmatrix=False, has_wgmma=False,
                      has_tma=False, has_fp8_mma=False, has_clusters=False, **_COMMON),
    "sm_89": ArchInfo(name="sm_89", compute_capability=(8, 9), example_gpus=("L40S", "L4", "RTX 4090"),
                      smem_per_sm=100 * KiB, smem_per_block_max=99 * KiB, max_threads_per_sm=1536,
                      max_blocks_per_sm=24, max_cluster_size=1, has_stmatrix=False, has_wgmma=False,
                      has_tma=False, has_fp8_mma=True, has_clusters=False, **_COMMON),
    "sm_90a": ArchInfo(name="sm_90a", compute_capability=(9, 0), example_gpus=("H100", "H200", "H20"),
                       smem_per_sm=228 * KiB, smem_per_block_max=227 * KiB, max_threads_per_sm=2048,
                       max_blocks_per_sm=32, max_cluster_size=8, has_stmatrix=True, has_wgmma=True,
                       has_tma=True, has_fp8_mma=True, has_clusters=True, **_COMMON),
    "sm_100a": ArchInfo(name="sm_100a", compute_capability=(10, 0), example_gpus=("B200", "GB200"),
                        smem_per_sm=228 * KiB, smem_per_block_max=227 * KiB, max_threads_per_sm=2048,
                        max_blocks_per_sm=32, max_cluster_size=8, has_stmatrix=True, has_wgmma=False,
                        has_tma=True, has_fp8_mma=True, has_clusters=True, has_tcgen05=True, **_COMMON),
}
assert tuple(_ARCHS) == SUPPORTED_ARCHS


def get_arch(name: str) -> ArchInfo:
    """Facts of ``name`` ("sm_80", "sm_89", "sm_90a", "sm_100a"; "sm80", "SM_90A" are accepted).
    Unknown names raise ``ValueError`` naming the supported ones."""
    return _ARCHS[check_arch_name(name)]
