"""Synthesis on sm_100a for a pair of CTAs: ``hl.mma`` in its pair form (a kernel of 2-CTA
clusters, ``c`` with twice ``b``'s rows: ``b`` is this CTA's half of the pair's B) gets the
``cta_group::2`` atom (M = 128 per CTA, 256 for the pair), reported by ``explain``; lowered to the
pair's TMEM allocation, the even CTA's MMA and a multicast commit; emulated against float64."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch.dtypes import F16, F32
from hexlayout.emulator import run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.ir.lowered import walk_instrs
from hexlayout.runtime import build
from hexlayout.synth.umma_choice import umma_refusal, umma_tilings

M, N, K = hl.dims("M N K")


def pair_gemm(nb: int = 64, ktiles: int = 2, pair: bool = True):
    """Each cluster of two CTAs computes 256 rows of ``c = a @ b^T`` (``b``: ``nb`` rows): CTA r its
    128 rows of ``a``, holding rows ``r nb/2 ..`` of ``b`` (``pair=False``: all of ``b``, the
    one-CTA form), ``ktiles`` k-tiles of 64 (the first writes the accumulator)."""
    half = nb // 2 if pair else nb

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def pair_mm(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        pid = hl.grid(hl.spatial(2 * hl.cdiv(a.shape[0], 256)))
        r = hl.cluster_rank()
        m0 = pid * 128
        sa = hl.shared(hl.f16, (128, 64))
        sb = hl.shared(hl.f16, (half, 64))
        acc = hl.register(hl.f32, (128, nb))
        for k in range(ktiles):
            hl.copy(hl.view(a, tile=(128, 64), origin=(m0, k * 64)), sa)
            hl.copy(hl.view(b, tile=(half, 64), origin=(r * half if pair else 0, k * 64)), sb)
            hl.commit_group()
            hl.wait_group(0)
            hl.cluster_sync()            # both CTAs' tiles are in place before the pair's MMA
            hl.mma(sa, sb, acc, accumulate=k > 0)
            hl.wgmma_commit()
            hl.wgmma_wait(0)
            hl.cluster_sync()            # the MMA read both CTAs' tiles: they may be refilled
        hl.copy(acc, hl.view(c, tile=(128, nb), origin=(m0, 0)))

    return pair_mm


@pytest.fixture(scope="module")
def built():
    return build(pair_gemm(), "sm_100a", compile=False)


def test_the_pair_form_gets_the_2cta_atom_reported_by_explain(built):
    from hexlayout.cli.explain import explain_report, format_report
    from hexlayout.cli.kernels import SynthesisResult
    from hexlayout.synth.solve import synthesize

    tk = pair_gemm().trace()
    text = format_report(explain_report(SynthesisResult(tk, synthesize(tk, "sm_100a"), 0.0, 0.0, {}),
                                        "pair_mm", "sm_100a"))
    assert "SM100_2x1SM_256x64x16_F32F16F16_SS" in text and "pair's even CTA (cta_group::2" in text
    lk = built.lowered
    mmas = [i for i in walk_instrs(lk.body) if isinstance(i, T.Tcgen05Mma)]
    assert {i.atom for i in mmas} == {"SM100_2x1SM_256x64x16_F32F16F16_SS"} and len(mmas) == 8
    commits = [i for i in walk_instrs(lk.body) if isinstance(i, T.Tcgen05Commit)]
    assert commits and all(i.cta_group == 2 and i.multicast == 3 for i in commits)
    allocs = [i for i in walk_instrs(lk.body) if isinstance(i, (T.TmemAlloc, T.TmemDealloc))]
    assert allocs and all(i.cta_group == 2 for i in allocs)


def test_the_pair_matches_float64_in_the_emulator(built):
    rng = np.random.default_rng(27)
    a = rng.uniform(-1, 1, (512, 128)).astype(np.float16)
    b = rng.uniform(-1, 1, (64, 128)).astype(np.float16)
    c = np.full((512, 64), np.nan, np.float32)
    rep = run(built.lowered, {"a": a, "b": b, "c": c})
    assert len(rep.blocks) == 4
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-5)


def test_the_one_cta_form_is_unchanged_in_a_cluster_kernel():
    lk = build(pair_gemm(pair=False), "sm_100a", compile=False).lowered
    atoms = {i.atom for i in walk_instrs(lk.body) if isinstance(i, T.Tcgen05Mma)}
    assert atoms == {"SM100_128x64x16_F32F16F16_SS"}
    assert all(i.cta_group == 1 for i in walk_instrs(lk.body) if isinstance(i, T.TmemAlloc))


def test_pair_tilings_and_refusals():
    tu = umma_tilings(128, 256, 64, F16, F16, F32, 256, cta_group=2)[0]
    assert tu.atom.name == "SM100_2x1SM_256x256x16_F32F16F16_SS" and tu.tile_mnk == (128, 256, 64)
    assert tu.cta_group == 2 and tu.columns == 256
    assert "128 rows per CTA" in umma_refusal(64, 64, 64, F16, F16, F32, 128, cta_group=2)
    assert "up to 256" in umma_refusal(128, 512, 64, F16, F16, F32, 128, cta_group=2)


@pytest.mark.parametrize("cluster", [None, (4, 1, 1)])
def test_the_pair_form_outside_a_2cta_cluster_is_a_shape_error(cluster):
    @hl.kernel(threads=128, cluster=cluster)
    def lone(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        hl.grid(hl.spatial(4))
        sa = hl.shared(hl.f16, (128, 64))
        sb = hl.shared(hl.f16, (32, 64))
        acc = hl.register(hl.f32, (128, 64))
        hl.mma(sa, sb, acc)

    with pytest.raises(hl.KernelError, match="only for a shared b .a shared or in registers. in a") as e:
        lone.trace()
    assert "lone" in str(e.value) and "hl.mma(sa, sb, acc)" in str(e.value)


@pytest.mark.nvrtc
def test_the_pair_kernel_compiles_for_sm_100a(built):
    """NVRTC for sm_100a: no spills; the pair's MMA (UTCHMMA.2CTA) and multicast commit in the SASS."""
    from hexlayout.runtime import compile_cuda

    g = built.generated
    ck = compile_cuda(g.source, "sm_100a", name=g.name, backend="nvrtc", cache=False)
    assert ck.resources is not None and not ck.resources.spills, ck.log
    counts = ck.sass_counts()
    assert counts.get("UTCHMMA.2CTA", 0) >= 8 and counts.get("UTCBAR.2CTA.MULTICAST", 0) >= 2, sorted(counts)


