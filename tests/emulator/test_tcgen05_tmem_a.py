"""sm_100a: a register tile as the A operand of ``tcgen05.mma``, fed through tensor memory.

``hl.mma(a_registers, b_shared, acc)`` synthesizes a ``_TS`` tcgen05.mma whose A the threads write
with ``tcgen05.st`` (``synth.umma_choice``'s A-source cost model, ``ir.lower.umma``); emulated
against float64 on random data over several k-tiles (the B ring and each unrolled mma's A
columns reused; a ring of two sets of them where a deeper wait leaves the previous MMA in
flight); and the emulator's checks of an A in TMEM on hand-written kernels: read before
``tcgen05.wait::st``, read by an issuer that did not synchronize with the storing warps, A's
columns rewritten while the MMA reading them is in flight. (A register A two warp groups run is
staged through shared memory instead: ``test_tcgen05_smem_a``.)"""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch.tmem import operand_a_layout
from hexlayout.emulator import AsyncHazardError, IllegalInstructionError, run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.ir.expr import RegRead
from hexlayout.synth.solve import synthesize
from hexlayout.synth.umma_choice import a_source_costs, register_a_refusal, register_a_source

from .kbuild import KB, gparam, here, rr
from .register_a_gemm import BK, gemm_args, register_a_gemm, walk


def _tmem_a_gemm(wait: bool = True):
    """``register_a_gemm`` on one warp group, unrolled by 2 (each unrolled mma has its own A), each
    k-tile's MMA left in flight (``wgmma_wait(1)``; ``wait`` False: ``wgmma_wait(2)``, so k-tile
    ``k + 2``'s store of A runs while the MMA of ``k`` may still read it)."""
    return register_a_gemm("tmem_a_gemm" + ("" if wait else "_nowait"), 128, 1 if wait else 2, unroll=2)


def _gemm_args(seed=29):
    args, want = gemm_args(6 * BK, seed=seed)      # 6 k-tiles: the B ring wraps
    return args, 2 * want


@pytest.fixture(scope="module")
def synthesized():
    return synthesize(_tmem_a_gemm().trace(), "sm_100a")


def test_register_a_through_tmem_matches_float64(synthesized) -> None:
    args, want = _gemm_args()
    run(synthesized.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5)
    mmas = [i for op, i in synthesized.lowered.choices if type(op).__name__ == "Mma"]
    assert mmas and all("_TS" in i and "A from TMEM (16 columns) written by tcgen05.st.16x64b.x8" in i
                        for i in mmas), mmas
    body = list(walk(synthesized.lowered.kernel.body))
    a_ops = [i for i in body if isinstance(i, T.Tcgen05Mma) and isinstance(i.a, T.TmemRef)]
    assert a_ops and all(isinstance(i, T.Tcgen05Mma) and isinstance(i.a, T.TmemRef)
                         for i in body if isinstance(i, T.Tcgen05Mma))
    stores = [i for i in body if isinstance(i, T.Tcgen05St) and "register A" in i.origin]
    # the two unrolled mmas alternate between two A ranges of 16 columns after the accumulator's 16
    # (the tail's copies would reuse them): 48 columns, allocated as 64
    assert len({str(i.taddr) for i in stores}) == 2
    assert [i.ncols for i in body if isinstance(i, T.TmemAlloc)] == [64]
    assert {(s.shape, s.num) for s in stores} == {("16x64b", 8)}
    assert not any(isinstance(i, L.StShared) for i in body)       # no shared staging of A
    # explain's decision: the shared staging as the alternative the cost model ranked lower
    d = next(d for d in synthesized.decisions if d.subject.startswith("mma at"))
    alt = d.alternatives[0]
    assert alt.status == "rejected" and "shared memory 7 instructions" in alt.reason
    assert "against TMEM's 5" in alt.reason and "4096 bytes per stage" in alt.reason


