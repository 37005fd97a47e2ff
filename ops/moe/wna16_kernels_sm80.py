"""W4A16 / W8A16 fused-MoE kernels in the tile language, layout-free (``hexlayout.ops.moe_wna16``).

Notation: ``x`` ``[T, H]`` activations (f16 / bf16), ``k`` experts per token, routed row ``r = t
* k + j`` (token ``t``, choice ``j``), local expert ``e`` of a block of ``BM`` sorted rows
(``sorted_ids``, padding ids ``>= T * k``; ``block_expert[b] = -1``: nothing to do). The
weights are the ones ``prepare_wna16`` re-lays out: a projection ``y = x @ W`` with input dim
``K`` and output dim ``N`` of every expert is the offline tensor ``q: hl.offline(u4[E * NP, KP])``
(``u8`` at 8 bits), read in logical coordinates: row ``e * NP + n`` holds column ``n`` of expert
``e``'s ``W`` along K (``NP`` the padded rows per expert; gate-up: gate, then up at ``NP / 2``);
its storage order is the one synthesis derives from the mma fragment each ``(BN, BK)`` tile
feeds (``hexlayout.ir.offline``: one 16-byte vector run per thread and tile), scales ``s [E, G,
N]`` and, for AWQ, zero points ``z [E, G, N]``
(both in the activations' dtype, ``G`` groups of ``GROUP`` rows of K)::

    W[e, c', n] = (q[e * NP + n, c'] - z[e, c' // GROUP, n]) * s[e, c' // GROUP, n]

with ``z = ZERO`` (``2^(bits-1)``, GPTQ) when ``ZERO > 0``. Each ``BK``-column k-tile of
``q`` is loaded as bytes, unpacked (shifts / masks: LOP3, PRMT), converted by the
magic-number conversion (two values per 32-bit word: ``hl.cast`` to f16 / bf16, printed as one
integer add and one packed subtraction), shifted by the zero point, scaled (packed f16 / bf16
arithmetic: ``q - z`` is exact, the product rounded once) and fed to ``mma.sync`` as its B
operand in registers: the dequantized weights never touch shared memory.

- ``moe_wna16_gate_up_kernel(dtype, bits, bk)``: for ``BN`` intermediate columns ``n0 ..``::

      g[r, n] = sum_c x[t, c] * W13[e, c, n]          (gate: columns n < I of w13)
      u[r, n] = sum_c x[t, c] * W13[e, c, I + n]      (up)
      h[r, n] = act(g) * u                            (SiLU, or exact erf GELU)

  stored in ``dtype`` at row ``p`` (the sorted position of ``r``) of ``h [EM, I]``
  (``ROUTER=True``: ``x[t]`` is first multiplied by ``tw[r]``, ``apply_router_weight_on_input``).
- ``moe_wna16_down_kernel(dtype, bits, bk)``: ``y[r, n] = tw[r] * sum_c h[p, c] * W2[e, c, n]``
  (``y [T * k, H]`` in ``dtype``, row ``r`` the slot at sorted position ``p``; ``ROUTER=True``:
  without ``tw``); ``hexlayout.ops.moe``'s pipeline sums the k slots of each token (moe_sum).

Split-K (``split=True`` of both factories; decode grids smaller than a wave, ``moe_wna16``
dispatches): ``SPLIT_K`` blocks per tile, split ``sp`` over the k-tiles ``[lo, hi)`` of
``moe_splitk._split_range`` (whole k-tiles: each starts on a ``BK`` boundary, and ``BK`` divides
``GROUP``, so every k-tile dequantizes with its own group's scales and zeros exactly as without
split). The f32 partials (``g``, ``u`` with the router weight on the input; ``tw[r] * ..`` of the
down GEMM) are added with ``hl.atomic_add`` into a zeroed workspace: gate-up ``h [2, EM, I]``
(``h[0]`` gate, ``h[1]`` up, row = sorted position; padding rows add nothing), then
``moe_splitk.moe_splitk_act_kernel`` writes the activation; down ``y [T * k, H]`` by slot, then
``moe_splitk.moe_splitk_cast_kernel`` rounds it to ``dtype``.

Targets: sm_80 / sm_89 (``mma.sync.m16n8k16``); sm_90a runs ``moe_wna16_kernels_sm90`` (swap-AB
wgmma, the dequantized weights as its register A operand), which reuses ``_dequant``.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32, u4, u8

from .blocks import expert_block, gathered_stages, k_tile_range, routed_rows

__all__ = ["moe_wna16_gate_up_kernel", "moe_wna16_down_kernel"]

T, H, E, EN, N, G, EM, NB, TK, I, KD, KP = hl.dims("T H E EN N G EM NB TK I KD KP")

def _dequant(
    q: Any,
    s: Any,
    z: Any,
    e: Any,
    row0: Any,
    n0: Any,
    k0: Any,
    BN: int,
    BK: int,
    GROUP: int,
    ZERO: int,
    dt: DType,
    bits: int,
    scaled: bool = True,
) -> Any:
    """The dequantized ``(BN, BK)`` tile ``(q - z) * s`` of expert ``e``'s ``W^T`` at columns
    ``n0 ..`` (rows ``row0 ..`` of the offline ``q``) and k ``k0 ..``, in ``dt``, in registers
    (the mma's operand). ``q`` is read in logical coordinates; its storage order is the one
    synthesis derives from the mma's fragment (``hl.offline``). ``scaled=False``: ``q - z``
    alone (per-channel scales, ``GROUP >= PER_CHANNEL``: ``_channel_scales`` multiplies the
    accumulator after the k loop)."""
    g = k0 // GROUP
    w = hl.view(q, (BN, BK), (row0, k0))
    if bits == 4:
        qt = hl.copy(w)  # bytes, unpacked to [0, 15]
    else:
        qt = hl.register(u8, (BN, BK))
        hl.copy(w, qt)
    st = None
    if scaled:  # else per-channel scales: sum_k x (q - z) s = s sum_k x (q - z), after the k loop
        st = hl.register(dt, (BN, 1))
        hl.copy(hl.view(s, tile=(1, 1, BN), origin=(e, g, n0))[0, :, :].T, st)
    if ZERO < 0:  # no zero point (MXFP4: e2m1 values, cast by their bit trick)
        c = hl.cast(qt, dt)
        return c if st is None else c * st
    if ZERO:  # a register tile: q - z stays packed f16 / bf16 arithmetic (a float scalar goes through f32)
        zt: Any = hl.full((BN, 1), float(ZERO), dt)
    else:
        zt = hl.register(dt, (BN, 1))
        hl.copy(hl.view(z, tile=(1, 1, BN), origin=(e, g, n0))[0, :, :].T, zt)
    # q (< 256) and q - z (|q - z| < 256) are exact in f16 and bf16: the product is rounded once
    w = hl.cast(qt, dt) - zt
    return w if st is None else w * st


def _channel_scales(s: Any, e: Any, n0: Any, BN: int, dt: DType) -> Any:
    """Per-channel scales ``s[e, 0, n0 ..]`` (one group over K) as a ``(1, BN)`` f32 row, by
    which the accumulator of unscaled ``q - z`` is multiplied after the k loop."""
    st = hl.register(dt, (1, BN))
    hl.copy(hl.view(s, tile=(1, 1, BN), origin=(e, 0, n0))[0, :, :], st)
    return hl.cast(st, f32)


#: ``GROUP`` at least this: one group over K (``wna16.ONE_GROUP``), the scales per channel
PER_CHANNEL = 1 << 30


def _topk_weight(sorted_ids: Any, tw: Any, m0: Any, BM: int) -> Any:
    """``tw[r]`` of the block's routed rows ``r`` as a ``(BM, 1)`` f32 column (0 for padding)."""
    r = hl.register(i32, (BM, 1))
    hl.copy(sorted_ids[hl.iota((BM, 1), 0) + m0], r)
    wr = hl.register(f32, (BM, 1))
    hl.copy(tw[hl.where(r < tw.shape[0], r, -1)], wr)
    return wr


def _staged_k_tiles(a: Any, rows: Any, m0: Any, BM: int, BK: int, STAGES: int, dt: DType,
                    split_k: int = 1, sp: Any = None) -> Any:
    """Yields ``(k0, ra)`` for each ``BK``-column k-tile of ``BM`` rows of ``a`` (the rows
    ``rows``, -1 a zero row; or, with ``rows=None``, rows ``m0 ..``), ``ra`` a ``(BM, BK)``
    register tile; the rows are copied into shared memory by cp.async ``STAGES - 1`` k-tiles
    ahead of their use (a runtime loop over the k-tiles). With a split index ``sp``: only the
    k-tiles of split ``sp`` of ``split_k`` (``blocks.k_tile_range``)."""
    num_k, k0, ktile = k_tile_range(a.shape[1], BK, split_k, sp)
    sa, _, load = gathered_stages(a, rows, m0, k0, dt, BM, BK, STAGES)
    for kt, _st in hl.pipeline(num_k, STAGES, load):
        ra = hl.register(dt, (BM, BK))
        hl.copy(sa[:, :, kt % STAGES], ra)
        yield ktile(kt) * BK, ra  # a consumed tile: inside the split (no clamp past K)


@cache
def moe_wna16_gate_up_kernel(dtype: DType, bits: int, bk: int = 64, split: bool = False,
                             wtype: DType | None = None) -> Any:
    """The gate-up grouped GEMM with the activation epilogue (see the module docstring).
    Constants: ``BM`` sorted rows, ``BN`` intermediate columns (of gate and of up), ``BK``,
    ``WARPS``, ``GROUP`` (K rows per scale), ``ZERO`` (GPTQ's zero point; 0: ``z`` given),
    ``TOPK``, ``GELU``, ``ROUTER``, ``SPLIT_K``. ``split``: the split-K form, ``h`` the f32
    workspace ``[2, EM, I]`` into which split ``sp``'s ``g`` / ``u`` partials are added (``GELU``
    unused: the activation is ``moe_splitk_act_kernel``'s)."""
    dt = dtype
    wt = wtype or (u4 if bits == 4 else u8)  # the weights' element type (e2m1: MXFP4)
    wname = "fp4" if wt.name == "e2m1" else bits
    h_t = f32[2, EM, I] if split else dt[EM, I]
    name = f"moe_wna16_gate_up_{dt}_w{wname}_k{bk}" + ("_splitk" if split else "")

    # 8 resident warps per SM (2 blocks of 4): registers up to 255 per thread, which the
    # prefill tile with the exact-GELU epilogue needs (ptxas's own choice, 168, spilled 4 B
    # on sm_80 and 20 B on sm_90a)
    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=name, min_blocks=lambda c: max(1, 8 // c["WARPS"]))
    def moe_wna16_gate_up(
        x: dt[T, H],
        q: hl.offline(wt[EN, KP]),
        s: dt[E, G, N],
        z: dt[E, G, N],  # type: ignore
        sorted_ids: i32[EM],
        block_expert: i32[NB],
        tw: f32[TK],
        h: h_t,  # type: ignore
        *,
        BM: int = 16,
        BN: int = 64,
        BK: int = bk,
        STAGES: int = 3,
        WARPS: int = 4,
        GROUP: int = 128,
        ZERO: int = 0,
        TOPK: int = 1,
        GELU: bool = False,
        ROUTER: bool = False,
        SPLIT_K: int = 1,
    ):
        Tx, Hx = x.shape
        Ix = h.shape[-1]
        e, m0, n0, sp = expert_block(block_expert, Ix, BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):
            rid = routed_rows(sorted_ids, m0, BM, Tx * TOPK)
            tok = hl.where(rid >= 0, rid // TOPK, -1)
            half = (Ix + BN - 1) // BN * BN  # offline rows per expert: gate, then up, each padded to BN
            acc_g = hl.zeros((BM, BN), f32)
            acc_u = hl.zeros((BM, BN), f32)
            if ROUTER:
                wr = _topk_weight(sorted_ids, tw, m0, BM)
            for k0, ra in _staged_k_tiles(x, tok, m0, BM, BK, STAGES, dt, SPLIT_K, sp):  # token rows
                if ROUTER:
                    ra = hl.cast(hl.cast(ra, f32) * wr, dt)
                # warps side by side along N: each weight is dequantized by one warp only
                sc = GROUP < PER_CHANNEL
                wg = _dequant(q, s, z, e, e * 2 * half + n0, n0, k0, BN, BK, GROUP, ZERO, dt, bits, sc)
                hl.mma(ra, wg, acc_g, warps=(1, WARPS))
                wu = _dequant(q, s, z, e, (2 * e + 1) * half + n0, n0 + Ix, k0, BN, BK, GROUP, ZERO, dt,
                              bits, sc)
                hl.mma(ra, wu, acc_u, warps=(1, WARPS))
            if GROUP >= PER_CHANNEL:
                acc_g = acc_g * _channel_scales(s, e, n0, BN, dt)
                acc_u = acc_u * _channel_scales(s, e, n0 + Ix, BN, dt)
            if split:  # f32 partials at the sorted position; padding rows add nothing
                pos = hl.where(rid >= 0, hl.iota((BM,), 0) + m0, -1)
                hl.atomic_add(h[0, pos, n0:n0 + BN], acc_g)
                hl.atomic_add(h[1, pos, n0:n0 + BN], acc_u)
            else:
                a = hl.gelu(acc_g) if GELU else hl.silu(acc_g)
                hl.copy(hl.cast(a * acc_u, dt), hl.view(h, (BM, BN), (m0, n0)))  # row = sorted position

    return moe_wna16_gate_up


@cache
def moe_wna16_down_kernel(dtype: DType, bits: int, bk: int = 64, split: bool = False,
                          wtype: DType | None = None) -> Any:
    """The down grouped GEMM with the top-k weight in its epilogue (see the module docstring).
    Constants as ``moe_wna16_gate_up_kernel``'s (``BN`` output columns). ``split``: the split-K
    form, ``y`` the f32 workspace ``[T * k, H]`` into which split ``sp``'s partials are added."""
    dt = dtype
    wt = wtype or (u4 if bits == 4 else u8)  # the weights' element type (e2m1: MXFP4)
    wname = "fp4" if wt.name == "e2m1" else bits
    y_t = f32[TK, H] if split else dt[TK, H]
    name = f"moe_wna16_down_{dt}_w{wname}_k{bk}" + ("_splitk" if split else "")

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=name)
    def moe_wna16_down(
        h: dt[EM, KD],
        q: hl.offline(wt[EN, KP]),
        s: dt[E, G, N],
        z: dt[E, G, N],  # type: ignore
        sorted_ids: i32[EM],
        block_expert: i32[NB],
        tw: f32[TK],
        y: y_t,  # type: ignore
        *,
        BM: int = 16,
        BN: int = 64,
        BK: int = bk,
        STAGES: int = 3,
        WARPS: int = 4,
        GROUP: int = 128,
        ZERO: int = 0,
        TOPK: int = 1,
        GELU: bool = False,
        ROUTER: bool = False,
        SPLIT_K: int = 1,
    ):
        TKx, Hx = y.shape
        e, m0, n0, sp = expert_block(block_expert, Hx, BM, BN, split, SPLIT_K)
        with hl.if_(e >= 0):
            acc = hl.zeros((BM, BN), f32)
            for k0, ra in _staged_k_tiles(h, None, m0, BM, BK, STAGES, dt, SPLIT_K, sp):  # rows of h
                row0 = e * ((Hx + BN - 1) // BN * BN) + n0  # offline rows per expert: H padded to BN
                w = _dequant(q, s, z, e, row0, n0, k0, BN, BK, GROUP, ZERO, dt, bits, GROUP < PER_CHANNEL)
                hl.mma(ra, w, acc, warps=(1, WARPS))
            if GROUP >= PER_CHANNEL:
                acc = acc * _channel_scales(s, e, n0, BN, dt)
            if not ROUTER:
                acc = acc * _topk_weight(sorted_ids, tw, m0, BM)
            rows = routed_rows(sorted_ids, m0, BM, TKx)
            if split:  # f32 partials to the token slots; padding rows add nothing
                hl.atomic_add(y[rows, n0:n0 + BN], acc)
            else:
                hl.copy(hl.cast(acc, dt), hl.view(y, (BM, BN), (None, n0), rows=rows))  # to the token slots

    return moe_wna16_down
