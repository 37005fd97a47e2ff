"""sm_100a in the emulator: tensor memory (alloc / dealloc / relinquish), tcgen05.mma into TMEM
completing through tcgen05.commit on an mbarrier, tcgen05.ld, and the errors of each step."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch.tmem import TMEM_SHAPES
from hexlayout.emulator import AsyncHazardError, IllegalInstructionError, run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.ir.expr import RegRead

from .kbuild import KB, gparam, here, rr
from .test_wgmma import stage_k_major

M, N, K = 128, 32, 64


def umma_kernel(*, ncols=64, alloc_twice=False, commit=True, wait=True, wait_ld_late=False, dealloc=True,
                relinquish=True, same_quarter=False, store_before_wait=False, threads_issue=1, waiters=128,
                first_accumulates=False, acc_regs=N):
    """A 128 x 32 x 64 f16 GEMM: 128B-swizzled K-major A and B in shared memory, four
    SM100_128x32x16 MMAs by thread 0 into the TMEM columns warp 0 allocated (their address read back
    from shared memory), a commit on an mbarrier, every
    warp waits, then loads its lane quarter (tcgen05.ld.32x32b.x32: row 32w + lane, 32 columns)."""
    kb = KB("umma", 128, arch="sm_100a")
    tid = kb.tid
    A, B, D = gparam("A", "f16", (M, K)), gparam("B", "f16", (N, K)), gparam("D", "f32", (M, N))
    sA = kb.shared("sA", "f16", M * K, align=1024)
    sB = kb.shared("sB", "f16", N * K, align=1024)
    tm = kb.shared("tmem_addr", "u32", 1, align=16)
    bar = kb.mbar("mma_done")
    acc = kb.reg("acc", "f32", acc_regs)
    ta = kb.reg("taddr", "u32", 1)
    taddr = RegRead(ta, 0)  # the TMEM address tcgen05.alloc wrote to shared memory
    warp0 = (tid < 32)
    body = [L.MbarInit(bar, 1, pred=tid.eq(0)),
            T.TmemAlloc(L.SharedRef(tm, 0), ncols, pred=warp0, loc=here("tmem = hl.tmem_alloc(...)"))]
    if alloc_twice:
        body.append(T.TmemAlloc(L.SharedRef(tm, 0), 512, pred=warp0, loc=here("second alloc")))
    body += stage_k_major(kb, A, sA, M, K) + stage_k_major(kb, B, sB, N, K)
    body += [T.Tcgen05Fence("before_thread_sync"), L.FenceProxyAsync(), L.BarSync(),
             T.Tcgen05Fence("after_thread_sync"), L.LdShared(rr(ta), L.SharedRef(tm, 0), 32)]
    for ks in range(K // 16):
        a, b = L.SmemDesc(sA, ks * 16, 1, 16, 1024), L.SmemDesc(sB, ks * 16, 1, 16, 1024)
        body.append(T.Tcgen05Mma("SM100_128x32x16_F32F16F16_SS", taddr, a, b,
                                 accumulate=int(ks > 0 or first_accumulates),
                                 pred=(tid < threads_issue), loc=here("hl.mma(sA, sB, acc)")))
    if commit:
        body.append(T.Tcgen05Commit(bar, pred=tid.eq(0), loc=here("commit")))
    if wait:
        body += [L.MbarWait(bar, 0, pred=(tid < waiters), loc=here("wait mma_done")),
                 T.Tcgen05Fence("after_thread_sync")]
    w = tid // 32
    lane_base = 0 if same_quarter else 32 * w
    body.append(T.Tcgen05Ld("32x32b", 32, rr(acc), taddr + lane_base * 65536,
                            loc=here("acc = hl.tmem_load(...)")))
    if not wait_ld_late and not store_before_wait:
        body.append(T.Tcgen05Wait("ld", loc=here("wait::ld")))
    for j in range(0, N, 4) if not wait_ld_late else ():
        body.append(L.StGlobal(L.GlobalRef(D, tid * N + j), rr(acc, j, 4), 128, loc=here("store D")))
    body += [T.Tcgen05Fence("before_thread_sync"), L.BarSync()]
    if dealloc:
        body.append(T.TmemDealloc(taddr, ncols, pred=warp0, loc=here("hl.tmem_free(tmem)")))
    if wait_ld_late:
        body.append(T.Tcgen05Wait("ld", loc=here("late wait::ld")))
    if relinquish:
        body.append(T.TmemRelinquish(pred=warp0))
    return kb.build([A, B, D], body)


def _args(seed=70):
    rng = np.random.default_rng(seed)
    return {"A": rng.uniform(-1, 1, (M, K)).astype(np.float16),
            "B": rng.uniform(-1, 1, (N, K)).astype(np.float16), "D": np.zeros((M, N), np.float32)}


def test_mma_commit_wait_ld_matches_float64():
    args = _args()
    rep = run(umma_kernel(), args)
    want = args["A"].astype(np.float64) @ args["B"].astype(np.float64).T
    np.testing.assert_allclose(args["D"], want, rtol=1e-5, atol=1e-5)
    assert sum(s.executions for s in rep.find("Tcgen05Mma")) == 4


def test_accumulating_onto_fresh_tmem_gives_nan():
    """Fresh TMEM holds the poison pattern: a first MMA with enable_input_d set reads garbage."""
    args = _args()
    run(umma_kernel(first_accumulates=True), args)
    assert np.isnan(args["D"]).all()


@pytest.mark.parametrize("kw", [{"wait": False}, {"commit": False, "wait": False}])
def test_ld_before_the_commit_arrived_is_an_error(kw):
    with pytest.raises(AsyncHazardError) as e:
        run(umma_kernel(**kw), _args())
    assert e.value.instr.opname == "Tcgen05Ld" and e.value.other_instr.opname == "Tcgen05Mma"
    assert "before its tcgen05.commit arrived" in str(e.value)
    assert "acc = hl.tmem_load(...)" in str(e.value) and "umma" in str(e.value)  # kernel, op and line


def test_ld_by_a_warp_that_did_not_observe_the_commit_is_an_error():
    """Warp 0 waits on the mbarrier (so the commit lands), warps 1..3 load without waiting."""
    with pytest.raises(AsyncHazardError) as e:
        run(umma_kernel(waiters=32), _args())
    assert "has not observed it" in str(e.value) and e.value.thread >= 32
    assert e.value.other_instr.opname == "Tcgen05Mma"


def test_dealloc_before_wait_ld_is_an_error():
    with pytest.raises(AsyncHazardError) as e:
        run(umma_kernel(wait_ld_late=True), _args())
    assert e.value.instr.opname == "TmemDealloc" and e.value.other_instr.opname == "Tcgen05Ld"
    assert "tcgen05.wait::ld" in str(e.value) and "hl.tmem_free(tmem)" in str(e.value)


def test_registers_of_ld_before_wait_ld_are_in_flight():
    words = "in-flight tcgen05.ld writes; wait for it with tcgen05.wait::ld"
    with pytest.raises(AsyncHazardError, match=words):
        run(umma_kernel(store_before_wait=True), _args())


def test_warp_outside_its_lane_quarter_is_an_error():
    words = r"warp 1 accesses TMEM lane 0, outside its lane quarter \[32, 64\)"
    with pytest.raises(IllegalInstructionError, match=words):
        run(umma_kernel(same_quarter=True), _args())


@pytest.mark.parametrize(("kw", "words"), [
    ({"acc_regs": 16}, "tcgen05.ld.32x32b.x32: register slice acc holds 64 bytes, the load writes 32 32-bit"),
    ({"ncols": 48}, "48 columns: not a power of two"),
    ({"alloc_twice": True}, "no free block"),
    ({"dealloc": False}, "exits with TMEM columns [0, 64) still allocated"),
    ({"relinquish": False}, "without tcgen05.relinquish_alloc_permit"),
    ({"threads_issue": 32}, "tcgen05.mma is issued by one thread, 32 are active"),
])
def test_allocation_and_issue_errors(kw, words):
    with pytest.raises(IllegalInstructionError) as e:
        run(umma_kernel(**kw), _args())
    assert words in str(e.value)


@pytest.mark.nvrtc
def test_the_emulated_kernel_compiles_for_sm_100a_with_tcgen05_sass():
    """The kernel the emulator ran, printed by the codegen (tcgen05 PTX) and compiled by NVRTC for
    sm_100a: no spills; the SASS has the tensor-memory allocator (UTCATOMSWS), the f16 MMA
    (UTCHMMA), its commit (UTCBAR) and the TMEM load (LDTM)."""
    from hexlayout.codegen import generate
    from hexlayout.runtime import compile_cuda
    from hexlayout.runtime.sass import count_prefix

    g = generate(umma_kernel())
    for text in ("tcgen05.mma.cta_group::1.kind::f16", "tcgen05.commit.cta_group::1", "hl_umma_desc(",
                 "tcgen05.ld.sync.aligned.32x32b.x32.b32", "tcgen05.wait::ld", "tcgen05.dealloc"):
        assert text in g.source, text
    ck = compile_cuda(g.source, "sm_100a", name=g.name, backend="nvrtc", cache=False)
    assert ck.resources is not None and not ck.resources.spills and ck.resources.stack_frame == 0, ck.log
    counts = ck.sass_counts()
    for prefix, least in {"UTCHMMA": 4, "LDTM": 1, "UTCBAR": 1, "UTCATOMSWS": 1}.items():
        assert count_prefix(counts, prefix) >= least, (prefix, sorted(counts))


def _raw_kernel(m, n, a_tmem=False):
    """D[m, n] = A[m, 64] @ B[n, 64]^T by SM100_{m}x{n}x16 MMAs (A from shared memory, or for
    ``a_tmem`` from TMEM, where the 128 threads put it with tcgen05.st.32x32b: row = lane), then
    every warp loads its lane quarter with the tcgen05.ld the synthesis chose
    (``choose_tmem_epilogue``) and stores its registers as they are: R[thread, value]."""
    from hexlayout.synth.tmem_choice import choose_tmem_epilogue

    ep = choose_tmem_epilogue(m, n)
    k = 64 if not a_tmem else 16
    kb = KB("umma_raw", 128, arch="sm_100a")
    tid = kb.tid
    A, B = gparam("A", "f16", (m, k)), gparam("B", "f16", (n, 64))
    values = ep.register_tv.size() // 128
    R = gparam("R", "f32", (128, values))
    sA = kb.shared("sA", "f16", m * 64, align=1024)
    sB = kb.shared("sB", "f16", n * 64, align=1024)
    tm = kb.shared("tmem_addr", "u32", 1, align=16)
    bar = kb.mbar("done")
    acc, ta, arow = kb.reg("acc", "f32", values), kb.reg("taddr", "u32", 1), kb.reg("arow", "f16", 16)
    taddr = RegRead(ta, 0)
    body = [L.MbarInit(bar, 1, pred=tid.eq(0)), T.TmemAlloc(L.SharedRef(tm, 0), 128, pred=(tid < 32))]
    body += (stage_k_major(kb, A, sA, m, 64) if not a_tmem else []) + stage_k_major(kb, B, sB, n, 64)
    body += [T.Tcgen05Fence("before_thread_sync"), L.FenceProxyAsync(), L.BarSync(),
             T.Tcgen05Fence("after_thread_sync"), L.LdShared(rr(ta), L.SharedRef(tm, 0), 32)]
    a_col = 64  # A's 8 columns (16 f16 of a row) live after D's
    if a_tmem:
        body += [L.LdGlobal(rr(arow, 0, 8), L.GlobalRef(A, tid * 16), 128),
                 L.LdGlobal(rr(arow, 8, 8), L.GlobalRef(A, tid * 16 + 8), 128),
                 T.Tcgen05St("32x32b", 8, taddr + a_col + (tid // 32) * 32 * 65536, rr(arow)),
                 T.Tcgen05Wait("st"), T.Tcgen05Fence("before_thread_sync"), L.BarSync(),
                 T.Tcgen05Fence("after_thread_sync")]
    src = "TS" if a_tmem else "SS"
    for ks in range(k // 16):
        a = T.TmemRef(taddr + a_col) if a_tmem else L.SmemDesc(sA, ks * 16, 1, 16, 1024)
        b = L.SmemDesc(sB, ks * 16, 1, 16, 1024)
        body.append(T.Tcgen05Mma(f"SM100_{m}x{n}x16_F32F16F16_{src}", taddr, a, b, accumulate=int(ks > 0),
                                 pred=tid.eq(0)))
    body += [T.Tcgen05Commit(bar, pred=tid.eq(0)), L.MbarWait(bar, 0), T.Tcgen05Fence("after_thread_sync")]
    per = TMEM_SHAPES[ep.shape].regs * ep.num
    width = TMEM_SHAPES[ep.shape].columns * ep.num
    lanes = range(0, 32, TMEM_SHAPES[ep.shape].lanes) if m == 128 else (0,)
    v = 0
    for c0 in range(0, n, width):
        for l0 in lanes:
            at = taddr + c0 + (l0 + (tid // 32) * 32) * 65536
            body.append(T.Tcgen05Ld(ep.shape, ep.num, rr(acc, v, per), at))
            v += per
    body.append(T.Tcgen05Wait("ld"))
    body += [L.StGlobal(L.GlobalRef(R, tid * values + j), rr(acc, j, 1), 32) for j in range(values)]
    body += [T.Tcgen05Fence("before_thread_sync"), L.BarSync(), T.TmemDealloc(taddr, 128, pred=(tid < 32)),
             T.TmemRelinquish(pred=(tid < 32))]
    return kb.build([A, B, R], body), ep


@pytest.mark.parametrize(("m", "a_tmem"), [(64, False), (128, True)])
def test_synthesized_tmem_load_layout_holds_the_product(m, a_tmem):
    """Register v of thread t holds D[i, j] at register_tv(t, v) = i + m * j: the ld shape the
    synthesis chose (M=64: 16x256b, M=128: 32x32b) read from the MMA's TMEM layout."""
    n = 32
    kern, ep = _raw_kernel(m, n, a_tmem)
    k = 16 if a_tmem else 64
    rng = np.random.default_rng(71)
    args = {"A": rng.uniform(-1, 1, (m, k)).astype(np.float16),
            "B": rng.uniform(-1, 1, (n, 64)).astype(np.float16),
            "R": np.zeros((128, ep.register_tv.size() // 128), np.float32)}
    run(kern, args)
    d = args["A"].astype(np.float64) @ args["B"][:, :k].astype(np.float64).T
    idx = ep.register_tv.indices().reshape(-1, 128).T
    np.testing.assert_allclose(args["R"], d.T.reshape(-1)[idx], rtol=1e-5, atol=1e-5)
