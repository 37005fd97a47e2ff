"""The bf16 / f16 fused-MoE grouped GEMMs for sm_90a: ``wgmma`` (HGMMA) instead of mma.sync.

The same products and row conventions as ``moe_kernels``' gate-up and down kernels (see its
docstring): rows are the sorted positions ``p`` of ``moe_align`` (blocks of ``BM`` slots of one
expert ``e = expert_ids[p // BM]``, -1: the block exits), slot ``s = sorted_ids[p]`` is token
``t = s // TOPK``'s choice, padding slots (``s >= T * TOPK``) read zeros and are never stored::

    gate-up: inter[p, n] = act(w_s * x_t . w13[e, n]) * (w_s * x_t . w13[e, I + n])
    down:    y[s, n]     = w_s' * inter[p] . w2[e, n]

``w_s = topk_weights.flat[s]`` with ``SCALE_IN`` (the router weight on the input; 1 otherwise),
``w_s'`` the same weight without ``SCALE_IN`` (1 with it); ``act`` SiLU or exact (erf) GELU; dot
products accumulated in f32, ``inter`` / ``y`` rounded once to the activations' dtype.

Two shapes of kernel, chosen by ``moe_sm90_config`` from the slots per expert (sizes only):

- swap-AB (decode / medium, ``BM`` = 16, 32 or 64 sorted rows): one warp group; the weight tile
  (``BN = 64`` output columns x ``BK``) is the wgmma A operand and the gathered rows the N side
  (m64nBMk16), so a few tokens per expert waste no MMA rows; the accumulator is the transposed
  ``BN x BM`` tile. Weights and gathered rows come by cp.async into ``STAGES`` shared buffers,
  ``STAGES - 2`` k-tiles ahead, with one wgmma group kept in flight (``wgmma_wait(1)``): the
  buffer refilled at k-tile ``kt`` is the one k-tile ``kt - 2`` read, finished by every thread
  before the barrier that precedes the refill; ``fence_proxy_async`` before that barrier
  (cp.async writes through the generic proxy, wgmma reads through the async one).
- large-token (``*_ws``, prefill, ``BM = 128``): tokens on the wgmma M side, 64 rows per
  consumer warp group (two), weights as B; warp group 0 (setmaxnreg 40) loads a ``STAGES``-deep
  ring, the weight tiles by TMA and the token rows by cp.async (the producer / consumer loops of
  ``moe_fp8_kernels_sm90``: full / empty mbarriers, one wgmma group in flight).
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

from .blocks import (
    block_rows,
    expert_block,
    gathered_stages,
    in_flight_loop,
    load_tile,
    mma_group_end,
    sorted_rows,
    sorted_tokens,
    warp_specialized,
)
from .kernels_sm80 import MoeConfig

__all__ = ["moe_gate_up_sm90_kernel", "moe_down_sm90_kernel", "moe_gate_up_sm90_ws_kernel",
           "moe_down_sm90_ws_kernel", "moe_sm90_config", "sm90_consts", "is_sm90", "grouped_arch", "arch_tag",
           "ARCHS", "run_gate_up_sm90", "run_down_sm90", "SWAP_STAGES", "WS_STAGES"]

T, H, E, N2, I, EM, NB, S = hl.dims("T H E N2 I EM NB S")

#: swap-AB stages: (64 + 64 weight rows + BM token rows) x 128 bytes each, 2 k-tiles of prefetch
SWAP_STAGES = 4
#: large-token ring: 32 KiB per stage (128 token rows + 2 x 64 weight rows of 64 elements)
WS_STAGES = 6


def moe_sm90_config(num_slots: int, num_experts: int) -> MoeConfig:
    """The sm_90a config for ``num_slots = T * k`` routed rows over ``num_experts`` (sizes only:
    capture-safe), by the average slots per expert ``T * k / E``: up to 16 -> swap-AB
    ``BM = 16``, up to 32 -> 32, up to 64 -> 64, more -> the large-token kernels (``BM = 128``).
    ``BM`` is the alignment's block; ``BN`` / ``BK`` / ``WARPS`` are the sm_80 tiles (the split-K
    kernels read them; the sm_90a kernels take ``sm90_consts(BM)``)."""
    per = num_slots / max(num_experts, 1)
    bm = 16 if per <= 16 else 32 if per <= 32 else 64 if per <= 64 else 128
    return MoeConfig(BM=bm, BN=64, BK=64 if bm <= 32 else 32, WARPS=4)


def sm90_consts(bm: int) -> dict[str, Any]:
    """The kernel constants of the sm_90a kernels for block ``bm`` (128: the ``*_ws`` kernels)."""
    if bm == 128:
        return {"BM": 128, "BN": 64, "BK": 64, "STAGES": WS_STAGES, "CONSUMERS": 2}
    return {"BM": bm, "BN": 64, "BK": 64, "STAGES": SWAP_STAGES}


def _mma_group(pairs: Any, arch: str) -> None:
    """The mmas of one k-tile over ``(A, B, acc)`` triples, kept in flight (sm_90a: one wgmma group,
    the previous one retired; sm_100a: they release their stage, ``blocks.in_flight_loop``)."""
    hl.wgmma_fence()
    for a, b, acc in pairs:
        hl.mma(a, b, acc)
    mma_group_end(arch)


@cache
def moe_gate_up_sm90_kernel(dtype: DType, act: str = "silu", arch: str = "sm_90a") -> Any:
    """Swap-AB gate-up: for the ``BN`` columns ``n0 + n`` and the ``BM`` sorted rows ``p`` of a
    block, ``g^T[n, p] = sum_c w13[e, n0 + n, c] * x[t_p, c]``, ``u^T`` likewise with the up rows
    ``I + n0 + n``; ``inter[p, n0 + n] = act(w_p * g) * (w_p * u)`` (``w_p`` with ``SCALE_IN``)."""
    dt = dtype

    @hl.kernel(threads=128, name=f"moe_gate_up_{arch_tag(arch)}_{dt}_{act}")
    def moe_gate_up_sm90(x: dt[T, H], w13: dt[E, N2, H], sorted_ids: i32[EM], expert_ids: i32[NB],  # type: ignore
                         topk_w: f32[S], inter: dt[EM, I],  # type: ignore
                         *, BM: int = 16, BN: int = 64, BK: int = 64, STAGES: int = 4, TOPK: int = 1,
                         SCALE_IN: bool = False):
        Tx, Kx = x.shape
        Ix = inter.shape[1]
        e, m0, n0, _ = expert_block(expert_ids, Ix, BM, BN)
        with hl.if_(e >= 0):                                         # unused blocks exit
            rid, rrow = block_rows(sorted_ids, m0, BM, Tx * TOPK)
            tok = hl.where(rid >= 0, rid // TOPK, -1)
            sa, (sg, su), load = gathered_stages(x, tok, m0, None, dt, BM, BK, STAGES,
                                                 w13, e, (n0, Ix + n0), BN)
            acc_g = hl.zeros((BN, BM), f32)
            acc_u = hl.zeros((BN, BM), f32)
            # cp.async STAGES - 2 k-tiles ahead: one more stage stays free for the mmas in flight
            for _kt, st in in_flight_loop(hl.cdiv(Kx, BK), STAGES, load, arch):
                _mma_group(((sg[:, :, st], sa[:, :, st], acc_g), (su[:, :, st], sa[:, :, st], acc_u)), arch)
            g, u = acc_g, acc_u
            if SCALE_IN:
                w = load_tile(topk_w[rrow], (1, BM))
                g, u = g * w, u * w
            a = hl.gelu(g) if act == "gelu" else hl.silu(g)
            hl.copy(hl.cast(a * u, dt), hl.view(inter, (BM, BN), (m0, n0)).T)

    return moe_gate_up_sm90


@cache
def moe_down_sm90_kernel(dtype: DType, arch: str = "sm_90a") -> Any:
    """Swap-AB down: ``y^T[n, s_p] = w_p' * sum_c w2[e, n0 + n, c] * inter[p, c]`` for the ``BM``
    sorted rows ``p`` of a block (slot ``s_p``; ``w_p'`` = 1 with ``SCALE_IN``), padding rows
    not stored."""
    dt = dtype

    @hl.kernel(threads=128, name=f"moe_down_{arch_tag(arch)}_{dt}")
    def moe_down_sm90(inter: dt[EM, I], w2: dt[E, H, I], sorted_ids: i32[EM], expert_ids: i32[NB],  # type: ignore
                      topk_w: f32[S], y: dt[S, H],  # type: ignore
                      *, BM: int = 16, BN: int = 64, BK: int = 64, STAGES: int = 4, SCALE_IN: bool = False):
        e, m0, n0, _ = expert_block(expert_ids, y.shape[1], BM, BN)
        with hl.if_(e >= 0):
            rid, rrow = block_rows(sorted_ids, m0, BM, y.shape[0])
            sa, (sb,), load = gathered_stages(inter, None, m0, None, dt, BM, BK, STAGES, w2, e, (n0,), BN)
            acc = hl.zeros((BN, BM), f32)
            # cp.async STAGES - 2 k-tiles ahead: one more stage stays free for the mmas in flight
            for _kt, st in in_flight_loop(hl.cdiv(inter.shape[1], BK), STAGES, load, arch):
                _mma_group(((sb[:, :, st], sa[:, :, st], acc),), arch)
            out = acc
            if not SCALE_IN:
                out = out * load_tile(topk_w[rrow], (1, BM))
            hl.copy(hl.cast(out, dt), hl.view(y, (BM, BN), (None, n0), rows=rid).T)

    return moe_down_sm90


def _check_ws(name: str, bm: int, stages: int, consumers: int) -> None:
    if bm != 64 * consumers or stages < 2:
        raise ValueError(f"{name}: BM ({bm}) must be 64 * CONSUMERS ({consumers}) and STAGES ({stages}) >= 2")


@cache
def moe_gate_up_sm90_ws_kernel(dtype: DType, act: str = "silu", arch: str = "sm_90a") -> Any:
    """Large-token gate-up, tokens on the wgmma M side: for the ``BM`` sorted rows ``p`` (token
    ``t_p``) and the ``BN`` columns ``n0 + n``, ``g[p, n] = sum_c x[t_p, c] * w13[e, n0 + n, c]``,
    ``u`` with the up rows ``I + n0 + n``, ``inter[p, n0 + n] = act(w_p * g) * (w_p * u)``."""
    dt = dtype

    @hl.kernel(threads=lambda c: 128 * (1 + c["CONSUMERS"]),
               name=f"moe_gate_up_{arch_tag(arch)}_ws_{dt}_{act}")
    def moe_gate_up_sm90_ws(x: dt[T, H], w13: dt[E, N2, H], sorted_ids: i32[EM], expert_ids: i32[NB],  # type: ignore
                            topk_w: f32[S], inter: dt[EM, I],  # type: ignore
                            *, BM: int = 128, BN: int = 64, BK: int = 64, STAGES: int = 6, CONSUMERS: int = 2,
                            TOPK: int = 1, SCALE_IN: bool = False):
        _check_ws("moe_gate_up_sm90_ws", BM, STAGES, CONSUMERS)
        Tx, Kx = x.shape
        Ix = inter.shape[1]
        e, m0, n0, _ = expert_block(expert_ids, Ix, BM, BN)
        with hl.if_(e >= 0):

            def consume(mainloop: Any) -> None:
                acc_g, acc_u = hl.register(f32, (BM, BN)), hl.register(f32, (BM, BN))
                mainloop(acc_g, acc_u)
                g, u = acc_g, acc_u
                if SCALE_IN:
                    rid = sorted_rows(sorted_ids, m0, BM, Tx * TOPK)
                    w = load_tile(topk_w[rid], (BM, 1))
                    g, u = g * w, u * w
                a = hl.gelu(g) if act == "gelu" else hl.silu(g)
                hl.copy(hl.cast(a * u, dt), hl.view(inter, (BM, BN), (m0, n0)))

            def tokens() -> Any:                                     # the producer's rows of x
                return sorted_tokens(sorted_ids, m0, BM, Tx, TOPK)

            warp_specialized(x, tokens, w13, e, (n0, Ix + n0), Kx, dt, BM, BN, BK, STAGES, CONSUMERS, consume,
                             arch)

    return moe_gate_up_sm90_ws


@cache
def moe_down_sm90_ws_kernel(dtype: DType, arch: str = "sm_90a") -> Any:
    """Large-token down, tokens on the wgmma M side: for the ``BM`` sorted rows ``p`` (slot
    ``s_p``) and the ``BN`` output columns ``n0 + n`` (two wgmma halves of ``BN / 2``),
    ``y[s_p, n0 + n] = w_p' * sum_c inter[p, c] * w2[e, n0 + n, c]`` (``w_p'`` = 1 with
    ``SCALE_IN``), padding rows not stored."""
    dt = dtype

    @hl.kernel(threads=lambda c: 128 * (1 + c["CONSUMERS"]), name=f"moe_down_{arch_tag(arch)}_ws_{dt}")
    def moe_down_sm90_ws(inter: dt[EM, I], w2: dt[E, H, I], sorted_ids: i32[EM], expert_ids: i32[NB],  # type: ignore
                         topk_w: f32[S], y: dt[S, H],  # type: ignore
                         *, BM: int = 128, BN: int = 128, BK: int = 64, STAGES: int = 6, CONSUMERS: int = 2,
                         SCALE_IN: bool = False):
        _check_ws("moe_down_sm90_ws", BM, STAGES, CONSUMERS)
        if BN % 2:
            raise ValueError(f"moe_down_sm90_ws: BN ({BN}) must be even (two wgmma halves)")
        H2 = BN // 2
        e, m0, n0, _ = expert_block(expert_ids, y.shape[1], BM, BN)
        with hl.if_(e >= 0):

            def consume(mainloop: Any) -> None:
                acc_x, acc_y = hl.register(f32, (BM, H2)), hl.register(f32, (BM, H2))
                mainloop(acc_x, acc_y)
                rid = sorted_rows(sorted_ids, m0, BM, y.shape[0])
                ox, oy = acc_x, acc_y
                if not SCALE_IN:
                    w = load_tile(topk_w[rid], (BM, 1))
                    ox, oy = ox * w, oy * w
                hl.copy(hl.cast(ox, dt), hl.view(y, (BM, H2), (None, n0), rows=rid))
                hl.copy(hl.cast(oy, dt), hl.view(y, (BM, H2), (None, n0 + H2), rows=rid))

            def positions() -> Any:                                  # the producer's rows of inter
                return hl.iota((BM, 1), 0) + m0

            warp_specialized(inter, positions, w2, e, (n0, n0 + H2), inter.shape[1], dt, BM, H2, BK, STAGES,
                             CONSUMERS, consume, arch)

    return moe_down_sm90_ws


#: The architectures the kernels of this module are built for: sm_90a (wgmma) and sm_100a (the
#: same sources; synthesis gives their ``hl.mma`` tcgen05 with the accumulators in tensor memory
#: and the wgmma commit / wait tcgen05 commits on mbarriers, ``hexlayout.ir.lower.umma``).
ARCHS = ("sm_90a", "sm_100a")


def arch_tag(arch: str) -> str:
    """The architecture in a kernel name (``moe_gate_up_sm100_...`` on sm_100a)."""
    if arch not in ARCHS:
        raise ValueError(f"the wgmma / tcgen05 MoE kernels are built for {' or '.join(ARCHS)}, not {arch}")
    return "sm" + arch[3:].rstrip("a")


def grouped_arch(device: Any) -> str | None:
    """The architecture of the MoE GEMMs on ``device`` when it is one of ``ARCHS`` (a Hopper or
    B200 / GB200 device, or ``HEXLAYOUT_EMULATE_ARCH=sm_90a`` / ``sm_100a`` for CPU tensors);
    None: the sm_80 kernels."""
    from ..host.device import kernel_arch

    arch = kernel_arch(device)
    return arch if arch in ARCHS else None


def is_sm90(device: Any) -> bool:
    """Whether the MoE GEMMs on ``device`` run this module's kernels (``grouped_arch``)."""
    return grouped_arch(device) is not None


