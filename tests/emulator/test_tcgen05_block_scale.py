"""sm_100a in the emulator: tcgen05.cp of UE8M0 block scale factors (shared memory -> TMEM) and
the block-scaled tcgen05.mma (kind::mxf8f6f4) that reads them, against float64
``sum_kb (A[:, kb] * 2^(SFA[:, kb] - 127)) @ (B[:, kb] * 2^(SFB[:, kb] - 127))^T``; the errors of
each step; the same program printed and compiled by NVRTC for sm_100a."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hexlayout.arch.block_scale import scale_smem_layout
from hexlayout.emulator import AsyncHazardError, IllegalInstructionError, run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.ir.expr import RegRead

from .kbuild import KB, gparam, here, rr
from .test_wgmma import stage_k_major

M, N, K = 128, 32, 128
KB_ = K // 32
ATOM = f"SM100_{M}x{N}x32_F32E4M3E4M3_UE8M0_SS"
SFA_COL, SFB_COL = 32, 36            # TMEM columns of the factors, after D's 32


def scaled_kernel(*, cp=True, mma_thread=0, overwrite_early=False, load_scales_early=False,
                  atom=ATOM, sf_ids=True):
    """D[128, 32] = block-scaled A[128, 128] @ B[32, 128]^T (e4m3, staged as their bytes into
    128B-swizzled K-major tiles); the factors, arranged by the host in the shared-memory layout
    (``scale_smem_layout``), stored by the 128 threads (one 32-bit word each), copied by thread 0
    with tcgen05.cp.32x128b.warpx4 into TMEM; four K = 32 MMAs, MMA kb reading byte kb."""
    kb = KB("umma_bs", 128, arch="sm_100a")
    tid = kb.tid
    A, B = gparam("A", "f16", (M, K // 2)), gparam("B", "f16", (N, K // 2))   # e4m3 bytes
    SA, SB = gparam("SA", "u32", (128,)), gparam("SB", "u32", (128,))
    D = gparam("D", "f32", (M, N))
    sA = kb.shared("sA", "f16", M * K // 2, align=1024)
    sB = kb.shared("sB", "f16", N * K // 2, align=1024)
    sSA = kb.shared("sSA", "u32", 128, align=128)
    sSB = kb.shared("sSB", "u32", 128, align=128)
    tm = kb.shared("tmem_addr", "u32", 1, align=16)
    bar = kb.mbar("mma_done")
    acc, ta, w = kb.reg("acc", "f32", N), kb.reg("taddr", "u32", 1), kb.reg("w", "u32", 2)
    taddr = RegRead(ta, 0)
    warp0 = tid < 32
    body = [L.MbarInit(bar, 1, pred=tid.eq(0)), T.TmemAlloc(L.SharedRef(tm, 0), 64, pred=warp0)]
    body += stage_k_major(kb, A, sA, M, K // 2) + stage_k_major(kb, B, sB, N, K // 2)
    for i, (g, s) in enumerate(((SA, sSA), (SB, sSB))):
        body += [L.LdGlobal(rr(w, i, 1), L.GlobalRef(g, tid), 32),
                 L.StShared(L.SharedRef(s, tid), rr(w, i, 1), 32)]
    body += [T.Tcgen05Fence("before_thread_sync"), L.FenceProxyAsync(), L.BarSync(),
             T.Tcgen05Fence("after_thread_sync"), L.LdShared(rr(ta), L.SharedRef(tm, 0), 32)]
    if cp:
        for buf, col in ((sSA, SFA_COL), (sSB, SFB_COL)):
            body.append(T.Tcgen05Cp("32x128b.warpx4", taddr + col, L.SmemDesc(buf, 0, 0, 0, 128),
                                    pred=tid.eq(0), loc=here("hl.copy(scales, tmem)")))
    if load_scales_early:
        body.append(T.Tcgen05Ld("32x32b", 4, rr(acc, 0, 4), taddr + SFA_COL + (tid // 32) * 32 * 65536,
                                loc=here("read the scales")))
    for ks in range(KB_):
        a, b = L.SmemDesc(sA, ks * 16, 1, 16, 1024), L.SmemDesc(sB, ks * 16, 1, 16, 1024)
        body.append(T.Tcgen05Mma(atom, taddr, a, b, accumulate=int(ks > 0), pred=tid.eq(mma_thread),
                                 sfa=taddr + SFA_COL, sfb=taddr + SFB_COL, sfa_id=ks if sf_ids else 0,
                                 sfb_id=ks if sf_ids else 0, loc=here("hl.mma(sA, sB, acc, scales)")))
    if overwrite_early:
        body.append(L.StShared(L.SharedRef(sSA, tid), rr(w, 1, 1), 32, loc=here("overwrite scales")))
    body.append(T.Tcgen05Commit(bar, pred=tid.eq(mma_thread)))
    body += [L.MbarWait(bar, 0), T.Tcgen05Fence("after_thread_sync"),
             T.Tcgen05Ld("32x32b", 32, rr(acc), taddr + (tid // 32) * 32 * 65536), T.Tcgen05Wait("ld")]
    body += [L.StGlobal(L.GlobalRef(D, tid * N + j), rr(acc, j, 4), 128) for j in range(0, N, 4)]
    body += [T.Tcgen05Fence("before_thread_sync"), L.BarSync(), T.TmemDealloc(taddr, 64, pred=warp0),
             T.TmemRelinquish(pred=warp0)]
    return kb.build([A, B, SA, SB, D], body)


def _sf_words(sf: np.ndarray) -> np.ndarray:
    """The 512-byte shared-memory atom of factors ``sf [rows <= 128, 4]`` (host side), as 128 words."""
    lay = scale_smem_layout(128, 4)
    atom = np.zeros(512, np.uint8)
    for r in range(sf.shape[0]):
        for k in range(4):
            atom[lay(r, k)] = sf[r, k]
    return atom.view(np.uint32)


def _data(seed=90):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-2, 2, (M, K)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.uniform(-2, 2, (N, K)).astype(ml_dtypes.float8_e4m3fn)
    sfa = rng.integers(118, 136, (M, KB_)).astype(np.uint8)      # 2^-9 .. 2^8
    sfb = rng.integers(118, 136, (N, KB_)).astype(np.uint8)
    args = {"A": a.view(np.uint8).view(np.float16), "B": b.view(np.uint8).view(np.float16),
            "SA": _sf_words(sfa), "SB": _sf_words(sfb), "D": np.zeros((M, N), np.float32)}
    sa = np.repeat(np.ldexp(1.0, sfa.astype(np.int64) - 127), 32, axis=1)     # per K element
    sb = np.repeat(np.ldexp(1.0, sfb.astype(np.int64) - 127), 32, axis=1)
    want = (a.astype(np.float64) * sa) @ (b.astype(np.float64) * sb).T
    return args, want


def test_block_scaled_mma_matches_float64():
    args, want = _data()
    rep = run(scaled_kernel(), args)
    np.testing.assert_allclose(args["D"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert sum(s.executions for s in rep.find("Tcgen05Cp")) == 2
    assert sum(s.executions for s in rep.find("Tcgen05Mma")) == KB_


def test_the_scale_byte_selects_the_k_block():
    """Every MMA reading byte 0 applies k-block 0's factors to all four: a different product."""
    args, want = _data(91)
    run(scaled_kernel(sf_ids=False), args)
    assert not np.allclose(args["D"], want, rtol=1e-3)


