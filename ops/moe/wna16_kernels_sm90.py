"""W4A16 / W8A16 fused-MoE grouped GEMMs for sm_90a: ``wgmma`` with swapped operands and the
dequantized weights as its register A operand (``hexlayout.ops.moe_wna16`` dispatches here on
sm_90a).

The same products, arguments and weight layout as ``moe_wna16_kernels``' gate-up and down kernels
(see its docstring: ``W[e, c, n] = (q[e * NP + n, c] - z[e, c // GROUP, n]) * s[e, c //
GROUP, n]``, ``z = ZERO`` for GPTQ). Swap-AB: a block computes the transposed tile ``out^T = W^T X^T``
of ``BN = 64 * WG`` output columns (64 per consumer warp group, ``WG`` 1 or 2) by ``BM`` sorted
rows (16, 32, 64 or 128: the wgmma N side, so a decode step with a few rows per expert wastes no
MMA rows):

- A: each k-tile of ``W^T`` (``BN x BK``) is copied from the offline ``q`` in logical
  coordinates, unpacked and dequantized in registers by ``moe_wna16_kernels._dequant`` (the
  storage order synthesis derives from the wgmma register-A fragment: one contiguous 16-byte run
  per thread and tile) and fed to ``wgmma.mma_async`` m64nBMk16 as its register A operand, so
  the accumulator rows are the output columns in order; the dequantized weights never touch
  shared memory;
- B: the ``BM`` gathered activation rows of the k-tile (K-major in shared memory), copied by
  cp.async ``STAGES - 2`` k-tiles ahead; cp.async writes through the generic proxy and wgmma
  reads through the async proxy, hence ``fence_proxy_async`` before the barrier that precedes
  each k-tile's wgmma group.

The main loop (``blocks.wgmma_pipeline``) never waits for the k-tile it just issued: k-tile
``k``'s wgmma group stays in flight (``wgmma.wait_group 1``) while k-tile ``k + 1``'s weights are
loaded and dequantized. The activation ring holds ``STAGES`` (4) steps of ``sm90_steps(BM)``
k-tiles (4 for decode: one cp.async wait, proxy fence and barrier per 4 k-tiles; 1 otherwise),
loaded 2 steps ahead: the step refilled at ``p`` is ``p - 2``'s, whose wgmma groups the wait
before that barrier retired in every thread. The loop is unrolled by 4 k-tiles (``sm90_unroll``:
decode one step, its buffers at one offset per iteration; otherwise the whole ring, every shared
address and wgmma descriptor a constant of its slot), and each unrolled k-tile dequantizes into its
own register A tiles, rewritten only after the wait that retired the wgmma reading them; the
k-tiles past the last whole iteration are traced once more after the loop. A group's scales (and AWQ's zero
points) are loaded once per group (``_new_group``: the slots that start one; a split starts on a
whole iteration). The decode down kernel takes ``column_tiles(BM)`` (2) tiles of 64 output columns
per block, as sm_80's: one activation stage and its synchronization serve twice the weights. The
accumulators are touched by wgmma alone until the loop ends.

Split-K (``split=True``, decode): as ``moe_wna16_kernels``' split forms (whole k-tiles of split
``sp``, f32 partials added atomically into the zeroed workspace ``h [2, EM, I]`` / ``y [T * k,
H]``; activation and rounding by ``moe_splitk``'s kernels).

Configs (``wna16_sm90_config`` in ``moe_wna16``, chosen by ``T * k / E``): decode ``BM = 16``,
medium ``BM = 32``, many tokens per expert ``BM = 64``, all on one consumer warp group (``WG =
1``: the prepared weights' offline layout is the one of a 64-row tile; two warp groups would
copy 128-row tiles, another storage order). The large-token config stays swap-AB rather than
putting the tokens on the wgmma M side: wgmma's B operand must come from shared memory, so
tokens-as-M would stage every dequantized weight tile registers -> shared -> wgmma (a shared
store, a barrier and a proxy fence per k-tile, and the weights in shared memory), whereas with
swap-AB the weights stay in registers and only the activations (read once per block) live in
shared memory; a wider N side (64 tokens) and two warp groups (each activation tile read by 128
weight columns) give the large-token case its reuse.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32, u4, u8

from .blocks import block_rows, expert_block, gathered_stages, k_tile_range, load_tile, wgmma_pipeline
from .wna16_kernels_sm80 import PER_CHANNEL, _dequant_tile, _group_params, column_tiles, scale_type

__all__ = ["moe_wna16_gate_up_sm90_kernel", "moe_wna16_down_sm90_kernel", "SM90_STAGES"]

#: activation stages (``BM x BK`` each, 2-8 KiB), loaded 2 k-tiles ahead: one more stage than
#: the loads ahead stays free for the wgmma group in flight
SM90_STAGES = 4

T, H, E, EN, N, G, EM, NB, TK, I, KD, KP = hl.dims("T H E EN N G EM NB TK I KD KP")


def sm90_steps(BM: int) -> int:
    """k-tiles per stage of the activation ring (``wgmma_pipeline``'s ``ku``): 4 for decode
    (``BM <= 16``: one cp.async wait, proxy fence and barrier per iteration of 4 k-tiles;
    ``SM90_STAGES`` steps of ``BM x 4 BK``, 32 KiB), else 1 (the stages of ``BM`` 64 rows stay
    32 KiB, every buffer index of the unrolled loop a constant of its slot)."""
    return 4 if BM <= 16 else 1


def sm90_unroll(BM: int, stages: int = SM90_STAGES) -> int:
    """k-tiles per iteration of the k loop (``wgmma_pipeline``'s ``unroll``): 4 (decode: one
    step of the ring, its buffers at one offset per iteration; else the whole ring of
    ``SM90_STAGES`` single k-tiles). ``stages`` is kept for the signature."""
    return 4


def _new_group(slot: int, BK: int, GROUP: int) -> bool:
    """Whether the k-tile traced in ``slot`` of ``wgmma_pipeline``'s ``sm90_unroll`` unrolled
    k-tiles loads its group's scales and zeros: slot 0 always (a tail k-tile past the loop is
    traced in its slot too, nested in the previous one's branch), then each slot that starts a
    group (``slot * BK`` a multiple of ``GROUP``: ``BK`` and ``GROUP`` powers of two, and every
    iteration starts on a multiple of ``sm90_unroll`` k-tiles, a split too: ``k_tile_range``'s
    ``unit``); the other slots share the previous slot's."""
    return slot == 0 or (slot * BK) % GROUP == 0


def _channel_scales(s: Any, row0: Any, BN: int, dt: DType) -> Any:
    """Per-channel scales ``s[row0 .., 0]`` (offline rows ``row0 ..``, one group over K) as a
    ``(BN, 1)`` f32 column, by which the accumulator of unscaled ``q - z`` is multiplied after
    the k loop."""
    st = hl.register(dt, (BN, 1))
    hl.copy(hl.view(s, (BN, 1), (row0, 0)), st)
    return hl.cast(st, f32)


@cache
def moe_wna16_gate_up_sm90_kernel(dtype: DType, bits: int, bk: int = 64, split: bool = False,
                                  wtype: DType | None = None) -> Any:
    """Gate-up with the activation epilogue, swap-AB wgmma: for the block's ``BN``
    intermediate columns ``n`` and sorted rows ``p`` (routed row ``r``, token ``t = r // TOPK``)::

        g^T[n, p] = sum_c W13[e, c, n] * x[t, c],   u^T[n, p] = sum_c W13[e, c, I + n] * x[t, c]
        h[p, n] = act(w_r * g^T[n, p]) * (w_r * u^T[n, p])

    (``w_r = tw[r]`` with ``ROUTER`` (``apply_router_weight_on_input``: scaling the products
    equals scaling ``x[t]``), else 1; ``act`` SiLU or exact erf GELU), stored in ``dtype``.
    Constants: ``BM``, ``BK``, ``STAGES``, ``WG`` (``BN = 64 * WG``), ``GROUP``, ``ZERO``,
    ``TOPK``, ``GELU``, ``ROUTER``, ``SPLIT_K``. ``split``: the split-K form, ``w_r * g^T`` /
    ``w_r * u^T`` of split ``sp``'s k-tiles added into the f32 workspace ``h [2, EM, I]`` (row =
    sorted position; ``GELU`` unused)."""
    dt = dtype
    wt = wtype or (u4 if bits == 4 else u8)  # the weights' element type (e2m1: MXFP4)
    wname = "fp4" if wt.name == "e2m1" else bits
    h_t = f32[2, EM, I] if split else dt[EM, I]
    st_t = scale_type(dt, wt)
    name = f"moe_wna16_gate_up_sm90_{dt}_w{wname}_k{bk}" + ("_splitk" if split else "")

    @hl.kernel(threads=lambda c: 128 * c["WG"], name=name)
    def moe_wna16_gate_up_sm90(
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
        STAGES: int = SM90_STAGES,
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
            num_k, k0, ktile = k_tile_range(Hx, BK, SPLIT_K, sp, sm90_unroll(BM, STAGES))  # whole iterations
            ku = sm90_steps(BM)
            sa, _, load = gathered_stages(x, tok, m0, k0, dt, BM, BK, STAGES * ku)  # token rows, K-major: B
            acc_g = hl.zeros((BN, BM), f32)
            acc_u = hl.zeros((BN, BM), f32)
            sc = GROUP < PER_CHANNEL
            params: dict[str, Any] = {}

            def step(kt: Any, st: Any, slot: int) -> None:
                c0 = ktile(kt) * BK  # a consumed tile: inside the split (no clamp past K)
                if _new_group(slot, BK, GROUP):  # a group's scales and zeros: once per group
                    params["g"] = _group_params(s, z, e * 2 * half + n0, c0, BN, GROUP, ZERO, dt, sc)
                    params["u"] = _group_params(s, z, (2 * e + 1) * half + n0, c0, BN, GROUP, ZERO, dt, sc)
                wg = _dequant_tile(q, e * 2 * half + n0, c0, BN, BK, dt, bits, *params["g"])
                wu = _dequant_tile(q, (2 * e + 1) * half + n0, c0, BN, BK, dt, bits, *params["u"])
                hl.wgmma_fence()
                hl.mma(wg, sa[:, :, st], acc_g, warps=hl.spatial(WG, 1))  # A from registers
                hl.mma(wu, sa[:, :, st], acc_u, warps=hl.spatial(WG, 1))
                hl.wgmma_commit()  # left in flight while the next k-tile is dequantized

            wgmma_pipeline(name, num_k, STAGES, load, step, unroll=sm90_unroll(BM, STAGES), ku=ku)
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

    return moe_wna16_gate_up_sm90


@cache
def moe_wna16_down_sm90_kernel(dtype: DType, bits: int, bk: int = 64, split: bool = False,
                               wtype: DType | None = None) -> Any:
    """Down with the top-k weight epilogue, swap-AB wgmma: for the block's ``BN`` output
    columns ``n`` and sorted rows ``p`` (routed row ``r``)::

        y[r, n] = tw[r] * sum_c W2[e, c, n] * h[p, c]

    (without ``tw`` when ``ROUTER``), stored in ``dtype`` to the token slot ``r`` (``y [T * k,
    H]``; ``moe_sum`` adds the k slots). Constants as the gate-up kernel's but ``TOPK`` and
    ``GELU``, and ``SPLIT_K``. ``split``: the split-K form, split ``sp``'s partials of ``y[r, n]``
    added into the f32 workspace ``y``."""
    dt = dtype
    wt = wtype or (u4 if bits == 4 else u8)  # the weights' element type (e2m1: MXFP4)
    wname = "fp4" if wt.name == "e2m1" else bits
    y_t = f32[TK, H] if split else dt[TK, H]
    st_t = scale_type(dt, wt)
    name = f"moe_wna16_down_sm90_{dt}_w{wname}_k{bk}" + ("_splitk" if split else "")

    @hl.kernel(threads=lambda c: 128 * c["WG"], name=name)
    def moe_wna16_down_sm90(
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
        STAGES: int = SM90_STAGES,
        WG: int = 1,
        GROUP: int = 128,
        ZERO: int = 0,
        ROUTER: bool = False,
        SPLIT_K: int = 1,
    ):
        BN = 64 * WG
        TKx, Hx = y.shape
        nt = column_tiles(BM)
        e, m0, n0, sp = expert_block(block_expert, Hx, BM, nt * BN, split, SPLIT_K)
        sc = GROUP < PER_CHANNEL  # group scales in the loop (else per channel, after it)
        with hl.if_(e >= 0):  # -1: no block (past the padded total)
            rid, rrow = block_rows(sorted_ids, m0, BM, TKx)
            num_k, k0, ktile = k_tile_range(h.shape[1], BK, SPLIT_K, sp, sm90_unroll(BM, STAGES))
            ku = sm90_steps(BM)
            sa, _, load = gathered_stages(h, None, m0, k0, dt, BM, BK, STAGES * ku)  # rows of h, K-major: B
            accs = [hl.zeros((BN, BM), f32) for _ in range(nt)]
            np_ = (Hx + BN - 1) // BN * BN  # offline rows per expert: H padded to BN
            # column tile j's offline rows; one past the expert's padded rows (its columns are past
            # H: nothing stored, scales read as 0) re-reads the expert's last tile
            rows0 = [e * np_ + n0 + (hl.minimum(j * BN, np_ - BN - n0) if j else 0) for j in range(nt)]
            params: list[Any] = []

            def step(kt: Any, st: Any, slot: int) -> None:
                c0 = ktile(kt) * BK
                if _new_group(slot, BK, GROUP):  # a group's scales and zeros: once per group
                    params[:] = [_group_params(s, z, r, c0, BN, GROUP, ZERO, dt, sc) for r in rows0]
                ws = [_dequant_tile(q, rows0[j], c0, BN, BK, dt, bits, *params[j]) for j in range(nt)]
                hl.wgmma_fence()
                for w, acc in zip(ws, accs):
                    hl.mma(w, sa[:, :, st], acc, warps=hl.spatial(WG, 1))  # A from registers
                hl.wgmma_commit()  # left in flight while the next k-tile is dequantized

            wgmma_pipeline(name, num_k, STAGES, load, step, unroll=sm90_unroll(BM, STAGES), ku=ku)
            twr = None if ROUTER else load_tile(tw[rrow], (1, BM))
            for j, acc in enumerate(accs):
                nj = n0 + j * BN
                if not sc:  # per-channel scales, once after the k loop
                    acc = acc * _channel_scales(s, rows0[j], BN, dt)
                out = acc if twr is None else acc * twr
                if split:  # f32 partials to the token slots; padding rows add nothing
                    hl.atomic_add(y[rrow, hl.iota((BN, 1), 0) + nj], out)
                else:
                    hl.copy(hl.cast(out, dt), hl.view(y, (BM, BN), (None, nj), rows=rid).T)  # to the slots

    return moe_wna16_down_sm90
