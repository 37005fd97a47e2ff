"""GEMM kernels in the tile language, layout-free: the anchors of post-scheduling fusion.

``c[M, N] = A @ B`` where ``A`` is ``a[M, K]`` (``a_layout="mk"``, K-major) or
``a[K, M]^T`` (``a_layout="km"``, M-major) and ``B`` is ``b[N, K]^T`` (``b_layout="nk"``,
K-major) or ``b[K, N]`` (``b_layout="kn"``, N-major), f16 or bf16 inputs, f32 accumulation,
output in the input type. The operands' stored (physical) matrices have unit stride in their
last mode and are dense (leading stride = row length), or with ``ld=(True, ...)`` /
``(..., True)`` take a free leading stride (the scalar sizes ``LDA`` / ``LDB``, bound at
launch from the tensors' strides: slices of bigger tensors run as they are; the dense variant
addresses rows with ``K`` / ``M`` / ``N``, fewer main-loop instructions on sm_80);
``leading_dims`` says which variant a pair of stored operands takes. ``c`` is row-major dense.
The kernels are scheduled alone; their operand loads and their stores of the accumulator
(``copy(cast(acc), view(c))``, or with ``stage_epilogue=True`` ``copy(cast(acc window),
staging tile)`` then ``copy(staging tile, view(c))``) are the fusion points where
``hexlayout.fusion`` puts prologues and epilogues (bias, activation, residual, scale, ...):
``hexlayout.ops.gemm`` builds its epilogue that way.

- ``gemm_sm80_kernel``: multistage cp.async pipeline (``STAGES`` shared buffers, one
  barrier per k-tile), shared -> register copies and mma.sync; synthesis picks the
  swizzles, ldmatrix (.trans for an M-major A / N-major B), the mma atom and the warp arrangement.
- ``gemm_sm90_kernel``: warp-specialized: warp group 0 issues TMA copies into
  ``STAGES`` stages (``full``/``empty`` mbarriers), the consumer warp groups run wgmma
  from shared memory and the epilogue; register budgets move with setmaxnreg. Persistent
  over output tiles: ``GRID`` blocks walk the tiles (``GRID = 0``: one block per tile).
- ``gemm_sm100_kernel``: the same source built for sm_100a: synthesis gives its ``hl.mma``
  tcgen05 (one issuing thread, accumulator in tensor memory, read back by ``tcgen05.ld``).

Kernels are built by factories specialized on the dtype and the A and B layouts; tile shapes
are keyword constants of the kernel. ``gemm_anchor(arch, dtype, b_layout)`` is the factory of
an architecture; ``fusion`` registers it with ``hexlayout.fusion`` (the GEMM anchor records
of ``mm``, ``addmm``, ``linear``, ``bmm`` and ``hexlayout.gemm``).
"""

# Annotations are evaluated when a kernel is defined (no ``from __future__ import annotations``):
# the tensor types depend on the factory's arguments.
import contextlib
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.arch.tmem import accumulator_stages
from hexlayout.lang import f32

__all__ = ["gemm_sm80_kernel", "gemm_sm90_kernel", "gemm_sm100_kernel",
           "gemm_anchor", "leading_dims", "ARCH_KERNELS"]

M, N, K = hl.dims("M N K")


def _check(dtype: DType, b_layout: str, a_layout: str = "mk") -> None:
    if dtype.name not in ("f16", "bf16"):
        raise ValueError(f"hexlayout gemm: inputs must be f16 or bf16, not {dtype}")
    if b_layout not in ("nk", "kn"):
        raise ValueError(f"hexlayout gemm: b_layout must be 'nk' (b is N x K) or 'kn' (b is K x N), "
                         f"not {b_layout!r}")
    if a_layout not in ("mk", "km"):
        raise ValueError(f"hexlayout gemm: a_layout must be 'mk' (a is M x K) or 'km' (a is K x M), "
                         f"not {a_layout!r}")


def leading_dims(a: Any, b: Any) -> tuple[bool, bool]:
    """Whether the GEMM kernel takes each stored operand with a free leading stride (the
    ``ld`` of the factories): for ``a`` / ``b`` (a stored ``rows x cols`` matrix with unit
    stride along ``cols``, or a batch of them: the last two modes; ``None``: computed by a
    prologue, not read from memory) ``False`` when it is dense - leading stride ``== cols``, or
    one row (whose leading stride is never used) - else ``True`` (``LDA`` / ``LDB``). The one
    choice ``hexlayout.ops.gemm`` and the fused GEMMs make."""
    def free(t: Any) -> bool:
        return t is not None and t.shape[-2] > 1 and t.stride(-2) != t.shape[-1]

    return free(a), free(b)


