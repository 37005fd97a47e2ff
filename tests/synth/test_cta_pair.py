"""Synthesized 2-CTA pairs (``hexlayout.synth.cta_pair``): a kernel written with no pair-specific
line - 2-CTA clusters, each CTA its own 128 rows of A, both loading the same B tile by TMA into a
stage ring, a plain ``hl.mma`` - gets ``tcgen05.mma.cta_group::2`` on sm_100a (each CTA staging half
of B, the loads on the even CTA's barrier), matches float64 in the emulator on ragged shapes, builds
with NVRTC (UTCHMMA.2CTA, no spills); on sm_90a it is unchanged, and outside the class it stays
``cta_group::1`` with the reason in ``explain``."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.ir.lowered import walk_instrs
from hexlayout.lang import f32
from hexlayout.synth.cta_pair import pair_rewrite
from hexlayout.synth.solve import synthesize

M, N, K = hl.dims("M N K")


def cluster_gemm(dt=hl.f16, *, b_rank: bool = False, multicast: bool = False, tiles: int = 1,
                 kn: bool = False, zeros: bool = False):
    """``c = a @ b^T`` by 2-CTA clusters: cluster ``j`` takes rows ``2 BM j ..`` (CTA ``r`` its ``BM``
    rows ``.. + BM r``) of columns ``BN (j % tiles_n) ..``; warp group 0 loads A and B by TMA into a
    ``STAGES`` ring, warp group 1 runs ``hl.mma`` per k-tile with sm_90a's commit / wait / release.
    ``b_rank``: CTA ``r`` loads B at columns ``+ BN r`` (the CTAs do not share B); ``multicast``: each
    CTA loads half of B into both CTAs (the sm_90a cluster idiom; the consumers of both CTAs release
    each stage); ``tiles``: the block takes the tile
    ``tiles`` times (the accumulator's epilogue in the loop of its MMAs); ``kn``: B stored ``K x N``
    (an N-major stage, read transposed); ``zeros``: the accumulator starts as a zero register tile
    that every MMA adds to."""

    @hl.kernel(threads=256, cluster=(2, 1, 1), name="cluster_gemm")
    def gemm(a: dt[M, K], b: dt[(K, N) if kn else (N, K)], c: dt[M, N],  # type: ignore
             *, BM: int = 128, BN: int = 64, BK: int = 64, STAGES: int = 2):
        Mx, Kx = a.shape
        Nx = c.shape[1]
        tiles_n = hl.cdiv(Nx, BN)
        pid = hl.grid(hl.spatial(2 * hl.cdiv(Mx, 2 * BM) * tiles_n))
        rank = hl.cluster_rank()
        m0 = (pid // 2 // tiles_n) * (2 * BM) + rank * BM
        n0 = (pid // 2 % tiles_n) * BN + (rank * BN if b_rank else 0)
        num_k = hl.cdiv(Kx, BK)
        H = BN // 2
        sa = hl.shared(dt, (BM, BK, STAGES))
        sb = hl.shared(dt, (BK, BN, STAGES) if kn else (BN, BK, STAGES))
        # multicast: a stage is written by both CTAs, so both CTAs' consumers release it
        ring = hl.Ring(STAGES, producers=1, consumers=2 if multicast else 1)
        hl.cluster_sync()
        stage_bytes = sa[:, :, 0].nbytes + sb[:, :, 0].nbytes
        with hl.warp_group(0):
            for t in hl.range(tiles):
                for k in hl.range(num_k):
                    it = t * num_k + k
                    s = it % STAGES
                    ring.acquire(it)
                    ring.fill(it, tx_bytes=stage_bytes)
                    bar = ring.full[s]
                    hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, k * BK)), sa[:, :, s], mbarrier=bar)
                    if multicast:
                        with hl.if_(rank.eq(0)):
                            hl.copy(hl.view(b, tile=(H, BK), origin=(n0, k * BK)), sb[0:H, :, s],
                                    mbarrier=bar, multicast=3)
                        with hl.else_():
                            hl.copy(hl.view(b, tile=(H, BK), origin=(n0 + H, k * BK)), sb[H:BN, :, s],
                                    mbarrier=bar, multicast=3)
                    elif kn:
                        hl.copy(hl.view(b, tile=(BK, BN), origin=(k * BK, n0)), sb[:, :, s], mbarrier=bar)
                    else:
                        hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, k * BK)), sb[:, :, s], mbarrier=bar)
        def release(stage):
            ring.release(stage)
            if multicast:
                ring.release(stage, cta=1 - rank)

        with hl.else_():
            for t in hl.range(tiles):
                acc = hl.zeros((BM, BN), f32) if zeros else hl.register(f32, (BM, BN))

                def consume(k, first, t=t, acc=acc):
                    it = t * num_k + k
                    s = it % STAGES
                    ring.wait_full(it)
                    hl.wgmma_fence()
                    hl.mma(sa[:, :, s], sb[:, :, s].T if kn else sb[:, :, s], acc,
                           accumulate=zeros or not first)
                    hl.wgmma_commit()
                    hl.wgmma_wait(1)
                    if not first:
                        release((it + STAGES - 1) % STAGES)

                with hl.if_(num_k > 0):
                    consume(0, True)
                for k in hl.range(1, num_k):
                    consume(k, False)
                hl.wgmma_wait(0)
                with hl.if_(num_k > 0):
                    release((t * num_k + num_k - 1) % STAGES)
                with hl.if_(num_k.eq(0)):
                    hl.assign(acc, hl.zeros((BM, BN), f32))
                hl.copy(hl.cast(acc, dt), hl.view(c, tile=(BM, BN), origin=(m0, n0)))
        hl.cluster_sync()

    return gemm


def _atoms(syn):
    return {i.atom for i in walk_instrs(syn.lowered.kernel.body) if isinstance(i, (T.Tcgen05Mma, L.Wgmma))}


def _pair_decision(syn):
    found = [d for d in syn.decisions if d.subject.startswith("2-CTA pair")]
    return found[0] if found else None


@pytest.fixture(scope="module", params=[False, True], ids=["same-coordinates", "multicast"])
def paired(request):
    """B loaded by both CTAs at the same coordinates, or in halves each CTA multicasts into both."""
    return synthesize(cluster_gemm(multicast=request.param).trace(), "sm_100a")


def test_the_plain_cluster_kernel_gets_the_pair_mma_with_half_of_b_per_cta(paired):
    assert _atoms(paired) == {"SM100_2x1SM_256x64x16_F32F16F16_SS"}
    body = list(walk_instrs(paired.lowered.kernel.body))
    loads = [i for i in body if isinstance(i, L.TmaLoad)]
    # A and B on the even CTA's barrier, no multicast left (each CTA loads its half of B)
    assert len(loads) in (2, 3) and all(i.pair_bar and not i.multicast for i in loads)
    sb = next(v for v, _ in paired.layouts() if v.name == "sb")
    assert sb.type.shape == (32, 64, 2)                               # half of the 64-row B tile
    # the even CTA expects both CTAs' A (2 x 128 x 64) and the pair's B (64 x 64) once
    expects = [i.tx_bytes for i in body if isinstance(i, L.MbarArrive) and i.tx_bytes]
    assert expects == [(2 * 128 + 64) * 64 * 2]
    assert any(isinstance(i, T.Tcgen05Commit) and i.cta_group == 2 and i.multicast == 3 for i in body)
    d = _pair_decision(paired)
    assert d is not None and d.chosen.startswith("tcgen05.mma.cta_group::2 (a pair of CTAs per MMA)")
    assert [a.status for a in d.alternatives] == ["chosen", "rejected"]
    assert d.chosen == d.alternatives[0].what
    assert "B 4096 shared bytes a stage, 20480 TMA bytes" in d.alternatives[0].what
    assert "B 8192 shared bytes a stage, 24576 TMA bytes" in d.alternatives[1].what


@pytest.mark.parametrize("shape", [(300, 104, 200), (130, 72, 72)])
def test_the_synthesized_pair_matches_float64(paired, shape):
    """M = 300: the second cluster's odd CTA holds rows 384.. past M; N = 104: a ragged second tile
    whose odd CTA's half of B (rows 96..) is partly out of bounds; K = 200: 4 k-tiles on 2 stages."""
    m, n, k = shape
    rng = np.random.default_rng(m + n + k)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    rep = run(paired.lowered.kernel, {"a": a, "b": b, "c": c})
    assert len(rep.blocks) == 2 * -(-m // 256) * -(-n // 64)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c.astype(np.float64), want, rtol=1e-2, atol=1e-2)


def test_an_n_major_b_pairs_too():
    """B stored K x N: the stage is BK x BN, read transposed; each CTA stages BN / 2 of its columns."""
    syn = synthesize(cluster_gemm(kn=True).trace(BN=128), "sm_100a")
    assert _atoms(syn) == {"SM100_2x1SM_256x128x16_F32F16F16_SS"}
    assert next(v for v, _ in syn.layouts() if v.name == "sb").type.shape == (64, 64, 2)
    m, n, k = 300, 136, 200
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": a, "b": np.ascontiguousarray(b.T), "c": c})
    np.testing.assert_allclose(c.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64).T,
                               rtol=1e-2, atol=1e-2)


def test_explain_shows_the_pair_choice_with_its_costs(paired):
    from hexlayout.cli.explain import explain_report, format_report
    from hexlayout.cli.kernels import SynthesisResult

    text = format_report(explain_report(SynthesisResult(paired.kernel, paired, 0.0, 0.0, {}), "x", "sm_100a"))
    assert ("chose tcgen05.mma.cta_group::2 (a pair of CTAs per MMA): B 4096 shared bytes a stage, 20480 TMA "
            "bytes and 2 tcgen05.mma per CTA and k-tile") in text
    assert ("tcgen05.mma.cta_group::1 (one CTA per MMA): B 8192 shared bytes a stage, 24576 TMA bytes and 4 "
            "tcgen05.mma per CTA and k-tile: both CTAs of each cluster load the same 64-row B tile") in text


@pytest.mark.parametrize("multicast", [False, True])
def test_the_same_kernel_on_sm90_is_unchanged(multicast):
    """wgmma, the whole B tile per CTA (multicast: B's halves still multicast), no pair barrier; and it
    is a correct sm_90a kernel (float64 in the emulator)."""
    tk = cluster_gemm(multicast=multicast).trace()
    assert pair_rewrite(tk, "sm_90a") == (None, None)
    syn = synthesize(tk, "sm_90a")
    assert _atoms(syn) == {"SM90_64x64x16_F32F16F16_SS"} and _pair_decision(syn) is None
    loads = [i for i in walk_instrs(syn.lowered.kernel.body) if isinstance(i, L.TmaLoad)]
    assert not any(i.pair_bar for i in loads) and sum(bool(i.multicast) for i in loads) == 2 * multicast
    assert next(v for v, _ in syn.layouts() if v.name == "sb").type.shape == (64, 64, 2)
    m, n, k = 300, 104, 200
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(c.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64).T,
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(("kw", "consts", "reason"), [
    ({}, {"BM": 64}, "has M = 64 rows of A per CTA"),
    ({}, {"BN": 48}, "has N = 48"),
    ({"b_rank": True}, {}, "reads coordinates that depend on the cluster rank"),
    ({"multicast": True, "b_rank": True}, {}, "read rows that depend on the cluster rank"),
])
def test_outside_the_class_the_mma_stays_one_cta_with_the_reason(kw, consts, reason):
    tk = cluster_gemm(**kw).trace(**consts)
    out, choice = pair_rewrite(tk, "sm_100a")
    assert out is None and choice is not None and not choice.paired
    assert reason in choice.reason, choice.reason
    assert "test_cta_pair.py" in choice.reason      # the source line of the op it names


def test_a_tile_loop_gets_the_accumulator_barrier_and_matches_float64():
    """The block takes its tile 3 times (the accumulator's epilogue in the loop of its MMAs): the even
    CTA waits on ``pair_acc_free0`` before each next tile's MMAs, which the odd CTA arrives on after
    its epilogue; the phases wrap (emulator: no deadlock, float64)."""
    syn = synthesize(cluster_gemm(tiles=3).trace(), "sm_100a")
    assert _atoms(syn) == {"SM100_2x1SM_256x64x16_F32F16F16_SS"}
    body = list(walk_instrs(syn.lowered.kernel.body))
    assert any(isinstance(i, L.MbarWait) and i.bar.name == "pair_acc_free0" for i in body)
    assert any(isinstance(i, L.MbarArrive) and i.bar.name == "pair_acc_free0" and i.cta is not None
               for i in body)
    m, n, k = 256, 64, 128
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(c.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64).T,
                               rtol=1e-2, atol=1e-2)


