"""The Mamba-2 SSD scan kernel in the language (``ssd_scan``'s kernel).

First version: a sequential recurrence, not yet the chunked SSD algorithm. One thread block
owns one sequence ``s``, one head ``h`` (group ``g = h // (H/G)``) and ``BP`` of its ``P``
channels, keeps the ``BP × N`` slice of the state in f32 registers and walks the sequence:

    dt_t = clamp(softplus?(dt[t, h] + dt_bias[h]), lo, hi)
    st   = exp(dt_t · A[h]) · st + (dt_t · x[t, h, :]) ⊗ B[t, g, :]          (BP × N)
    y[t, h, :] = st · C[t, g, :] + D[h, :] ⊙ x[t, h, :]     (then · silu(z[t, h, :]))

from ``st = init[s, h]`` (zeros without initial states); the state at the end of the sequence
is written to ``final[s, h]``. The ``B`` / ``C`` rows of ``CH`` positions are staged in shared
memory (one copy per chunk, broadcast over the block's ``P`` slice). It reads every input once
and is exact in f32 for any chunk size (``ssd_scan``'s ``chunk_size`` does not change it);
the chunked form with tensor-core ``C·Bᵀ`` products is the next step. ``VARLEN``: sequence ``s`` is positions
``cu[s]:cu[s+1]`` of batch row 0, else batch row ``s``; ``N`` is padded to the power of two
``NS`` and ``P`` split in ``BP`` slices (views read the padding as 0, stores skip it).
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

__all__ = ["ssd_scan_kernel"]

NB, L, H, P, G, N, S, S1 = hl.dims("NB L H P G N S S1")
SXB, SXL, SXH, SBB, SBL, SBG = hl.dims("SXB SXL SXH SBB SBL SBG")   # strides of x, B
SCB, SCL, SCG, SZB, SZL, SZH = hl.dims("SCB SCL SCG SZB SZL SZH")   # strides of C, z


def _vec(t: Any, origin: tuple[Any, ...], n: int, column: bool) -> Any:
    """The f32 register vector of ``n`` elements of ``t``'s last mode at ``origin``: shape
    ``(n, 1)`` when ``column``, else ``(1, n)``; elements past the end read 0."""
    rank = len(origin)
    v = hl.view(t, (1,) * (rank - 1) + (n,), origin)[(0,) * (rank - 2)]
    r = hl.register(t.dtype, (n, 1) if column else (1, n))
    hl.copy(v.T if column else v, r)
    return hl.cast(r, f32)


def _dt(dt: Any, dt_bias: Any, lim: Any, b: Any, t: Any, h: Any, softplus: bool, clamp: bool) -> Any:
    """The (1, 1) step ``clamp(softplus?(dt[b, t, h] + dt_bias[h]), lim[0], lim[1])``."""
    v = _vec(dt, (b, t, h), 1, False) + _vec(dt_bias, (0, h), 1, False)
    if softplus:
        v = hl.softplus(v)
    if clamp:
        v = hl.minimum(hl.maximum(v, _vec(lim, (0, 0), 1, False)), _vec(lim, (0, 1), 1, False))
    return v


def _row(sm: Any, j: Any, ns: int) -> Any:
    """Row ``j`` of the shared ``(CH, ns)`` chunk as an f32 ``(1, ns)`` register row."""
    r = hl.register(sm.dtype, (1, ns))
    hl.copy(sm.tile((1, ns), (j, 0)), r)
    return hl.cast(r, f32)


def _step(x: Any, dt: Any, dt_bias: Any, lim: Any, z: Any, y: Any, st: Any, sb: Any, sc: Any, a_h: Any,
          d_p: Any, at: tuple[Any, ...], j: Any, flags: tuple[bool, bool, bool], n_state: Any) -> None:
    """One position ``at = (b, pos, h, p0)``: the state update and ``y[b, pos, h, p0:p0+BP]``
    (``B`` / ``C`` rows from row ``j`` of the shared chunks; ``n_state`` = N, the columns of
    the ``NS``-wide state that are not padding; ``flags`` = SOFTPLUS, CLAMP, HAS_Z)."""
    b, pos, h, p0 = at
    bp, ns = st.shape
    dtv = _dt(dt, dt_bias, lim, b, pos, h, flags[0], flags[1])
    xt = _vec(x, at, bp, True)
    hl.assign(st, hl.exp(dtv * a_h) * st + (dtv * xt) * _row(sb, j, ns))
    prod = hl.where(hl.iota((bp, ns), 1) < n_state, st * _row(sc, j, ns), 0.0)   # N's padding: 0
    yt = hl.sum(prod, 1) + d_p * xt
    if flags[2]:
        yt = yt * hl.silu(_vec(z, at, bp, True))
    hl.copy(hl.cast(yt, y.dtype), hl.view(y, (1, 1, 1, bp), at)[0, 0].T)


@cache
def ssd_scan_kernel(dtype: DType) -> Any:
    """The scan for ``dtype`` (f16 / bf16 ``x``, ``B``, ``C``, ``z``, ``y``; f32 ``dt``, ``A``,
    ``D``, ``dt_bias`` and states). Constants: ``BP``, ``NS`` (see the module docstring),
    ``SOFTPLUS``, ``CLAMP`` (apply ``dt_limit``), ``HAS_Z``, ``VARLEN``, ``FINAL``."""
    dt_ = dtype

    @hl.kernel(threads=128, name=f"ssd_scan_{dt_}")
    def ssd_scan_k(x: dt_[NB, L, H, P].strides(SXB, SXL, SXH, 1), dt: f32[NB, L, H], A: f32[1, H],  # type: ignore
                   B: dt_[NB, L, G, N].strides(SBB, SBL, SBG, 1),  # type: ignore
                   C: dt_[NB, L, G, N].strides(SCB, SCL, SCG, 1), D: f32[H, P],  # type: ignore
                   z: dt_[NB, L, H, P].strides(SZB, SZL, SZH, 1), dt_bias: f32[1, H],  # type: ignore
                   lim: f32[1, 2], init: f32[S, H, P, N], final: f32[S, H, P, N],  # type: ignore
                   y: dt_[NB, L, H, P], cu: i32[S1], SXB: i32, SXL: i32, SXH: i32, SBB: i32, SBL: i32,
                   SBG: i32, SCB: i32, SCL: i32, SCG: i32, SZB: i32, SZL: i32, SZH: i32,
                   *, BP: int = 64, NS: int = 128, CH: int = 16,  # type: ignore
                   SOFTPLUS: bool = False, CLAMP: bool = False, HAS_Z: bool = False, VARLEN: bool = False,
                   FINAL: bool = False):
        s, h, pb = hl.grid(hl.spatial(init.shape[0], x.shape[2], hl.cdiv(x.shape[3], BP)))
        p0 = pb * BP
        g = h // (x.shape[2] // B.shape[2])
        if VARLEN:
            b, start = 0, cu[s]
            n = cu[s + 1] - start
        else:
            b, start, n = s, 0, x.shape[1]
        st = hl.register(f32, (BP, NS))
        hl.copy(hl.view(init, (1, 1, BP, NS), (s, h, p0, 0))[0, 0], st)
        a_h = _vec(A, (0, h), 1, False)
        d_p = _vec(D, (h, p0), BP, True)
        sb, sc = hl.shared(dt_, (CH, NS)), hl.shared(dt_, (CH, NS))
        for c in hl.range(hl.cdiv(n, CH)):
            c0 = start + c * CH
            hl.syncthreads()           # every thread is done with the previous chunk's rows
            hl.copy(hl.view(B, (1, CH, 1, NS), (b, c0, g, 0))[0, :, 0, :], sb)
            hl.copy(hl.view(C, (1, CH, 1, NS), (b, c0, g, 0))[0, :, 0, :], sc)
            hl.commit_group()
            hl.wait_group(0)
            hl.syncthreads()
            for j in hl.range(hl.minimum(CH, n - c * CH)):
                _step(x, dt, dt_bias, lim, z, y, st, sb, sc, a_h, d_p, (b, c0 + j, h, p0), j,
                      (SOFTPLUS, CLAMP, HAS_Z), B.shape[3])
        if FINAL:
            hl.copy(st, hl.view(final, (1, 1, BP, NS), (s, h, p0, 0))[0, 0])

    return ssd_scan_k
