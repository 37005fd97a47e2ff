"""sm_100a ``cta_group::2`` in the emulator: a pair of CTAs of a cluster runs one
``tcgen05.mma`` (M = 256: 128 rows of A in each CTA's shared memory, B's N rows split in halves,
each CTA's 128 rows of D in its own TMEM), with the pair's TMEM allocation and a multicast
``tcgen05.commit``; and the pairing rules as errors."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.emulator import AsyncHazardError, IllegalInstructionError, run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.ir.expr import RegRead

from .kbuild import KB, gparam, here, rr
from .test_wgmma import SW128

M, N, K = 256, 32, 64


def _stage(kb, src, dst, rows, row0, name):
    """st.shared rows ``row0 .. row0 + rows`` of a row-major (., 64) f16 tensor into a
    128B-swizzled K-major tile."""
    tid, out = kb.tid, []
    v = kb.reg(f"v_{name}", "f16", 8)
    for i in range(rows * K // 8 // kb.threads):
        c = tid + i * kb.threads
        r, ch = c // (K // 8), c % (K // 8)
        out += [L.LdGlobal(rr(v), L.GlobalRef(src, (row0 + r) * K + ch * 8), 128),
                L.StShared(L.SharedRef(dst, SW128(r * K + ch * 8)), rr(v), 128)]
    return out


def pair_kernel(*, cluster=True, issuer_rank=0, peer_allocs=True, multicast=True, peer_waits=True,
                overwrite_in_flight=False, peer_ncols=32, alloc_group=2, mma=True):
    """D[256, 32] = A[256, 64] @ B[32, 64]^T on a cluster of two CTAs (128 threads each).
    CTA r stages A's rows 128r.. and B's rows 16r.., both allocate with cta_group::2 (warp 0),
    a cluster barrier, then thread 0 of CTA ``issuer_rank`` issues four
    SM100_2x1SM_256x32x16 MMAs and commits (cta_group::2, multicast to both CTAs' ``done``);
    each CTA waits on its own ``done`` and loads its 128 rows (tcgen05.ld.32x32b.x32), stores
    them to D's rows 128r.., and frees its TMEM after a second cluster barrier."""
    kb = KB("umma_pair", 128, grid=(2,), arch="sm_100a")
    tid = kb.tid
    rank = kb.bid[0] % 2
    A, B, D = gparam("A", "f16", (M, K)), gparam("B", "f16", (N, K)), gparam("D", "f32", (M, N))
    sA = kb.shared("sA", "f16", M // 2 * K, align=1024)
    sB = kb.shared("sB", "f16", N // 2 * K, align=1024)
    tm = kb.shared("tmem_addr", "u32", 1, align=16)
    done, issued = kb.mbar("done"), kb.mbar("issued")
    acc, ta = kb.reg("acc", "f32", N), kb.reg("taddr", "u32", 1)
    taddr = RegRead(ta, 0)
    warp0 = tid < 32
    alloc_pred = warp0 if peer_allocs else (warp0 & rank.eq(0))
    body = [L.MbarInit(done, 1, pred=tid.eq(0)), L.MbarInit(issued, 1, pred=tid.eq(0)),
            T.TmemAlloc(L.SharedRef(tm, 0), 32, cta_group=alloc_group, pred=alloc_pred & rank.eq(0),
                        loc=here("tmem = hl.tmem_alloc(32, cta_group=2)")),
            T.TmemAlloc(L.SharedRef(tm, 0), peer_ncols, cta_group=alloc_group, pred=alloc_pred & rank.eq(1),
                        loc=here("tmem = hl.tmem_alloc(32, cta_group=2)"))]
    body += _stage(kb, A, sA, M // 2, rank * (M // 2), "a") + _stage(kb, B, sB, N // 2, rank * (N // 2), "b")
    body += [T.Tcgen05Fence("before_thread_sync"), L.FenceProxyAsync(), L.ClusterBarrier(),
             T.Tcgen05Fence("after_thread_sync"), L.LdShared(rr(ta), L.SharedRef(tm, 0), 32)]
    me = tid.eq(0) & rank.eq(issuer_rank)
    for ks in range(K // 16 if mma else 0):
        a, b = L.SmemDesc(sA, ks * 16, 1, 16, 1024), L.SmemDesc(sB, ks * 16, 1, 16, 1024)
        body.append(T.Tcgen05Mma("SM100_2x1SM_256x32x16_F32F16F16_SS", taddr, a, b, accumulate=int(ks > 0),
                                 pred=me, loc=here("hl.mma(sA, sB, acc)")))
    body += [T.Tcgen05Commit(done, cta_group=2, multicast=3 if multicast else None, pred=me,
                             loc=here("commit")),
             L.MbarArrive(issued, cta=1 - issuer_rank, pred=me)]   # tell the other CTA the MMA is issued
    if overwrite_in_flight:     # the odd CTA refills its B tile as soon as the MMA is issued; the
        refilled = kb.mbar("refilled")   # even CTA waits for that before it waits for the MMA
        body.insert(0, L.MbarInit(refilled, 128, pred=tid.eq(0)))
        body += [L.MbarWait(issued, 0, pred=rank.eq(1)),
                 L.IfThen(rank.eq(1), _stage(kb, B, sB, N // 2, 0, "b2") + [L.MbarArrive(refilled, cta=0)]),
                 L.MbarWait(refilled, 0, pred=rank.eq(0))]
    if peer_waits:              # (with multicast: the commit arrives in both CTAs)
        body += [L.MbarWait(done, 0, loc=here("wait done"))]
    else:                       # the odd CTA reads first; the even CTA waits for the MMA after that
        peer_read = kb.mbar("peer_read")
        body.insert(0, L.MbarInit(peer_read, 128, pred=tid.eq(0)))
        body += [L.MbarWait(issued, 0, pred=rank.eq(1))]
    ld = [T.Tcgen05Fence("after_thread_sync"),
          T.Tcgen05Ld("32x32b", 32, rr(acc), taddr + (tid // 32) * 32 * 65536,
                      loc=here("acc = hl.tmem_load(tmem)")),
          T.Tcgen05Wait("ld")]
    if peer_waits:
        body += ld
    else:
        body += [L.IfThen(rank.eq(1), ld + [L.MbarArrive(peer_read, cta=0)]),
                 L.MbarWait(peer_read, 0, pred=rank.eq(0)), L.MbarWait(done, 0, pred=rank.eq(0)),
                 L.IfThen(rank.eq(0), ld)]
    body += [L.StGlobal(L.GlobalRef(D, (rank * 128 + tid) * N + j), rr(acc, j, 4), 128)
             for j in range(0, N, 4)]
    body += [T.Tcgen05Fence("before_thread_sync"), L.ClusterBarrier(),
             T.TmemDealloc(taddr, 32, cta_group=alloc_group, pred=alloc_pred),
             T.TmemRelinquish(cta_group=alloc_group, pred=alloc_pred)]
    k = kb.build([A, B, D], body)
    if cluster:
        k.cluster = (2,)
    return k


def _args(seed=90):
    rng = np.random.default_rng(seed)
    return {"A": rng.uniform(-1, 1, (M, K)).astype(np.float16),
            "B": rng.uniform(-1, 1, (N, K)).astype(np.float16), "D": np.zeros((M, N), np.float32)}


def test_pair_mma_matches_float64():
    """Both CTAs' 128 rows of D from one MMA chain issued by the even CTA: D_c = A_c @ [B_0; B_1]^T."""
    args = _args()
    rep = run(pair_kernel(), args)
    want = args["A"].astype(np.float64) @ args["B"].astype(np.float64).T
    np.testing.assert_allclose(args["D"], want, rtol=1e-5, atol=1e-5)
    assert sum(s.executions for s in rep.find("Tcgen05Mma")) == 4


def test_issue_from_the_odd_cta_is_an_error():
    with pytest.raises(IllegalInstructionError) as e:
        run(pair_kernel(issuer_rank=1), _args())
    assert "issued from the odd CTA" in str(e.value) and "hl.mma(sA, sB, acc)" in str(e.value)
    assert "umma_pair" in str(e.value)


def test_pair_outside_a_cluster_is_an_error():
    with pytest.raises(IllegalInstructionError) as e:
        run(pair_kernel(cluster=False), _args())
    assert "runs on a pair of CTAs of one cluster" in str(e.value)
    assert e.value.instr.opname == "TmemAlloc" and "cta_group=2" in str(e.value)


def test_mma_into_the_peers_unallocated_tmem_is_an_error():
    """The odd CTA never runs its tcgen05.alloc.cta_group::2: the even CTA's MMA may not write
    the columns it reserved there."""
    with pytest.raises(IllegalInstructionError) as e:
        run(pair_kernel(peer_allocs=False), _args())
    assert e.value.instr.opname == "Tcgen05Mma"
    assert "D in the pair's CTA" in str(e.value) and "has not executed its own tcgen05.alloc" in str(e.value)


@pytest.mark.parametrize(("kw", "words"), [
    ({"peer_ncols": 64}, "alloc.cta_group::2 of 64 columns by warp 0, but the pair's CTA allocated 32"),
    ({"alloc_group": 1}, "with cta_group::2 in a CTA whose tcgen05 instructions use cta_group::1"),
])
def test_pair_allocation_errors(kw, words):
    """The pair's warps allocate different column counts; a CTA mixes cta_group::1 (its TMEM) and
    cta_group::2 (the pair's MMA)."""
    with pytest.raises(IllegalInstructionError) as e:
        run(pair_kernel(**kw), _args())
    assert words in str(e.value)


def test_a_cta_that_never_joins_the_pairs_allocation_is_an_error_at_exit():
    kb = KB("lonely_alloc", 32, grid=(2,), arch="sm_100a")
    even = (kb.bid[0] % 2).eq(0)
    tm = kb.shared("tmem_addr", "u32", 1, align=16)
    ta = kb.reg("taddr", "u32", 1)
    body = [T.TmemAlloc(L.SharedRef(tm, 0), 32, cta_group=2, pred=even, loc=here("alloc")), L.BarSync(),
            L.LdShared(rr(ta), L.SharedRef(tm, 0), 32, pred=even), L.ClusterBarrier(),
            T.TmemDealloc(RegRead(ta, 0), 32, cta_group=2, pred=even),
            T.TmemRelinquish(cta_group=2, pred=even)]
    k = kb.build([], body)
    k.cluster = (2,)
    with pytest.raises(IllegalInstructionError) as e:
        run(k, {})
    assert "block (1,) exits without joining the tcgen05.alloc.cta_group::2 of columns [0, 32)" \
        in str(e.value)


def test_overwriting_the_peers_operand_while_in_flight_is_an_error():
    with pytest.raises(AsyncHazardError) as e:
        run(pair_kernel(overwrite_in_flight=True), _args())
    assert e.value.instr.opname == "StShared" and "sB" in str(e.value)
    assert "in-flight tcgen05.mma reads it" in str(e.value)


@pytest.mark.parametrize("multicast", [True, False])
def test_reading_d_before_the_commit_arrived_in_that_cta_is_an_error(multicast):
    """The odd CTA reads its D knowing only that the MMA was issued, before the commit's arrival
    landed in it (multicast: on its own barrier, which it did not wait on; else only on the even
    CTA's barrier, which nobody waited on yet)."""
    with pytest.raises(AsyncHazardError) as e:
        run(pair_kernel(multicast=multicast, peer_waits=False), _args())
    assert e.value.instr.opname == "Tcgen05Ld" and "tcgen05.commit" in str(e.value)
    assert "acc = hl.tmem_load(tmem)" in str(e.value)


@pytest.mark.nvrtc
def test_the_pair_kernel_compiles_for_sm_100a_with_2cta_sass():
    """The kernel the emulator ran, printed (cta_group::2 PTX, multicast commit) and compiled by
    NVRTC for sm_100a: no spills; the SASS has the pair's f16 MMA and its commit."""
    from hexlayout.codegen import generate
    from hexlayout.runtime import compile_cuda

    g = generate(pair_kernel())
    for text in ("tcgen05.mma.cta_group::2.kind::f16", "tcgen05.alloc.cta_group::2",
                 "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64",
                 "tcgen05.dealloc.cta_group::2", "tcgen05.relinquish_alloc_permit.cta_group::2"):
        assert text in g.source, text
    ck = compile_cuda(g.source, "sm_100a", name=g.name, backend="nvrtc", cache=False)
    assert ck.resources is not None and not ck.resources.spills and ck.resources.stack_frame == 0, ck.log
    counts = ck.sass_counts()
    assert counts.get("UTCHMMA.2CTA", 0) >= 4 and counts.get("UTCBAR.2CTA.MULTICAST", 0) >= 1, sorted(counts)
    assert any(k.startswith("UTCATOMSWS.2CTA") for k in counts), sorted(counts)   # the pair's allocator
