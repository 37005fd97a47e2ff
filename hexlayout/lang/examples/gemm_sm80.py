"""Ampere multistage GEMM: ``c[M, N] = a[M, K] @ b[N, K]^T`` (f16 in, f32 accumulate, f16 out).

Each block computes a ``BM x BN`` tile of ``c``. ``STAGES`` shared-memory buffers hold
tiles of ``a`` and ``b`` in flight: tile ``k + STAGES - 1`` is loaded with cp.async
while tile ``k`` is multiplied. Ragged edges (M, N, K not multiples of the tile) need no
masks: views past the tensor's end have a short (or non-positive) extent, out-of-bounds
elements load as zero and are not stored.
"""

from __future__ import annotations

import hexlayout.lang as hl
from hexlayout.lang import f16, f32

M, N, K = hl.dims("M N K")


@hl.kernel(threads=lambda c: 32 * c["WARPS"])
def gemm_sm80(a: f16[M, K], b: f16[N, K], c: f16[M, N], *, BM: int = 128, BN: int = 128,
              BK: int = 32, STAGES: int = 3, WARPS: int = 4):
    M, K = a.shape
    N = b.shape[0]
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(M, BM), hl.cdiv(N, BN)))
    m0 = pid_m * BM
    n0 = pid_n * BN
    num_k = hl.cdiv(K, BK)

    sa = hl.shared(f16, (BM, BK, STAGES))
    sb = hl.shared(f16, (BN, BK, STAGES))
    acc = hl.zeros((BM, BN), f32)

    # prologue: start loading the first STAGES-1 k-tiles (tiles past K load zeros)
    for s in range(STAGES - 1):
        hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, s * BK)), sa[:, :, s])
        hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, s * BK)), sb[:, :, s])
        hl.commit_group()

    for k in hl.range(num_k):
        # tile k has landed once at most STAGES-2 groups are pending; the barrier also
        # guarantees every warp finished reading the stage the next load overwrites
        hl.wait_group(STAGES - 2)
        hl.syncthreads()
        kn = k + (STAGES - 1)
        hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, kn * BK)), sa[:, :, kn % STAGES])
        hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, kn * BK)), sb[:, :, kn % STAGES])
        hl.commit_group()

        s = k % STAGES
        ra = hl.register(f16, (BM, BK))
        rb = hl.register(f16, (BN, BK))
        hl.copy(sa[:, :, s], ra)
        hl.copy(sb[:, :, s], rb)
        hl.mma(ra, rb, acc)

    hl.wait_group(0)
    rc = hl.cast(acc, f16)
    hl.copy(rc, hl.view(c, tile=(BM, BN), origin=(m0, n0)))
