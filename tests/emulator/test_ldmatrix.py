"""ldmatrix / stmatrix fragments per the PTX ISA, and their bank wavefronts."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.emulator import run
from hexlayout.ir import lowered as L
from hexlayout.layout import Swizzle

from .kbuild import KB, gparam, here, rand, rr


def _ldsm_kernel(num: int, trans: bool, swizzle: bool, stmatrix: bool = False):
    """A (8, 64) f16 tile (row-major, optionally Swizzle<3,3,3>) is staged in shared memory by
    st.shared; ldmatrix.x{num} reads matrices j = columns 8j..8j+7; registers go to global."""
    kb = KB("ldsm", 32)
    x = gparam("x", "f16", (8 * 64,))
    y = gparam("y", "f16", (512,) if stmatrix else (32 * 2 * num,))
    s = kb.shared("tile", "f16", 8 * 64, align=1024)
    o = kb.shared("out", "f16", 8 * 64, align=1024)
    sw = Swizzle(3, 3, 3) if swizzle else (lambda e: e)
    v = kb.reg("v", "f16", 8)
    f = kb.reg("f", "f16", 2 * num)
    tid = kb.tid
    body = []
    for h in range(2):  # each thread stages 16 elements of the tile
        e = tid * 16 + h * 8  # row = e // 64, col = e % 64
        body += [
            L.LdGlobal(rr(v), L.GlobalRef(x, e), 128),
            L.StShared(L.SharedRef(s, sw(e)), rr(v), 128, origin="stage tile"),
        ]
    body.append(L.BarSync())
    row_addr = sw((tid % 8) * 64 + (tid // 8) * 8)  # lane 8j+r: row r of matrix j
    body.append(L.Ldmatrix(rr(f), L.SharedRef(s, row_addr), num, trans, loc=here("ldmatrix"), origin="ldsm"))
    if stmatrix:
        body += [
            L.Stmatrix(L.SharedRef(o, row_addr), rr(f), num, trans, origin="stsm"),
            L.BarSync(),
            L.LdShared(rr(v), L.SharedRef(o, sw(tid * 16)), 128),
            L.StGlobal(L.GlobalRef(y, tid * 16), rr(v), 128),
            L.LdShared(rr(v), L.SharedRef(o, sw(tid * 16 + 8)), 128),
            L.StGlobal(L.GlobalRef(y, tid * 16 + 8), rr(v), 128),
        ]
    else:
        body.append(L.StGlobal(L.GlobalRef(y, tid * 2 * num), rr(f), 32 * num))
    return kb.build([x, y], body)


def _expected(tile: np.ndarray, num: int, trans: bool) -> np.ndarray:
    out = np.zeros((32, num, 2), tile.dtype)
    for lane in range(32):
        for j in range(num):
            for e in range(2):
                if trans:
                    out[lane, j, e] = tile[2 * (lane % 4) + e, 8 * j + lane // 4]
                else:
                    out[lane, j, e] = tile[lane // 4, 8 * j + 2 * (lane % 4) + e]
    return out.reshape(-1)


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_fragments(num, trans):
    rng = np.random.default_rng(20 + num)
    x = rand((512,), np.float16, rng)
    y = np.zeros(64 * num, np.float16)
    run(_ldsm_kernel(num, trans, swizzle=True), {"x": x, "y": y})
    np.testing.assert_array_equal(y, _expected(x.reshape(8, 64), num, trans))


def test_ldmatrix_bank_conflicts_unswizzled_vs_swizzled():
    rng = np.random.default_rng(30)
    x = rand((512,), np.float16, rng)
    plain = run(_ldsm_kernel(4, False, swizzle=False), {"x": x, "y": np.zeros(256, np.float16)})
    swz = run(_ldsm_kernel(4, False, swizzle=True), {"x": x, "y": np.zeros(256, np.float16)})
    p = plain.find("Ldmatrix")[0]
    s = swz.find("Ldmatrix")[0]
    assert (p.smem_wavefronts, p.smem_ideal_wavefronts, p.bank_conflicts) == (32, 4, 28)  # 8 per phase
    assert (s.smem_wavefronts, s.smem_ideal_wavefronts, s.bank_conflicts) == (4, 4, 0)
    # the staging stores (16 B per thread, 8 consecutive threads cover one 128-byte row) are conflict-free
    assert all(st.bank_conflicts == 0 for st in swz.find("StShared"))


@pytest.mark.parametrize("trans", [False, True])
def test_stmatrix_inverts_ldmatrix(trans):
    rng = np.random.default_rng(31)
    x = rand((512,), np.float16, rng)
    y = np.zeros(512, np.float16)
    run(_ldsm_kernel(4, trans, swizzle=True, stmatrix=True), {"x": x, "y": y})
    got, want = y.reshape(8, 64), x.reshape(8, 64)
    np.testing.assert_array_equal(got[:, :32], want[:, :32])  # the 4 matrices stmatrix wrote
    assert np.isnan(got[:, 32:]).all()  # never written: poisoned (NaN)
