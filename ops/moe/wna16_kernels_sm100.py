"""W4A16 / W8A16 fused-MoE grouped GEMMs for sm_100a: the dequantized weights fed to
``tcgen05.mma`` from tensor memory, the accumulators in tensor memory (``hexlayout.ops.moe.wna16``
dispatches here on compute capability 10.0 and under ``HEXLAYOUT_EMULATE_ARCH=sm_100a``).

The same products, arguments, configs and split-K forms as ``moe_wna16_kernels_sm90`` (see its
docstring: swap-AB, a block computes the transposed tile ``out^T = W^T X^T`` of ``BN = 64``
output columns by ``BM`` sorted rows, 16 / 32 / 64), and the same source shape: each k-tile's
``(BN, BK)`` weight tile is

- copied from the offline ``q`` in logical coordinates and dequantized in registers by
  ``moe_wna16_kernels._dequant`` (the storage order of ``q`` is the one synthesis derives from the
  register fragment the tile is dequantized in, ``hl.offline``),
- multiplied by ``hl.mma`` on that register tile (A = weights, B = the gathered activation rows,
  K-major in shared memory). tcgen05.mma reads A from shared or tensor memory only; synthesis
  (``hexlayout.synth.umma_choice``: ``a_source_costs``) feeds it through tensor memory: every
  warp writes its registers into the op's A columns with one ``tcgen05.st.16x64b`` (one weight
  row per thread, so one scale and zero point per group; BK 64: ``.x16``, 32 columns; BK 32:
  ``.x8``), then ``tcgen05.wait::st``, a fenced barrier and the
  ``tcgen05.mma`` M64 x N``BM`` ``_TS`` issues (``hexlayout.ir.lower.umma``). Staging through
  shared memory would take 4 (BK 64) ``st.shared.v4`` per thread and their addresses, a
  ``fence.proxy.async`` and a ``(BN, BK, STAGES)`` shared ring per weight tile; both need the
  barrier. The accumulators are read back with ``tcgen05.ld`` after the loop.

The loop is ``blocks.wgmma_pipeline``'s sm_100a form, unrolled by 2: each k-tile's MMAs release
its activation stage themselves (a ``tcgen05.commit`` onto the stage's mbarrier, no wait for the
MMAs in the loop); k-tile ``k``'s MMAs stay in flight while k-tiles ``k + 1`` and ``k + 2`` are
dequantized. The refill at k-tile ``k`` of ``k - 2``'s stage waits on that stage's barrier, which
also retires the MMAs that read the A columns of ``k``'s unrolled copy (``k - 2``'s) before
``k``'s tensor-memory store rewrites them.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32, u4, u8

from .blocks import block_rows, expert_block, gathered_stages, k_tile_range, load_tile, wgmma_pipeline
from .wna16_kernels_sm80 import PER_CHANNEL, _dequant, scale_type
from .wna16_kernels_sm90 import SM90_STAGES, _channel_scales

__all__ = ["moe_wna16_gate_up_sm100_kernel", "moe_wna16_down_sm100_kernel", "SM100_STAGES"]

#: activation and weight stages (``(BM + BN) x BK`` elements each), activations loaded 2
#: k-tiles ahead, as on sm_90a
SM100_STAGES = SM90_STAGES

T, H, E, EN, N, G, EM, NB, TK, I, KD, KP = hl.dims("T H E EN N G EM NB TK I KD KP")


@cache
def moe_wna16_gate_up_sm100_kernel(dtype: DType, bits: int, bk: int = 64, split: bool = False,
                                   wtype: DType | None = None) -> Any:
    """Gate-up with the activation epilogue (``moe_wna16_gate_up_sm90_kernel``'s product and
    constants, ``WG`` 1), the dequantized weights the register A of tcgen05.mma::

        g^T[n, p] = sum_c W13[e, c, n] * x[t, c],   u^T[n, p] = sum_c W13[e, c, I + n] * x[t, c]
        h[p, n] = act(w_r * g^T[n, p]) * (w_r * u^T[n, p])"""
    dt = dtype
    wt = wtype or (u4 if bits == 4 else u8)
    wname = "fp4" if wt.name == "e2m1" else bits
    h_t = f32[2, EM, I] if split else dt[EM, I]
    st_t = scale_type(dt, wt)
    name = f"moe_wna16_gate_up_sm100_{dt}_w{wname}_k{bk}" + ("_splitk" if split else "")

    @hl.kernel(threads=lambda c: 128 * c["WG"], name=name)
    def moe_wna16_gate_up_sm100(
        x: dt[T, H],
        q: hl.offline(wt[EN, KP]),
        s: hl.offline(st_t[EN, G]),  # type: ignore
        z: hl.offline(u8[EN, G]),
        sorted_ids: i32[EM],
        block_expert: i32[NB],
        tw: f32[TK],
        h: h_t,  # type: ignore
        *,
        BM: int = 16,
        BK: int = bk,
        STAGES: int = SM100_STAGES,
        WG: int = 1,
        GROUP: int = 128,
        ZERO: int = 0,
        TOPK: int = 1,
        GELU: bool = False,
        ROUTER: bool = False,
        SPLIT_K: int = 1,
    ):
        BN = 64 * WG
        Tx, Hx = x.shape
        Ix = h.shape[-1]
        e, m0, n0, sp = expert_block(block_expert, Ix, BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):  # -1: no block (past the padded total)
            rid, rrow = block_rows(sorted_ids, m0, BM, Tx * TOPK)
            tok = hl.where(rid >= 0, rid // TOPK, -1)
            half = (Ix + BN - 1) // BN * BN  # offline rows per expert: gate, then up, each padded to BN
            num_k, k0, ktile = k_tile_range(Hx, BK, SPLIT_K, sp)
            sa, _, load = gathered_stages(x, tok, m0, k0, dt, BM, BK, STAGES)  # token rows, K-major: B
            acc_g = hl.zeros((BN, BM), f32)
            acc_u = hl.zeros((BN, BM), f32)

            def step(kt: Any, st: Any, _slot: int) -> None:
                c0 = ktile(kt) * BK
                sc = GROUP < PER_CHANNEL
                wg = _dequant(q, s, z, e * 2 * half + n0, c0, BN, BK, GROUP, ZERO, dt, bits, sc)
                wu = _dequant(q, s, z, (2 * e + 1) * half + n0, c0, BN, BK, GROUP, ZERO, dt, bits, sc)
                hl.wgmma_fence()
                hl.mma(wg, sa[:, :, st], acc_g, warps=hl.spatial(WG, 1))  # A from registers
                hl.mma(wu, sa[:, :, st], acc_u, warps=hl.spatial(WG, 1))
                # left in flight while the next k-tile is dequantized; they release the stage

            wgmma_pipeline(name, num_k, STAGES, load, step, arch="sm_100a")
            g, u = acc_g, acc_u
            if GROUP >= PER_CHANNEL:  # per-channel scales, once after the k loop
                g = g * _channel_scales(s, e * 2 * half + n0, BN, dt)
                u = u * _channel_scales(s, (2 * e + 1) * half + n0, BN, dt)
            if ROUTER:
                wr = load_tile(tw[rrow], (1, BM))
                g, u = g * wr, u * wr
            if split:  # f32 partials at the sorted position; padding rows add nothing
                pos = hl.where(rrow >= 0, hl.iota((1, BM), 1) + m0, -1)
                col = hl.iota((BN, 1), 0) + n0
                hl.atomic_add(h[0, pos, col], g)
                hl.atomic_add(h[1, pos, col], u)
            else:
                a = hl.gelu(g) if GELU else hl.silu(g)
                hl.copy(hl.cast(a * u, dt), hl.view(h, (BM, BN), (m0, n0)).T)  # row = sorted position

    return moe_wna16_gate_up_sm100


@cache
def moe_wna16_down_sm100_kernel(dtype: DType, bits: int, bk: int = 64, split: bool = False,
                                wtype: DType | None = None) -> Any:
    """Down with the top-k weight epilogue (``moe_wna16_down_sm90_kernel``'s product and
    constants, ``WG`` 1), the dequantized weights the register A of tcgen05.mma::

        y[r, n] = tw[r] * sum_c W2[e, c, n] * h[p, c]"""
    dt = dtype
    wt = wtype or (u4 if bits == 4 else u8)
    wname = "fp4" if wt.name == "e2m1" else bits
    y_t = f32[TK, H] if split else dt[TK, H]
    st_t = scale_type(dt, wt)
    name = f"moe_wna16_down_sm100_{dt}_w{wname}_k{bk}" + ("_splitk" if split else "")

    @hl.kernel(threads=lambda c: 128 * c["WG"], name=name)
    def moe_wna16_down_sm100(
        h: dt[EM, KD],
        q: hl.offline(wt[EN, KP]),
        s: hl.offline(st_t[EN, G]),  # type: ignore
        z: hl.offline(u8[EN, G]),
        sorted_ids: i32[EM],
        block_expert: i32[NB],
        tw: f32[TK],
        y: y_t,  # type: ignore
        *,
        BM: int = 16,
        BK: int = bk,
        STAGES: int = SM100_STAGES,
        WG: int = 1,
        GROUP: int = 128,
        ZERO: int = 0,
        ROUTER: bool = False,
        SPLIT_K: int = 1,
    ):
        BN = 64 * WG
        TKx, Hx = y.shape
        e, m0, n0, sp = expert_block(block_expert, Hx, BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):  # -1: no block (past the padded total)
            rid, rrow = block_rows(sorted_ids, m0, BM, TKx)
            num_k, k0, ktile = k_tile_range(h.shape[1], BK, SPLIT_K, sp)
            sa, _, load = gathered_stages(h, None, m0, k0, dt, BM, BK, STAGES)  # rows of h, K-major: B
            acc = hl.zeros((BN, BM), f32)

            row0 = e * ((Hx + BN - 1) // BN * BN) + n0  # offline rows per expert: H padded to BN

            def step(kt: Any, st: Any, _slot: int) -> None:
                sc = GROUP < PER_CHANNEL
                w = _dequant(q, s, z, row0, ktile(kt) * BK, BN, BK, GROUP, ZERO, dt, bits, sc)
                hl.wgmma_fence()
                hl.mma(w, sa[:, :, st], acc, warps=hl.spatial(WG, 1))  # A from registers
                # left in flight while the next k-tile is dequantized; they release the stage

            wgmma_pipeline(name, num_k, STAGES, load, step, arch="sm_100a")
            if GROUP >= PER_CHANNEL:  # per-channel scales, once after the k loop
                acc = acc * _channel_scales(s, row0, BN, dt)
            out = acc if ROUTER else acc * load_tile(tw[rrow], (1, BM))
            if split:  # f32 partials to the token slots; padding rows add nothing
                hl.atomic_add(y[rrow, hl.iota((BN, 1), 0) + n0], out)
            else:
                hl.copy(hl.cast(out, dt), hl.view(y, (BM, BN), (None, n0), rows=rid).T)  # to the token slots

    return moe_wna16_down_sm100
