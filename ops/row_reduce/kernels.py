"""Row reductions in the tile language: the reduction anchors of post-scheduling fusion.

``c[M, 1] = reduce_j x[M, j]`` over the last mode (``j < N``) for ``fn`` in ``"sum"``,
``"mean"`` (the sum divided by ``N``), ``"max"``: each block loads ``BM`` whole rows into
one register tile of ``BN >= N`` columns (``BN`` a power of two; the columns past ``N`` of a
row - the tail - are read as 0 and, with ``MASK``, replaced by the reduction's identity
after the load, so a prologue's value there - ``exp(0 - max) = 1`` - never counts), converts
them to f32, reduces each row (in-thread accumulation, warp shuffles, shared memory across
warps: synthesis chooses) and stores one f32 value per row. The row load and the store are
the fusion points: ``hexlayout.fusion`` computes a prologue (``x ** 2`` of an f16 input cast
to f32) into the loaded tile and an epilogue (``x * rsqrt(mean + eps) * w``: the reduced
column broadcast over the row) into the store. ``fusion`` registers ``row_reduce_anchor``
as the row-reduction anchor record of ``hexlayout.fusion``.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the factory.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32

__all__ = ["row_reduce_kernel", "row_reduce_anchor", "row_reduce_consts", "REDUCE_FNS", "MAX_ROW"]

M, N = hl.dims("M N")

#: The longest row a row-reduction anchor takes (one block holds a row in registers; any
#: length from 1 up, the tail of a power-of-two tile masked); longer rows are not fused.
MAX_ROW = 8192
#: the reductions the anchor computes
REDUCE_FNS = ("sum", "mean", "max")


@cache
def row_reduce_kernel(dtype: DType, fn: str, align_bytes: int = 16) -> Any:
    """``c[M, 1] = fn_j x[M, j]`` (f32 result) for ``x`` of ``dtype`` (see the module docstring)
    whose rows start ``align_bytes``-aligned (16 unless the row length says less)."""
    if fn not in REDUCE_FNS:
        raise ValueError(f"hexlayout row_reduce: fn must be one of {REDUCE_FNS}, not {fn!r}")
    dt = dtype
    op = "max" if fn == "max" else "sum"

    suffix = "" if align_bytes == 16 else f"_a{align_bytes}"

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"row_{fn}_{dt}{suffix}")
    def row_reduce(x: dt[M, N].aligned(align_bytes), c: f32[M, 1], *,  # type: ignore
                   BM: int = 4, BN: int = 64, WARPS: int = 1, MASK: bool = False):
        Mx, Nx = x.shape
        pid = hl.grid(hl.spatial(hl.cdiv(Mx, BM)))
        m0 = pid * BM
        xr = hl.register(dt, (BM, BN))
        hl.copy(hl.view(x, (BM, BN), (m0, 0)), xr)
        xf = hl.cast(xr, f32)
        if MASK:                 # the tail of the row: the reduction's identity
            xf = hl.where(hl.iota((BM, BN), 1) < Nx, xf, float("-inf") if op == "max" else 0.0)
        r = hl.reduce(xf, op, 1)
        if fn == "mean":
            # N as an f32 column (the row length is a runtime size; a power-of-two tile: 1 / BN)
            r = r / hl.cast(hl.iota((BM, 1), 1) + Nx, f32) if MASK else r * (1.0 / BN)
        hl.copy(r, hl.view(c, (BM, 1), (m0, 0)))

    return row_reduce


def row_reduce_anchor(dtype: DType, fn: str, align_bytes: int = 16) -> Any:
    """The anchor kernel for ``dtype``, ``fn`` and the rows' alignment (``hexlayout.fusion``'s
    provider)."""
    return row_reduce_kernel(dtype, fn, align_bytes)



def row_reduce_consts(m: int, n: int) -> dict[str, Any]:
    """Tile constants for ``m`` rows of ``n`` (``1 <= n <= MAX_ROW``): ``BN`` the power of two
    ``>= n`` (at least 32) and ``MASK`` when ``n < BN``, so every row length up to ``BN``
    shares one build; one row a block (a broadcast row such as a norm's weight then has the
    row's layout), one warp per 256 columns, at most 8."""
    if not 1 <= n <= MAX_ROW:
        raise ValueError(f"hexlayout row_reduce: rows of {n} (1 to {MAX_ROW} columns)")
    bn = 32
    while bn < n:
        bn *= 2
    return {"BM": 1, "BN": bn, "WARPS": max(1, min(8, bn // 256)), "MASK": n != bn}
