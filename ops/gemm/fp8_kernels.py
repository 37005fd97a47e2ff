"""Dense FP8 (e4m3) GEMM kernels with 128-block scales, per architecture (``hexlayout.ops.gemm_fp8``).

Notation: ``a`` ``[M, K]`` e4m3 with per-token-group scales ``as_[m, kt]`` f32, passed transposed as
``as_t`` ``[ceil(K / 128), M]`` (the column-major scales of vLLM's ``per_token_group_quant_fp8(...,
column_major_scales=True)``, DeepGEMM's layout: a k-tile's scales of consecutive rows are contiguous),
``b`` ``[N, K]`` e4m3 with block scales ``bs`` ``[ceil(N / 128), ceil(K / 128)]`` f32; every
kernel computes::

    c[m, n] = odt( sum_kt as_[m, kt] * bs[n // 128, kt] * sum_{k in k-tile kt} a[m, k] * b[n, k]
                   (+ bias[n]) )

over the 128-wide k-tiles ``kt`` (``BK = 128``: one scale column per k-tile; the ragged last
k-tile reads zeros past ``K``), accumulated in f32. A column tile of ``BN`` dividing 128 lies in
one 128-row scale block of ``b``, so its weight scale per k-tile is one number.

They are the MoE FP8 grouped GEMMs' schedules (``ops/moe/fp8_kernels_sm89.py``,
``fp8_kernels_sm90.py``, ``fp8_kernels_sm100.py``) for one expert and rows in order: plain
``hl.view`` tiles of ``a`` (no ``sorted_ids`` gather, no expert lookup, no ``-1`` block), the
activation scale per row and k-tile instead of one per row, and the same shared building blocks
(``moe.blocks.wgmma_pipeline`` / ``check_in_flight_stages``, ``moe.fp8_kernels_sm100.ue8m0_of``):

- ``gemm_fp8_sm89_kernel``: e4m3 ``mma.sync.m16n8k32`` (sm_89), ``BM x BN`` tiles, cp.async
  ``STAGES``; each k-tile's partial product ``p`` (scale-d 0) is added as ``acc += p *
  (as_[rows, kt] * bs[n0 // 128, kt])``.
- ``gemm_fp8_sm90_kernel(odt, arch)``: swap-AB ``wgmma`` m64nNk32 from shared memory (sm_90a) or
  e4m3 ``tcgen05.mma`` with the accumulators in tensor memory (the same source built for
  sm_100a): the ``BN = 64`` weight rows are the MMA's M side, ``BM`` (16 / 32 / 64) rows of ``a``
  its N side; partials per k-tile, two used alternately (``wgmma_pipeline``), scaled in
  registers as above, the k-tile's scales cp.async-staged in shared memory with its operands.
- ``gemm_fp8_sm90_ws_kernel(odt, arch)``: more than 64 rows: ``BM = 128`` rows of ``a`` on the MMA's
  M side times ``BN = 128`` columns of ``b`` in two halves, warp-specialized (``moe.blocks.
  warp_specialized``: a producer warp group loading ``b`` by TMA and ``a`` by cp.async into a ring,
  two consumer warp groups); each half's k-tile partial scaled as above.
- ``gemm_fp8_sm100_ue8m0_kernel``: every scale a power of two (UE8M0: DeepSeek-V3.1's checkpoints
  with UE8M0 activation quantization, MXFP8): the block-scaled ``tcgen05.mma`` (kind::mxf8f6f4)
  applies both sides' factors inside the MMA, ``acc[n, m] += sum_kb (b[n, kb] * 2^(SFB[n, kb] -
  127)) (a[m, kb] * 2^(SFA[m, kb] - 127))`` over the 32-wide k-blocks, with the factors the
  exponent bytes of ``bs[n // 128, kt]`` and ``as_[m, kt]`` (repeated for a k-tile's four
  k-blocks), written into each stage when it is loaded and copied to tensor memory by the
  issuing thread (``tcgen05.cp``); nothing is scaled in registers. ``BN = 128`` (the
  block-scaled MMA's M), ``BM`` a multiple of 8 up to 64.

``HAS_BIAS``: ``bias`` ``[N]`` f32 added in the epilogue (a one-element dummy otherwise).
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import e4m3, f32, u8

from ..moe.blocks import check_in_flight_stages, load_tile, warp_specialized, wgmma_pipeline
from ..moe.fp8_kernels_sm89 import SCALE_BLOCK  # the scale group / block side along K and N: 128
from ..moe.fp8_kernels_sm100 import BN_BS, ue8m0_of
from ..moe.kernels_sm90 import arch_tag

__all__ = ["gemm_fp8_sm89_kernel", "gemm_fp8_sm90_kernel", "gemm_fp8_sm90_ws_kernel",
           "gemm_fp8_sm100_ue8m0_kernel", "SCALE_BLOCK", "BN_BS", "MAX_BM_BS"]

M, K, N, MB, KB, NB, NBIAS, E = hl.dims("M K N MB KB NB NBIAS E")

#: weight rows per tile of the block-scaled tcgen05.mma (its M, one CTA)
#: most rows of ``a`` per block-scaled tile (the MMA's N side; 128 x BM f32 accumulator)
MAX_BM_BS = 64
#: activation scales a swap-AB stage holds (one per thread of the 128; the tile's BM <= 64 used)
SCALE_ROWS = 128
#: 32-wide k-blocks per 128-wide k-tile (one UE8M0 factor each)
KBLOCKS = SCALE_BLOCK // 32


def _check(name: str, bn: int, bk: int) -> None:
    if bk != SCALE_BLOCK or SCALE_BLOCK % bn:
        raise ValueError(f"{name}: BK ({bk}) must be {SCALE_BLOCK} (one scale column per k-tile) and BN "
                         f"({bn}) divide {SCALE_BLOCK} (a column tile in one scale block)")


def _b_scale(bs: Any, n0: Any, kt: Any) -> Any:
    """``bs[n0 // 128, kt]`` as a ``(1, 1)`` register tile (the tile's one weight scale)."""
    return load_tile(bs[hl.iota((1, 1), 0) + n0 // SCALE_BLOCK, kt], (1, 1))


def _tiles(a: Any, b: Any, bm: int, bn: int, bk: int, stages: int) -> tuple[Any, Any, Any, Any, Any, Any]:
    """``(m0, n0, num_k, sa, sb, load)``: this block's first row of ``a`` and of ``b`` over a grid of
    ``ceil(M / bm) x ceil(N / bn)`` tiles, its k-tile count, the shared stages of ``a`` and ``b`` and
    the ``hl.pipeline`` load filling stage ``st`` with k-tile ``kt`` (ragged edges read as 0)."""
    mx, kx = a.shape
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(mx, bm), hl.cdiv(b.shape[0], bn)))
    m0, n0 = pid_m * bm, pid_n * bn
    sa = hl.shared(e4m3, (bm, bk, stages))
    sb = hl.shared(e4m3, (bn, bk, stages))

    def load(kt: Any, st: Any) -> None:
        hl.copy(hl.view(a, (bm, bk), (m0, kt * bk)), sa[:, :, st])
        hl.copy(hl.view(b, (bn, bk), (n0, kt * bk)), sb[:, :, st])

    return m0, n0, hl.cdiv(kx, bk), sa, sb, load


def _epilogue(acc: Any, bias: Any, cols: Any, has_bias: bool) -> Any:
    """``acc + bias[cols]`` (``cols``: the column index tile, broadcast along the other axis)."""
    if has_bias:
        return acc + load_tile(bias[cols], cols.shape)
    return acc


@cache
def gemm_fp8_sm89_kernel(odt: DType) -> Any:
    """The sm_89 kernel (see the module docstring): e4m3 ``mma.sync``, a partial per k-tile scaled
    by the row's activation scale times the tile's weight scale. Constants: ``BM``, ``BN`` (divides
    128), ``BK`` (128), ``STAGES``, ``WARPS``, ``HAS_BIAS``."""
    name = f"gemm_fp8_sm89_{odt}"

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=name)
    def gemm_fp8_sm89(a: e4m3[M, K], as_t: f32[KB, MB], b: e4m3[N, K], bs: f32[NB, KB],  # type: ignore
                      bias: f32[NBIAS], c: odt[M, N],  # type: ignore
                      *, BM: int = 64, BN: int = 64, BK: int = 128, STAGES: int = 2, WARPS: int = 4,
                      HAS_BIAS: bool = False):
        _check(name, BN, BK)
        m0, n0, num_k, sa, sb, load = _tiles(a, b, BM, BN, BK, STAGES)
        rows = hl.iota((BM, 1), 0) + m0
        acc = hl.zeros((BM, BN), f32)
        for kt, st in hl.pipeline(num_k, STAGES, load):
            ra = hl.register(e4m3, (BM, BK))
            rb = hl.register(e4m3, (BN, BK))
            hl.copy(sa[:, :, st], ra)
            hl.copy(sb[:, :, st], rb)
            p = hl.zeros((BM, BN), f32)
            hl.mma(ra, rb, p)
            acc += p * (load_tile(as_t[kt, rows], (BM, 1)) * _b_scale(bs, n0, kt))
        out = _epilogue(acc, bias, hl.iota((1, BN), 1) + n0, HAS_BIAS)
        hl.copy(hl.cast(out, odt), hl.view(c, (BM, BN), (m0, n0)))

    return gemm_fp8_sm89


