"""TMA loads into swizzled shared memory completing on mbarriers, a warp-specialized
producer / consumer wgmma GEMM over a multi-stage full / empty mbarrier ring, and deadlocks."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.emulator import AsyncHazardError, DeadlockError, IllegalInstructionError, run
from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var
from hexlayout.layout import Swizzle

from .kbuild import KB, gparam, here, rr
from .test_wgmma import d_frag_stores

SW128 = Swizzle(3, 3, 3)


def tma_tile_kernel(rows: int, wait: bool = True, swizzle: int = 128):
    """One TMA box (64 cols x 64 rows of f16, 128B swizzle) at row 64 of an X[rows, 64] tensor,
    then every thread copies the (unswizzled) tile to Y."""
    kb = KB("tma_tile", 128, arch="sm_90a")
    X = gparam("X", "f16", (rows, 64))
    Y = gparam("Y", "f16", (64, 64))
    s = kb.shared("tile", "f16", 64 * 64, align=1024)
    bar = kb.mbar("bar")
    desc = L.TmaDesc("X_map", X, box=(64, 64), dims=(1, 0), swizzle_bytes=swizzle)
    v = kb.reg("v", "f16", 8)
    tid = kb.tid
    body = [
        L.MbarInit(bar, 1, pred=tid.eq(0), loc=here("mbarrier.init")),
        L.BarSync(),
        L.IfThen(
            tid.eq(0),
            [
                L.MbarArrive(bar, tx_bytes=64 * 64 * 2, loc=here("arrive.expect_tx")),
                L.TmaLoad(
                    L.SharedRef(s, 0), desc, (0, 64), bar, loc=here("tma load"), origin="copy X -> tile"
                ),
            ],
        ),
    ]
    if wait:
        body.append(L.MbarWait(bar, 0, loc=here("wait full")))
    for i in range(4):
        c = tid + 128 * i
        r, ch = c % 64, c // 64  # 8 consecutive threads read 8 rows of one 16-byte column
        sw = SW128 if swizzle == 128 else (lambda e: e)
        body += [
            L.LdShared(rr(v), L.SharedRef(s, sw(r * 64 + ch * 8)), 128, loc=here("v = tile[...]")),
            L.StGlobal(L.GlobalRef(Y, r * 64 + ch * 8), rr(v), 128),
        ]
    k = kb.build([X, Y], body)
    k.tma = [desc]
    return k


def test_tma_load_swizzled_with_oob_zero_fill():
    rng = np.random.default_rng(70)
    rows = 100  # rows 64..99 in bounds, 100..127 filled with zeros
    x = rng.uniform(-1, 1, (rows, 64)).astype(np.float16)
    y = np.full((64, 64), 7, np.float16)
    rep = run(tma_tile_kernel(rows), {"X": x, "Y": y})
    np.testing.assert_array_equal(y[:36], x[64:])
    np.testing.assert_array_equal(y[36:], 0)
    t = rep.find("TmaLoad")[0]
    assert t.executions == 1 and t.gmem_bytes == 36 * 64 * 2
    assert sum(s.bank_conflicts for s in rep.find("LdShared")) == 0


def test_tma_unswizzled_reads_conflict():
    rng = np.random.default_rng(71)
    x = rng.uniform(-1, 1, (128, 64)).astype(np.float16)
    y = np.zeros((64, 64), np.float16)
    rep = run(tma_tile_kernel(128, swizzle=0), {"X": x, "Y": y})
    np.testing.assert_array_equal(y, x[64:])
    assert sum(s.bank_conflicts for s in rep.find("LdShared")) > 0


def test_reading_tma_destination_before_the_mbarrier_wait_is_an_error():
    with pytest.raises(AsyncHazardError) as e:
        run(
            tma_tile_kernel(128, wait=False),
            {"X": np.ones((128, 64), np.float16), "Y": np.zeros((64, 64), np.float16)},
        )
    assert e.value.instr.opname == "LdShared" and e.value.other_instr.opname == "TmaLoad"
    assert "mbarrier" in str(e.value) and str(e.value.other_instr.loc) in str(e.value)


def test_illegal_tma_box_is_reported():
    k = tma_tile_kernel(128)
    k.tma[0].box = (128, 64)  # 256-byte inner box row with a 128-byte swizzle
    with pytest.raises(IllegalInstructionError) as e:
        run(k, {"X": np.ones((128, 64), np.float16), "Y": np.zeros((64, 64), np.float16)})
    assert "swizzle" in str(e.value)


def ws_gemm_kernel(N=64, K=512, stages=2, consumer_release=True, skip_arrive_expect=False, releaser=0):
    """Warp-specialized C[64, N] = A[64, K] @ B[N, K]^T: warp group 0 produces (one thread issues the
    TMA loads of A and B k-tiles of 64 into a `stages`-deep ring), warp group 1 consumes (4 wgmma per
    k-tile), full[s] / empty[s] mbarriers between them."""
    kb = KB("ws_gemm", 256, arch="sm_90a")
    A = gparam("A", "f16", (64, K))
    B = gparam("B", "f16", (N, K))
    D = gparam("D", "f32", (64, N))
    sA = kb.shared("sA", "f16", stages * 64 * 64, align=1024)
    sB = kb.shared("sB", "f16", stages * N * 64, align=1024)
    kb.mbar("full", stages)
    kb.mbar("empty", stages)
    dA = L.TmaDesc("A_map", A, box=(64, 64), dims=(1, 0), swizzle_bytes=128)
    dB = L.TmaDesc("B_map", B, box=(64, N), dims=(1, 0), swizzle_bytes=128)
    acc = kb.reg("acc", "f32", N // 2)
    tid = kb.tid
    kt = Var("kt", 0, K // 64)
    s, ph = kt % stages, (kt // stages) % 2
    tile_bytes = (64 + N) * 64 * 2
    init = []
    for i in range(stages):
        init += [
            L.MbarInit(L.MbarRef("full", i, stages), 1, pred=tid.eq(0)),
            L.MbarInit(L.MbarRef("empty", i, stages), 1, pred=tid.eq(0)),
        ]
    producer = [
        L.SetMaxNReg(40, False),
        L.IfThen(
            tid.eq(0),
            [
                L.ForLoop(
                    kt,
                    0,
                    K // 64,
                    1,
                    [
                        L.MbarWait(L.MbarRef("empty", s, stages), ph ^ 1, loc=here("wait empty")),
                        L.MbarArrive(
                            L.MbarRef("full", s, stages),
                            tx_bytes=0 if skip_arrive_expect else tile_bytes,
                            loc=here("arrive.expect_tx full"),
                        ),
                        L.TmaLoad(
                            L.SharedRef(sA, s * 64 * 64),
                            dA,
                            (kt * 64, 0),
                            L.MbarRef("full", s, stages),
                            loc=here("tma A"),
                        ),
                        L.TmaLoad(
                            L.SharedRef(sB, s * N * 64),
                            dB,
                            (kt * 64, 0),
                            L.MbarRef("full", s, stages),
                            loc=here("tma B"),
                        ),
                    ],
                )
            ],
        ),
    ]
    ctid = tid - 128
    mma = [L.MbarWait(L.MbarRef("full", s, stages), ph, loc=here("wait full")), L.WgmmaFence()]
    for ks in range(4):
        mma.append(
            L.Wgmma(
                f"SM90_64x{N}x16_F32F16F16_SS",
                rr(acc),
                L.SmemDesc(sA, s * 64 * 64 + ks * 16, 1, 16, 1024),
                L.SmemDesc(sB, s * N * 64 + ks * 16, 1, 16, 1024),
                loc=here("wgmma"),
                origin="mma",
            )
        )
    mma += [L.WgmmaCommit(), L.WgmmaWait(0, loc=here("wgmma wait"))]
    if consumer_release:
        mma.append(
            L.MbarArrive(L.MbarRef("empty", s, stages), pred=ctid.eq(releaser), loc=here("arrive empty"))
        )
    consumer = [L.SetMaxNReg(232, True), L.Alu("mov", rr(acc), (0.0,)), L.ForLoop(kt, 0, K // 64, 1, mma)]
    # the consumer's D-fragment stores index by the warp group's own thread index
    stores = d_frag_stores(kb, D, acc, N)
    for st in stores:
        from hexlayout.ir.expr import substitute

        st.dst.offset = substitute(st.dst.offset, {tid: ctid})
    consumer += stores
    body = init + [L.BarSync(), L.IfThen(tid < 128, producer, consumer, loc=here("warp specialization"))]
    k = kb.build([A, B, D], body)
    k.tma = [dA, dB]
    return k


@pytest.mark.parametrize("stages,releaser", [(2, 0), (3, 0), (2, 37)])
def test_warp_specialized_producer_consumer_gemm(stages, releaser):
    rng = np.random.default_rng(72)
    K = 512
    a = rng.uniform(-1, 1, (64, K)).astype(np.float16)
    b = rng.uniform(-1, 1, (64, K)).astype(np.float16)
    d = np.zeros((64, 64), np.float32)
    rep = run(ws_gemm_kernel(K=K, stages=stages, releaser=releaser), {"A": a, "B": b, "D": d})
    np.testing.assert_allclose(d, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-4)
    assert sum(s.executions for s in rep.find("TmaLoad")) == 2 * K // 64
    assert sum(s.executions for s in rep.find("Wgmma")) == 4 * K // 64


def test_producer_overwriting_a_stage_without_empty_barrier_is_caught():
    """Without the consumer's release the producer would deadlock; with the empty wait removed the
    producer's TMA overwrites a stage an in-flight or unfinished consumer reads."""
    k = ws_gemm_kernel(consumer_release=False)
    with pytest.raises(DeadlockError) as e:
        run(
            k,
            {
                "A": np.ones((64, 512), np.float16),
                "B": np.ones((64, 512), np.float16),
                "D": np.zeros((64, 64), np.float32),
            },
        )
    msg = str(e.value)
    assert "wait empty" in msg and "empty[0]" in msg and "thread 0:" in msg


