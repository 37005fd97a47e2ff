"""Split-K for the grouped GEMMs of the fused MoE (bf16 / f16 weights), for decode sizes.

At small ``T`` a grouped GEMM's grid (one block per ``BM`` sorted rows of an expert and ``BN``
output columns) has too few blocks for the SMs, each streaming all of ``K`` (gate-up of the
DeepSeek-V3 TP8 slice at ``T = 1``: 8 experts x 4 column blocks of ``I = 256`` = 32 blocks on
132 SMs, each over ``K = H = 7168``; down of Mixtral at ``T = 1``: 2 x 64 = 128 blocks over
``K = I = 14336``). Split-K gives every tile ``SPLIT_K`` blocks, block ``sp`` taking the k-tiles
``[sp * P, min(KT, sp * P + P))`` with ``KT = ceil(K / BK)``, ``P = ceil(KT / SPLIT_K)``.
Gate-up (``K = H``):

    G[p, n] = sum_sp sum_{k in split sp} x[t_p, k] * w13[e, n, k]          (gate, n < I)
    U[p, n] = sum_sp sum_{k in split sp} x[t_p, k] * w13[e, I + n, k]      (up)
    inter[p, n] = act(w_p * G[p, n]) * (w_p * U[p, n])

for sorted position ``p`` (slot ``s = sorted_ids[p]``, token ``t_p = s // TOPK``, expert ``e`` of
its block); ``w_p = topk_weights.flat[s]`` with ``apply_router_weight_on_input``, else 1 (scaling
``x_t`` scales both products: they are linear in it). Down (``K = I``):

    Y[s, h] = sum_sp sum_{k in split sp} w'_s * inter[p, k] * w2[e, h, k],  y[s] = Y[s] in dtype

with ``w'_s = topk_weights.flat[s]``, or 1 with ``apply_router_weight_on_input``.

- ``moe_gate_up_splitk_kernel(dtype)``: the partial sums of one split in f32, added with
  ``hl.atomic_add`` (``red.global.add.f32``) into the workspaces ``ws_g`` / ``ws_u`` [EM, I]
  (zero-filled by the launcher); padding rows (slot ``S = T * TOPK``) add nothing. The same
  ``STAGES``-stage cp.async pipeline as ``moe_gate_up_kernel``; the prefetches past the split's
  last k-tile get an origin past ``K`` (no memory read).
- ``moe_splitk_act_kernel(dtype, act)``: ``inter[p] = act(w_p G[p]) * (w_p U[p])`` rounded once to
  ``dtype``, per block of ``BM`` rows of an expert (unused blocks exit, as in the GEMMs).
  ``slot_rows=True``: workspaces and ``inter`` by slot ``s`` instead of sorted position (the fp8
  path's split GEMMs, ``ops/moe_fp8.py``, reuse it and ``moe_splitk_cast_kernel``).
- ``moe_down_splitk_kernel(dtype)``: as ``moe_down_kernel``, its weighted f32 partials added
  into row ``s`` of the workspace ``ws`` [S, H] (zero-filled); ``moe_splitk_cast_kernel(dtype)``
  rounds ``ws`` once into ``y`` (rows of slots without a local expert stay 0).

The language has no integer atomics nor a memory fence, so the last-arriving block cannot run
the epilogue: a second (small) kernel does. The order of the atomic additions is not defined:
results may differ from run to run in the last bits of f32 before the rounding to ``dtype``.

``choose_split_k`` picks ``SPLIT_K`` from the sizes only (never the routing: capture-safe);
``splitk_gate_up(w13, fallback)`` / ``splitk_down(w2, fallback)`` are the pipeline's launchers
that run the split path when it says ``> 1`` and ``fallback`` (the plain launcher) otherwise.
``HEXLAYOUT_MOE_SPLIT_K=n`` (or the launchers' ``split_k=n``) forces ``SPLIT_K = n`` for both
GEMMs (1: off), on CPU / emulated tensors too; without it CPU tensors never split (the emulator
runs the plain path).
"""

from __future__ import annotations

import os
from functools import cache
from typing import TYPE_CHECKING, Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32
from hexlayout.runtime.args import ArgumentError

from ..host.device import sm_count
from ..host.launch import build_for, lang_dtype, run_kernel, zeroed
from .align import max_padded_slots
from .blocks import expert_block, k_tile_range, routed_rows
from .kernels_sm80 import MoeConfig, _expert_mma, _slot_tokens, _weights, moe_config, moe_down_config

if TYPE_CHECKING:
    from .pipeline import Down, GateUp, MoeRun

__all__ = ["moe_gate_up_splitk_kernel", "moe_splitk_act_kernel", "moe_down_splitk_kernel",
           "moe_splitk_cast_kernel", "choose_split_k", "splitk_gate_up", "splitk_down", "SPLIT_K_ENV",
           "MAX_SPLIT_K", "MIN_SPLIT_KTILES"]

