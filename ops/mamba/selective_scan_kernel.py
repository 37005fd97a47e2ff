"""The Mamba-1 selective-scan kernel in the language (``hexlayout.ops.selective_scan``).

For every batch ``b``, group ``g``, channel ``d`` (of the ``DG = dim / G`` channels of group
``g``) and state ``n``, with ``Δ_t = softplus(delta_t + delta_bias)`` (when asked; torch's
softplus, threshold 20)::

    h_t[d, n] = exp(Δ_t[d] · A[d, n]) · h_{t-1}[d, n] + Δ_t[d] · B_t[n] · u_t[d]
    y_t[d]    = Σ_n C_t[n] · h_t[d, n] + D[d] · u_t[d]          out_t = y_t · silu(z_t[d])

Each thread block owns ``BD`` channels of one (batch, group) and keeps their f32 state
``h[BD, NS]`` (``NS`` = N rounded up to a power of two; the padding reads A = B = C = 0, so it
stays 0) in registers. It walks L in chunks of ``CH``: the chunk tiles of u, delta, B, C (and z)
are loaded with coalesced global reads, the per-element work (bias, softplus, ``Δ·u``, the mask
of the steps past L: Δ = 0 there, so ``h`` is left as it is) is done on the whole chunk tile, and
the results go to shared memory; then the recurrence runs sequentially over the chunk's ``CH``
steps (unrolled), each step reading one column of the staged tiles and reducing
``y_t = Σ_n C_t h_t`` over N. The chunk's ``y`` returns through shared memory for the
``D·u`` and ``silu(z)`` epilogue and one coalesced store. The last state is stored when asked.

``INIT``: ``h`` starts from ``init[s]`` (else 0). ``VARLEN``: sequence ``s`` has
``ln[s+1] - ln[s]`` steps starting at position ``cu[s]`` of batch row 0 (else batch row ``s``,
all ``L`` positions); the host lays the sequences out at ``cu[s]``, multiples of ``CH`` (aligned
vectors, and a chunk never reaches the next sequence), so the masked steps past a sequence's
end read and write only its own padding.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

__all__ = ["selective_scan_kernel", "selective_scan_consts", "softplus20", "SOFTPLUS_THRESHOLD"]

Bt, G, DG, L, N, S, S1 = hl.dims("Bt G DG L N S S1")

#: torch's softplus returns x itself above this input
SOFTPLUS_THRESHOLD = 20.0


def softplus20(x: Any) -> Any:
    """torch's ``F.softplus(x)`` (beta 1, threshold 20): ``x`` for ``x > 20``, else ``ln(1 + e^x)``,
    on a register tile."""
    return hl.where(x > SOFTPLUS_THRESHOLD, x, hl.softplus(x))


@cache
def selective_scan_kernel(dtype: DType) -> Any:
    """The selective-scan kernel for inputs of ``dtype`` (f16 / bf16 / f32); constants ``BD``
    channels per block, ``NS`` (the state size padded to a power of two), ``CH`` steps per chunk
    and the flags ``SOFTPLUS``, ``HAS_D``, ``HAS_Z``, ``HAS_BIAS``, ``LAST`` (store the state),
    ``INIT`` (start from ``init``) and ``VARLEN`` (packed sequences, module docstring)."""
    dt = dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"selective_scan_{dt}")
    def selective_scan_k(
        u: dt[Bt, G, DG, L],  # type: ignore
        delta: dt[Bt, G, DG, L],  # type: ignore
        A: f32[G, DG, N],
        Bm: dt[Bt, G, N, L],  # type: ignore
        Cm: dt[Bt, G, N, L],  # type: ignore
        D: f32[G, DG],
        z: dt[Bt, G, DG, L],  # type: ignore
        delta_bias: f32[G, DG],
        out: dt[Bt, G, DG, L],  # type: ignore
        last_state: f32[S, G, DG, N],
        init: f32[S, G, DG, N],
        cu: i32[S1],
        ln: i32[S1],
        *,
        BD: int = 32,
        NS: int = 16,
        CH: int = 16,
        SOFTPLUS: bool = False,
        HAS_D: bool = False,
        HAS_Z: bool = False,
        HAS_BIAS: bool = False,
        LAST: bool = False,
        INIT: bool = False,
        VARLEN: bool = False,
        WARPS: int = 4,
    ):
        s, g, db = hl.grid(hl.spatial(last_state.shape[0], u.shape[1], hl.cdiv(u.shape[2], BD)))
        d0 = db * BD
        if VARLEN:
            b, start = 0, cu[s]
            Lx = ln[s + 1] - ln[s]
        else:
            b, start, Lx = s, 0, u.shape[3]
        ar = hl.register(f32, (BD, NS))
        hl.copy(hl.view(A, (1, BD, NS), (g, d0, 0))[0], ar)
        if HAS_BIAS:
            bias = hl.register(f32, (1, BD))
            hl.copy(hl.view(delta_bias, (1, BD), (g, d0)), bias)
        if HAS_D:
            dvec = hl.register(f32, (1, BD))
            hl.copy(hl.view(D, (1, BD), (g, d0)), dvec)
        h = hl.zeros((BD, NS), f32)
        if INIT:
            hl.copy(hl.view(init, (1, 1, BD, NS), (s, g, d0, 0))[0, 0], h)
        tile = (1, 1, BD, CH)  # chunk tiles keep the tensors' rank: 16-byte vectors along L
        su = hl.shared(f32, tile)  # Δ·u of the chunk
        sd = hl.shared(f32, tile)  # Δ of the chunk (0 past L)
        sb = hl.shared(f32, (1, 1, NS, CH))
        sc = hl.shared(f32, (1, 1, NS, CH))
        sy = hl.shared(f32, tile)  # Σ_n C·h of the chunk
        for c in hl.range(hl.cdiv(Lx, CH)):
            l0 = c * CH
            p0 = start + l0
            ur = hl.register(dt, tile)
            hl.copy(hl.view(u, tile, (b, g, d0, p0)), ur)
            dr = hl.register(dt, tile)
            hl.copy(hl.view(delta, tile, (b, g, d0, p0)), dr)
            br = hl.register(dt, (1, 1, NS, CH))
            hl.copy(hl.view(Bm, (1, 1, NS, CH), (b, g, 0, p0)), br)
            cr = hl.register(dt, (1, 1, NS, CH))
            hl.copy(hl.view(Cm, (1, 1, NS, CH), (b, g, 0, p0)), cr)
            df = hl.cast(dr, f32)
            if HAS_BIAS:
                df = df + bias.T
            if SOFTPLUS:
                df = softplus20(df)
            df = hl.where(hl.iota(tile, 3) + l0 < Lx, df, 0.0)  # steps past L leave h as it is
            uf = hl.cast(ur, f32)
            hl.copy(df * uf, su)
            hl.copy(df, sd)
            hl.copy(hl.cast(br, f32), sb)
            hl.copy(hl.cast(cr, f32), sc)
            hl.syncthreads()
            for t in range(CH):  # the recurrence, sequential along the chunk (unrolled)
                dt_t = hl.register(f32, (BD, 1))
                hl.copy(sd[0, 0, :, t : t + 1], dt_t)
                du_t = hl.register(f32, (BD, 1))
                hl.copy(su[0, 0, :, t : t + 1], du_t)
                b_t = hl.register(f32, (1, NS))
                hl.copy(sb[0, 0, :, t : t + 1].T, b_t)
                c_t = hl.register(f32, (1, NS))
                hl.copy(sc[0, 0, :, t : t + 1].T, c_t)
                hl.assign(h, hl.exp(dt_t * ar) * h + du_t * b_t)
                hl.copy(hl.sum(h * c_t, 1), sy[0, 0, :, t : t + 1])
            hl.syncthreads()
            y = hl.register(f32, tile)
            hl.copy(sy, y)
            if HAS_D:
                y = y + dvec.T * uf
            if HAS_Z:
                zr = hl.register(dt, tile)
                hl.copy(hl.view(z, tile, (b, g, d0, p0)), zr)
                y = y * hl.silu(hl.cast(zr, f32))
            hl.copy(hl.cast(y, dt), hl.view(out, tile, (b, g, d0, p0)))
        if LAST:
            hl.copy(h, hl.view(last_state, (1, 1, BD, NS), (s, g, d0, 0))[0, 0])

    return selective_scan_k


def selective_scan_consts(dg: int, n: int, length: int) -> dict[str, int]:
    """Tile constants for ``dg`` channels per group, state size ``n`` and ``length`` steps:
    ``NS`` the power of two ``>= n`` (at least 4), ``BD`` channels per block so the state takes
    at most 4 f32 registers a thread at N <= 64 (``BD · NS <= 512``, 8 to 32, no more than ``dg``
    rounded up to a power of two), ``CH = 16`` steps per chunk (a 16-step unrolled recurrence: 96
    registers at N = 16 on sm_80, where 32 steps and 64 channels take 195), one warp per 128 state
    elements (at most 4). ``length`` does not change the build (one build serves every L)."""
    ns = 4
    while ns < n:
        ns *= 2
    bd = max(8, min(32, 512 // ns))
    pg = 8
    while pg < dg:
        pg *= 2
    bd = min(bd, pg)
    return {"BD": bd, "NS": ns, "CH": 16, "WARPS": max(1, min(4, bd * ns // 128))}