@cache
def gemm_fp8_sm90_kernel(odt: DType, arch: str = "sm_90a") -> Any:
    """The swap-AB ``wgmma`` (sm_90a) / ``tcgen05`` (sm_100a) kernel (see the module docstring).
    Constants: ``BM`` (rows of ``a``: 16 / 32 / 64), ``BN`` (64), ``BK`` (128), ``STAGES`` (>= 3),
    ``HAS_BIAS``. The activation scales come transposed, ``as_t`` ``[ceil(K / 128), M]`` (the
    column-major ``a_scale`` of vLLM's ``per_token_group_quant_fp8(column_major_scales=True)``,
    DeepGEMM's layout), so a k-tile's ``BM`` scales are one contiguous row: copied by cp.async with
    the operand tiles into a shared stage, read from there when the partial is scaled."""
    name = f"gemm_fp8_{arch_tag(arch)}_{odt}"

    @hl.kernel(threads=128, name=name)
    def gemm_fp8_sm90(a: e4m3[M, K], as_t: f32[KB, MB], b: e4m3[N, K], bs: f32[NB, KB],  # type: ignore
                      bias: f32[NBIAS], c: odt[M, N],  # type: ignore
                      *, BM: int = 64, BN: int = 64, BK: int = 128, STAGES: int = 4, HAS_BIAS: bool = False):
        _check(name, BN, BK)
        m0, n0, num_k, sa, sb, load_ab = _tiles(a, b, BM, BN, BK, STAGES)
        # the k-tile's activation scales, staged with it: 128 of them (one per thread; BM used)
        ssa = hl.shared(f32, (1, SCALE_ROWS, STAGES))

        def load(kt: Any, st: Any) -> None:
            load_ab(kt, st)
            kc = hl.minimum(kt, bs.shape[1] - 1)     # prefetches past K: the last column (unused)
            hl.copy(hl.view(as_t, (1, SCALE_ROWS), (kc, m0)), ssa[:, :, st])

        acc = hl.zeros((BN, BM), f32)
        parts = [hl.register(f32, (BN, BM)) for _ in range(2)]

        def step(kt: Any, st: Any, slot: int) -> None:
            hl.wgmma_fence()
            hl.mma(sb[:, :, st], sa[:, :, st], parts[slot], accumulate=False)
            hl.wgmma_commit()  # in flight while the previous k-tile's partial is scaled

        def finish(kt: Any, slot: int) -> None:   # stage kt % STAGES is refilled two k-tiles later
            st = kt % STAGES
            sx = hl.register(f32, (1, BM))
            hl.copy(ssa[:, 0:BM, st], sx)
            hl.assign(acc, acc + parts[slot] * (sx * _b_scale(bs, n0, kt)))

        wgmma_pipeline(name, num_k, STAGES, load, step, finish)
        out = _epilogue(acc, bias, hl.iota((BN, 1), 0) + n0, HAS_BIAS)
        hl.copy(hl.cast(out, odt), hl.view(c, (BM, BN), (m0, n0)).T)

    return gemm_fp8_sm90