T, H, E, N2, I, EM, NB, S = hl.dims("T H E N2 I EM NB S")

#: Environment variable forcing ``SPLIT_K`` (an integer >= 1) for the gate-up GEMM.
SPLIT_K_ENV = "HEXLAYOUT_MOE_SPLIT_K"
#: The largest split the chooser picks (each split count is its own build).
MAX_SPLIT_K = 16
#: The fewest k-tiles (of ``BK``) a split gets from the chooser (the pipeline's prologue and the
#: atomic epilogue amortized over at least this many tiles).
MIN_SPLIT_KTILES = 8


@cache
def moe_gate_up_splitk_kernel(dtype: DType) -> Any:
    """The split-K gate-up grouped GEMM for ``dtype``: f32 partial gate / up products of split
    ``sp`` atomically added into ``ws_g`` / ``ws_u`` (see the module docstring)."""
    dt = dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"moe_gate_up_splitk_{dt}")
    def moe_gate_up_splitk(x: dt[T, H], w13: dt[E, N2, H], sorted_ids: i32[EM], expert_ids: i32[NB],  # type: ignore
                           ws_g: f32[EM, I], ws_u: f32[EM, I],  # type: ignore
                           *, BM: int = 16, BN: int = 64, BK: int = 64, WARPS: int = 4, STAGES: int = 3,
                           TOPK: int = 1, SPLIT_K: int = 2):
        ni = ws_g.shape[1]
        e, m0, n0, sp = expert_block(expert_ids, ni, BM, BN, True, SPLIT_K)
        with hl.if_(e >= 0):                                         # unused blocks exit
            slots, tok = _slot_tokens(sorted_ids, m0, BM, TOPK)
            acc_g = hl.zeros((BM, BN), f32)
            acc_u = hl.zeros((BM, BN), f32)
            num_k, k0, _ = k_tile_range(x.shape[1], BK, SPLIT_K, sp)   # the split's k-tiles
            _expert_mma(lambda c0: x[tok, c0:c0 + BK], w13, e, (n0, ni + n0), (acc_g, acc_u), num_k, k0, dt,
                        BM, BN, BK, STAGES)
            rows = hl.where(slots < x.shape[0] * TOPK, hl.iota((BM,), 0) + m0, -1)   # padding: none
            hl.atomic_add(ws_g[rows, n0:n0 + BN], acc_g)
            hl.atomic_add(ws_u[rows, n0:n0 + BN], acc_u)

    return moe_gate_up_splitk


@cache
def moe_splitk_act_kernel(dtype: DType, act: str = "silu", slot_rows: bool = False) -> Any:
    """``inter[p] = act(w_p * ws_g[p]) * (w_p * ws_u[p])`` in f32, rounded once to ``dtype``
    (``w_p`` = ``topk_weights.flat[sorted_ids[p]]`` with ``SCALE_IN``, else 1); ``act`` SiLU or
    exact GELU. One block per ``BM`` sorted rows of an expert and ``BN`` columns.

    ``slot_rows``: the rows of ``ws_g`` / ``ws_u`` ([S, I]) and ``inter`` are slots ``s =
    sorted_ids[p]`` instead of sorted positions (the fp8 path's layout: ``inter[s] =
    act(w_p * ws_g[s]) * (w_p * ws_u[s])``, padding positions skipped)."""
    dt = dtype

    @hl.kernel(threads=128, name=f"moe_splitk_act_{dt}_{act}" + ("_slots" if slot_rows else ""))
    def moe_splitk_act(ws_g: f32[S if slot_rows else EM, I], ws_u: f32[S if slot_rows else EM, I],  # type: ignore
                       sorted_ids: i32[EM], expert_ids: i32[NB], topk_w: f32[S], inter: dt[EM, I],  # type: ignore
                       *, BM: int = 16, BN: int = 128, SCALE_IN: bool = False):
        e, m0, n0, _ = expert_block(expert_ids, inter.shape[1], BM, BN)
        with hl.if_(e >= 0):
            g = hl.register(f32, (BM, BN))
            u = hl.register(f32, (BM, BN))
            if slot_rows:                                        # rows of the slots, padding: none
                rid = routed_rows(sorted_ids, m0, BM, topk_w.shape[0])
                hl.copy(hl.view(ws_g, (BM, BN), (None, n0), rows=rid), g)
                hl.copy(hl.view(ws_u, (BM, BN), (None, n0), rows=rid), u)
            else:
                hl.copy(hl.view(ws_g, tile=(BM, BN), origin=(m0, n0)), g)
                hl.copy(hl.view(ws_u, tile=(BM, BN), origin=(m0, n0)), u)
            if SCALE_IN:
                w = _weights(topk_w, sorted_ids, m0, BM, BN)
                g = g * w
                u = u * w
            gate = hl.silu(g) if act == "silu" else hl.gelu(g)
            if slot_rows:
                hl.copy(hl.cast(gate * u, dt), hl.view(inter, (BM, BN), (None, n0), rows=rid))
            else:
                hl.copy(hl.cast(gate * u, dt), hl.view(inter, tile=(BM, BN), origin=(m0, n0)))

    return moe_splitk_act


