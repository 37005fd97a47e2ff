"""Tensor memory (TMEM, sm_100a): its geometry, allocation rules, the accumulator layouts of
``tcgen05.mma`` and the ``tcgen05.ld`` / ``tcgen05.st`` shapes, as CuTe layouts.

Each CTA has 128 lanes x 512 columns of 32-bit cells. A TMEM address is
``lane << 16 | column`` (CuTe's ``TMEM::DP`` stride is ``1 << 16``). ``tcgen05.alloc`` takes a
power-of-two number of columns >= 32 (and <= 512), allocated for all 128 lanes; the allocating
warp must ``tcgen05.dealloc`` everything it allocated and ``tcgen05.relinquish_alloc_permit``
before the CTA exits. Warp ``w`` of a warp group may access lanes ``32*(w%4) .. 32*(w%4)+31``
only (its lane quarter; CuTe asserts ``warp % 4 == (taddr >> 16) / 32 % 4``).

``tcgen05.ld`` / ``tcgen05.st`` move a warp's registers from / to a block of TMEM; shape
``.LxBb`` covers L lanes x B bits, ``.num = .xN`` repeats it N times along the columns. Lane
``l`` (thread of the warp) and register ``r`` hold the TMEM cell (PTX ISA "Matrix fragments
for tcgen05.ld / st"; CuTe ``SM100_TMEM_LOAD_*`` ``DstLayout``):

* ``32x32b``:  lane ``l``, column ``r``;
* ``16x64b``:  lane ``l//4 + 8*(l%2)``, column ``(l//2)%2 + 2r``;
* ``16x128b``: lane ``l//4 + 8*(r%2)``, column ``l%4 + 4*(r//2)``;
* ``16x256b``: lane ``l//4 + 8*((r//2)%2)``, column ``r%2 + 2*(l%4) + 8*(r//4)``;
* ``16x32bx2``: lane ``l%16``, column ``r`` of half ``l//16``; half 1 starts
  ``immHalfSplitoff`` columns after half 0.

``tmem_copy_layout(shape, num)`` is that map as a TV layout ``(thread, register) -> lane +
lanes * column`` over the atom's (lanes x columns) block, colexicographic as every hexlayout TV
layout (for ``16x32bx2`` the two halves are columns ``[0, num)`` and ``[num, 2 num)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..layout import Layout

__all__ = ["TMEM_LANES", "TMEM_COLUMNS", "TMEM_DP", "TmemShape", "TMEM_SHAPES", "tmem_copy_layout",
           "accumulator_stages",
           "check_alloc_columns", "lane_quarter", "accumulator_layout", "operand_a_layout", "tmem_ld_ptx"]

TMEM_LANES = 128
TMEM_COLUMNS = 512
#: Address stride of one lane (a TMEM address is ``lane << 16 | column``).
TMEM_DP = 1 << 16


@dataclass(frozen=True)
class TmemShape:
    """A ``tcgen05.ld/st`` shape: ``lanes`` x ``bits`` per repetition, registers per thread per
    repetition, and the largest ``.num`` (the register count may not exceed 128)."""

    name: str
    lanes: int
    bits: int
    regs: int

    @property
    def columns(self) -> int:
        """32-bit columns per repetition (``16x32bx2``: both halves)."""
        return self.bits // 32 * (2 if self.name == "16x32bx2" else 1)

    @property
    def nums(self) -> tuple[int, ...]:
        """The ``.num`` repetitions allowed: powers of two with at most 128 registers per thread."""
        return tuple(n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n * self.regs <= 128)


TMEM_SHAPES: dict[str, TmemShape] = {s.name: s for s in (
    TmemShape("32x32b", 32, 32, 1), TmemShape("16x64b", 16, 64, 1), TmemShape("16x128b", 16, 128, 2),
    TmemShape("16x256b", 16, 256, 4), TmemShape("16x32bx2", 16, 32, 1))}


def _shape(name: str) -> TmemShape:
    if name not in TMEM_SHAPES:
        raise ValueError(f"tcgen05.ld/st: shape {name!r} is not one of {', '.join(TMEM_SHAPES)}")
    return TMEM_SHAPES[name]


def tmem_copy_layout(shape: str, num: int = 1) -> Layout:
    """``(thread 32, register regs*num) -> lane + lanes * column`` of ``tcgen05.ld/st.{shape}.x{num}``.

    Example:
        >>> str(tmem_copy_layout("32x32b", 4))
        '(32,4):(1,32)'
    """
    s = _shape(shape)
    if num not in s.nums:
        allowed = ", ".join(f"x{n}" for n in s.nums)
        raise ValueError(f"tcgen05.ld/st.{shape}: .num x{num} is not one of {allowed}")
    if shape == "32x32b":
        return Layout((32, num), (1, 32))
    if shape == "16x64b":  # lane l//4 + 8(l%2), column (l//2)%2 + 2r
        return Layout(((2, 2, 8), num), ((8, 16, 1), 32))
    if shape == "16x128b":  # lane l//4 + 8(r%2), column l%4 + 4(r//2)
        return Layout(((4, 8), (2, num)), ((16, 1), (8, 64)))
    if shape == "16x256b":  # lane l//4 + 8((r//2)%2), column r%2 + 2(l%4) + 8(r//4)
        return Layout(((4, 8), (2, 2, num)), ((32, 1), (16, 8, 128)))
    return Layout(((16, 2), num), ((1, 16 * num), 16))  # 16x32bx2: lane l%16, column r (+num for half 1)


def tmem_ld_ptx(shape: str, num: int, store: bool = False) -> str:
    """The PTX of ``tcgen05.ld`` (or ``.st``) for ``shape`` and ``num`` with 32-bit registers."""
    _shape(shape)
    op = "st" if store else "ld"
    return f"tcgen05.{op}.sync.aligned.{shape}.x{num}.b32"


def check_alloc_columns(ncols: int, in_use: int = 0) -> None:
    """Raise ``ValueError`` unless ``tcgen05.alloc`` of ``ncols`` columns is legal with
    ``in_use`` columns already allocated: a power of two in [32, 512] that still fits."""
    if ncols < 32 or ncols > TMEM_COLUMNS or ncols & (ncols - 1):
        raise ValueError(f"tcgen05.alloc: {ncols} columns is not a power of two in [32, {TMEM_COLUMNS}]")
    if in_use + ncols > TMEM_COLUMNS:
        raise ValueError(f"tcgen05.alloc: {ncols} columns with {in_use} in use exceed the {TMEM_COLUMNS} "
                         "columns of tensor memory")


def accumulator_stages(n: int, elem_bits: int = 32, most: int | None = None, reserved: int = 0) -> int:
    """How many ``M x n`` accumulators (``n * elem_bits / 32`` TMEM columns each) a kernel can
    rotate through in tensor memory: ``floor((512 - reserved) / columns)``, at most ``most``.
    Stage ``s`` of a rotation holds the accumulator of tile ``i`` with ``i % stages == s``, so
    the MMAs of tile ``i + 1`` write other columns than the epilogue of tile ``i`` reads: two
    stages overlap them, more absorb an epilogue slower than a tile's MMAs.

    Example:
        >>> accumulator_stages(256), accumulator_stages(128), accumulator_stages(128, most=2)
        (2, 4, 2)
    """
    cols = -(-n * elem_bits // 32)
    fit = (TMEM_COLUMNS - reserved) // cols if cols else 0
    if fit < 1:
        raise ValueError(f"an accumulator of {n} x {elem_bits}-bit columns ({cols} TMEM columns) does not "
                         f"fit in the {TMEM_COLUMNS - reserved} free columns of tensor memory")
    return fit if most is None else max(1, min(fit, most))


def lane_quarter(warp: int) -> range:
    """The TMEM lanes warp ``warp`` (of the CTA) may access with tcgen05.ld/st: ``32*(warp%4)`` on."""
    q = warp % 4
    return range(32 * q, 32 * q + 32)


def accumulator_layout(m: int, n: int, cta_group: int = 1, elem_bits: int = 32) -> Layout:
    """The TMEM addresses of one CTA's share of a ``tcgen05.mma`` accumulator: ``(row, col) ->
    lane << 16 | column`` (PTX ISA "Data path layout organization"; ``m`` is the whole MMA's M).

    * ``cta_group::1, M=128`` and ``cta_group::2, M=256`` (128 rows per CTA): row ``i`` in lane ``i``;
    * ``cta_group::1, M=64``: rows ``16q .. 16q+15`` in lanes ``32q .. 32q+15`` (the first half of
      each warp's quarter), so a ``16x*b`` tcgen05.ld reads them;
    * ``cta_group::2, M=128`` (64 rows per CTA): row ``i``, column ``j`` in lane ``i + 64*(j // (N/2))``,
      column ``j % (N/2)``.

    Column ``j`` of a 32-bit accumulator is TMEM column ``j`` (16-bit: two per column is not modelled).

    Example:
        >>> str(accumulator_layout(128, 64))
        '(128,64):(65536,1)'
    """
    if elem_bits != 32:
        raise ValueError("accumulator_layout: only 32-bit accumulators are modelled")
    if (cta_group, m) in ((1, 128), (2, 256)):
        return Layout((128, n), (TMEM_DP, 1))
    if (cta_group, m) == (1, 64):
        return Layout(((16, 4), n), ((TMEM_DP, 32 * TMEM_DP), 1))
    if (cta_group, m) == (2, 128):
        return Layout((64, (n // 2, 2)), (TMEM_DP, (1, 64 * TMEM_DP)))
    raise ValueError(f"tcgen05.mma: M={m} is not valid for cta_group::{cta_group}")


def operand_a_layout(m: int, k: int, bits: int) -> Layout:
    """The TMEM cells of a ``tcgen05.mma`` A operand read from tensor memory (the ``_TS`` atoms,
    ``cta_group::1``): ``(row, k) -> (lane << 16 | column) * (32 / bits) + slot``, i.e. element
    ``(i, k)`` is bits ``[bits * slot, bits * (slot + 1))`` (low bits first) of the 32-bit cell
    in lane ``L(i)``, column ``k // (32 / bits)``, ``slot = k % (32 / bits)``.

    The lanes are the accumulator's for the same ``M`` (``accumulator_layout``; PTX ISA "Data path
    layout organization": A and D of one MMA share their data-path lanes, CuTe allocates A with
    ``TmemAllocMode::NonInterleaved`` for that): ``M = 128`` row ``i`` in lane ``i``; ``M = 64``
    rows ``16q .. 16q+15`` in lanes ``32q .. 32q+15``. A k-step of the MMA (``K = 256 / bits``
    elements) is 8 consecutive columns; an ``m x k`` tile takes ``k * bits / 32`` columns.

    Example:
        >>> str(operand_a_layout(128, 16, 16))
        '(128,(2,8)):(131072,(1,2))'
    """
    if bits not in (8, 16):
        raise ValueError(f"tcgen05.mma A from tensor memory: {bits}-bit elements are not modelled (8, 16)")
    per = 32 // bits
    if k % (256 // bits):
        raise ValueError(f"tcgen05.mma A from tensor memory: K = {k} is not whole k-steps of {256 // bits}")
    words = k // per
    acc = accumulator_layout(m, words)
    lane, col = acc[0], acc[1]
    return Layout((lane.shape, (per, col.shape)), (_scaled(lane.stride, per), (1, _scaled(col.stride, per))))


def _scaled(stride: object, f: int) -> object:
    return tuple(_scaled(x, f) for x in stride) if isinstance(stride, tuple) else int(stride) * f  # type: ignore[arg-type]
