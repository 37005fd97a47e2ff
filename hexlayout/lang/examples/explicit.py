"""GEMM kernels with every layout and instruction written out (no synthesis needed).

``c[M, N] = a[M, K] @ b[N, K]^T`` with f16 or bf16 inputs, f32 accumulation, the input type
out. These are what synthesis must reproduce (or beat) from the layout-free examples, and
what the emulator checks the lowering against.

- ``gemm_sm80_explicit``: multistage cp.async (16-byte, coalesced) into K-major shared
  stages swizzled with ``Swizzle<B,3,3>`` (``B = log2(BK/8)``: conflict-free ldmatrix),
  ldmatrix.x4 into the mma.sync m16n8k16 fragments of ``spatial(2,2) * repeat(BM/32, BN/16)``
  warps, register -> global epilogue.
- ``gemm_sm90_explicit``: one warp group; TMA box loads into 128-byte-swizzled K-major
  stages completing on ``full`` mbarriers (one expect_tx arrival per stage), wgmma
  64xBNx16 from shared-memory descriptors, ``repeat(BM/64, 1)`` over M.
"""

from __future__ import annotations

from typing import Any

import hexlayout.lang as hl
from hexlayout.arch import get_atom
from hexlayout.arch.dtypes import DType
from hexlayout.arch.gmma import gmma_smem_atom
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.lang import f32
from hexlayout.layout import ComposedLayout, Layout, Swizzle, composition, tile_to_shape

__all__ = ["gemm_sm80_explicit", "gemm_sm90_explicit", "gemm_sm90_ws_explicit", "staged"]

M, N, K = hl.dims("M N K")


def staged(tile: Layout | ComposedLayout, stages: int) -> Layout | ComposedLayout:
    """A rank-2 tile layout with a third (stage) mode of stride ``cosize(tile)``."""
    inner = tile.layout_b if isinstance(tile, ComposedLayout) else tile
    n = inner.shape[0] * inner.shape[1] if not isinstance(inner.shape[0], tuple) else inner.size()
    lay = Layout((inner.shape[0], inner.shape[1], stages), (inner.stride[0], inner.stride[1], n))
    return ComposedLayout(tile.layout_a, tile.offset, lay) if isinstance(tile, ComposedLayout) else lay


def _mma_atom(prefix: str, dtype: DType, shape: str) -> str:
    t = dtype.cute
    return f"{prefix}_{shape}_F32{t}{t}" + ("F32_TN" if prefix == "SM80" else "_SS")


def _sm90_stages(dtype: DType, BM: int, BN: int, BK: int, STAGES: int,
                 swizzle_bytes: int) -> tuple[Any, Any, int]:
    """The sm_90a shared stages: wgmma's canonical K-major atom with a ``swizzle_bytes``-byte swizzle
    tiled to ``BM x BK`` (``a``) and ``BN x BK`` (``b``), ``STAGES`` deep; and the bytes one stage
    of both holds (what a stage's ``full`` mbarrier expects)."""
    smem_a = staged(tile_to_shape(gmma_smem_atom(dtype.bits, "K", swizzle_bytes), (BM, BK)), STAGES)
    smem_b = staged(tile_to_shape(gmma_smem_atom(dtype.bits, "K", swizzle_bytes), (BN, BK)), STAGES)
    return smem_a, smem_b, (BM + BN) * BK * dtype.bits // 8


def _block_tiles(dt: DType, a: Any, b: Any, smem_a: Any, smem_b: Any, BM: int, BN: int, BK: int,
                 STAGES: int) -> tuple[Any, Any, Any, Any, Any]:
    """In a kernel: this block's output tile origin ``(m0, n0)`` (grid ``ceil(M / BM) x ceil(N /
    BN)``), the k-tile count ``ceil(K / BK)``, and the shared stages ``sa`` (``BM x BK x
    STAGES``, layout ``smem_a``) and ``sb`` (``BN x BK x STAGES``, ``smem_b``)."""
    M, K = a.shape
    N = b.shape[0]
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(M, BM), hl.cdiv(N, BN)))
    m0, n0 = pid_m * BM, pid_n * BN
    num_k = hl.cdiv(K, BK)
    sa = hl.shared(dt, (BM, BK, STAGES), layout=smem_a, name="sa")
    sb = hl.shared(dt, (BN, BK, STAGES), layout=smem_b, name="sb")
    return m0, n0, num_k, sa, sb


