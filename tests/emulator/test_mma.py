"""mma.sync m16n8k16 (f16 / bf16, f32 and f16 accumulators) and m16n8k32 (s8): fragments loaded
from global memory by the PTX ISA formulas, results against float64 / int64 numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hexlayout.emulator import DivergenceError, IllegalInstructionError, run
from hexlayout.ir import lowered as L

from .kbuild import KB, gparam, here, rr

# element i of lane (g = lane // 4, t = lane % 4) -> (row, col); PTX ISA "Matrix Fragments for mma.m16n8k*"
FRAG16 = {
    "a": lambda g, t, i: (g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >= 4)),  # (m, k) of 16x16
    "b": lambda g, t, i: (2 * t + (i & 1) + 8 * (i >= 2), g),  # (k, n) of 16x8
    "c": lambda g, t, i: (g + 8 * (i >= 2), 2 * t + (i & 1)),  # (m, n) of 16x8
}
FRAG8 = {
    "a": lambda g, t, i: (g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >= 8)),  # 16x32
    "b": lambda g, t, i: (4 * t + (i & 3) + 16 * (i >= 4), g),  # 32x8
    "c": FRAG16["c"],
}


def mma_warp_kernel(atom: str, da: str, dc: str, K: int, frag: dict, nvals: dict, vec: dict):
    """One warp: A (16xK, row-major), B^T (8xK, row-major), C, D (16x8 row-major)."""
    kb = KB("mma_" + atom, 32)
    A = gparam("A", da, (16, K))
    B = gparam("B", da, (8, K))  # B[n, k]
    C = gparam("C", dc, (16, 8))
    D = gparam("D", dc, (16, 8))
    g, t = kb.tid // 4, kb.tid % 4
    ra, rb, rc, rd = (kb.reg(n, d, nvals[n]) for n, d in (("a", da), ("b", da), ("c", dc), ("d", dc)))
    body = []

    def loads(reg, param, which, store=False):
        bits = {"a": 8 if da == "i8" else 16, "b": 8 if da == "i8" else 16, "c": 16 if dc == "f16" else 32}[
            "c" if which == "d" else which
        ]
        step = vec[which]
        out = []
        for i in range(0, reg.count, step):
            r0, c0 = frag["c" if which == "d" else which](g, t, i)
            if which == "b":
                r0, c0 = c0, r0  # stored as B[n, k]
            ncol = K if which in ("a", "b") else 8
            ref = L.GlobalRef(param, r0 * ncol + c0)
            if store:
                out.append(L.StGlobal(ref, rr(reg, i, step), bits * step))
            else:
                out.append(L.LdGlobal(rr(reg, i, step), ref, bits * step, origin=f"load {which}"))
        return out

    body += loads(ra, A, "a") + loads(rb, B, "b") + loads(rc, C, "c")
    mma = L.MmaSync(atom, rr(rd), rr(ra), rr(rb), rr(rc), loc=here("mma"), origin="mma")
    body.append(mma)
    body += loads(rd, D, "d", store=True)
    return kb.build([A, B, C, D], body)


CASES = {
    "f16_f32": ("SM80_16x8x16_F32F16F16F32_TN", "f16", "f32", np.float16, np.float32, 1e-5),
    "bf16_f32": ("SM80_16x8x16_F32BF16BF16F32_TN", "bf16", "f32", ml_dtypes.bfloat16, np.float32, 1e-5),
    "f16_f16": ("SM80_16x8x16_F16F16F16F16_TN", "f16", "f16", np.float16, np.float16, 1e-2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mma_m16n8k16(case):
    atom, da, dc, npa, npc, tol = CASES[case]
    rng = np.random.default_rng(40)
    k = mma_warp_kernel(
        atom, da, dc, 16, FRAG16, {"a": 8, "b": 4, "c": 4, "d": 4}, {"a": 2, "b": 2, "c": 2, "d": 2}
    )
    a = rng.uniform(-1, 1, (16, 16)).astype(npa)
    b = rng.uniform(-1, 1, (8, 16)).astype(npa)
    c = rng.uniform(-1, 1, (16, 8)).astype(npc)
    d = np.zeros((16, 8), npc)
    rep = run(k, {"A": a, "B": b, "C": c, "D": d})
    ref = a.astype(np.float64) @ b.astype(np.float64).T + c.astype(np.float64)
    np.testing.assert_allclose(d.astype(np.float64), ref, rtol=tol, atol=tol)
    assert rep.find("MmaSync")[0].warp_executions == 1


def test_mma_m16n8k32_s8():
    rng = np.random.default_rng(41)
    k = mma_warp_kernel(
        "SM80_16x8x32_S32S8S8S32_TN",
        "i8",
        "i32",
        32,
        FRAG8,
        {"a": 16, "b": 8, "c": 4, "d": 4},
        {"a": 4, "b": 4, "c": 2, "d": 2},
    )
    a = rng.integers(-128, 128, (16, 32)).astype(np.int8)
    b = rng.integers(-128, 128, (8, 32)).astype(np.int8)
    c = rng.integers(-(2**20), 2**20, (16, 8)).astype(np.int32)
    d = np.zeros((16, 8), np.int32)
    run(k, {"A": a, "B": b, "C": c, "D": d})
    np.testing.assert_array_equal(d, a.astype(np.int64) @ b.astype(np.int64).T + c)


def test_mma_needs_the_whole_warp_and_matching_registers():
    k = mma_warp_kernel(
        *CASES["f16_f32"][:3], 16, FRAG16, {"a": 8, "b": 4, "c": 4, "d": 4}, {"a": 2, "b": 2, "c": 2, "d": 2}
    )
    mma = next(i for i in k.body if isinstance(i, L.MmaSync))
    mma.pred = k.thread_index < 16
    args = {
        "A": np.ones((16, 16), np.float16),
        "B": np.ones((8, 16), np.float16),
        "C": np.ones((16, 8), np.float32),
        "D": np.zeros((16, 8), np.float32),
    }
    with pytest.raises(DivergenceError) as e:
        run(k, args)
    assert "warp 0" in str(e.value) and str(mma.loc) in str(e.value)
    mma.pred = None
    mma.a = rr(mma.a.array, 0, 4)
    with pytest.raises(IllegalInstructionError):
        run(k, args)
