"""W4A16 / W8A16 fused-MoE kernels in the tile language, layout-free (``hexlayout.ops.moe_wna16``).

Notation: ``x`` ``[T, H]`` activations (f16 / bf16), ``k`` experts per token, routed row ``r = t
* k + j`` (token ``t``, choice ``j``), local expert ``e`` of a block of ``BM`` sorted rows
(``sorted_ids``, padding ids ``>= T * k``; ``block_expert[b] = -1``: nothing to do). The
weights are the ones ``prepare_wna16`` re-lays out: a projection ``y = x @ W`` with input dim
``K`` and output dim ``N`` of every expert is the offline tensor ``q: hl.offline(u4[E * NP, KP])``
(``u8`` at 8 bits), read in logical coordinates: row ``e * NP + n`` holds column ``n`` of expert
``e``'s ``W`` along K (``NP`` the padded rows per expert; gate-up: gate, then up at ``NP / 2``);
its storage order is the one synthesis derives from the mma fragment each ``(BN, BK)`` tile
feeds (``hexlayout.ir.offline``: one 16-byte vector run per thread and tile), scales ``s:
hl.offline(dt[E * NP, G])`` (in the activations' dtype; MXFP4: e8m0 bytes ``u8``, ``2^(s -
127)``) and, for AWQ, zero points ``z: hl.offline(u8[E * NP, G])`` (``G`` groups of ``GROUP``
rows of K; the rows ``q``'s; without zero points ``z`` is a ``u8`` tensor of the scales' sizes,
not read), both read as ``(BN, 1)`` columns at ``q``'s rows, stored in the order of the register
column that consumes them (the threads of a fragment that share a column read one run: a
thread's columns one load, no bounds predicate) and converted once per group in registers::

    W[e, c', n] = (q[e * NP + n, c'] - z[e * NP + n, c' // GROUP]) * s[e * NP + n, c' // GROUP]

with ``z = ZERO`` (``2^(bits-1)``, GPTQ) when ``ZERO > 0``. Each ``BK``-column k-tile of
``q`` is loaded as bytes, unpacked (shifts / masks: LOP3, PRMT), converted by the
magic-number conversion (two values per 32-bit word: ``hl.cast`` to f16 / bf16, printed as one
integer add and one packed subtraction), shifted by the zero point, scaled (packed f16 / bf16
arithmetic: ``q - z`` is exact, the product rounded once) and fed to ``mma.sync`` as its B
operand in registers: the dequantized weights never touch shared memory. AWQ's loaded zero
points with group scales are folded once per group into the bias ``-z * s`` (f16: rounded once,
an error below half an f16 ulp of ``z * s``; bf16 keeps ``(q - z) * s``): ``W = q * s + (-z *
s)``, one fma per pair after the conversion.

The k loop runs in steps of ``KU = k_steps(BM)`` k-tiles (4 for decode, ``BM <= 16``; 1 for
prefill): one cp.async stage of ``BM x KU*BK`` activations, one wait and one barrier per step,
the ``KU`` weight tiles loaded straight to registers (each ``(BN, BK)`` tile of ``q`` keeps its
offline layout), the scales and zeros loaded once per group (``_new_group``). A k-tile of the
last step past ``KP`` is skipped (``_inside``); the activations there are zeros.

- ``moe_wna16_gate_up_kernel(dtype, bits, bk)``: for ``BN`` intermediate columns ``n0 ..``::

      g[r, n] = sum_c x[t, c] * W13[e, c, n]          (gate: columns n < I of w13)
      u[r, n] = sum_c x[t, c] * W13[e, c, I + n]      (up)
      h[r, n] = act(g) * u                            (SiLU, or exact erf GELU)

  stored in ``dtype`` at row ``p`` (the sorted position of ``r``) of ``h [EM, I]``
  (``ROUTER=True``: ``x[t]`` is first multiplied by ``tw[r]``, ``apply_router_weight_on_input``).
- ``moe_wna16_down_kernel(dtype, bits, bk)``: ``y[r, n] = tw[r] * sum_c h[p, c] * W2[e, c, n]``
  (``y [T * k, H]`` in ``dtype``, row ``r`` the slot at sorted position ``p``; ``ROUTER=True``:
  without ``tw``); ``hexlayout.ops.moe``'s pipeline sums the k slots of each token (moe_sum).
  A block takes ``column_tiles(BM)`` tiles of ``BN`` columns side by side (2 for decode: one
  activation k-tile and its ldmatrix fragments feed both).

Split-K (``split=True`` of both factories; decode grids smaller than a wave, ``moe_wna16``
dispatches): ``SPLIT_K`` blocks per tile, split ``sp`` over the steps ``[lo, hi)`` of
``moe_splitk._split_range`` (whole steps: each starts on a ``KU * BK`` boundary, and ``BK`` divides
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
import contextlib
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32, u4, u8, u32

from .blocks import expert_block, gathered_stages, k_tile_range, routed_rows

__all__ = ["moe_wna16_gate_up_kernel", "moe_wna16_down_kernel"]

T, H, E, EN, N, G, EM, NB, TK, I, KD, KP = hl.dims("T H E EN N G EM NB TK I KD KP")

def _group_params(s: Any, z: Any, row0: Any, k0: Any, BN: int, GROUP: int, ZERO: int, dt: DType,
                  scaled: bool = True) -> tuple[Any, Any]:
    """``(st, zt)``: the scales ``s[row0 .., g]`` (None when ``scaled`` is False: per-channel
    scales, applied after the k loop) and the zero points ``z[row0 .., g]`` (a constant ``ZERO``
    tile for GPTQ; None without zero point, ``ZERO < 0``) of group ``g = k0 // GROUP``, as
    ``(BN, 1)`` register columns in ``dt`` (GPTQ's constant zero point: the float ``ZERO``, made a
    tile by ``_dequant_tile``; AWQ's loaded one with scales in f16: the ``Bias`` ``-z * s``, so that
    ``(q - z) * s = q * s - z * s`` is one fma). The stored forms are converted here, once per
    group: AWQ's zero points are ``u8`` (``z`` exact in ``dt``), MXFP4's scales e8m0 bytes
    (``_e8m0``: ``2^(s - 127)``). Loaded once per group the k loop covers with them."""
    g = k0 // GROUP
    st = None
    if scaled:  # else per-channel scales: sum_k x (q - z) s = s sum_k x (q - z), after the k loop
        st = _scale_column(s, row0, g, BN, dt)
    if ZERO < 0:  # no zero point (MXFP4: e2m1 values, cast by their bit trick)
        return st, None
    if ZERO:  # GPTQ's constant: the tile is made beside its use (``_dequant_tile``: folded there)
        return st, float(ZERO)
    zb = hl.register(u8, (BN, 1))
    hl.copy(hl.view(z, (BN, 1), (row0, g)), zb)
    zt = hl.cast(zb, dt)  # exact: z < 16
    if st is None or dt.name != "f16":  # (bf16's 8-bit mantissa: -z * s rounded is too coarse)
        return st, zt
    # AWQ, f16: the group's bias -z * s once per group, (q - z) * s = q * s + (-z * s): one fma per pair
    return st, Bias(hl.full((BN, 1), 0.0, dt) - zt * st)


def _e8m0(b: Any, dt: DType) -> Any:
    """The e8m0 bytes ``b`` (a ``u8`` register tile) as the powers of two ``2^(b - 127)`` in
    ``dt``: the f32 pattern ``b << 23`` (the exponent field; ``b = 0``: ``2^-127``, the
    subnormal pattern ``0x00400000``), then rounded to ``dt``, exact for the exponents
    ``prepare_mxfp4`` accepts for ``dt`` (bf16: all, f16: ``2^-24 .. 2^15``)."""
    w = hl.cast(b, u32)
    f = hl.bitcast(hl.where(hl.equal(w, 0), 0x00400000, w << 23), f32)
    return hl.cast(f, dt)


def _scale_column(s: Any, row0: Any, g: Any, BN: int, dt: DType) -> Any:
    """The scales ``s[row0 .., g]`` (offline rows ``row0 ..``, group ``g``) as a ``(BN, 1)``
    register column in ``dt``: loaded in ``dt``, or, for e8m0 bytes (``u8``: MXFP4), loaded as
    bytes and converted by ``_e8m0``."""
    st = hl.register(s.dtype, (BN, 1))
    hl.copy(hl.view(s, (BN, 1), (row0, g)), st)
    return _e8m0(st, dt) if s.dtype == u8 else st


class Bias:
    """A group's folded AWQ zero point: the ``(BN, 1)`` tile ``-z * s`` (rounded once in the
    activations' dtype), added to ``q * s`` by one fma per pair instead of subtracting ``z``."""

    def __init__(self, tile: Any) -> None:
        self.tile = tile


