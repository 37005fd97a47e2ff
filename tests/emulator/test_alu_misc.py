"""ALU ops and cvt rounding, warp shuffles, setmaxnreg, uniformity checks, TMA stores."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hexlayout.emulator import AsyncHazardError, DivergenceError, IllegalInstructionError, run
from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var

from .kbuild import KB, gparam, here, rand, rr


def _unary_kernel(op, src_t, dst_t, n=4):
    kb = KB("alu_" + op, 32)
    X = gparam("X", src_t, (32 * n,))
    Y = gparam("Y", dst_t, (32 * n,))
    a = kb.reg("a", src_t, n)
    b = kb.reg("b", dst_t, n)
    sb = {"f32": 32, "f16": 16, "bf16": 16, "e4m3": 8, "i32": 32, "i8": 8}
    body = [
        L.LdGlobal(rr(a), L.GlobalRef(X, kb.tid * n), sb[src_t] * n),
        L.Alu(op, rr(b), (rr(a),)),
        L.StGlobal(L.GlobalRef(Y, kb.tid * n), rr(b), sb[dst_t] * n),
    ]
    return kb.build([X, Y], body)


@pytest.mark.parametrize(
    "dst,npd", [("f16", np.float16), ("bf16", ml_dtypes.bfloat16), ("e4m3", ml_dtypes.float8_e4m3fn)]
)
def test_cvt_rounds_to_nearest_even(dst, npd):
    rng = np.random.default_rng(80)
    x = rng.uniform(-300, 300, 128).astype(np.float32)
    x[:4] = [1000.0, -1000.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11]  # saturation and ties
    y = np.zeros(128, npd)
    run(_unary_kernel("cvt", "f32", dst), {"X": x, "Y": y})
    want = x.astype(np.float64)
    if dst == "e4m3":
        want = np.clip(want, -448, 448)
    np.testing.assert_array_equal(y, want.astype(np.float32).astype(npd))


def test_cvt_float_to_int_saturates_and_rounds_even():
    x = np.array([2.5, 3.5, -2.5, 1e10, -1e10, np.nan, 0.49, 7.51] * 16, np.float32)
    y = np.zeros(128, np.int32)
    run(_unary_kernel("cvt", "f32", "i32"), {"X": x, "Y": y})
    info = np.iinfo(np.int32)
    np.testing.assert_array_equal(y[:8], [2, 4, -2, info.max, info.min, 0, 0, 8])


def test_binary_and_fma_ops():
    rng = np.random.default_rng(81)
    kb = KB("alu2", 32)
    X = gparam("X", "f32", (32 * 4,))
    Y = gparam("Y", "f32", (32 * 4,))
    a, b, c = (kb.reg(n, "f32", 4) for n in "abc")
    body = [
        L.LdGlobal(rr(a), L.GlobalRef(X, kb.tid * 4), 128),
        L.Alu("mul", rr(b), (rr(a), 3.0)),
        L.Alu("fma", rr(c), (rr(a), rr(b), -1.0)),
        L.Alu("max", rr(c), (rr(c), 0.25)),
        L.Alu("exp2", rr(b), (rr(c),)),
        L.Alu("select", rr(c), (rr(a), rr(b), rr(c))),
        L.StGlobal(L.GlobalRef(Y, kb.tid * 4), rr(c), 128),
    ]
    x = rand((128,), np.float32, rng)
    y = np.zeros(128, np.float32)
    run(kb.build([X, Y], body), {"X": x, "Y": y})
    xd = x.astype(np.float32)
    want = np.exp2(np.maximum(xd * (xd * np.float32(3)) - 1, 0.25))
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_shfl_butterfly_reduction_and_idx():
    rng = np.random.default_rng(82)
    kb = KB("shfl", 64)
    X = gparam("X", "f32", (64,))
    Y = gparam("Y", "f32", (128,))
    v, t, b = kb.reg("v", "f32", 1), kb.reg("t", "f32", 1), kb.reg("b", "f32", 1)
    body = [L.LdGlobal(rr(v), L.GlobalRef(X, kb.tid), 32)]
    for k in (16, 8, 4, 2, 1):
        body += [L.Shfl(rr(t), rr(v), "bfly", k), L.Alu("add", rr(v), (rr(v), rr(t)))]
    body += [
        L.Shfl(rr(b), rr(v), "idx", 3, width=8),
        L.StGlobal(L.GlobalRef(Y, kb.tid), rr(v), 32),
        L.StGlobal(L.GlobalRef(Y, 64 + kb.tid), rr(b), 32),
    ]
    x = rand((64,), np.float32, rng)
    y = np.zeros(128, np.float32)
    run(kb.build([X, Y], body), {"X": x, "Y": y})
    sums = x.reshape(2, 32).astype(np.float64).sum(1)
    np.testing.assert_allclose(y[:64], np.repeat(sums, 32), rtol=1e-5)
    np.testing.assert_allclose(y[64:], np.repeat(sums, 32), rtol=1e-5)


def test_shfl_up_and_down_stay_in_their_segment():
    """``up`` reads lane ``lane - arg``, ``down`` lane ``lane + arg`` of the ``width``-lane segment;
    past its first / last lane a thread keeps its own value (as PTX ``shfl.sync.up`` / ``down``)."""
    kb = KB("shfl_ud", 64)
    X = gparam("X", "f32", (64,))
    Y = gparam("Y", "f32", (128,))
    v, u, d = kb.reg("v", "f32", 1), kb.reg("u", "f32", 1), kb.reg("d", "f32", 1)
    body = [L.LdGlobal(rr(v), L.GlobalRef(X, kb.tid), 32),
            L.Shfl(rr(u), rr(v), "up", 3, width=8),
            L.Shfl(rr(d), rr(v), "down", 2, width=16),
            L.StGlobal(L.GlobalRef(Y, kb.tid), rr(u), 32),
            L.StGlobal(L.GlobalRef(Y, 64 + kb.tid), rr(d), 32)]
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(128, np.float32)
    run(kb.build([X, Y], body), {"X": x, "Y": y})
    t = np.arange(64)
    np.testing.assert_array_equal(y[:64], np.where(t % 8 >= 3, t - 3, t))
    np.testing.assert_array_equal(y[64:], np.where(t % 16 < 14, t + 2, t))


def test_setmaxnreg_count_must_be_legal():
    kb = KB("nreg", 128, arch="sm_90a")
    bad = L.SetMaxNReg(100, True, loc=here("setmaxnreg 100"))
    with pytest.raises(IllegalInstructionError) as e:
        run(kb.build([], [L.SetMaxNReg(232, True), bad]), {})
    assert "multiple of 8" in str(e.value) and str(bad.loc) in str(e.value)


def test_non_uniform_loop_bound_and_register_index_are_errors():
    kb = KB("div", 32)
    i = Var("i", 0, 32)
    r = kb.reg("r", "f32", 32)
    loop = L.ForLoop(i, 0, kb.tid, 1, [], loc=here("for i < tid"))
    with pytest.raises(DivergenceError) as e:
        run(kb.build([], [loop]), {})
    assert "loop" in str(e.value) and str(loop.loc) in str(e.value)
    mov = L.Alu("mov", L.RegRef(r, kb.tid % 4, 1), (1.0,), loc=here("r[tid % 4] = 1"))
    with pytest.raises(DivergenceError):
        run(kb.build([], [mov]), {})


def test_tma_store_round_trip_and_overwrite_before_wait():
    rng = np.random.default_rng(83)
    kb = KB("tma_store", 128, arch="sm_90a")
    X = gparam("X", "f16", (64, 64))
    Y = gparam("Y", "f16", (40, 64))  # ragged: rows 40.. of the box are dropped
    s = kb.shared("tile", "f16", 64 * 64, align=1024)
    bar = kb.mbar("bar")
    dx = L.TmaDesc("X_map", X, box=(64, 64), dims=(1, 0), swizzle_bytes=128)
    dy = L.TmaDesc("Y_map", Y, box=(64, 64), dims=(1, 0), swizzle_bytes=128)
    v = kb.reg("v", "f16", 8)
    t0 = kb.tid.eq(0)
    head = [
        L.MbarInit(bar, 1, pred=t0),
        L.BarSync(),
        L.MbarArrive(bar, tx_bytes=8192, pred=t0),
        L.TmaLoad(L.SharedRef(s, 0), dx, (0, 0), bar, pred=t0),
        L.MbarWait(bar, 0),
        L.TmaStore(dy, (0, 0), L.SharedRef(s, 0), pred=t0, loc=here("tma store")),
        L.TmaStoreCommit(pred=t0),
    ]
    good = head + [L.TmaStoreWait(0, pred=t0)]
    x = rand((64, 64), np.float16, rng)
    y = np.zeros((40, 64), np.float16)
    k = kb.build([X, Y], good)
    k.tma = [dx, dy]
    run(k, {"X": x, "Y": y})
    np.testing.assert_array_equal(y, x[:40])
    bad = head + [L.StShared(L.SharedRef(s, kb.tid * 8), rr(v), 128, pred=t0, loc=here("tile[...] = v"))]
    k2 = kb.build([X, Y], bad)
    with pytest.raises(AsyncHazardError) as e:
        run(k2, {"X": x, "Y": y})
    assert e.value.other_instr.opname == "TmaStore" and "cp.async.bulk.wait_group.read" in str(e.value)