@cache
def moe_down_splitk_kernel(dtype: DType) -> Any:
    """The split-K down grouped GEMM for ``dtype``: split ``sp``'s f32 partial of
    ``w_s * (inter[p] @ w2[e]^T)`` (``w_s = topk_weights.flat[s]``, or 1 with ``SCALE_IN``)
    atomically added into row ``s`` (the slot of sorted position ``p``) of ``ws`` [S, H]."""
    dt = dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"moe_down_splitk_{dt}")
    def moe_down_splitk(inter: dt[EM, I], w2: dt[E, H, I], sorted_ids: i32[EM], expert_ids: i32[NB],  # type: ignore
                        topk_w: f32[S], ws: f32[S, H],  # type: ignore
                        *, BM: int = 16, BN: int = 64, BK: int = 64, WARPS: int = 4, STAGES: int = 3,
                        SCALE_IN: bool = False, SPLIT_K: int = 2):
        e, m0, n0, sp = expert_block(expert_ids, ws.shape[1], BM, BN, True, SPLIT_K)
        with hl.if_(e >= 0):
            acc = hl.zeros((BM, BN), f32)
            num_k, k0, _ = k_tile_range(inter.shape[1], BK, SPLIT_K, sp)   # the split's k-tiles
            _expert_mma(lambda c0: hl.view(inter, tile=(BM, BK), origin=(m0, c0)), w2, e, (n0,), (acc,),
                        num_k, k0, dt, BM, BN, BK, STAGES)
            if not SCALE_IN:
                acc *= _weights(topk_w, sorted_ids, m0, BM, BN)
            dest = routed_rows(sorted_ids, m0, BM, ws.shape[0])     # padding rows: no addition
            hl.atomic_add(ws[dest, n0:n0 + BN], acc)

    return moe_down_splitk


@cache
def moe_splitk_cast_kernel(dtype: DType) -> Any:
    """``y[s, h] = ws[s, h]`` rounded once from f32 to ``dtype``, per ``ROWS x BH`` tile."""
    dt = dtype

    @hl.kernel(threads=128, name=f"moe_splitk_cast_{dt}")
    def moe_splitk_cast(ws: f32[S, H], y: dt[S, H], *, ROWS: int = 16, BH: int = 128):  # type: ignore
        pid_r, pid_h = hl.grid(hl.spatial(hl.cdiv(y.shape[0], ROWS), hl.cdiv(y.shape[1], BH)))
        r = hl.register(f32, (ROWS, BH))
        hl.copy(hl.view(ws, tile=(ROWS, BH), origin=(pid_r * ROWS, pid_h * BH)), r)
        hl.copy(hl.cast(r, dt), hl.view(y, tile=(ROWS, BH), origin=(pid_r * ROWS, pid_h * BH)))

    return moe_splitk_cast


