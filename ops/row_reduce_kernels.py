"""Row reductions in the tile language: the reduction anchors of post-scheduling fusion.

``c[M, 1] = reduce_j x[M, j]`` over the last mode (``j < N``) for ``fn`` in ``"sum"``,
``"mean"`` (the sum times ``1 / N``), ``"max"``: each block loads ``BM`` whole rows
(``BN = N`` columns, one register tile), converts them to f32, reduces each row (in-thread
accumulation, warp shuffles, shared memory across warps: synthesis chooses) and stores one
f32 value per row. The row load and the store are the fusion points: ``hexlayout.fusion``
computes a prologue (``x ** 2`` of an f16 input cast to f32) into the loaded tile and an
epilogue (``x * rsqrt(mean + eps) * w``: the reduced column broadcast over the row) into the
store. Importing this module registers ``row_reduce_anchor`` with ``hexlayout.fusion``.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the factory.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32

__all__ = ["row_reduce_kernel", "row_reduce_anchor", "row_reduce_consts", "REDUCE_FNS"]

M, N = hl.dims("M N")

#: the reductions the anchor computes
REDUCE_FNS = ("sum", "mean", "max")


@cache
def row_reduce_kernel(dtype: DType, fn: str) -> Any:
    """``c[M, 1] = fn_j x[M, j]`` (f32 result) for ``x`` of ``dtype`` (see the module docstring)."""
    if fn not in REDUCE_FNS:
        raise ValueError(f"hexlayout row_reduce: fn must be one of {REDUCE_FNS}, not {fn!r}")
    dt = dtype
    op = "max" if fn == "max" else "sum"

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"row_{fn}_{dt}")
    def row_reduce(x: dt[M, N], c: f32[M, 1], *, BM: int = 4, BN: int = 64, WARPS: int = 1):  # type: ignore
        Mx = x.shape[0]
        pid = hl.grid(hl.spatial(hl.cdiv(Mx, BM)))
        m0 = pid * BM
        xr = hl.register(dt, (BM, BN))
        hl.copy(hl.view(x, (BM, BN), (m0, 0)), xr)
        r = hl.reduce(hl.cast(xr, f32), op, 1)
        if fn == "mean":
            r = r * (1.0 / BN)
        hl.copy(r, hl.view(c, (BM, 1), (m0, 0)))

    return row_reduce


def row_reduce_anchor(dtype: DType, fn: str) -> Any:
    """The anchor kernel for ``dtype`` and ``fn`` (``hexlayout.fusion``'s provider)."""
    return row_reduce_kernel(dtype, fn)


def row_reduce_consts(m: int, n: int) -> dict[str, Any]:
    """Tile constants for ``m`` rows of ``n`` (``n``: a power of two, 32 to 1024): ``BN = n``,
    one row a block (a broadcast row such as a norm's weight then has the row's layout), one
    warp per 256 columns."""
    return {"BM": 1, "BN": n, "WARPS": max(1, min(4, n // 256))}


def _register() -> None:
    from hexlayout.fusion.anchors import register_reduction

    register_reduction(row_reduce_anchor, row_reduce_consts)


_register()
