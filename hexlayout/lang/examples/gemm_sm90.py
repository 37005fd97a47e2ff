"""Hopper warp-specialized GEMM: ``c[M, N] = a[M, K] @ b[N, K]^T`` (f16/bf16 in, f32 accumulate).

Warp group 0 is the producer: it lowers its register budget and issues TMA copies of
the ``a`` and ``b`` k-tiles into ``STAGES`` shared buffers, each completing on the stage's
``full`` mbarrier (which expects the tiles' bytes). The consumer warp groups (1 and 2)
raise their register budget, wait on ``full``, run wgmma from shared memory into the
register accumulator, and release the stage through its ``empty`` mbarrier once the
wgmma reading it has retired. Phases alternate every ``STAGES`` k-tiles. The epilogue
casts and stores the accumulator; ragged edges are handled by the views' extents (TMA
zero-fills out-of-bounds loads; the store skips them).
"""

from __future__ import annotations

import hexlayout.lang as hl
from hexlayout.lang import f16, f32

M, N, K = hl.dims("M N K")

CONSUMERS = 2  # consumer warp groups


@hl.kernel(threads=128 * (1 + CONSUMERS))
def gemm_sm90(a: f16[M, K], b: f16[N, K], c: f16[M, N], *, BM: int = 128, BN: int = 256,
              BK: int = 64, STAGES: int = 4):
    M, K = a.shape
    N = b.shape[0]
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(M, BM), hl.cdiv(N, BN)))
    m0 = pid_m * BM
    n0 = pid_n * BN
    num_k = hl.cdiv(K, BK)

    sa = hl.shared(f16, (BM, BK, STAGES), layout=hl.auto(swizzle="128B"))
    sb = hl.shared(f16, (BN, BK, STAGES), layout=hl.auto(swizzle="128B"))
    full = hl.mbarrier(STAGES)
    empty = hl.mbarrier(STAGES)
    for s in range(STAGES):
        hl.mbarrier_init(full, s, arrivals=1)           # the producer's expect_tx arrival
        hl.mbarrier_init(empty, s, arrivals=CONSUMERS)  # one arrival per consumer warp group
    hl.syncthreads()

    stage_bytes = sa[:, :, 0].nbytes + sb[:, :, 0].nbytes
    with hl.warp_group(0):
        hl.setmaxnreg(40, increase=False)
        for k in hl.range(num_k):
            s = k % STAGES
            # wait until the consumers released this stage (the first round passes at once)
            hl.wait(empty, s, phase=((k // STAGES) % 2) ^ 1)
            hl.arrive(full, s, tx_bytes=stage_bytes, who="one")
            hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, k * BK)), sa[:, :, s], mbarrier=full[s])
            hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, k * BK)), sb[:, :, s], mbarrier=full[s])
    with hl.else_():
        hl.setmaxnreg(232, increase=True)
        acc = hl.zeros((BM, BN), f32)
        for k in hl.range(num_k):
            s = k % STAGES
            hl.wait(full, s, phase=(k // STAGES) % 2)
            hl.wgmma_fence()
            hl.mma(sa[:, :, s], sb[:, :, s], acc, warps=hl.spatial(CONSUMERS, 1))
            hl.wgmma_commit()
            hl.wgmma_wait(0)
            hl.arrive(empty, s, who="warpgroup")
        rc = hl.cast(acc, f16)
        hl.copy(rc, hl.view(c, tile=(BM, BN), origin=(m0, n0)))