def choose_split_k(num_tokens: int, topk: int, num_experts: int, hidden: int, inter: int, sm_count: int,
                   cfg: MoeConfig | None = None, gemm: str = "gate_up") -> int:
    """``SPLIT_K`` of the ``gemm`` (``"gate_up"``: N = I, K = H; ``"down"``: N = H, K = I) from
    the sizes only (never the routing):

    - ``S = T * k`` slots, tiles ``cfg = moe_config(S)`` (``moe_down_config`` of it for the
      down GEMM: ``BM``, ``BN``, ``BK``); ``NB = max_padded_slots(S, E, BM) / BM`` row blocks;
    - ``M = min(NB, max(ceil(S / BM), min(S, E)))`` row blocks with an expert when the slots
      spread over ``min(S, E)`` experts (each at least one block, ``ceil(S / BM)`` in all at
      least); ``tiles = M * ceil(N / BN)``; ``KT = ceil(K / BK)`` k-tiles;
    - ``tiles >= sm_count`` (a wave already): 1; else ``min(MAX_SPLIT_K, floor(2 * sm_count /
      tiles), floor(KT / MIN_SPLIT_KTILES))``, and 1 when that is below 2: ``tiles * SPLIT_K``
      blocks fill one to two waves, each split at least ``MIN_SPLIT_KTILES`` k-tiles.
    """
    s = num_tokens * topk
    if s <= 0:
        return 1
    cfg = cfg or moe_config(s)
    n, k = (inter, hidden) if gemm == "gate_up" else (hidden, inter)
    if gemm != "gate_up":
        cfg = moe_down_config(cfg)
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    nb = max_padded_slots(s, num_experts, bm) // bm
    m = min(nb, max(-(-s // bm), min(s, num_experts)))
    tiles = m * -(-n // bn)
    if tiles >= sm_count:
        return 1
    split = min(MAX_SPLIT_K, 2 * sm_count // tiles, -(-k // bk) // MIN_SPLIT_KTILES)
    return split if split >= 2 else 1


def _forced(split_k: int | None) -> int | None:
    """The forced split: the argument, else ``HEXLAYOUT_MOE_SPLIT_K``, else ``None``."""
    if split_k is not None:
        val: Any = split_k
        src = "split_k"
    else:
        val = os.environ.get(SPLIT_K_ENV)
        if val is None or val == "":
            return None
        src = SPLIT_K_ENV
    try:
        n = int(val)
    except (TypeError, ValueError):
        n = 0
    if isinstance(val, bool) or n < 1 or str(n) != str(val).strip():
        raise ArgumentError("hexlayout.fused_moe", src, f"must be an integer >= 1 (SPLIT_K of the grouped "
                            f"GEMMs), got {val!r}")
    return n


def _split(run: MoeRun, forced: int | None, num_experts: int, inter: int, gemm: str) -> int:
    """The forced split, else 1 on CPU, else ``choose_split_k`` with the device's SM count."""
    x = run.x
    if forced is not None:
        return forced
    if x.device.type != "cuda":
        return 1
    return choose_split_k(x.shape[0], run.topk, num_experts, x.shape[1], inter, sm_count(x.device), run.cfg,
                          gemm)


def splitk_gate_up(w13: Any, fallback: GateUp, split_k: int | None = None) -> GateUp:
    """The gate-up launcher of ``run_moe_pipeline``: ``SPLIT_K`` forced (``split_k`` /
    ``HEXLAYOUT_MOE_SPLIT_K``) or, on CUDA, ``choose_split_k`` with the device's SM count (1 on
    CPU); ``SPLIT_K = 1`` runs ``fallback`` unchanged, else the split kernel into a zeroed f32
    workspace [2, EM, I] and ``moe_splitk_act_kernel`` into ``inter``."""
    forced = _forced(split_k)

    def launch(run: MoeRun, inter: Any) -> None:
        import torch

        x = run.x
        split = _split(run, forced, w13.shape[0], inter.shape[1], "gate_up")
        if split <= 1:
            fallback(run, inter)
            return
        dt = lang_dtype(x.dtype)
        ws = zeroed((2, inter.shape[0], inter.shape[1]), torch.float32, x.device)   # atomics add into it
        consts = {**run.cfg, "TOPK": run.topk, "SPLIT_K": split}
        bld = build_for(moe_gate_up_splitk_kernel(dt), x.device, consts)
        run_kernel(bld, (x, w13, run.sorted_ids, run.expert_ids, ws[0], ws[1]), outputs=(4, 5))
        fin = build_for(moe_splitk_act_kernel(dt, run.activation), x.device,
                        {"BM": run.cfg["BM"], "SCALE_IN": run.scale_in})
        run_kernel(fin, (ws[0], ws[1], run.sorted_ids, run.expert_ids, run.topk_w, inter), outputs=(5,))

    return launch


def splitk_down(w2: Any, fallback: Down, split_k: int | None = None) -> Down:
    """The down launcher of ``run_moe_pipeline``: ``SPLIT_K`` as in ``splitk_gate_up`` (with
    ``gemm="down"``); 1 runs ``fallback``, else ``moe_down_splitk_kernel`` into a zeroed f32
    workspace [S, H] and ``moe_splitk_cast_kernel`` into ``y`` (rows of remote or unused slots:
    0, as the pipeline expects)."""
    forced = _forced(split_k)

    def launch(run: MoeRun, inter: Any, y: Any) -> None:
        import torch

        split = _split(run, forced, w2.shape[0], inter.shape[1], "down")
        if split <= 1:
            fallback(run, inter, y)
            return
        dt = lang_dtype(y.dtype)
        ws = zeroed(y.shape, torch.float32, y.device)      # atomics add into it
        consts = {**moe_down_config(run.cfg), "SCALE_IN": run.scale_in, "SPLIT_K": split}
        bld = build_for(moe_down_splitk_kernel(dt), y.device, consts)
        run_kernel(bld, (inter, w2, run.sorted_ids, run.expert_ids, run.topk_w, ws), outputs=(5,))
        run_kernel(build_for(moe_splitk_cast_kernel(dt), y.device, {}), (ws, y), outputs=(1,))

    return launch