def test_a_left_in_flight_by_a_deeper_wait_rotates_through_two_sets() -> None:
    """``wgmma_wait(2)``: k-tile ``k + 2``'s store of the same unrolled mma's A runs while the MMA of
    ``k`` may still read it, so each unrolled mma gets two sets of its 16 columns (``R`` = 2,
    ``test_tcgen05_tmem_a_ring``): 16 + 2 x 2 x 16 = 80 columns, allocated as 128; no race."""
    syn = synthesize(_tmem_a_gemm(wait=False).trace(), "sm_100a")
    args, want = _gemm_args()
    run(syn.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5)
    body = list(walk(syn.lowered.kernel.body))
    assert [i.ncols for i in body if isinstance(i, T.TmemAlloc)] == [128]
    mmas = [i for op, i in syn.lowered.choices if type(op).__name__ == "Mma"]
    assert mmas and all("A from TMEM (2 sets of 16 columns" in i for i in mmas), mmas


def test_cost_model_and_refusals() -> None:
    c = a_source_costs(64, 64, 16)
    # one tcgen05.st per warp against 4 st.shared.v4 (and their addresses) per thread
    got = (c["tmem"].moves, c["tmem"].tmem_columns, c["smem"].moves, c["smem"].smem_bytes)
    assert got == (1, 32, 8, 8192)
    assert c["tmem"].instructions < c["smem"].instructions
    f16, f32 = hl.f16, hl.f32
    assert register_a_refusal(64, 16, 64, f16, f16, f32, 128) is None
    # two warp groups, 512 A columns: not through TMEM, staged through shared memory instead
    assert register_a_source(64, 16, 64, f16, f16, f32, 256) == (
        "smem", "256 threads: tcgen05.st writes A from one warp group's lanes (128 threads)")
    src, why = register_a_source(128, 256, 1024, f16, f16, f32, 128)
    assert src == "smem" and "needs 512 columns" in why
    assert register_a_refusal(128, 256, 1024, f16, f16, f32, 128) is None


# --- the emulator's checks on hand-written kernels ------------------------------------------------