@cache
def gemm_fp8_sm90_ws_kernel(odt: DType, arch: str = "sm_90a") -> Any:
    """The many-row kernel (sm_90a, and sm_100a with general scales; the MoE FP8 ``*_ws`` kernels'
    schedule, ``moe.blocks.warp_specialized``): ``BM = 64 * CONSUMERS`` rows of ``a`` on the MMA's M
    side times two ``BN / 2``-column halves of ``b``; warp group 0 loads a ``STAGES``-deep ring (the
    ``b`` tiles by TMA, the rows of ``a`` by cp.async), the consumer warp groups issue the wgmma /
    tcgen05 MMAs and add each half's k-tile partial as ``acc += p * (as_[rows, kt] * bs[n0 // 128,
    kt])`` (the scales loaded before the stage's wait). ``b`` comes as ``[1, N, K]`` (the TMA box's
    expert mode). Constants: ``BM`` (``64 * CONSUMERS``), ``BN`` (divides 128, even), ``BK`` (128),
    ``STAGES``, ``CONSUMERS``, ``HAS_BIAS``."""
    name = f"gemm_fp8_{arch_tag(arch)}_ws_{odt}"

    @hl.kernel(threads=lambda c: 128 * (1 + c["CONSUMERS"]), name=name)
    def gemm_fp8_sm90_ws(a: e4m3[M, K], as_t: f32[KB, MB], b: e4m3[E, N, K], bs: f32[NB, KB],  # type: ignore
                         bias: f32[NBIAS], c: odt[M, N],  # type: ignore
                         *, BM: int = 128, BN: int = 128, BK: int = 128, STAGES: int = 6, CONSUMERS: int = 2,
                         HAS_BIAS: bool = False):
        _check(name, BN, BK)
        if BM != 64 * CONSUMERS or BN % 2 or STAGES < 3:
            raise ValueError(f"{name}: BM ({BM}) must be 64 * CONSUMERS ({CONSUMERS}), BN ({BN}) even and "
                             f"STAGES ({STAGES}) >= 3")
        Mx, Kx = a.shape
        H2 = BN // 2
        pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(Mx, BM), hl.cdiv(b.shape[1], BN)))
        m0, n0 = pid_m * BM, pid_n * BN

        def rows() -> Any:                               # the producer's rows of a (past M: -1, zeros)
            r = hl.iota((BM,), 0) + m0
            return hl.where(r < Mx, r, -1)

        def consume(mainloop: Any) -> None:
            rc = hl.iota((BM, 1), 0) + m0
            held: list[Any] = []

            def scale_x(kt: Any) -> Any:                 # the row scales times the tile's weight scale
                held[:] = [load_tile(as_t[kt, rc], (BM, 1)) * _b_scale(bs, n0, kt)]
                return held[0]

            acc_x, acc_y = hl.zeros((BM, H2), f32), hl.zeros((BM, H2), f32)
            mainloop(acc_x, acc_y, scale_x, lambda kt: (lambda: held[0]))   # one load for both halves
            for acc, c0 in ((acc_x, n0), (acc_y, n0 + H2)):
                out = _epilogue(acc, bias, hl.iota((1, H2), 1) + c0, HAS_BIAS)
                hl.copy(hl.cast(out, odt), hl.view(c, (BM, H2), (m0, c0)))

        warp_specialized(a, rows, b, 0, (n0, n0 + H2), Kx, e4m3, BM, H2, BK, STAGES, CONSUMERS, consume)

    return gemm_fp8_sm90_ws


