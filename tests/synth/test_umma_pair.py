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

    with pytest.raises(hl.KernelError, match="only for shared a and b in a kernel of 2-CTA clusters") as e:
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
