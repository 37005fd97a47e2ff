"""The decode-step kernel of ``hexlayout.ops.selective_state_update`` in the language.

Both Mamba forms run as one general form: ``state [S, H, P, N]``, ``x``, ``dt``, ``z``
``[batch, H, P]``, ``A [H, P, N]``, ``B``, ``C`` ``[batch, G, N]`` (head ``h`` reads group
``h // (H / G)``), ``D``, ``dt_bias`` ``[H, P]`` (Mamba-1 is ``H = G`` heads of ``P = dim / G``
channels). For batch row ``b`` and its state row ``s = state_batch_indices[b]`` (``b`` without
indices; ``s < 0`` skips the row: state untouched, ``y`` left at 0)::

    Δ = softplus(dt + dt_bias)        (dt + dt_bias without dt_softplus; torch's threshold 20)
    state[s, h, p, :] = exp(Δ A[h, p, :]) ⊙ state[s, h, p, :] + Δ x[b, h, p] B[b, g, :]
    y[b, h, p] = C[b, g, :] · state[s, h, p, :] + D[h, p] x[b, h, p]      (· silu(z) with z)

Each thread block holds ``BP`` rows ``p`` of one (batch, head) state in f32 registers
(``NS`` = N padded to a power of two; the padding reads 0), updates them and reduces ``y``
over N; the state is read and written in its own dtype (f16 / bf16 / f32).
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtypes.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

from .selective_scan_kernel import softplus20

__all__ = ["state_update_kernel", "state_update_consts"]

Bt, S, H, P, N, G = hl.dims("Bt S H P N G")
SS, SH, SP = hl.dims("SS SH SP")  # strides of the state
SAH, SAP, SAN = hl.dims("SAH SAP SAN")  # strides of A (0 where a per-head A is broadcast)


@cache
def state_update_kernel(dtype: DType, state_dtype: DType, index_dtype: DType) -> Any:
    """The kernel for inputs of ``dtype``, a state of ``state_dtype`` and state indices of
    ``index_dtype`` (i32 / i64); constants ``BP`` rows per block, ``NS`` (N padded to a power
    of two) and the flags ``SOFTPLUS``, ``HAS_D``, ``HAS_Z``, ``HAS_BIAS``, ``HAS_IDX``."""
    dt, st, it = dtype, state_dtype, index_dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"selective_state_update_{dt}_{st}_{it}")
    def state_update_k(
        state: st[S, H, P, N].strides(SS, SH, SP, 1),  # type: ignore
        x: dt[Bt, H, P],  # type: ignore
        dtv: dt[Bt, H, P],  # type: ignore
        A: f32[H, P, N].strides(SAH, SAP, SAN),
        Bm: dt[Bt, G, N],  # type: ignore
        Cm: dt[Bt, G, N],  # type: ignore
        D: f32[H, P],
        z: dt[Bt, H, P],  # type: ignore
        dt_bias: f32[H, P],
        state_batch_indices: it[Bt],  # type: ignore
        out: dt[Bt, H, P],  # type: ignore
        SAH: i32,
        SAP: i32,
        SAN: i32,
        SS: i32,
        SH: i32,
        SP: i32,
        *,
        BP: int = 32,
        NS: int = 16,
        SOFTPLUS: bool = False,
        HAS_D: bool = False,
        HAS_Z: bool = False,
        HAS_BIAS: bool = False,
        HAS_IDX: bool = False,
        WARPS: int = 4,
    ):
        b, hh, pb = hl.grid(hl.spatial(x.shape[0], x.shape[1], hl.cdiv(x.shape[2], BP)))
        p0 = pb * BP
        g = hh // (x.shape[1] // Bm.shape[1])
        slot = state_batch_indices[b] if HAS_IDX else b
        with hl.if_(slot >= 0):
            sv = hl.view(state, (1, 1, BP, NS), (slot, hh, p0, 0))  # tiles keep the rank: vectors
            sr = hl.register(st, (1, 1, BP, NS))
            hl.copy(sv, sr)
            ar = hl.register(f32, (1, BP, NS))
            hl.copy(hl.view(A, (1, BP, NS), (hh, p0, 0)), ar)
            xr = hl.register(dt, (1, BP))
            hl.copy(hl.view(x, (1, 1, BP), (b, hh, p0))[0], xr)
            dr = hl.register(dt, (1, BP))
            hl.copy(hl.view(dtv, (1, 1, BP), (b, hh, p0))[0], dr)
            br = hl.register(dt, (1, NS))
            hl.copy(hl.view(Bm, (1, 1, NS), (b, g, 0))[0], br)
            cr = hl.register(dt, (1, NS))
            hl.copy(hl.view(Cm, (1, 1, NS), (b, g, 0))[0], cr)
            df = hl.cast(dr, f32)
            if HAS_BIAS:
                bias = hl.register(f32, (1, BP))
                hl.copy(hl.view(dt_bias, (1, BP), (hh, p0)), bias)
                df = df + bias
            if SOFTPLUS:
                df = softplus20(df)
            xf = hl.cast(xr, f32)
            h = hl.exp(df.T * ar) * hl.cast(sr, f32) + (df * xf).T * hl.cast(br, f32)
            hl.copy(hl.cast(h, st), sv)
            y = hl.sum(h * hl.cast(cr, f32), 3)[0, 0].T
            if HAS_D:
                dvec = hl.register(f32, (1, BP))
                hl.copy(hl.view(D, (1, BP), (hh, p0)), dvec)
                y = y + dvec * xf
            if HAS_Z:
                zr = hl.register(dt, (1, BP))
                hl.copy(hl.view(z, (1, 1, BP), (b, hh, p0))[0], zr)
                y = y * hl.silu(hl.cast(zr, f32))
            hl.copy(hl.cast(y, dt), hl.view(out, (1, 1, BP), (b, hh, p0))[0])

    return state_update_k


def state_update_consts(p: int, n: int) -> dict[str, int]:
    """Tile constants for ``p`` rows per head and state size ``n``: ``NS`` the power of two
    ``>= n`` (at least 4), ``BP`` rows per block (``BP · NS <= 1024``, at most 64, at least 4,
    no more than ``p`` rounded up to a power of two unless a warp would then hold fewer than 32
    elements), one warp per 128 state elements (at most 4)."""
    ns = 4
    while ns < n:
        ns *= 2
    bp = max(4, min(64, 1024 // ns))
    pp = 4
    while pp < p:
        pp *= 2
    bp = max(min(bp, pp), 32 // ns)  # at least one element per thread of a warp
    return {"BP": bp, "NS": ns, "WARPS": max(1, min(4, bp * ns // 128))}