def _dequant_tile(q: Any, row0: Any, k0: Any, BN: int, BK: int, dt: DType, bits: int, st: Any,
                  zt: Any) -> Any:
    """The dequantized ``(BN, BK)`` tile ``(q - z) * s`` of the offline ``q`` at rows ``row0 ..``
    and k ``k0 ..`` in ``dt``, in registers (the mma's operand), with the group's ``(st, zt)``
    of ``_group_params`` (``st`` None: ``q - z`` alone; ``zt`` None: ``q * s``, no zero point).
    ``q`` is read in logical coordinates; its storage order is the one synthesis derives from
    the mma's fragment (``hl.offline``)."""
    w = hl.view(q, (BN, BK), (row0, k0))
    if bits == 4:
        qt = hl.copy(w)  # bytes, unpacked to [0, 15]
    else:
        qt = hl.register(u8, (BN, BK))
        hl.copy(w, qt)
    if isinstance(zt, float):  # a register tile: q - z stays packed f16 / bf16 arithmetic (a float
        zt = hl.full((BN, 1), zt, dt)     # scalar goes through f32), folded into the conversion
    c = hl.cast(qt, dt)
    if isinstance(zt, Bias):
        return c * st + zt.tile
    if zt is not None:
        # q (< 256) and q - z (|q - z| < 256) are exact in f16 and bf16: the product is rounded once
        c = c - zt
    return c if st is None else c * st