def _a_kernel(*, wait_st=True, barrier=True, rewrite_in_flight=False, a_halves=8):
    """D[64, 16] = A[64, 16] @ B[16, :16]^T with A stored by the 128 threads into TMEM column 32 on
    (tcgen05.st.16x256b.x1: the layout ``operand_a_layout(64, 16, 16)``), one SM100_64x16x16 TS
    MMA, a commit, every thread's wait, then each warp's tcgen05.ld.16x256b.x2 of D."""
    kb = KB("tmem_a", 128, arch="sm_100a")
    tid = kb.tid
    A, B, R = gparam("A", "f16", (128, 8)), gparam("B", "f16", (16, 64)), gparam("R", "f32", (128, 8))
    sB = kb.shared("sB", "f16", 16 * 64, align=1024)
    tm = kb.shared("tmem_addr", "u32", 1, align=16)
    bar = kb.mbar("done")
    acc, ta, areg = kb.reg("acc", "f32", 8), kb.reg("taddr", "u32", 1), kb.reg("areg", "f16", 8)
    taddr = RegRead(ta, 0)
    lane0 = (tid // 32) * 32 * 65536
    from .test_wgmma import stage_k_major

    body = [L.MbarInit(bar, 1, pred=tid.eq(0)), T.TmemAlloc(L.SharedRef(tm, 0), 64, pred=(tid < 32))]
    body += stage_k_major(kb, B, sB, 16, 64)
    body += [T.Tcgen05Fence("before_thread_sync"), L.FenceProxyAsync(), L.BarSync(),
             T.Tcgen05Fence("after_thread_sync"), L.LdShared(rr(ta), L.SharedRef(tm, 0), 32),
             L.LdGlobal(rr(areg), L.GlobalRef(A, tid * 8), 128),
             T.Tcgen05St("16x256b", 1, taddr + lane0 + 32, rr(areg, 0, a_halves), loc=here("store A"))]
    if wait_st:
        body.append(T.Tcgen05Wait("st"))
    body.append(T.Tcgen05Fence("before_thread_sync"))
    if barrier:
        body.append(L.BarSync())
    body += [T.Tcgen05Fence("after_thread_sync"),
             T.Tcgen05Mma("SM100_64x16x16_F32F16F16_TS", taddr, T.TmemRef(taddr + 32),
                          L.SmemDesc(sB, 0, 1, 16, 1024), accumulate=0, pred=tid.eq(0), loc=here("hl.mma")),
             T.Tcgen05Commit(bar, pred=tid.eq(0))]
    if rewrite_in_flight:
        body.append(T.Tcgen05St("16x256b", 1, taddr + lane0 + 32, rr(areg), loc=here("store next A")))
    body += [L.MbarWait(bar, 0), T.Tcgen05Fence("after_thread_sync"),
             T.Tcgen05Ld("16x256b", 2, rr(acc), taddr + lane0), T.Tcgen05Wait("ld")]
    body += [L.StGlobal(L.GlobalRef(R, tid * 8 + j), rr(acc, j, 1), 32) for j in range(8)]
    body += [T.Tcgen05Fence("before_thread_sync"), L.BarSync(), T.TmemDealloc(taddr, 64, pred=(tid < 32)),
             T.TmemRelinquish(pred=(tid < 32))]
    return kb.build([A, B, R], body)


def _a_args(seed=31):
    rng = np.random.default_rng(seed)
    return {"A": rng.uniform(-1, 1, (128, 8)).astype(np.float16),
            "B": rng.uniform(-1, 1, (16, 64)).astype(np.float16), "R": np.zeros((128, 8), np.float32)}


def _a_of(regs: np.ndarray) -> np.ndarray:
    """The 64 x 16 A the threads' registers ``regs[thread, 8]`` store with tcgen05.st.16x256b.x1 at
    column 0 of their quarter: through ``tmem_copy_layout`` and ``operand_a_layout``."""
    from hexlayout.arch.tmem import tmem_copy_layout

    cell = np.asarray(tmem_copy_layout("16x256b", 1).indices()).reshape(-1, 32).T   # [lane, reg]
    lane, col = cell % 16, cell // 16
    where = {}
    lay = np.asarray(operand_a_layout(64, 16, 16).indices()).reshape(16, 64).T      # [row, k]
    for i in range(64):
        for kk in range(16):
            x = int(lay[i, kk])
            where[(x // 2) >> 16, (x // 2) & 0xFFFF, x % 2] = (i, kk)
    out = np.full((64, 16), np.nan)
    words = regs.reshape(128, 4, 2)                           # 4 32-bit registers of 2 f16
    for t in range(128):
        for r in range(4):
            for h in range(2):
                i, kk = where[(32 * (t // 32) + int(lane[t % 32, r]), int(col[t % 32, r]), h)]
                out[i, kk] = words[t, r, h]
    return out


def test_hand_written_a_in_tmem_matches_float64() -> None:
    args = _a_args()
    run(_a_kernel(), args)
    d = _a_of(args["A"].astype(np.float64)) @ args["B"][:, :16].astype(np.float64).T   # K = 16: one MMA
    # warp w's tcgen05.ld.16x256b.x2 at its quarter: D rows 16w.. in lanes 32w.. (operand_a_layout's lanes)
    from hexlayout.synth.tmem_choice import choose_tmem_epilogue

    ep = choose_tmem_epilogue(64, 16)
    assert (ep.shape, ep.num) == ("16x256b", 2)
    idx = ep.register_tv.indices().reshape(-1, 128).T
    np.testing.assert_allclose(args["R"], d.T.reshape(-1)[idx], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("kw", "words"), [
    ({"wait_st": False}, "has not waited for (tcgen05.wait::st"),
    ({"barrier": False}, "without the issuing thread 0 synchronizing"),
    ({"rewrite_in_flight": True}, "which an in-flight tcgen05.mma reads as its A operand"),
])
def test_a_in_tmem_hazards_are_errors(kw, words) -> None:
    with pytest.raises(AsyncHazardError) as e:
        run(_a_kernel(**kw), _a_args())
    assert words in str(e.value), str(e.value)
    assert "tmem_a" in str(e.value)


def test_a_store_from_a_register_slice_of_the_wrong_size_is_an_error() -> None:
    """tcgen05.st.16x256b.x1 reads 4 32-bit registers per thread: a slice of 4 f16 (8 bytes) is
    an illegal instruction."""
    with pytest.raises(IllegalInstructionError) as e:
        run(_a_kernel(a_halves=4), _a_args())
    msg = str(e.value)
    assert "tcgen05.st.16x256b.x1: register slice areg holds 8 bytes, the store reads 4 32-bit" in msg, msg
    assert "tmem_a" in msg and "store A" in msg, msg
