"""``MmaAtom``: one matrix-multiply-accumulate instruction as CuTe's ``MMA_Traits`` see it.

An atom computes ``D[M,N] = A[M,K] @ B[N,K]^T + C[M,N]`` over ``shape_mnk = (M, N, K)``
with ``num_threads`` cooperating threads. Its three TV layouts map
``(thread, value) -> index`` in elements, thread mode first:

* ``a_layout``: ``(T, V) -> m + M*k``      (A is M x K)
* ``b_layout``: ``(T, V) -> n + N*k``      (B is N x K, i.e. K x N stored "col")
* ``c_layout``: ``(T, V) -> m + M*n``      (C and D share it)

Value order equals PTX register element order (``a0, a1, ...``; two 16-bit elements per
32-bit register, low half first). For operands read from shared memory through a wgmma
descriptor (``a_source == "smem"``), CuTe's layout is ``(128, (M, K)) : (0, (1, M))``:
every thread sees the whole tile, the hardware reads it through the descriptor; ``a_major``
/ ``b_major`` say which canonical shared-memory layout (K- or MN-major) the descriptor
describes. For ``tcgen05.mma`` (sm_100a) the accumulator lives in tensor memory
(``c_source == "tmem"``), A comes from shared memory or tensor memory, and ``cta_group`` says
whether one CTA or a pair of CTAs (``cta_group::2``) runs the instruction. A block-scaled
``tcgen05.mma`` (``scale_type`` "ue8m0") also reads one scale factor per row of A and of B and
per ``scale_vec`` K elements from tensor memory (``hexlayout.arch.block_scale``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..layout import Layout
from .atom import InstructionAtom
from .dtypes import DType

__all__ = ["MmaAtom"]


@dataclass(frozen=True)
class MmaAtom(InstructionAtom):
    """An mma instruction: shapes, TV layouts (elements), dtypes, PTX and register counts.

    ``regs_a``/``regs_b``/``regs_c`` count the 32-bit registers one thread passes for the
    operand (0 for a shared-memory operand, which is passed as one 64-bit descriptor).
    ``ptx`` is the instruction with all its modifiers, ``ptx_operands`` a template of its
    operand list.
    """

    name: str
    kind: str  # "mma.sync", "wgmma" or "tcgen05"
    shape_mnk: tuple[int, int, int]
    thr_id: Layout
    a_layout: Layout
    b_layout: Layout
    c_layout: Layout
    a_dtype: DType
    b_dtype: DType
    c_dtype: DType
    arch: str
    ptx: str
    ptx_operands: str
    regs_a: int
    regs_b: int
    regs_c: int
    a_source: str = "rmem"
    b_source: str = "rmem"
    a_major: str = "K"
    b_major: str = "K"
    options: tuple[tuple[str, str], ...] = field(default=())
    c_source: str = "rmem"
    cta_group: int = 1
    #: the block-scale factor type of a block-scaled MMA ("ue8m0": ``tcgen05.mma ... .block_scale``);
    #: "" for an unscaled one
    scale_type: str = ""
    #: K elements that share one scale factor (32 for ``scale_vec::1X`` of kind::mxf8f6f4)
    scale_vec: int = 0

    FAMILY = "mma"

    @property
    def d_layout(self) -> Layout:
        """D shares C's layout (CuTe asserts it for every atom)."""
        return self.c_layout

    @property
    def d_dtype(self) -> DType:
        return self.c_dtype

    @property
    def m(self) -> int:
        return self.shape_mnk[0]

    @property
    def n(self) -> int:
        return self.shape_mnk[1]

    @property
    def k(self) -> int:
        return self.shape_mnk[2]

    @property
    def values_a(self) -> int:
        """Elements of A per thread (``size(a_layout) / num_threads``)."""
        return self.per_thread(self.a_layout)

    @property
    def values_b(self) -> int:
        return self.per_thread(self.b_layout)

    @property
    def values_c(self) -> int:
        return self.per_thread(self.c_layout)

    def __str__(self) -> str:
        return (f"{self.name}: {self.ptx} (M,N,K)={self.shape_mnk} threads={self.num_threads}\n"
                f"  A {self.a_dtype} {self.a_layout}\n  B {self.b_dtype} {self.b_layout}\n"
                f"  C {self.c_dtype} {self.c_layout}")