def _operand_types(dt: DType, a_layout: str, b_layout: str, ld: tuple[bool, bool]) -> tuple[Any, Any]:
    """The parameter types of ``a`` and ``b``: the stored matrix (``M x K`` / ``K x M``,
    ``N x K`` / ``K x N``) with unit stride in its last mode, dense, or (``ld[0]`` /
    ``ld[1]``) with the leading stride ``LDA`` / ``LDB`` (a scalar size bound from the
    tensor's stride at launch)."""
    a_type = dt[(M, K) if a_layout == "mk" else (K, M)]
    b_type = dt[(N, K) if b_layout == "nk" else (K, N)]
    return a_type.strides("LDA", 1) if ld[0] else a_type, b_type.strides("LDB", 1) if ld[1] else b_type


def _suffix(a_layout: str, b_layout: str, ld: tuple[bool, bool]) -> str:
    """The kernel name's layout part: ``b_layout``, with ``km_`` before it for an M-major A,
    and ``_lda`` / ``_ldb`` / ``_ldab`` after it for the operands with a free leading stride."""
    lds = "".join(x for x, on in zip("ab", ld) if on)
    return (b_layout if a_layout == "mk" else f"km_{b_layout}") + (f"_ld{lds}" if lds else "")


def _epilogue_window(bm: int, bn: int, dt: DType) -> int:
    """Columns of the output tile staged at once on sm_90a: the widest power-of-two divisor
    ``w`` of ``bn`` whose ``bm x w`` tile fits ``SM90_EPILOGUE_SMEM`` (the shared memory
    ``sm90_stages`` leaves beside the pipeline stages)."""
    from .config import SM90_EPILOGUE_SMEM

    w = bn
    while w > 8 and (bm * w * dt.bytes > SM90_EPILOGUE_SMEM or bn % w):
        w //= 2
    return w


def _store_accumulator(acc: Any, c: Any, sc: Any, m0: Any, n0: Any, dt: DType, W: int) -> None:
    """Store the ``BM x BN`` fp32 accumulator ``acc`` as ``dt`` into ``c[m0:m0+BM, n0:n0+BN]``
    (the fusion point of epilogues): with ``sc=None`` in one register-to-global store; else
    staged through the ``BM x W`` shared tile ``sc`` in ``BN / W`` column windows, window ``j``
    being columns ``[jW, (j+1)W)``: a barrier (the previous window's, or tile's, reader of
    ``sc`` is done), ``acc``'s window cast into ``sc``, a barrier, ``sc`` copied to ``c``."""
    BM, BN = acc.shape
    if sc is None:
        hl.copy(hl.cast(acc, dt), hl.view(c, tile=(BM, BN), origin=(m0, n0)))
        return
    for j in range(BN // W):
        hl.syncthreads()
        hl.copy(hl.cast(acc[:, j * W:(j + 1) * W], dt), sc)
        hl.syncthreads()
        hl.copy(sc, hl.view(c, tile=(BM, W), origin=(m0, n0 + j * W)))


@cache
def gemm_sm80_kernel(dtype: DType, b_layout: str = "nk", stage_epilogue: bool = False,
                     a_layout: str = "mk", ld: tuple[bool, bool] = (False, False)) -> Any:
    """The Ampere multistage GEMM ``c = A @ B`` for ``dtype`` / ``a_layout`` / ``b_layout``
    (an M-major A is loaded into a ``BK x BM`` shared tile and read transposed); the accumulator
    is stored from registers in one ``BM x BN`` store, or with ``stage_epilogue=True`` (or
    the kernel constant ``STAGE_EPILOGUE``) through shared memory in 16-byte stores (rows of
    ``c`` must then be 16-byte aligned: ``N % 8 == 0``; ``hexlayout.ops.gemm`` chooses it
    whenever they are). ``ld``: whether ``a`` / ``b`` take a free leading stride ``LDA`` /
    ``LDB`` (else dense: see ``leading_dims``)."""
    _check(dtype, b_layout, a_layout)
    dt = dtype
    ld = (bool(ld[0]), bool(ld[1]))
    a_type, b_type = _operand_types(dt, a_layout, b_layout, ld)
    mk = a_layout == "mk"

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"gemm_sm80_{dt}_{_suffix(a_layout, b_layout, ld)}")
    def gemm(a: a_type, b: b_type, c: dt[M, N],  # type: ignore
             *, BM: int = 128, BN: int = 128, BK: int = 32, STAGES: int = 3, WARPS: int = 4,
             STAGE_EPILOGUE: bool = False):
        staged = stage_epilogue or STAGE_EPILOGUE
        Mx, Kx = a.shape if mk else a.shape[::-1]
        Nx = c.shape[1]
        pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(Mx, BM), hl.cdiv(Nx, BN)))
        m0, n0 = pid_m * BM, pid_n * BN
        num_k = hl.cdiv(Kx, BK)
        sa = hl.shared(dt, (BM, BK, STAGES) if mk else (BK, BM, STAGES))
        sb = hl.shared(dt, (BN, BK, STAGES) if b_layout == "nk" else (BK, BN, STAGES))
        acc = hl.zeros((BM, BN), f32)

        def load(kt: Any, s: Any) -> None:
            if mk:
                hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, kt * BK)), sa[:, :, s])
            else:
                hl.copy(hl.view(a, tile=(BK, BM), origin=(kt * BK, m0)), sa[:, :, s])
            if b_layout == "nk":
                hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, kt * BK)), sb[:, :, s])
            else:
                hl.copy(hl.view(b, tile=(BK, BN), origin=(kt * BK, n0)), sb[:, :, s])

        for _k, s in hl.pipeline(num_k, STAGES, load):
            ra = hl.register(dt, (BM, BK))
            rb = hl.register(dt, (BN, BK))
            hl.copy(sa[:, :, s] if mk else sa[:, :, s].T, ra)
            hl.copy(sb[:, :, s] if b_layout == "nk" else sb[:, :, s].T, rb)
            hl.mma(ra, rb, acc)
        # the fusion point of epilogues: the accumulator stored, or staged through shared memory (32-bit
        # shared stores, 16-byte shared loads and global stores: stmatrix is sm_90+) in column
        # windows of W = BK columns (32 for the 64 x 64 tile), through the first A stage buffer,
        # which the main loop no longer reads after the first barrier (no extra shared memory;
        # 128x128x32 on 4 warps: 231 registers, no spills, where a separate BM x BN tile spilled
        # at 255; at 64x64x64 with a K x N B, ptxas held 96 registers and spilled 8 B with
        # 64-column windows, none with 32; 32 at 128x128x64 spilled 4 B instead)
        W = min(BK, 32) if (BM, BN) == (64, 64) else BK
        if staged and BN % W:
            raise ValueError(f"hexlayout gemm: gemm_sm80 stages its epilogue in {W}-column windows: "
                             f"BN ({BN}) must be a multiple of {W}")
        # (an M-major A's stages are BK x BM: the window gets its own BM x W tile)
        sc = (sa[:, :W, 0] if mk else hl.shared(dt, (BM, W))) if staged else None
        _store_accumulator(acc, c, sc, m0, n0, dt, W)

    return gemm