def run_gate_up_sm90(w13: Any, run: Any, inter: Any) -> None:
    """The gate-up launch of ``moe.run_moe_pipeline`` on sm_90a (``run``: its ``MoeRun``): the
    swap-AB kernel for ``run.cfg["BM"]`` 16 / 32 / 64, the large-token one for 128."""
    from ..host.launch import build_for, lang_dtype, run_kernel

    bm = run.cfg["BM"]
    kern = moe_gate_up_sm90_ws_kernel if bm == 128 else moe_gate_up_sm90_kernel
    consts = {**sm90_consts(bm), "TOPK": run.topk, "SCALE_IN": run.scale_in}
    arch = grouped_arch(run.x.device) or "sm_90a"
    bld = build_for(kern(lang_dtype(run.x.dtype), run.activation, arch), run.x.device, consts)
    run_kernel(bld, (run.x, w13, run.sorted_ids, run.expert_ids, run.topk_w, inter), outputs=(5,))


def run_down_sm90(w2: Any, run: Any, inter: Any, y: Any) -> None:
    """The down launch of ``moe.run_moe_pipeline`` on sm_90a (as ``run_gate_up_sm90``; the
    large-token kernel takes 128 output columns per block)."""
    from ..host.launch import build_for, lang_dtype, run_kernel

    bm = run.cfg["BM"]
    kern = moe_down_sm90_ws_kernel if bm == 128 else moe_down_sm90_kernel
    consts = {**sm90_consts(bm), "SCALE_IN": run.scale_in}
    if bm == 128:
        consts["BN"] = 128
    arch = grouped_arch(run.x.device) or "sm_90a"
    bld = build_for(kern(lang_dtype(run.x.dtype), arch), run.x.device, consts)
    run_kernel(bld, (inter, w2, run.sorted_ids, run.expert_ids, run.topk_w, y), outputs=(5,))
