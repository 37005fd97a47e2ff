"""The grouped GEMMs of the fused mixture of experts (bf16 / f16 weights), in the tile language.

Rows are token slots in the order of ``moe_align`` (``sorted_ids``, blocks of ``BM`` slots of
one expert, ``expert_ids[b]`` or -1 for an unused block, which exits at once); slot ``s`` is
token ``s // TOPK``'s ``s % TOPK``-th choice, the padding slot ``S = T * TOPK`` reads zeros and
is never stored.

- ``moe_gate_up_kernel(dtype, act)``: ``inter[p] = act(x_t @ W_gate[e]^T) * (x_t @ W_up[e]^T)``
  for sorted position ``p`` holding slot ``s`` of token ``t = s // TOPK`` and expert ``e``, with
  ``w13[e]`` = ``[gate rows (I) ; up rows (I)] x H``; ``act`` SiLU or exact GELU (erf). With
  ``SCALE_IN`` (``apply_router_weight_on_input``) both products are first scaled by
  ``topk_weights.flat[s]`` (the same as scaling ``x_t``: the products are linear in it).
  ``inter`` ``[EM, I]`` (EM = ``len(sorted_ids)``) is written once, padding rows included.
- ``moe_down_kernel(dtype)``: ``y[s] = w_s * (inter[p] @ w2[e]^T)`` (``w_s =
  topk_weights.flat[s]``, or 1 with ``SCALE_IN``), rows scattered to their slot ``s``.
- ``moe_sum_kernel(dtype)``: ``out[t] = sum_j y[t * TOPK + j]`` in f32, rounded once.

Both GEMMs are ``STAGES``-stage cp.async pipelines (as ``gemm_sm80_kernel``): the gathered rows
of ``x`` (by token index) or ``inter`` and the weight tiles of expert ``e`` go to shared memory,
then registers, then mma.sync; the mma atom, warp arrangement, swizzles, ldmatrix and every
layout are synthesized (sm_80 / sm_89; sm_90a runs the same mma.sync kernels, no wgmma yet). No
torch op runs between the kernels: the op only allocates ``inter``, ``y`` and ``out``.
"""

from collections.abc import Callable
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

from .blocks import expert_block, k_tile_range, routed_rows

__all__ = ["moe_gate_up_kernel", "moe_down_kernel", "moe_sum_kernel", "moe_config", "moe_down_config",
           "MoeConfig"]

T, H, E, N2, I, EM, NB, S, KK = hl.dims("T H E N2 I EM NB S KK")


class MoeConfig(dict):
    """Tile constants of the two grouped GEMMs: ``BM`` (= the alignment's block), ``BN``,
    ``BK``, ``WARPS`` (``STAGES`` defaults to 3)."""


def moe_config(num_slots: int) -> MoeConfig:
    """The config for ``num_slots = T * k`` routed rows (never the routing: capture-safe):
    decode (up to 128 slots: 1-16 tokens at k <= 8) 16 x 64 x 64 tiles on 4 warps, medium (up
    to 2048) 32 x 64 x 64, prefill 64 x 64 x 32, on 4 warps, 3 stages (no spills on sm_80 /
    sm_90a; 64 x 128 tiles spill with ``SCALE_IN`` or, on 8 warps, on sm_90a)."""
    if num_slots <= 128:
        return MoeConfig(BM=16, BN=64, BK=64, WARPS=4)
    if num_slots <= 2048:
        return MoeConfig(BM=32, BN=64, BK=64, WARPS=4)
    return MoeConfig(BM=64, BN=64, BK=32, WARPS=4)


def moe_down_config(cfg: MoeConfig) -> MoeConfig:
    """The down GEMM's tiles for a gate-up config: the same ``BM`` and ``BK``, at most 64
    columns, 4 warps."""
    return MoeConfig(BM=cfg["BM"], BN=min(cfg["BN"], 64), BK=cfg["BK"], WARPS=4)


def _weights(topk_w: Any, sorted_ids: Any, m0: Any, bm: int, bn: int) -> Any:
    """``topk_weights.flat[sorted_ids[m0 + i]]`` as a ``(BM, BN)`` tile (each column the same:
    loaded per element, so it takes the accumulator's layout)."""
    idx = hl.register(i32, (bm, bn))
    hl.copy(sorted_ids[hl.iota((bm, bn), 0) + m0], idx)
    w = hl.register(f32, (bm, bn))
    hl.copy(topk_w[hl.where(idx < topk_w.shape[0], idx, -1)], w)
    return w