def test_scales_never_copied_give_nan():
    args, _ = _data()
    run(scaled_kernel(cp=False), args)
    assert np.isnan(args["D"]).all()


def test_mma_of_another_thread_before_the_copy_completed_is_an_error():
    with pytest.raises(AsyncHazardError) as e:
        run(scaled_kernel(mma_thread=32), _data()[0])
    assert "thread 0's tcgen05.cp that is not complete" in str(e.value)
    assert e.value.other_instr.opname == "Tcgen05Cp" and "hl.mma(sA, sB, acc, scales)" in str(e.value)


def test_reading_the_copied_cells_before_the_commit_is_an_error():
    with pytest.raises(AsyncHazardError, match="that a tcgen05.cp writes before its tcgen05.commit arrived"):
        run(scaled_kernel(load_scales_early=True), _data()[0])


def test_overwriting_the_source_before_the_copy_completed_is_an_error():
    with pytest.raises(AsyncHazardError) as e:
        run(scaled_kernel(overwrite_early=True), _data()[0])
    assert "overwrite scales" in str(e.value) and e.value.other_instr.opname == "Tcgen05Cp"


def test_scale_factors_for_an_unscaled_atom_are_an_error():
    with pytest.raises(IllegalInstructionError, match="is not block-scaled; it takes no scale factors"):
        run(scaled_kernel(atom="SM100_128x32x32_F32E4M3E4M3_SS"), _data()[0])


@pytest.mark.nvrtc
def test_the_emulated_kernel_compiles_for_sm_100a():
    """The program above printed (tcgen05.cp, the block-scaled MMA with its descriptor and factor
    addresses) and compiled by NVRTC for sm_100a: no spills; the SASS has the copy (UTCCP) and a
    UTC*MMA per k-block."""
    from hexlayout.codegen import generate
    from hexlayout.runtime import compile_cuda
    from hexlayout.runtime.sass import count_prefix

    g = generate(scaled_kernel())
    for text in ("tcgen05.cp.cta_group::1.32x128b.warpx4",
                 "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X"):
        assert text in g.source, text
    ck = compile_cuda(g.source, "sm_100a", name=g.name, backend="nvrtc", cache=False)
    assert ck.resources is not None and not ck.resources.spills and ck.resources.stack_frame == 0, ck.log
    counts = ck.sass_counts()
    print(sorted(counts))
    assert count_prefix(counts, "UTCCP") >= 2, sorted(counts)
    assert sum(v for k, v in counts.items() if k.startswith("UTC") and "MMA" in k) >= KB_, sorted(counts)