@cache
def gemm_sm90_kernel(dtype: DType, b_layout: str = "nk", stage_epilogue: bool = False,
                     peer_release: bool = True, a_layout: str = "mk",
                     ld: tuple[bool, bool] = (False, False)) -> Any:
    """The Hopper warp-specialized, persistent TMA + wgmma GEMM (``_warp_specialized_gemm``)."""
    return _warp_specialized_gemm("sm_90a", dtype, b_layout, stage_epilogue, peer_release, a_layout, ld)


@cache
def gemm_sm100_kernel(dtype: DType, b_layout: str = "nk", stage_epilogue: bool = False,
                      a_layout: str = "mk", ld: tuple[bool, bool] = (False, False),
                      peer_release: bool = True) -> Any:
    """The same kernel source as ``gemm_sm90_kernel``, built for Blackwell (sm_100a): synthesis
    turns its ``hl.mma`` on shared tiles into single-thread ``tcgen05.mma`` with the accumulator
    in tensor memory and its wgmma commit / wait into ``tcgen05.commit`` on mbarriers; the
    epilogue reads the accumulator with the ``tcgen05.ld`` synthesis chooses
    (``hexlayout.ir.lower.umma``). One CTA per MMA (``cta_group::1``): ``BM`` 64 or 128,
    ``CLUSTER=1``; persistent with ``GRID > 0``. ``CLUSTER=2``: a pair of CTAs per MMA
    (``cta_group::2``, ``BM=128``; persistent with ``GRID > 0`` pairs): the pair computes a
    ``2 BM x BN`` tile, CTA ``r``
    its rows ``BM r ..``; each CTA stages its ``BM`` rows of A and its half (``BN/2`` rows) of the
    pair's B tile, and the ``hl.mma`` in its pair form (``sb`` of ``BN/2`` rows, ``acc`` of ``BN``
    columns) is synthesized as one ``tcgen05.mma.cta_group::2`` the even CTA issues. Both CTAs'
    TMA loads of a stage complete on the even CTA's full barrier (``pair_barrier=True``, which
    expects both CTAs' bytes), the one barrier the even CTA waits on before the MMA; the odd CTA's
    consumers take no part in the k-loop. Each k-tile's MMAs release their stage in both CTAs when
    they complete (``hl.arrive(..., who="mma")``: the commit multicast to both empty barriers),
    and (``GRID=0``) the odd CTA tells the even one when its epilogue has read its accumulator
    (``acc_free``), before the next tile's MMAs overwrite it. Persistent (``GRID > 0`` pairs): the
    roles and TMEM accumulator stages of the one-CTA persistent kernel below, the even CTA's MMA
    warp group issuing for the pair and both CTAs' epilogue warp groups releasing a stage on the
    even CTA's ``acc_empty`` (``_overlapped_roles``). ``peer_release=False`` lets each CTA's loads complete
    on its own barrier: the even CTA's MMA reads the odd CTA's stage unordered with its loads, the
    broken pipeline the emulator must reject.

    On sm_100a every k-tile's MMAs release their stage themselves (one ``tcgen05.commit`` onto
    its empty barrier, no wait in the k-loop); the tile's MMAs are committed once more after the
    loop, the wait for that commit preceding the epilogue's ``tcgen05.ld``.

    Persistent (``GRID > 0``, one CTA or a pair per MMA): ``128 (2 + CONSUMERS)`` threads per
    CTA - the TMA warp group, an MMA warp group, ``CONSUMERS`` epilogue warp groups - and the
    accumulator in ``arch.tmem.accumulator_stages(BN, most=ACC_STAGES)`` TMEM stages
    (``ACC_STAGES=2``: both 256-column stages of BN = 256 fill the 512 columns), so the MMAs of
    the next tile run while the epilogue drains the current one (``_overlapped_roles``)."""
    return _warp_specialized_gemm("sm_100a", dtype, b_layout, stage_epilogue, peer_release, a_layout, ld)