def tma_pair_gemm(pair_barrier: bool = True):
    """One k-tile of the pair form with TMA loads: each CTA loads its 128 rows of ``a`` and its
    32 rows of ``b``; with ``pair_barrier`` their bytes complete on the even CTA's barrier (which
    expects both CTAs' bytes), the only barrier the MMA's issuer waits on."""

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def tma_pair(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        pid = hl.grid(hl.spatial(2 * hl.cdiv(a.shape[0], 256)))
        r = hl.cluster_rank()
        sa = hl.shared(hl.f16, (128, 64))
        sb = hl.shared(hl.f16, (32, 64))
        full = hl.mbarrier(1)
        hl.mbarrier_init(full, 0, arrivals=1)
        hl.cluster_sync()
        if pair_barrier:         # the even CTA's barrier expects both CTAs' bytes
            with hl.if_(r.eq(0)):
                hl.arrive(full, 0, tx_bytes=2 * (sa.nbytes + sb.nbytes), who="one")
        else:                    # each CTA's barrier its own
            hl.arrive(full, 0, tx_bytes=sa.nbytes + sb.nbytes, who="one")
        hl.copy(hl.view(a, tile=(128, 64), origin=(pid * 128, 0)), sa, mbarrier=full[0],
                pair_barrier=pair_barrier)
        hl.copy(hl.view(b, tile=(32, 64), origin=(r * 32, 0)), sb, mbarrier=full[0],
                pair_barrier=pair_barrier)
        with hl.if_(r.eq(0)):
            hl.wait(full, 0, phase=0)        # the pair's bytes (with pair_barrier: both CTAs')
        acc = hl.register(hl.f32, (128, 64))
        hl.mma(sa, sb, acc, accumulate=False)
        hl.wgmma_commit()
        hl.wgmma_wait(0)
        hl.copy(acc, hl.view(c, tile=(128, 64), origin=(pid * 128, 0)))
        hl.cluster_sync()

    return tma_pair


def _tma_args(seed=28):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (300, 64)).astype(np.float16)
    b = rng.uniform(-1, 1, (64, 64)).astype(np.float16)
    return a, b, {"a": a, "b": b, "c": np.full((300, 64), np.nan, np.float32)}


def test_tma_loads_completing_on_the_pairs_barrier_feed_the_pair_mma():
    bld = build(tma_pair_gemm(), "sm_100a", compile=False)
    loads = [i for i in walk_instrs(bld.lowered.body) if isinstance(i, L.TmaLoad)]
    assert len(loads) == 2 and all(i.pair_bar for i in loads)
    assert "cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global" in bld.generated.source
    a, b, args = _tma_args()
    run(bld.lowered, args)
    np.testing.assert_allclose(args["c"], a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-5)


def test_without_the_pairs_barrier_the_mma_reads_the_peers_bytes_unordered():
    """Each CTA's loads complete on its own barrier and only the even CTA waits: its MMA reads
    the odd CTA's tiles unordered with the odd CTA's TMA load of them."""
    from hexlayout.emulator import RaceError

    bld = build(tma_pair_gemm(pair_barrier=False), "sm_100a", compile=False)
    with pytest.raises(RaceError) as e:
        run(bld.lowered, _tma_args()[2])
    assert e.value.instr.opname == "TmaLoad" and e.value.block == (1,)
    assert "conflicting: Tcgen05Mma" in str(e.value)


@pytest.mark.nvrtc
def test_the_tma_pair_kernel_compiles_for_sm_100a():
    """NVRTC accepts cp.async.bulk.tensor.cta_group::2 for sm_100a (no spills): UTMALDG.2D.2CTA."""
    from hexlayout.runtime import compile_cuda

    g = build(tma_pair_gemm(), "sm_100a", compile=False).generated
    ck = compile_cuda(g.source, "sm_100a", name=g.name, backend="nvrtc", cache=False)
    assert ck.resources is not None and not ck.resources.spills, ck.log
    counts = ck.sass_counts()
    assert counts.get("UTMALDG.2D.2CTA", 0) >= 2 and counts.get("UTCHMMA.2CTA", 0) >= 4, sorted(counts)
