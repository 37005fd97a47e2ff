"""Block-tile GEMMs with cp.async + ldmatrix + mma.sync (4 warps), and the emulator's speed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hexlayout.emulator import RaceError, run

from .gemm_sm80 import gemm_kernel


def _args(M, N, K, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    b = rng.uniform(-1, 1, (N, K)).astype(np.float16)
    return a, b, np.zeros((M, N), np.float32)


def test_gemm_64x64x32_four_warps():
    a, b, c = _args(128, 64, 64, 50)
    rep = run(gemm_kernel(128, 64, 64, 64, 64, 32, 2, 2), {"A": a, "B": b, "C": c})
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5)
    assert len(rep.blocks) == 2
    assert sum(s.bank_conflicts for s in rep.find("Ldmatrix")) == 0
    assert sum(s.bank_conflicts for s in rep.find("CpAsync")) == 0
    mma = rep.find("MmaSync")
    assert sum(s.warp_executions for s in mma) == 2 * 4 * (64 // 32) * 2 * 2 * 4  # blocks*warps*kt*kk*MI*NI


def test_gemm_unswizzled_has_ldmatrix_conflicts():
    a, b, c = _args(64, 64, 64, 51)
    rep = run(gemm_kernel(64, 64, 64, 64, 64, 64, 2, 2, swizzle=False), {"A": a, "B": b, "C": c})
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-5)
    ld = rep.find("Ldmatrix")
    assert sum(s.smem_wavefronts for s in ld) == 8 * sum(s.smem_ideal_wavefronts for s in ld)


def test_gemm_without_sync_after_cp_async_wait_races():
    a, b, c = _args(64, 64, 32, 52)
    with pytest.raises(RaceError) as e:
        run(gemm_kernel(64, 64, 32, 64, 64, 32, 2, 2, sync_after_wait=False), {"A": a, "B": b, "C": c})
    assert e.value.instr.opname == "Ldmatrix" and e.value.other_instr.opname == "CpAsync"


def test_gemm_128x128x128_speed():
    a, b, c = _args(128, 128, 128, 53)
    k = gemm_kernel(128, 128, 128, 128, 128, 64, 2, 2)
    t = time.perf_counter()
    rep = run(k, {"A": a, "B": b, "C": c})
    dt = time.perf_counter() - t
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-5)
    execs = rep.total("executions")
    warps = rep.total("warp_executions")
    print(
        f"\n128x128x128 GEMM, 128 threads: {execs} instruction executions ({warps} warp-level) in {dt:.2f} s"
    )
    assert dt < 10.0