def test_deadlock_on_barrier_nobody_arrives_on():
    kb = KB("stuck", 64, arch="sm_90a")
    bar = kb.mbar("never")
    wait = L.MbarWait(bar, 0, loc=here("wait never"))
    body = [L.MbarInit(bar, 1, pred=kb.tid.eq(0)), L.BarSync(), wait]
    with pytest.raises(DeadlockError) as e:
        run(kb.build([], body), {})
    assert e.value.instr is wait and str(wait.loc) in str(e.value) and "threads 0-63" in str(e.value)
    assert "1/1 arrival(s) missing" in str(e.value)


def test_deadlock_on_bar_sync_in_one_branch():
    kb = KB("half_sync", 64)
    sync = L.BarSync(loc=here("sync in branch"))
    body = [L.IfThen(kb.tid < 32, [sync])]
    with pytest.raises(DeadlockError) as e:
        run(kb.build([], body), {})
    assert "32 of 64" in str(e.value) and str(sync.loc) in str(e.value)


def test_missing_expect_tx_completes_phase_early_and_is_caught():
    with pytest.raises(AsyncHazardError) as e:
        run(
            ws_gemm_kernel(skip_arrive_expect=True),
            {
                "A": np.ones((64, 512), np.float16),
                "B": np.ones((64, 512), np.float16),
                "D": np.zeros((64, 64), np.float32),
            },
        )
    assert e.value.instr.opname == "Wgmma" and e.value.other_instr.opname == "TmaLoad"