def test_a_refused_kernel_synthesizes_one_cta_with_the_reason_in_its_decision():
    syn = synthesize(cluster_gemm(b_rank=True).trace(), "sm_100a")
    assert _atoms(syn) == {"SM100_128x64x16_F32F16F16_SS"}
    d = _pair_decision(syn)
    assert d.chosen.startswith("tcgen05.mma.cta_group::1 (one CTA per MMA): B 8192 shared bytes a stage")
    assert d.alternatives[0].status == "rejected" and d.alternatives[0].reason.startswith("the load of B")
    assert "cluster rank" in d.alternatives[0].reason


def test_a_pair_form_that_does_not_lower_falls_back_to_one_cta_with_the_error():
    """A zero register accumulator every MMA adds to: its tcgen05.st before the pair's MMA would need
    a cluster barrier (the lowering refuses it), so the kernel keeps cta_group::1 and says why."""
    syn = synthesize(cluster_gemm(zeros=True).trace(), "sm_100a")
    assert _atoms(syn) == {"SM100_128x64x16_F32F16F16_SS"}
    d = _pair_decision(syn)
    assert d.chosen.startswith("tcgen05.mma.cta_group::1")
    assert d.alternatives[0].status == "rejected"
    assert d.alternatives[0].reason.startswith("the pair form did not synthesize: ")


