"""The sm_100a register-A GEMM the tcgen05 A-operand tests build (``test_tcgen05_tmem_a``: A through
tensor memory, ``test_tcgen05_smem_a``: A staged through shared memory), its random operands and
its float64 reference."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

import hexlayout.lang as hl

M, N, K = hl.dims("M N K")
BK = 32


def register_a_gemm(name: str, threads: int, pending: int, unroll: int = 1) -> Any:
    """``c[64, 16] = (2 a)[64, K] @ b[16, K]^T`` run by ``threads`` threads: each k-tile of ``a``
    loaded into registers and doubled there (the register A), ``b``'s k-tile into stage ``k % 4``
    of a shared ring, each k-tile's MMA left in flight (``wgmma_wait(pending)``: ``pending`` earlier
    executions of the mma may still read A when it is written again). ``ceil(K / BK)`` k-tiles
    (a ragged last one is zero-filled); ``unroll`` > 1: the loop body repeated ``unroll`` times
    (each copy its own mma, so its own A) over ``floor(K / (unroll BK))`` iterations."""

    @hl.kernel(threads=threads, name=name)
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sb = hl.shared(hl.f16, (16, BK, 4))
        acc = hl.zeros((64, 16), hl.f32)
        for j in hl.range(hl.cdiv(a.shape[1], BK) if unroll == 1 else a.shape[1] // (unroll * BK)):
            for s in range(unroll):
                kt = unroll * j + s if unroll > 1 else j
                w = load_k_tile(a, b, sb[:, :, kt % 4], kt)
                hl.mma(w + w, sb[:, :, kt % 4], acc)
                hl.wgmma_commit()
                hl.wgmma_wait(pending)
        hl.wgmma_wait(0)
        hl.copy(acc, c.tile((64, 16), (0, 0)))

    return k


def load_k_tile(a: Any, b: Any, sb: Any, kt: Any) -> Any:
    """``b``'s k-tile ``kt`` (``n x BK``, ``n`` the rows of ``sb``) copied into the shared stage
    ``sb`` (cp.async, waited for, fenced for the async proxy, a barrier), then ``a``'s k-tile
    (``64 x BK``) loaded into registers and returned, after a ``wgmma_fence``: what each k-tile of
    these kernels does before its mma."""
    hl.copy(b.tile((sb.shape[0], BK), (0, kt * BK)), sb)
    hl.commit_group()
    hl.wait_group(0)
    hl.fence_proxy_async()
    hl.syncthreads()
    w = hl.register(hl.f16, (64, BK))
    hl.copy(a.tile((64, BK), (0, kt * BK)), w)
    hl.wgmma_fence()
    return w


def gemm_args(kx: int, n: int = 16, seed: int = 37) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Random ``a[64, kx]``, ``b[n, kx]`` (f16), ``c`` NaN-filled, and ``a @ b^T`` in float64."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (64, kx)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, kx)).astype(np.float16)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    return {"a": a, "b": b, "c": np.full((64, n), np.nan, np.float32)}, want


def walk(body: list[Any]) -> Iterator[Any]:
    """Every lowered instruction of ``body`` and, after each, those of its nested bodies (loops,
    branches, elected branches: any ``body`` / ``then_body`` / ``else_body``)."""
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from walk(getattr(i, sub, None) or [])