def _wgmma_stage(full: Any, sa: Any, sb: Any, acc: Any, k: Any, STAGES: int, atom: str, warps: Any) -> None:
    """In a kernel: wait until k-tile ``k`` landed in stage ``s = k % STAGES`` (phase ``(k //
    STAGES) % 2`` of ``full[s]``), then ``acc += sa[s] @ sb[s]^T`` by wgmma, retired before
    returning."""
    s = k % STAGES
    hl.wait(full, s, (k // STAGES) % 2)
    hl.wgmma_fence()
    hl.mma(sa[:, :, s], sb[:, :, s], acc, atom=atom, warps=warps)
    hl.wgmma_commit()
    hl.wgmma_wait(0)


def gemm_sm80_explicit(dtype: DType = hl.f16, *, BM: int = 128, BN: int = 128, BK: int = 32,
                       STAGES: int = 3, swizzle: bool = True, sync: bool = True) -> Any:
    """The sm_80 GEMM; ``swizzle=False`` keeps plain K-major stages (bank conflicts) and
    ``sync=False`` drops the barrier after ``wait_group`` (a race); both for demonstrations."""
    atom = _mma_atom("SM80", dtype, "16x8x16")
    warps = hl.spatial(2, 2) * hl.repeat(BM // 32, BN // 16)
    tm = TiledMma(get_atom(atom), warps, BK // 16)
    bits = {16: 1, 32: 2, 64: 3}[BK]
    tile_a = Layout((BM, BK), (BK, 1))
    tile_b = Layout((BN, BK), (BK, 1))
    if swizzle:
        tile_a = composition(Swizzle(bits, 3, 3), tile_a)
        tile_b = composition(Swizzle(bits, 3, 3), tile_b)
    smem_a, smem_b = staged(tile_a, STAGES), staged(tile_b, STAGES)
    dt = dtype

    @hl.kernel(threads=128, name=f"gemm_sm80_{dtype}")
    def gemm(a: dt[M, K], b: dt[N, K], c: dt[M, N]):  # type: ignore[valid-type]
        m0, n0, num_k, sa, sb = _block_tiles(dt, a, b, smem_a, smem_b, BM, BN, BK, STAGES)
        acc = hl.zeros((BM, BN), f32, layout=tm.c_tv())
        for s in range(STAGES - 1):
            hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, s * BK)), sa[:, :, s])
            hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, s * BK)), sb[:, :, s])
            hl.commit_group()
        for k in hl.range(num_k):
            hl.wait_group(STAGES - 2)
            if sync:
                hl.syncthreads()
            kn = k + (STAGES - 1)
            hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, kn * BK)), sa[:, :, kn % STAGES])
            hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, kn * BK)), sb[:, :, kn % STAGES])
            hl.commit_group()
            s = k % STAGES
            ra = hl.register(dt, (BM, BK), layout=tm.a_tv())
            rb = hl.register(dt, (BN, BK), layout=tm.b_tv())
            hl.copy(sa[:, :, s], ra)
            hl.copy(sb[:, :, s], rb)
            hl.mma(ra, rb, acc, atom=atom, warps=warps)
        hl.wait_group(0)
        hl.copy(hl.cast(acc, dt), hl.view(c, tile=(BM, BN), origin=(m0, n0)))

    return gemm