def _factors(scale_t: Any, r0: Any, kt: Any, valid: int) -> Any:
    """The ``(128, 4)`` UE8M0 factors of rows ``r0 .. r0 + valid`` at k-tile ``kt`` of the transposed
    scales ``scale_t`` ``[k-tiles, rows]``
    (its exponent bytes, the same for the k-tile's four 32-wide k-blocks); rows past ``valid`` or
    past the tensor read scale 0: factor 0 (their MMA columns are never stored)."""
    i = hl.iota((BN_BS, KBLOCKS), 0)
    idx = hl.where(i < valid, i + r0, -1)
    return ue8m0_of(load_tile(scale_t[kt, idx], (BN_BS, KBLOCKS)))


@cache
def gemm_fp8_sm100_ue8m0_kernel(odt: DType) -> Any:
    """The block-scaled ``tcgen05.mma`` kernel for UE8M0 scales (see the module docstring).
    Constants: ``BM`` (rows of ``a``: a multiple of 8 in [8, 64]), ``BN`` (128), ``BK`` (128),
    ``STAGES`` (>= 3), ``HAS_BIAS``."""
    name = f"gemm_fp8_sm100_ue8m0_{odt}"

    @hl.kernel(threads=128, name=name)
    def gemm_fp8_sm100_ue8m0(a: e4m3[M, K], as_t: f32[KB, MB], b: e4m3[N, K], bs: f32[NB, KB],  # type: ignore
                             bias: f32[NBIAS], c: odt[M, N],  # type: ignore
                             *, BM: int = 64, BN: int = 128, BK: int = 128, STAGES: int = 4,
                             HAS_BIAS: bool = False):
        if BN != BN_BS or BK != SCALE_BLOCK or BM % 8 or not 8 <= BM <= MAX_BM_BS:
            raise ValueError(f"{name}: BN ({BN}) must be {BN_BS} (the block-scaled tcgen05.mma's M), BK "
                             f"({BK}) {SCALE_BLOCK} and BM ({BM}) a multiple of 8 in [8, {MAX_BM_BS}]")
        check_in_flight_stages(name, STAGES)
        m0, n0, num_k, sa, sb, load_ab = _tiles(a, b, BM, BN, BK, STAGES)
        fa = hl.shared(u8, (BN_BS, KBLOCKS, STAGES))
        fb = hl.shared(u8, (BN_BS, KBLOCKS, STAGES))

        def load(kt: Any, st: Any) -> None:
            load_ab(kt, st)
            kc = hl.minimum(kt, bs.shape[1] - 1)     # prefetches past K: the last column (unused)
            blk = hl.iota((BN_BS, KBLOCKS), 0) * 0 + n0 // SCALE_BLOCK   # the tile's one scale block
            hl.copy(ue8m0_of(load_tile(bs[blk, kc], (BN_BS, KBLOCKS))), fb[:, :, st])
            hl.copy(_factors(as_t, m0, kc, BM), fa[:, :, st])

        acc = hl.zeros((BN, BM), f32)
        ahead = STAGES - 2
        for _kt, st in hl.pipeline(num_k, STAGES, load, ahead=ahead, async_proxy=True,
                                   wgmma_in_flight=True):
            hl.wgmma_fence()
            hl.mma(sb[:, :, st], sa[:, :, st], acc, scale_a=fb[:, :, st], scale_b=fa[:, :, st])
            hl.wgmma_commit()
            hl.wgmma_wait(1)
        out = _epilogue(acc, bias, hl.iota((BN, 1), 0) + n0, HAS_BIAS)
        hl.copy(hl.cast(out, odt), hl.view(c, (BM, BN), (m0, n0)).T)

    return gemm_fp8_sm100_ue8m0
