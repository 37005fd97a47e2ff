"""FP8 (e4m3) fused-MoE kernels in the tile language, layout-free (``hexlayout.ops.moe_fp8``).

Notation: ``x`` ``[T, H]`` activations (f16 / bf16), ``k`` experts per token, routed row
``r = t * k + j`` (token ``t``, choice ``j``), local expert ``e`` of a block of sorted rows.
Weights ``w [E, N, K]`` e4m3 with fp32 scales ``ws``: ``W[e, n, c] = w[e, n, c] * ws[e, n //
128, c // 128]`` (block scales) or ``w[e, n, c] * ws[e, 0, 0]`` (one per expert, stored as
``[E, 1, 1]``).

- ``moe_fp8_quant_kernel(dtype)``: per-row dynamic quantization ``s_r = max_c |x[r, c]| /
  448``, ``q[r, c] = e4m3(x[r, c] / s_r)`` (round to nearest even, saturating; a row of zeros
  has ``s_r = 0`` and ``q = 0``). With ``ROUTER=True`` the row is first multiplied by ``rw[r]``
  (``apply_router_weight_on_input``). Two passes over the row in ``BK``-column chunks: the
  absolute maximum (f32), then the scaled conversion.
- ``moe_fp8_gate_up_kernel(dtype)``: for a block of ``BM`` sorted rows (``sorted_ids``,
  padding ids ``>= T * k``) owned by expert ``e = block_expert[b]`` (``-1``: nothing to do),
  and ``BN`` intermediate columns ``n0 ..``::

      g[r, n] = s_t * sum_c q[t, c] * W[e, n, c]          (gate rows of w13: n < I)
      u[r, n] = s_t * sum_c q[t, c] * W[e, I + n, c]      (up rows)
      h[r, n] = act(g) * u                                (act: SiLU or exact GELU)

  stored in ``dtype`` at row ``r`` of ``h [T * k, I]``. The token rows of ``q`` are gathered
  through ``t = r // k``; e4m3 ``mma.sync.m16n8k32`` with f32 accumulation; block scales
  multiply each ``BK = 128``-column k-tile's partial product by the column's scale before it
  is added (a per-expert scale is applied once in the epilogue, with ``s_t``).
- ``moe_fp8_down_kernel(dtype)``: ``y[r, n] = dtype(tw[r] * s_r * sum_c hq[r, c] * W2[e, n,
  c])`` (``y [T * k, H]``, summed over the k choices by ``moe.run_moe_pipeline``'s ``moe_sum``),
  ``hq`` / ``s_r`` the per-row quantized ``h``; ``tw`` the top-k weights (``ROUTER=False``) or 1
  (``ROUTER=True``: applied to the input).

Split-K (``split=True`` of the two GEMM factories, decode grids smaller than a wave): ``SPLIT_K``
blocks per tile, split ``sp`` over the k-tiles ``[lo, hi)`` of ``moe_splitk._split_range``; the
per-token / per-row scale, the top-k weight and the per-expert or per-k-tile block weight scales
are applied to each split's partial (all linear in it), which is added atomically in f32 into a
zeroed workspace by row ``r`` (gate-up ``[2, T * k, I]``: gate, up; down ``[T * k, N]``); the
activation and the rounding to ``dtype`` are ``moe_splitk``'s kernels.

Targets: sm_89 and sm_90a (``mma.sync`` with e4m3 operands exists from sm_89 on).
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import e4m3, f32, i32

from .blocks import expert_block, gathered_stages, k_tile_range, load_tile, routed_rows, sorted_rows

__all__ = ["moe_fp8_quant_kernel", "moe_fp8_gate_up_kernel", "moe_fp8_down_kernel", "check_down_tiles",
           "scale_down", "FP8_MAX", "SCALE_BLOCK"]

R, K, T, E, N, NB, KB, EM, NBLK, TK, I = hl.dims("R K T E N NB KB EM NBLK TK I")

#: the largest finite e4m3 value: activations are scaled so their row maximum maps to it
FP8_MAX = 448.0
#: the side of a weight scale block (``block=(128, 128)``)
SCALE_BLOCK = 128


@cache
def moe_fp8_quant_kernel(dtype: DType) -> Any:
    """Per-row e4m3 quantization of ``x [R, K]`` (see the module docstring)."""
    dt = dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"moe_fp8_quant_{dt}")
    def moe_fp8_quant(x: dt[R, K], rw: f32[R], q: e4m3[R, K], s: f32[R],  # type: ignore
                      *, ROWS: int = 4, BK: int = 256, WARPS: int = 4, ROUTER: bool = False):
        Rx, Kx = x.shape
        pid = hl.grid(hl.spatial(hl.cdiv(Rx, ROWS)))
        r0 = pid * ROWS
        nk = hl.cdiv(Kx, BK)
        if ROUTER:
            wr = hl.register(f32, (ROWS, 1))
            hl.copy(_col(rw, r0, ROWS), wr)
        amax = hl.zeros((ROWS, 1), f32)
        for kt in hl.range(nk):
            xr = hl.register(dt, (ROWS, BK))
            hl.copy(hl.view(x, (ROWS, BK), (r0, kt * BK)), xr)
            hl.assign(amax, hl.maximum(amax, hl.max_reduce(hl.abs(hl.cast(xr, f32)), 1)))
        if ROUTER:
            amax = amax * hl.abs(wr)
        sc = amax / FP8_MAX
        safe = hl.where(sc.eq(0.0), 1.0, sc)
        for kt in hl.range(nk):
            xr = hl.register(dt, (ROWS, BK))
            hl.copy(hl.view(x, (ROWS, BK), (r0, kt * BK)), xr)
            xf = hl.cast(xr, f32)
            if ROUTER:
                xf = xf * wr
            hl.copy(hl.cast(xf / safe, e4m3), hl.view(q, (ROWS, BK), (r0, kt * BK)))
        hl.copy(sc, _col(s, r0, ROWS))

    return moe_fp8_quant


def _scale(ws: Any, e: Any, col: Any, first: Any, kb: Any, uniform: bool) -> Any:
    """The block scales of the columns ``col`` (a ``(1, BN)`` or ``(BN, 1)`` index tile) at
    k-block ``kb``; ``uniform``: every column is in the block of ``first`` (the tile lies in one
    128-row block of the weights), one ``(1, 1)`` scale."""
    if uniform:
        return load_tile(ws[e, hl.iota((1, 1), 0) + first // SCALE_BLOCK, kb], (1, 1))
    return load_tile(ws[e, col // SCALE_BLOCK, kb], col.shape)


def check_down_tiles(bn: int, bk: int, block_scale: bool) -> None:
    """The down kernels' tiles with block scales: ``BN`` divides and ``BK`` equals ``SCALE_BLOCK``
    (one scale per tile and k-tile)."""
    if block_scale and (SCALE_BLOCK % bn or bk != SCALE_BLOCK):
        raise ValueError(f"moe_fp8_down: with block scales BN ({bn}) must divide and BK ({bk}) equal "
                         f"{SCALE_BLOCK}")


def scale_down(acc: Any, hs: Any, tw: Any, ws: Any, e: Any, rows: Any, col: Any, router: bool,
               block_scale: bool) -> Any:
    """The down GEMM's scaled product ``acc * s_r * tw[r] * ws[e]``: the per-row scales ``hs``
    and top-k weights ``tw`` (1 with ``router``) of the slots ``rows`` (an index tile, -1 for
    padding), broadcast along ``rows``' axis, and the per-expert weight scale broadcast along the
    columns ``col`` (block scales: already in ``acc``, per k-tile)."""
    rs = load_tile(hs[rows], rows.shape)
    if not router:
        rs = rs * load_tile(tw[rows], rows.shape)
    out = acc * rs
    if not block_scale:
        out = out * load_tile(ws[e, col * 0, 0], col.shape)
    return out


def _col(a: Any, r0: Any, rows: int) -> Any:
    """Rows ``r0 .. r0 + rows`` of the 1-d global tensor ``a`` as a ``(rows, 1)`` gathered view."""
    r = hl.iota((rows, 1), 0) + r0
    return a[r]


@cache
def moe_fp8_gate_up_kernel(dtype: DType, split: bool = False) -> Any:
    """The gate-up grouped GEMM with the activation epilogue (see the module docstring).
    Constants: ``BM`` sorted rows, ``BN`` intermediate columns (of gate and of up), ``BK`` (128:
    one scale block per k-tile), ``STAGES``, ``WARPS``, ``TOPK``, ``GELU``, ``BLOCK_SCALE``,
    ``UNIFORM`` (block scales, ``I % BN == 0``: each tile of gate or up columns lies in one
    128-row scale block, so one scale per tile and k-tile), ``SPLIT_K``.

    ``split``: the split-K kernel: ``SPLIT_K`` blocks per tile, split ``sp`` over the k-tiles
    ``moe_splitk._split_range`` gives it; the output is the f32 workspace ``h [2, T * k, I]``
    (zeroed by the launcher) into which the scaled partials ``s_t * sum_{c in split} q[t, c] *
    W[e, n, c]`` (gate, ``h[0]``) and ``... W[e, I + n, c]`` (up, ``h[1]``) are added atomically
    at row ``r`` (the scales are linear: applied to each partial); the activation is
    ``moe_splitk.moe_splitk_act_kernel``'s (``GELU`` unused)."""
    dt = dtype
    h_t = f32[2, TK, I] if split else dt[TK, I]

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"moe_fp8_gate_up_{dt}" + ("_splitk" if split else ""))
    def moe_fp8_gate_up(xq: e4m3[T, K], xs: f32[T], w: e4m3[E, N, K], ws: f32[E, NB, KB],  # type: ignore
                        sorted_ids: i32[EM], block_expert: i32[NBLK], h: h_t,  # type: ignore
                        *, BM: int = 16, BN: int = 64, BK: int = 128, STAGES: int = 2, WARPS: int = 4,
                        TOPK: int = 1, GELU: bool = False, BLOCK_SCALE: bool = False, UNIFORM: bool = False,
                        SPLIT_K: int = 1):
        Tx, Kx = xq.shape
        Ix = h.shape[-1]
        e, m0, n0, sp = expert_block(block_expert, Ix, BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)
            rid = routed_rows(sorted_ids, m0, BM, Tx * TOPK)
            tok = hl.where(rid >= 0, rid // TOPK, -1)
            num_k, k0, ktile = k_tile_range(Kx, BK, SPLIT_K, sp)
            sa, (sg, su), load = gathered_stages(xq, tok, m0, k0, e4m3, BM, BK, STAGES,
                                                 w, e, (n0, Ix + n0), BN)
            acc_g = hl.zeros((BM, BN), f32)
            acc_u = hl.zeros((BM, BN), f32)
            col = hl.iota((1, BN), 1) + n0
            for kt, st in hl.pipeline(num_k, STAGES, load):
                ra = hl.register(e4m3, (BM, BK))
                rg = hl.register(e4m3, (BN, BK))
                ru = hl.register(e4m3, (BN, BK))
                hl.copy(sa[:, :, st], ra)
                hl.copy(sg[:, :, st], rg)
                hl.copy(su[:, :, st], ru)
                if BLOCK_SCALE:
                    pg = hl.zeros((BM, BN), f32)
                    pu = hl.zeros((BM, BN), f32)
                    hl.mma(ra, rg, pg)
                    hl.mma(ra, ru, pu)
                    kb = ktile(kt) * BK // SCALE_BLOCK
                    acc_g += pg * _scale(ws, e, col, n0, kb, UNIFORM)
                    acc_u += pu * _scale(ws, e, col + Ix, n0 + Ix, kb, UNIFORM)
                else:
                    hl.mma(ra, rg, acc_g)
                    hl.mma(ra, ru, acc_u)
            rid2 = hl.register(i32, (BM, 1))
            hl.copy(sorted_ids[hl.iota((BM, 1), 0) + m0], rid2)
            sx = load_tile(xs[hl.where(rid2 < Tx * TOPK, rid2 // TOPK, -1)], (BM, 1))
            if BLOCK_SCALE:
                g = acc_g * sx
                u = acc_u * sx
            else:
                we = load_tile(ws[e, col * 0, 0], (1, BN))
                g = acc_g * sx * we
                u = acc_u * sx * we
            if split:                                    # scaled partials; padding rows: none
                hl.atomic_add(h[0, rid, n0:n0 + BN], g)
                hl.atomic_add(h[1, rid, n0:n0 + BN], u)
            else:
                a = hl.gelu(g) if GELU else hl.silu(g)
                hl.copy(hl.cast(a * u, dt), hl.view(h, (BM, BN), (None, n0), rows=rid))

    return moe_fp8_gate_up


@cache
def moe_fp8_down_kernel(dtype: DType, split: bool = False) -> Any:
    """The down grouped GEMM with the top-k weight epilogue (see the module docstring).
    Constants as ``moe_fp8_gate_up_kernel``'s (``ROUTER``: the weights were applied to the
    input, ``tw`` is not read). ``split``: the split-K kernel, as the gate-up one's: the f32
    partials ``tw[r] * s_r * sum_{c in split} hq[r, c] * W2[e, n, c]`` added atomically into the
    zeroed workspace ``y [T * k, N]`` (rounded to ``dtype`` by ``moe_splitk_cast_kernel``)."""
    y_t = f32[TK, N] if split else dtype[TK, N]

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"moe_fp8_down_{dtype}" + ("_splitk" if split else ""))
    def moe_fp8_down(hq: e4m3[TK, K], hs: f32[TK], w: e4m3[E, N, K], ws: f32[E, NB, KB], tw: f32[TK],
                     sorted_ids: i32[EM], block_expert: i32[NBLK], y: y_t,  # type: ignore
                     *, BM: int = 16, BN: int = 64, BK: int = 128, STAGES: int = 2, WARPS: int = 4,
                     ROUTER: bool = False, BLOCK_SCALE: bool = False, SPLIT_K: int = 1):
        TKx, Kx = hq.shape
        check_down_tiles(BN, BK, BLOCK_SCALE)
        e, m0, n0, sp = expert_block(block_expert, y.shape[1], BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):                             # -1: no block (past the padded total)
            rid = routed_rows(sorted_ids, m0, BM, TKx)
            num_k, k0, ktile = k_tile_range(Kx, BK, SPLIT_K, sp)
            sa, (sb,), load = gathered_stages(hq, rid, m0, k0, e4m3, BM, BK, STAGES, w, e, (n0,), BN)
            acc = hl.zeros((BM, BN), f32)
            col = hl.iota((1, BN), 1) + n0
            for kt, st in hl.pipeline(num_k, STAGES, load):
                ra = hl.register(e4m3, (BM, BK))
                rb = hl.register(e4m3, (BN, BK))
                hl.copy(sa[:, :, st], ra)
                hl.copy(sb[:, :, st], rb)
                if BLOCK_SCALE:
                    p = hl.zeros((BM, BN), f32)
                    hl.mma(ra, rb, p)
                    acc += p * _scale(ws, e, col, n0, ktile(kt) * BK // SCALE_BLOCK, True)   # BN | 128
                else:
                    hl.mma(ra, rb, acc)
            slots = sorted_rows(sorted_ids, m0, BM, TKx)
            out = scale_down(acc, hs, tw, ws, e, slots, col, ROUTER, BLOCK_SCALE)
            if split:                                    # scaled partials; padding rows: none
                hl.atomic_add(hl.view(y, (BM, BN), (None, n0), rows=rid), out)
            else:
                hl.copy(hl.cast(out, dtype), hl.view(y, (BM, BN), (None, n0), rows=rid))

    return moe_fp8_down