def _dequant(
    q: Any,
    s: Any,
    z: Any,
    row0: Any,
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
    ``n0 ..`` (rows ``row0 ..`` of the offline ``q``) and k ``k0 ..``, in ``dt``, in registers:
    ``_dequant_tile`` with the group parameters of ``_group_params`` (``scaled=False``: ``q - z``
    alone, per-channel scales: ``_channel_scales`` multiplies the accumulator after the k loop)."""
    st, zt = _group_params(s, z, row0, k0, BN, GROUP, ZERO, dt, scaled)
    return _dequant_tile(q, row0, k0, BN, BK, dt, bits, st, zt)


def _channel_scales(s: Any, row0: Any, BN: int, dt: DType) -> Any:
    """Per-channel scales ``s[row0 .., 0]`` (one group over K) as a ``(1, BN)`` f32 row, by
    which the accumulator of unscaled ``q - z`` is multiplied after the k loop."""
    st = hl.register(dt, (BN, 1))
    hl.copy(hl.view(s, (BN, 1), (row0, 0)), st)
    return hl.cast(st, f32).T


def scale_type(dt: DType, wt: DType) -> DType:
    """The stored type of the scales: e8m0 bytes (``u8``) for MXFP4 (``e2m1`` weights), else
    the activations' ``dt``."""
    return u8 if wt.name == "e2m1" else dt


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
                    split_k: int = 1, sp: Any = None, ku: int = 1, kp: Any = None) -> Any:
    """Yields ``(k0, ras, tail)`` for each ``ku * BK``-column step of ``BM`` rows of ``a`` (the
    rows ``rows``, -1 a zero row; or, with ``rows=None``, rows ``m0 ..``): ``ras`` the ``ku``
    ``(BM, BK)`` register tiles of k-tiles ``k0 + h * BK`` (``h < ku``). The rows are copied into
    shared memory by cp.async ``STAGES - 1`` steps ahead of their use (as ``hl.pipeline``: one
    wait and one barrier per step, so ``ku`` k-tiles share them; columns past ``K`` are zeros).
    With ``ku > 1`` the steps whose k-tiles all lie below ``kp`` (the weights' padded ``KP``) run
    in the runtime loop (``tail`` False) and the last one, when it reaches past ``kp``, is traced
    once more after it (``tail`` True: the body skips its k-tiles past ``kp``), so the loop holds
    no guard. With a split index ``sp``: only the steps of split ``sp`` of ``split_k``
    (``blocks.k_tile_range``)."""
    span = ku * BK
    num_k, k0, ktile = k_tile_range(a.shape[1], span, split_k, sp)
    # stage st holds the step's k-tile h in buffer st * ku + h: each k-tile a (BM, BK) copy, whose
    # threads take the same rows for every h (one gathered row index per thread and step)
    sa, _, load1 = gathered_stages(a, rows, m0, lambda c: c, dt, BM, BK, STAGES * ku)

    def load(kt: Any, st: Any) -> None:
        for h in range(ku):
            load1(k0(kt) + h * BK, st * ku + h)

    def step(kt: Any, st: Any) -> list[Any]:
        ras = []
        for h in range(ku):
            ra = hl.register(dt, (BM, BK))
            hl.copy(sa[:, :, st * ku + h], ra)
            ras.append(ra)
        return ras

    if ku == 1:
        for kt, st in hl.pipeline(num_k, STAGES, load):
            yield ktile(kt) * BK, step(kt, st), False  # a consumed tile: inside the split
        return
    ahead = STAGES - 1
    for j in range(ahead):
        load(j, j)
        hl.commit_group()

    def staged(kt: Any) -> list[Any]:
        hl.wait_group(ahead - 1)
        hl.syncthreads()
        load(kt + ahead, (kt + ahead) % STAGES)
        hl.commit_group()
        return step(kt, kt % STAGES)

    full = hl.minimum(hl.maximum(kp // span - ktile(0), 0), num_k)  # steps inside KP
    for kt in hl.range(full):
        yield ktile(kt) * span, staged(kt), False
    with hl.if_(full < num_k):  # the last step, past KP (at most one: KP - K < BK)
        yield ktile(full) * span, staged(full), True
    hl.wait_group(0)


def _new_group(hk: int, ku: int, BK: int, GROUP: int) -> bool:
    """Whether k-tile ``hk`` of a step of ``ku`` k-tiles (the step's origin a multiple of ``ku *
    BK``, ``BK`` dividing ``GROUP``) starts a group whose scales and zeros must be loaded: the
    first k-tile always; then every ``GROUP / BK`` k-tiles when a step spans whole groups, never
    when a group spans whole steps, else every k-tile."""
    span = ku * BK
    if hk == 0 or GROUP % span == 0:
        return hk == 0
    return span % GROUP != 0 or (hk * BK) % GROUP == 0


def _inside(q: Any, kh: Any, hk: int) -> Any:
    """The guard of k-tile ``hk`` of a step at ``kh``: none for the first (a step starts inside
    ``K``), else ``kh < KP`` (the offline weights end at ``KP``; past it the step's activation
    columns are zeros and the k-tile is skipped)."""
    return contextlib.nullcontext() if hk == 0 else hl.if_(kh < q.shape[1])


def column_tiles(BM: int) -> int:
    """``(BN, BK)`` weight tiles the sm_80 down kernel takes side by side per k-tile (columns
    ``n0 .. n0 + NT * BN``): 2 for decode (``BM <= 16``: the activations' k-tile, its ldmatrix
    fragments, the loop's addressing, wait and barrier shared by twice the weights, as the gate-up
    kernel's two projections share them), else 1 (prefill: the grid's blocks)."""
    return 2 if BM <= 16 else 1


def k_steps(BM: int) -> int:
    """k-tiles per step of the sm_80 k loop: 4 for decode (``BM <= 16``: the loop's addressing,
    wait, barrier and branch shared by 4 k-tiles, the weights of 4 k-tiles in flight), else 1
    (prefill: the shared stages of ``BM`` rows stay ``BM * BK`` elements)."""
    return 4 if BM <= 16 else 1


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
    st_t = scale_type(dt, wt)
    name = f"moe_wna16_gate_up_{dt}_w{wname}_k{bk}" + ("_splitk" if split else "")

    # 8 resident warps per SM (2 blocks of 4): registers up to 255 per thread, which the
    # prefill tile with the exact-GELU epilogue needs (ptxas's own choice, 168, spilled 4 B
    # on sm_80 and 20 B on sm_90a)
    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=name, min_blocks=lambda c: max(1, 8 // c["WARPS"]))
    def moe_wna16_gate_up(
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
            ku = k_steps(BM)
            sc = GROUP < PER_CHANNEL
            steps = _staged_k_tiles(x, tok, m0, BM, BK, STAGES, dt, SPLIT_K, sp, ku, q.shape[1])  # token rows
            for k0, ras, tail in steps:
                for hk, ra in enumerate(ras):
                    kh = k0 + hk * BK
                    if ROUTER:
                        ra = hl.cast(hl.cast(ra, f32) * wr, dt)
                    with _inside(q, kh, hk if tail else 0):  # (a group past KP is not loaded)
                        if _new_group(hk, ku, BK, GROUP):  # a group's scales and zeros: loaded once
                            pg = _group_params(s, z, e * 2 * half + n0, kh, BN, GROUP, ZERO, dt, sc)
                            pu = _group_params(s, z, (2 * e + 1) * half + n0, kh, BN, GROUP, ZERO, dt, sc)
                        # warps side by side along N: each weight is dequantized by one warp only
                        wg = _dequant_tile(q, e * 2 * half + n0, kh, BN, BK, dt, bits, *pg)
                        hl.mma(ra, wg, acc_g, warps=(1, WARPS))
                        wu = _dequant_tile(q, (2 * e + 1) * half + n0, kh, BN, BK, dt, bits, *pu)
                        hl.mma(ra, wu, acc_u, warps=(1, WARPS))
            if GROUP >= PER_CHANNEL:
                acc_g = acc_g * _channel_scales(s, e * 2 * half + n0, BN, dt)
                acc_u = acc_u * _channel_scales(s, (2 * e + 1) * half + n0, BN, dt)
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
    st_t = scale_type(dt, wt)
    name = f"moe_wna16_down_{dt}_w{wname}_k{bk}" + ("_splitk" if split else "")

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=name)
    def moe_wna16_down(
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
        nt = column_tiles(BM)
        e, m0, n0, sp = expert_block(block_expert, Hx, BM, nt * BN, split, SPLIT_K)
        sc = GROUP < PER_CHANNEL  # group scales in the loop (else per channel, after it)
        with hl.if_(e >= 0):
            accs = [hl.zeros((BM, BN), f32) for _ in range(nt)]
            ku = k_steps(BM)
            np_ = (Hx + BN - 1) // BN * BN  # offline rows per expert: H padded to BN
            # column tile j's offline rows; one past the expert's padded rows (its columns are past
            # H: nothing stored, scales read as 0) re-reads the expert's last tile
            rows0 = [e * np_ + n0 + (hl.minimum(j * BN, np_ - BN - n0) if j else 0) for j in range(nt)]
            steps = _staged_k_tiles(h, None, m0, BM, BK, STAGES, dt, SPLIT_K, sp, ku, q.shape[1])  # rows of h
            for k0, ras, tail in steps:
                for hk, ra in enumerate(ras):
                    kh = k0 + hk * BK
                    with _inside(q, kh, hk if tail else 0):  # (a group past KP is not loaded)
                        if _new_group(hk, ku, BK, GROUP):  # a group's scales and zeros: loaded once
                            pgs = [_group_params(s, z, r, kh, BN, GROUP, ZERO, dt, sc) for r in rows0]
                        for j in range(nt):
                            w = _dequant_tile(q, rows0[j], kh, BN, BK, dt, bits, *pgs[j])
                            hl.mma(ra, w, accs[j], warps=(1, WARPS))
            twr = None if ROUTER else _topk_weight(sorted_ids, tw, m0, BM)
            rows = routed_rows(sorted_ids, m0, BM, TKx)
            for j, acc in enumerate(accs):
                nj = n0 + j * BN
                if not sc:
                    acc = acc * _channel_scales(s, rows0[j], BN, dt)
                if twr is not None:
                    acc = acc * twr
                if split:  # f32 partials to the token slots; padding rows add nothing
                    hl.atomic_add(y[rows, nj:nj + BN], acc)
                else:
                    hl.copy(hl.cast(acc, dt), hl.view(y, (BM, BN), (None, nj), rows=rows))  # to the slots

    return moe_wna16_down