def _slot_tokens(sorted_ids: Any, m0: Any, bm: int, topk: int) -> tuple[Any, Any]:
    """``(slots, tokens)`` of the block's sorted positions ``m0 ..`` as ``(bm,)`` index tiles: the
    slots ``sorted_ids[m0 ..]`` and their tokens ``slot // topk`` (padding: token ``T``, reads 0)."""
    slots = hl.register(i32, (bm,))
    hl.copy(sorted_ids[m0:m0 + bm], slots)
    return slots, slots // topk


def _expert_mma(a_tile: Callable[[Any], Any], w: Any, e: Any, w_rows: tuple[Any, ...], accs: tuple[Any, ...],
                num_k: Any, k0: Callable[[Any], Any], dt: Any, bm: int, bn: int, bk: int,
                stages: int) -> None:
    """``accs[i] += A @ W_i^T`` over ``num_k`` k-tiles (``k0(j)``: the first column of local
    k-tile ``j``): ``A`` the ``(bm, bk)`` global tile ``a_tile(k)`` at column ``k``, ``W_i`` the
    ``bn`` rows ``w_rows[i] ..`` of expert ``e``'s ``w [E, N, K]``; a ``stages``-stage cp.async
    pipeline into shared memory, then registers, then mma.sync."""
    sa = hl.shared(dt, (bm, bk, stages))
    sw = tuple(hl.shared(dt, (bn, bk, stages)) for _ in w_rows)

    def load(kt: Any, s: Any) -> None:                           # cp.async: A rows, weight rows
        c0 = k0(kt)
        hl.copy(a_tile(c0), sa[:, :, s])
        for r0, sb in zip(w_rows, sw):
            hl.copy(hl.view(w, tile=(1, bn, bk), origin=(e, r0, c0))[0, :, :], sb[:, :, s])

    for _k, s in hl.pipeline(num_k, stages, load):
        ra, rw = hl.register(dt, (bm, bk)), tuple(hl.register(dt, (bn, bk)) for _ in w_rows)
        hl.copy(sa[:, :, s], ra)
        for sb, rb in zip(sw, rw):
            hl.copy(sb[:, :, s], rb)
        for rb, acc in zip(rw, accs):
            hl.mma(ra, rb, acc)


def _emit_nodes(nodes: tuple, out: int, value: Any) -> Any:
    """Spec nodes (``hexlayout.fusion.spec.Node``) of one value ``("input", 0)`` and numbers,
    traced on f32 tiles; node ``out``'s tile."""
    from hexlayout.fusion.aten import emit_elementwise

    env: list = []
    for n in nodes:
        args = [value if a[0] == "input" else env[a[1]] if a[0] == "node" else
                float(a[1]) if isinstance(a[1], (int, float)) and not isinstance(a[1], bool) else a[1]
                for a in n.args]
        env.append(emit_elementwise(n.op, args, dict(n.kwargs)))
    return env[out]


def _row_scale(x: Any, sorted_ids: Any, m0: Any, topk: int, scales: tuple, dt: Any, like: Any) -> Any:
    """``prod_i post_i(red_k pre_i(x[t, k]))`` (``fusion_prologue.RowScale``) for the tokens ``t``
    of the block's sorted slots ``m0 ..`` as a ``(bm, 1)`` f32 tile: the gathered rows read in
    ``(bm, bn)`` tiles (``like``'s shape: an accumulator) through index tiles of that shape
    (loaded per element, as ``_weights``), ``pre_i`` of each added into a tile made from
    ``like`` (so it has the accumulator's layout and the row values reduced from it broadcast
    over the accumulators), reduced over its columns after the row (padding rows read 0,
    columns past the row count 0)."""
    bm, bn = like.shape
    slots = hl.register(i32, (bm, bn))
    hl.copy(sorted_ids[hl.iota((bm, bn), 0) + m0], slots)
    rows = slots // topk
    sums = [like * 0.0 for _ in scales]
    for kt in hl.range(hl.cdiv(x.shape[1], bn)):
        cols = hl.iota((bm, bn), 1) + kt * bn
        r = hl.register(dt, (bm, bn))
        hl.copy(x[rows, cols], r, other=0.0)
        xf = hl.cast(r, f32)
        for sc, acc in zip(scales, sums):
            acc += hl.where(cols < x.shape[1], _emit_nodes(sc.pre, sc.pre_out, xf), 0.0)
    out = None
    for sc, acc in zip(scales, sums):
        if sc.fn == "mean":
            acc = acc / hl.cast(hl.iota((bm, bn), 1) * 0 + x.shape[1], f32)
        v = _emit_nodes(sc.post, sc.post_out, hl.reduce(acc, "sum", 1))
        out = v if out is None else out * v
    return out


