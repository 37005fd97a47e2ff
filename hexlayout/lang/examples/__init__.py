"""Example kernels written with ``hl.auto`` layouts, as the later stages consume them.

- ``gemm_sm80.gemm_sm80``: multistage (cp.async) GEMM for Ampere: global->shared stage
  buffers, shared->register, mma.sync, commit/wait groups, a register->global epilogue.
- ``gemm_sm90.gemm_sm90``: warp-specialized Hopper GEMM: TMA copies completing on
  mbarriers, producer / consumer warp groups with setmaxnreg, wgmma from shared memory.
- ``flash_attention.flash_attention_fwd``: FlashAttention-2-style forward (causal or
  not): S = Q K^T, online softmax (reduce max / exp2 / sum), P cast to f16 and used as
  the A operand of P V, ragged sequence edges handled through view extents.
- ``paged_attention.paged_decode``: paged decode attention (GQA): the sequence length read
  from memory is the loop bound, K/V rows are gathered through the block table with
  indices computed in registers.

- ``explicit``: the same GEMMs (sm_80 and sm_90a) with every layout and instruction
  written out, as synthesis should find them; run end to end in the emulator.

All compute ``C = A @ B^T`` style products: ``b`` is (N, K) (K-major), as ``hl.mma`` takes it.
"""

from .flash_attention import flash_attention_fwd
from .gemm_sm80 import gemm_sm80
from .gemm_sm90 import gemm_sm90
from .paged_attention import paged_decode

__all__ = ["gemm_sm80", "gemm_sm90", "flash_attention_fwd", "paged_decode"]
