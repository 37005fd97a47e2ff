"""Explicit-layout GEMMs, traced -> lowered -> emulated thread by thread, against float64.

sm_80: cp.async multistage + ldmatrix + mma.sync; sm_90a: TMA + mbarriers + wgmma. Sizes
include ragged edges (M, N not multiples of the tile; K a multiple of 8 but not of BK).
"""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.lang.examples.explicit import gemm_sm80_explicit, gemm_sm90_explicit, gemm_sm90_ws_explicit
from hexlayout.synth.solve import synthesize

SIZES = [(128, 128, 128), (200, 136, 72), (64, 256, 40)]


def _check(kernel, arch: str, dtype, m: int, n: int, k: int, seed: int):
    prog = synthesize(kernel.trace(), arch).lowered
    rng = np.random.default_rng(seed)
    npdt = dtype.numpy()
    a = rng.standard_normal((m, k)).astype(npdt)
    b = rng.standard_normal((n, k)).astype(npdt)
    c = np.full((m, n), np.nan, dtype=npdt)
    report = run(prog.kernel, {"a": a, "b": b, "c": c})
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    err = np.abs(c.astype(np.float64) - ref) / (np.abs(ref) + 1.0)
    assert err.max() < 1e-2, f"max relative error {err.max()}"
    return prog, report


@pytest.mark.parametrize("dtype", [hl.f16, hl.bf16], ids=str)
@pytest.mark.parametrize(("m", "n", "k"), SIZES)
def test_sm80_gemm_matches_float64(dtype, m: int, n: int, k: int) -> None:
    prog, report = _check(gemm_sm80_explicit(dtype), "sm_80", dtype, m, n, k, m + n + k)
    chosen = {ins for _, ins in prog.choices}
    assert {"cp.async.cg.16", "SM75_U32x4_LDSM_N"} <= chosen
    ld = [s for s in report.sites if s.kind == "Ldmatrix"]
    assert ld and all(s.bank_conflicts == 0 for s in ld)          # swizzled: conflict-free


@pytest.mark.parametrize("dtype", [hl.f16, hl.bf16], ids=str)
@pytest.mark.parametrize(("m", "n", "k"), [(128, 128, 128), (200, 136, 200)])
def test_sm90_gemm_matches_float64(dtype, m: int, n: int, k: int) -> None:
    prog, report = _check(gemm_sm90_explicit(dtype), "sm_90a", dtype, m, n, k, 7 * m + n + k)
    kinds = {type(i).__name__ for i in _walk(prog.kernel.body)}
    assert {"TmaLoad", "Wgmma", "MbarWait"} <= kinds


@pytest.mark.parametrize("dtype", [hl.f16, hl.bf16], ids=str)
@pytest.mark.parametrize(("m", "n", "k"), [(128, 128, 512), (72, 200, 136)])
def test_warp_specialized_sm90_gemm_matches_float64(dtype, m: int, n: int, k: int) -> None:
    prog, _ = _check(gemm_sm90_ws_explicit(dtype), "sm_90a", dtype, m, n, k, 3 * m + n + k)
    kinds = {type(i).__name__ for i in _walk(prog.kernel.body)}
    assert {"TmaLoad", "Wgmma", "MbarWait", "SetMaxNReg", "IfThen"} <= kinds


def _walk(body):
    for ins in body:
        yield ins
        for attr in ("body", "then_body", "else_body"):
            yield from _walk(getattr(ins, attr, []) or [])