@cache
def moe_gate_up_kernel(dtype: DType, act: str = "silu", scales: tuple = ()) -> Any:
    """The gate-up grouped GEMM for ``dtype`` and ``act`` (``"silu"`` / ``"gelu"``); with
    ``scales`` (``fusion_prologue.RowScale`` s of ``x``'s rows: an RMSNorm's ``rsqrt(mean(x * x)
    + eps)``) both products are scaled by their product per row before the activation."""
    dt = dtype
    tag = "_row_scaled" if scales else ""

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"moe_gate_up_{dt}_{act}{tag}")
    def moe_gate_up(x: dt[T, H], w13: dt[E, N2, H], sorted_ids: i32[EM], expert_ids: i32[NB],  # type: ignore
                    topk_w: f32[S], inter: dt[EM, I],  # type: ignore
                    *, BM: int = 16, BN: int = 64, BK: int = 64, WARPS: int = 4, STAGES: int = 3,
                    TOPK: int = 1, SCALE_IN: bool = False):
        ni = inter.shape[1]
        e, m0, n0, _ = expert_block(expert_ids, ni, BM, BN)
        with hl.if_(e >= 0):                                         # unused blocks exit
            _, tok = _slot_tokens(sorted_ids, m0, BM, TOPK)
            acc_g = hl.zeros((BM, BN), f32)
            acc_u = hl.zeros((BM, BN), f32)
            if scales:              # before the main loop: its tiles are dead when the accumulators grow
                r = _row_scale(x, sorted_ids, m0, TOPK, scales, dt, acc_g)
            num_k, k0, _ = k_tile_range(x.shape[1], BK, 1, None)
            _expert_mma(lambda c0: x[tok, c0:c0 + BK], w13, e, (n0, ni + n0), (acc_g, acc_u), num_k, k0, dt,
                        BM, BN, BK, STAGES)
            if scales:
                acc_g *= r
                acc_u *= r
            if SCALE_IN:
                w = _weights(topk_w, sorted_ids, m0, BM, BN)
                acc_g *= w
                acc_u *= w
            gate = hl.silu(acc_g) if act == "silu" else hl.gelu(acc_g)
            hl.copy(hl.cast(gate * acc_u, dt), hl.view(inter, tile=(BM, BN), origin=(m0, n0)))

    return moe_gate_up


@cache
def moe_down_kernel(dtype: DType) -> Any:
    """The down grouped GEMM for ``dtype``: weighted rows scattered to their slots."""
    dt = dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"moe_down_{dt}")
    def moe_down(inter: dt[EM, I], w2: dt[E, H, I], sorted_ids: i32[EM], expert_ids: i32[NB],  # type: ignore
                 topk_w: f32[S], y: dt[S, H],  # type: ignore
                 *, BM: int = 16, BN: int = 64, BK: int = 64, WARPS: int = 4, STAGES: int = 3,
                 SCALE_IN: bool = False):
        e, m0, n0, _ = expert_block(expert_ids, y.shape[1], BM, BN)
        with hl.if_(e >= 0):
            acc = hl.zeros((BM, BN), f32)
            num_k, k0, _ = k_tile_range(inter.shape[1], BK, 1, None)
            _expert_mma(lambda c0: hl.view(inter, tile=(BM, BK), origin=(m0, c0)), w2, e, (n0,), (acc,),
                        num_k, k0, dt, BM, BN, BK, STAGES)
            if not SCALE_IN:
                acc *= _weights(topk_w, sorted_ids, m0, BM, BN)
            dest = routed_rows(sorted_ids, m0, BM, y.shape[0])      # padding rows: not stored
            hl.copy(hl.cast(acc, dt), y[dest, n0:n0 + BN])

    return moe_down


@cache
def moe_sum_kernel(dtype: DType) -> Any:
    """``out[t] = sum_j y[t, j]`` over the ``TOPK`` slots of token ``t`` (``y`` seen as
    ``[T, TOPK, H]``), accumulated in f32."""
    dt = dtype

    @hl.kernel(threads=128, name=f"moe_sum_{dt}")
    def moe_sum(y: dt[T, KK, H], out: dt[T, H], *, ROWS: int = 16, BH: int = 64, TOPK: int = 1):  # type: ignore
        pid_t, pid_h = hl.grid(hl.spatial(hl.cdiv(out.shape[0], ROWS), hl.cdiv(out.shape[1], BH)))
        t0, h0 = pid_t * ROWS, pid_h * BH
        acc = hl.zeros((ROWS, BH), f32)
        for j in range(TOPK):
            r = hl.register(dt, (ROWS, BH))
            hl.copy(hl.view(y, tile=(ROWS, 1, BH), origin=(t0, j, h0))[:, 0, :], r)
            acc += hl.cast(r, f32)
        hl.copy(hl.cast(acc, dt), hl.view(out, tile=(ROWS, BH), origin=(t0, h0)))

    return moe_sum