@pytest.mark.nvrtc
def test_the_synthesized_pair_builds_for_sm100_with_2cta_sass():
    from hexlayout.runtime import build

    bld = build(cluster_gemm(hl.bf16), "sm_100a", BN=128, STAGES=4)
    res = bld.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and 0 < res.registers <= 255, res
    counts = bld.compiled.sass_counts()
    assert counts.get("UTCHMMA.2CTA", 0) >= 1, sorted(counts)
    assert counts.get("UTCBAR.2CTA.MULTICAST", 0) >= 1, sorted(counts)
    assert any(op.startswith("LDTM") for op in counts) and any(op.startswith("UTMALDG") for op in counts)


@pytest.mark.nvrtc
@pytest.mark.parametrize("multicast", [False, True])
def test_the_synthesized_pair_matches_float64_in_the_ptx_executor(multicast):
    """The PTX NVRTC made from the printed pair (so the printing is checked too): the pair's MMA and its
    multicast commit run; ragged M, N and K."""
    import hexlayout.runtime as rt
    from hexlayout.runtime import build

    bld = build(cluster_gemm(multicast=multicast), "sm_100a", compile=False)
    m, n, k = 200, 88, 136
    rng = np.random.default_rng(m + n + k + multicast)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    rep = rt.emulate(bld, a, b, c, mode="ptx")
    assert rep.opcodes.get("tcgen05.mma.cta_group::2.kind::f16")
    commit = "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64"
    assert rep.opcodes.get(commit)
    loads = [op for op in rep.opcodes if op.startswith("cp.async.bulk.tensor")]
    assert loads and all("cta_group::2" in op and "multicast" not in op for op in loads), loads
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c.astype(np.float64), want, rtol=1e-2, atol=1e-2)


def test_a_deep_ring_gets_as_many_commit_barriers_so_the_lagging_odd_cta_waits_correctly():
    """STAGES = 4 with wgmma_wait(1): the odd CTA's consumers are paced only by their own stage
    releases, so the even CTA may issue 4 commits past the one they wait for; with the 2 commit
    barriers wgmma_wait(1) alone asks for, a barrier would run two phases ahead of the odd CTA's
    waiters (the emulator reports the commit landing on a phase it does not belong to); the lowering
    gives the pair 4. Twelve k-tiles: the ring wraps three times."""
    syn = synthesize(cluster_gemm().trace(STAGES=4), "sm_100a")
    assert {b.name: b.count for b in syn.lowered.kernel.mbarriers}["tc_done"] == 4
    m, n, k = 256, 64, 64 * 12
    rng = np.random.default_rng(12)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(c.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64).T,
                               rtol=1e-2, atol=1e-2)