def gemm_sm90_explicit(dtype: DType = hl.f16, *, BM: int = 128, BN: int = 128, BK: int = 64,
                       STAGES: int = 3) -> Any:
    """The sm_90a GEMM (one warp group, TMA + mbarrier pipeline, wgmma SS)."""
    atom = _mma_atom("SM90", dtype, f"64x{BN}x16")
    warps = hl.spatial(1, 1) * hl.repeat(BM // 64, 1)
    tm = TiledMma(get_atom(atom), warps, BK // 16)
    swz = {32: 64, 64: 128}.get(BK, 128) if BK <= 64 else 128
    smem_a, smem_b, stage_bytes = _sm90_stages(dtype, BM, BN, BK, STAGES, swz)
    dt = dtype

    @hl.kernel(threads=128, name=f"gemm_sm90_{dtype}")
    def gemm(a: dt[M, K], b: dt[N, K], c: dt[M, N]):  # type: ignore[valid-type]
        m0, n0, num_k, sa, sb = _block_tiles(dt, a, b, smem_a, smem_b, BM, BN, BK, STAGES)
        full = hl.mbarrier(STAGES)
        for s in range(STAGES):
            hl.mbarrier_init(full, s, 1)
        hl.syncthreads()
        acc = hl.zeros((BM, BN), f32, layout=tm.c_tv())
        for s in range(STAGES - 1):
            hl.arrive(full, s, tx_bytes=stage_bytes, who="one")
            hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, s * BK)), sa[:, :, s], mbarrier=full[s])
            hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, s * BK)), sb[:, :, s], mbarrier=full[s])
        for k in hl.range(num_k):
            _wgmma_stage(full, sa, sb, acc, k, STAGES, atom, warps)
            hl.syncthreads()
            kn = k + (STAGES - 1)
            sn = kn % STAGES
            hl.arrive(full, sn, tx_bytes=stage_bytes, who="one")
            hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, kn * BK)), sa[:, :, sn], mbarrier=full[sn])
            hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, kn * BK)), sb[:, :, sn], mbarrier=full[sn])
        hl.copy(hl.cast(acc, dt), hl.view(c, tile=(BM, BN), origin=(m0, n0)))

    return gemm


def gemm_sm90_ws_explicit(dtype: DType = hl.f16, *, BM: int = 128, BN: int = 128, BK: int = 64,
                          STAGES: int = 4, CONSUMERS: int = 2) -> Any:
    """Warp-specialized sm_90a GEMM: warp group 0 produces (TMA into ``STAGES`` stages after
    waiting on ``empty``), warp groups ``1..CONSUMERS`` consume (wait ``full``, wgmma, release
    ``empty``), with register budgets moved by setmaxnreg."""
    atom = _mma_atom("SM90", dtype, f"64x{BN}x16")
    warps = hl.spatial(CONSUMERS, 1) * hl.repeat(BM // (64 * CONSUMERS), 1)
    tm = TiledMma(get_atom(atom), warps, BK // 16)
    smem_a, smem_b, stage_bytes = _sm90_stages(dtype, BM, BN, BK, STAGES, 128)
    dt = dtype

    @hl.kernel(threads=128 * (1 + CONSUMERS), name=f"gemm_sm90_ws_{dtype}")
    def gemm(a: dt[M, K], b: dt[N, K], c: dt[M, N]):  # type: ignore[valid-type]
        m0, n0, num_k, sa, sb = _block_tiles(dt, a, b, smem_a, smem_b, BM, BN, BK, STAGES)
        full = hl.mbarrier(STAGES)
        empty = hl.mbarrier(STAGES)
        for s in range(STAGES):
            hl.mbarrier_init(full, s, 1)
            hl.mbarrier_init(empty, s, CONSUMERS)
        hl.syncthreads()
        with hl.warp_group(0):
            hl.setmaxnreg(40, increase=False)
            for k in hl.range(num_k):
                s = k % STAGES
                hl.wait(empty, s, ((k // STAGES) % 2) ^ 1)
                hl.arrive(full, s, tx_bytes=stage_bytes, who="one")
                hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, k * BK)), sa[:, :, s], mbarrier=full[s])
                hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, k * BK)), sb[:, :, s], mbarrier=full[s])
        with hl.else_():
            hl.setmaxnreg(232, increase=True)
            acc = hl.zeros((BM, BN), f32, layout=tm.c_tv())
            for k in hl.range(num_k):
                _wgmma_stage(full, sa, sb, acc, k, STAGES, atom, warps)
                hl.arrive(empty, k % STAGES, who="warpgroup")          # release the stage
            hl.copy(hl.cast(acc, dt), hl.view(c, tile=(BM, BN), origin=(m0, n0)))

    return gemm