def _warp_specialized_gemm(arch: str, dtype: DType, b_layout: str, stage_epilogue: bool, peer_release: bool,
                           a_layout: str, ld: tuple[bool, bool]) -> Any:
    """The warp-specialized, persistent TMA + ``hl.mma`` GEMM ``c = A @ B`` (an M-major A
    or N-major B: a ``BK x BM`` / ``BK x BN`` stage read by wgmma through an MN-major
    descriptor); the
    accumulator is stored from registers, or with ``stage_epilogue=True`` (or the kernel
    constant ``STAGE_EPILOGUE``) by stmatrix and TMA stores (``c``'s row stride must then be a
    multiple of 16 bytes: ``N % 8 == 0``).

    ``CLUSTER=2`` (one block per tile, ``GRID=0``): 2-CTA clusters whose blocks take the tiles
    ``(m, 2j)`` and ``(m, 2j + 1)``, which share the A tile: each CTA loads one half
    (``BM/2`` rows) of every A k-tile by TMA and multicasts it into both CTAs' stage, so every
    CTA's full barrier expects the whole stage's bytes; a stage is refilled only after the
    consumers of both CTAs released it (each consumer warp group arrives on its own and on
    the peer's empty barrier, which expect ``2 * CONSUMERS`` arrivals); cluster barriers follow
    the barrier inits and precede exit. ``peer_release=False`` leaves out the arrive on the
    peer (expecting ``CONSUMERS`` arrivals): the broken pipeline the emulator must reject.
    ``ld``: as ``gemm_sm80_kernel``'s (the TMA descriptors take the strides from the tensors at
    launch either way)."""
    _check(dtype, b_layout, a_layout)
    dt = dtype
    ld = (bool(ld[0]), bool(ld[1]))
    a_type, b_type = _operand_types(dt, a_layout, b_layout, ld)
    mk = a_layout == "mk"

    def cluster_of(c: dict[str, Any]) -> tuple[int, ...] | None:
        return (2, 1, 1) if c["CLUSTER"] == 2 else None

    tag = arch.replace("_", "").rstrip("a")             # sm90, sm100: the kernel name's architecture

    def overlapped(c: dict[str, Any]) -> bool:        # sm_100a persistent (one CTA or a pair per MMA): an
        return arch == "sm_100a" and bool(c["GRID"])  # MMA warp group, epilogue ones

    @hl.kernel(threads=lambda c: 128 * (1 + c["CONSUMERS"] + overlapped(c)), cluster=cluster_of,
               name=f"gemm_{tag}_{dt}_{_suffix(a_layout, b_layout, ld)}")
    def gemm(a: a_type, b: b_type, c: dt[M, N],  # type: ignore
             *, BM: int = 128, BN: int = 256, BK: int = 64, STAGES: int = 4, CONSUMERS: int = 2,
             GRID: int = 0, STAGE_EPILOGUE: bool = False, CLUSTER: int = 1, ACC_STAGES: int = 2):
        staged = stage_epilogue or STAGE_EPILOGUE
        # sm_100a persistent (one CTA or a pair per MMA): an MMA warp group issues tile i + 1's MMAs into
        # the next accumulator stage in TMEM while the epilogue warp groups drain tile i's
        overlap = overlapped({"GRID": GRID, "CLUSTER": CLUSTER})
        paired = arch == "sm_100a" and CLUSTER == 2        # a pair of CTAs per tcgen05.mma
        if paired and (BM != 128 or BN % 32 or BN > 256):
            raise ValueError(f"hexlayout gemm: gemm_sm100 with CLUSTER=2 runs a pair of CTAs per MMA: BM=128 "
                             f"rows per CTA and BN a multiple of 32 up to 256 (got BM={BM}, BN={BN})")
        if CLUSTER not in (1, 2) or (CLUSTER == 2 and not paired and (GRID or BM % 128 or not mk)):
            raise ValueError(f"hexlayout gemm: CLUSTER={CLUSTER}: 1, or 2 with one block per tile (GRID=0), "
                             f"BM a multiple of 128 and a K-major A (got GRID={GRID}, BM={BM}, "
                             f"a_layout={a_layout!r})")
        Mx, Kx = a.shape if mk else a.shape[::-1]
        Nx = c.shape[1]
        tiles_m, tiles_n = hl.cdiv(Mx, BM), hl.cdiv(Nx, BN)
        num_tiles = tiles_m * tiles_n
        num_k = hl.cdiv(Kx, BK)
        sa = hl.shared(dt, (BM, BK, STAGES) if mk else (BK, BM, STAGES))
        BNs = BN // 2 if paired else BN          # B rows this CTA stages (the pair: its half)
        sb = hl.shared(dt, (BNs, BK, STAGES) if b_layout == "nk" else (BK, BNs, STAGES))
        W = _epilogue_window(BM, BN, dt)
        sc = hl.shared(dt, (BM, W)) if staged else None
        clustered = CLUSTER == 2 and not paired
        # the consumers of both CTAs of a cluster release a stage (each into its own and its peer's)
        # sm_100a: the tensor cores release a stage (one tcgen05.commit arrival when its MMAs completed)
        tc = arch == "sm_100a"
        ring = hl.Ring(STAGES, producers=1,
                       consumers=1 if tc else CONSUMERS * (2 if clustered and peer_release else 1))
        # the pair (peer_release): both CTAs' loads of a stage complete on the even CTA's full barrier
        pair_bar = paired and peer_release
        if paired and not overlap:  # the odd CTA's epilogue has read its accumulator: the next tile's MMA
            acc_free = hl.mbarrier(1, name="acc_free")          # may write it
            hl.mbarrier_init(acc_free, 0, arrivals=1)
        if overlap:     # the accumulator stages in TMEM: filled by the MMA group, drained by the epilogue
            n_acc = accumulator_stages(BN, most=ACC_STAGES)     # (a pair: both CTAs' epilogue warps
            acc_bars = (hl.mbarrier(n_acc, name="acc_full"), hl.mbarrier(n_acc, name="acc_empty"))
            for s in range(n_acc):                              # release the even CTA's acc_empty)
                hl.mbarrier_init(acc_bars[0], s, arrivals=1)
                hl.mbarrier_init(acc_bars[1], s, arrivals=2 * 4 * CONSUMERS if paired else 128 * CONSUMERS)
        if clustered or paired:
            hl.cluster_sync()        # the peer arrives on / multicasts into these barriers
        else:
            hl.syncthreads()
        rank: Any = 0
        if paired:      # cluster pid // 2 takes the 2 BM x BN tiles pid // 2 (+ GRID, ... with GRID
            pair_tiles = hl.cdiv(Mx, 2 * BM) * tiles_n        # pairs: persistent); CTA r its rows BM r ..
            pid = hl.grid(hl.spatial(2 * (GRID or pair_tiles)))
            rank = hl.cluster_rank()
            my_tiles = hl.cdiv(hl.maximum(pair_tiles - pid // 2, 0), GRID) if GRID else 1
        elif clustered:
            pairs_n = hl.cdiv(tiles_n, 2)
            pid = hl.grid(hl.spatial(2 * tiles_m * pairs_n))
            rank = hl.cluster_rank()
            my_tiles = 1
        elif GRID:
            pid = hl.grid(hl.spatial(GRID))
            my_tiles = hl.cdiv(hl.maximum(num_tiles - pid, 0), GRID)
        else:
            pid = hl.grid(hl.spatial(num_tiles))
            my_tiles = 1

        def origin(t: Any) -> tuple[Any, Any]:
            if paired:
                pair = pid // 2 + t * (GRID or 1)
                return (pair // tiles_n) * 2 * BM + rank * BM, (pair % tiles_n) * BN
            if clustered:        # cluster pid // 2 takes tiles (m, 2j) and (m, 2j + 1): one A tile
                pair = pid // 2
                return (pair // pairs_n) * BM, (2 * (pair % pairs_n) + rank) * BN
            tile = pid + t * (GRID or 1)
            return (tile // tiles_n) * BM, (tile % tiles_n) * BN

        def release(stage: Any) -> None:
            ring.release(stage)
            if clustered and peer_release:
                ring.release(stage, cta=1 - rank)

        stage_bytes = sa[:, :, 0].nbytes + sb[:, :, 0].nbytes
        H = BM // 2
        with hl.warp_group(0):
            hl.setmaxnreg(40, increase=False)
            for t in hl.range(my_tiles):
                m0, n0 = origin(t)
                for k in hl.range(num_k):
                    it = t * num_k + k
                    s = it % STAGES
                    ring.acquire(it)
                    if pair_bar:          # the even CTA's barrier expects both CTAs' bytes
                        with hl.if_(rank.eq(0)):
                            ring.fill(it, tx_bytes=2 * stage_bytes)
                    else:
                        ring.fill(it, tx_bytes=stage_bytes)
                    bar = ring.full[s]
                    if clustered:    # this CTA's half of the shared A tile, into both CTAs
                        with hl.if_(rank.eq(0)):
                            hl.copy(hl.view(a, tile=(H, BK), origin=(m0, k * BK)), sa[0:H, :, s],
                                    mbarrier=bar, multicast=3)
                        with hl.else_():
                            hl.copy(hl.view(a, tile=(H, BK), origin=(m0 + H, k * BK)), sa[H:BM, :, s],
                                    mbarrier=bar, multicast=3)
                    elif mk:
                        hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, k * BK)), sa[:, :, s], mbarrier=bar,
                                pair_barrier=pair_bar)
                    else:
                        hl.copy(hl.view(a, tile=(BK, BM), origin=(k * BK, m0)), sa[:, :, s], mbarrier=bar,
                                pair_barrier=pair_bar)
                    nb = n0 + rank * BNs if paired else n0        # the pair: this CTA's half of B
                    if b_layout == "nk":
                        hl.copy(hl.view(b, tile=(BNs, BK), origin=(nb, k * BK)), sb[:, :, s], mbarrier=bar,
                                pair_barrier=pair_bar)
                    else:
                        hl.copy(hl.view(b, tile=(BK, BNs), origin=(k * BK, nb)), sb[:, :, s], mbarrier=bar,
                                pair_barrier=pair_bar)
        if overlap:
            with hl.else_():
                _overlapped_roles(c, sa, sb, sc, ring, acc_bars, my_tiles, num_k, origin, dt, BM, BN, W,
                                  STAGES, CONSUMERS, mk, b_layout, rank if paired else None)
            if paired:
                hl.cluster_sync()    # no CTA exits while its peer may still multicast or arrive into it
            return
        with hl.else_():
            hl.setmaxnreg(232, increase=True)
            for t in hl.range(my_tiles):
                m0, n0 = origin(t)
                # no zeroed accumulator: the tile's first wgmma writes it (scale-d 0, the first
                # k-tile peeled off the loop), so ptxas sees no register writes between the
                # wgmmas of a tile (no C7515) and the loop has no first-iteration test
                acc = hl.register(f32, (BM, BN))

                def consume(k: Any, first: bool, t: Any = t, acc: Any = acc) -> None:
                    it = t * num_k + k
                    s = it % STAGES
                    if pair_bar:      # the even CTA's barrier says both CTAs' stages are full; the odd
                        with hl.if_(rank.eq(0)):      # CTA's consumers only wait for the tile's commit
                            ring.wait_full(it)
                    else:
                        ring.wait_full(it)
                    hl.wgmma_fence()
                    hl.mma(sa[:, :, s] if mk else sa[:, :, s].T,
                           sb[:, :, s] if b_layout == "nk" else sb[:, :, s].T, acc,
                           warps=hl.spatial(CONSUMERS, 1), accumulate=not first)
                    if tc:            # the stage is free once these MMAs completed (a pair: in both CTAs)
                        ring.release(s, who="mma")
                        return
                    hl.wgmma_commit()
                    # keep one wgmma group in flight: the previous k-tile's has retired, release its stage
                    hl.wgmma_wait(1)
                    if not first:
                        release((it + STAGES - 1) % STAGES)

                if paired:            # the odd CTA's epilogue of the previous tile has read its TMEM
                    with hl.if_((t > 0) & rank.eq(0)):
                        hl.wait(acc_free, 0, phase=(t - 1) % 2)
                with hl.if_(num_k > 0):
                    consume(0, True)
                # (sm_100a: two k-tiles per iteration of the printed loop; the issuer's loop is short,
                # the unrolled copy shares its loop test and branch)
                for k in hl.range(1, num_k, unroll=2 if tc else False):
                    consume(k, False)
                if tc:                # the tile's MMAs: one commit, waited for before the TMEM loads
                    hl.wgmma_commit()
                hl.wgmma_wait(0)
                if not tc:
                    with hl.if_(num_k > 0):
                        release((t * num_k + num_k - 1) % STAGES)
                with hl.if_(num_k.eq(0)):                   # K = 0: the product is zero
                    hl.assign(acc, hl.zeros((BM, BN), f32))
                # the fusion point of epilogues: the accumulator staged through shared memory
                # (stmatrix, then a TMA store), in column windows of at most
                # SM90_EPILOGUE_SMEM bytes; the first barrier waits for the previous
                # window's (or tile's) TMA store to have read sc
                # (a cluster's second tile past the last column - odd tile counts - stores nothing)
                with hl.if_(n0 < Nx) if clustered else contextlib.nullcontext():
                    _store_accumulator(acc, c, sc, m0, n0, dt, W)
                if paired:            # (the TMEM loads are behind: the epilogue read acc)
                    with hl.if_((t + 1 < my_tiles) & rank.eq(1)):
                        hl.arrive(acc_free, 0, who="one", cta=0)
        if clustered or paired:
            hl.cluster_sync()        # no CTA exits while its peer may still multicast into it

    return gemm


def _overlapped_roles(c: Any, sa: Any, sb: Any, sc: Any, ring: Any, acc_bars: tuple[Any, Any], my_tiles: Any,
                      num_k: Any, origin: Any, dt: DType, BM: int, BN: int, W: int, STAGES: int,
                      CONSUMERS: int, mk: bool, b_layout: str, rank: Any = None) -> None:
    """The MMA and epilogue roles of the persistent sm_100a GEMM (warp groups ``1`` and
    ``2 .. 1 + CONSUMERS``; warp group 0 is the TMA producer). The accumulator rotates through
    ``S = arch.tmem.accumulator_stages(BN, most=ACC_STAGES)`` stages in TMEM (``acc_bars``: their
    full and empty barriers, ``S`` each) (``BN`` columns
    each: 2 for BN = 256, up to 4 for BN = 128): the ``j``-th tile of the CTA goes to stage
    ``j % S``. The MMA group waits for stage ``s`` to be drained (``acc_empty[s]``, the
    epilogue's ``128 CONSUMERS`` arrivals of the previous use), issues the tile's k-loop
    (each k-tile's MMAs release their ring stage) and commits onto ``acc_full[s]``; the
    epilogue groups wait on ``acc_full[s]``, read the accumulator (``tcgen05.ld``, their lane
    quarters), store it (``sc``: the staging tile, ``None`` for a store from registers; see
    ``_store_accumulator``) and arrive on ``acc_empty[s]``. So the MMAs of tile ``j + 1`` run while
    the epilogue of tile ``j`` does (no wait on the stage the epilogue reads). The tile loop is
    unrolled by ``S`` (one register tile per stage, its TMEM columns its own).

    A pair of CTAs per MMA (``rank``: the CTA's cluster rank; ``cta_group::2``): only the even
    CTA's MMA group runs - it waits on its own full barriers (both CTAs' loads complete there) and
    on its ``acc_empty[s]``; its MMAs write both CTAs' TMEM (each CTA its ``BM`` rows, the same
    columns) and its ``hl.arrive(acc_full, s, who="mma")`` is the pair's commit, multicast to both
    CTAs' ``acc_full[s]``. The epilogue groups of both CTAs wait on their own ``acc_full[s]`` and
    release the stage on the *even* CTA's ``acc_empty[s]`` (``hl.arrive(..., cta=0, who="warp")``:
    per warp, after the loads' ``tcgen05.wait::ld`` and ``tcgen05.fence::before_thread_sync``, a
    ``__syncwarp`` and lane 0's remote arrive with cluster-scope release, as CuTe DSL's elected
    per-warp release), which expects both CTAs' ``4 CONSUMERS`` warps: the next MMA into the
    stage's columns is ordered after the odd CTA's reads too. The odd CTA's MMA group has nothing
    to issue."""
    acc_full, acc_empty = acc_bars
    S = acc_full.count
    accs = [hl.register(f32, (BM, BN), name=f"acc{s}") for s in range(S)]
    rounds = hl.cdiv(my_tiles, S)
    # epilogue registers: what the producer's and MMA group's 40 leave of the 64 Ki, at most 232
    regs = min(232, (65536 // 128 - 80) // CONSUMERS // 8 * 8)
    with hl.warp_group(1):
        hl.setmaxnreg(40, increase=False)
        with hl.if_(rank.eq(0)) if rank is not None else contextlib.nullcontext():
            for u in hl.range(rounds):
                for s in range(S):
                    t = u * S + s
                    acc = accs[s]

                    def consume(k: Any, first: bool, t: Any = t, acc: Any = acc) -> None:
                        it = t * num_k + k
                        st = it % STAGES
                        ring.wait_full(it)
                        hl.wgmma_fence()
                        hl.mma(sa[:, :, st] if mk else sa[:, :, st].T,
                               sb[:, :, st] if b_layout == "nk" else sb[:, :, st].T, acc,
                               accumulate=not first)
                        ring.release(st, who="mma")         # the ring stage is free once these MMAs completed

                    with hl.if_(t < my_tiles):
                        with hl.if_(u > 0):                 # the epilogue drained this stage's previous tile
                            hl.wait(acc_empty, s, phase=(u - 1) % 2)
                        with hl.if_(num_k > 0):
                            consume(0, True)
                        for k in hl.range(1, num_k, unroll=2):
                            consume(k, False)
                        hl.arrive(acc_full, s, who="mma")   # the tile's MMAs completed: stage s is readable
    with hl.else_():
        hl.setmaxnreg(regs, increase=True)
        for u in hl.range(rounds):
            for s in range(S):
                t = u * S + s
                acc = accs[s]
                with hl.if_(t < my_tiles):
                    m0, n0 = origin(t)
                    hl.wait(acc_full, s, phase=u % 2)
                    with hl.if_(num_k.eq(0)):           # K = 0: no MMA wrote it, the product is zero
                        hl.assign(acc, hl.zeros((BM, BN), f32))
                    _store_accumulator(acc, c, sc, m0, n0, dt, W)
                    # its TMEM columns are read: the next MMAs may write (a pair: the even CTA's MMAs
                    # write both CTAs' columns, so each warp of both CTAs releases the even CTA's
                    # barrier: lane 0 after a __syncwarp, a remote arrive at cluster scope)
                    if rank is None:
                        hl.arrive(acc_empty, s)
                    else:
                        hl.arrive(acc_empty, s, cta=0, who="warp")


#: The GEMM factory of each architecture (sm_89 runs the Ampere kernel).
ARCH_KERNELS = {"sm_80": gemm_sm80_kernel, "sm_89": gemm_sm80_kernel, "sm_90a": gemm_sm90_kernel,
                "sm_100a": gemm_sm100_kernel}


def gemm_anchor(arch: str, dtype: DType, b_layout: str, *, staged: bool = False, a_layout: str = "mk",
                ld: tuple[bool, bool] = (False, False)) -> Any:
    """The GEMM anchor kernel for ``arch`` (``a_layout`` / ``b_layout``: the stored operands,
    ``ld``: which of them take a free leading stride, ``leading_dims``; see the module
    docstring); ``staged=True``: one whose operand loads are plain
    copies into shared memory (not TMA), so that a computing prologue can replace them (the
    Ampere kernel, which every supported architecture runs). The accumulator is stored from
    registers in one piece, or with the constant ``STAGE_EPILOGUE=True`` through shared
    memory (rows of ``c`` 16-byte aligned: ``N % 8 == 0``)."""
    if arch not in ARCH_KERNELS:
        raise ValueError(f"hexlayout gemm: unsupported architecture {arch!r}; supported: "
                         f"{', '.join(ARCH_KERNELS)}")
    # the defaults left out: the kernel objects (and their builds) of the factories' plain calls
    kw: dict[str, Any] = {"a_layout": a_layout} if a_layout != "mk" else {}
    if any(ld):
        kw["ld"] = (bool(ld[0]), bool(ld[1]))
    return (gemm_sm80_kernel if staged else ARCH_KERNELS[arch])(dtype, b_layout, **kw)


def gemm_consts(arch: str, m: int, n: int, k: int, staged: bool = False,
                windows: bool = False) -> dict[str, Any]:
    """The tile constants of ``gemm_anchor(arch, ..., staged)`` for an ``m x n x k`` problem
    (the heuristic of ``gemm_config``; the staged kernel takes the Ampere configs).
    ``windows=True`` (an epilogue that works on each output element alone) stages the
    epilogue in column windows (``STAGE_EPILOGUE``) when rows of ``c`` are 16-byte aligned
    (``n % 8 == 0``): the epilogue's registers are live for one window, not the whole tile."""
    from .config import choose_config

    cfg_arch = "sm_80" if staged or arch == "sm_89" else arch
    consts: dict[str, Any] = choose_config(cfg_arch, m, n, k).consts(m, n)
    if windows and n % 8 == 0:
        consts["STAGE_EPILOGUE"] = True
    return consts
