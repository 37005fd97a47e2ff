"""sm_100a: a register tile as the A operand of ``tcgen05.mma`` staged through shared memory by
synthesis where tensor memory cannot take it (two warp groups; A beside accumulators over 512
columns): a K-major swizzled ring the lowering allocates, ``st.shared`` of the fragment,
``fence.proxy.async``, a barrier, the ``_SS`` atom (``synth.smem_stage``, ``synth.umma_choice``'s
A-source cost model, ``ir.lower.umma.stage_depths``). Emulated against float64 on random data
over a ragged K (the ring wrapping); a ring one buffer too small is reported by the emulator; a
loop that never waits for its MMAs, and a pair's register A, are errors naming kernel, op and line."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import AsyncHazardError, run
from hexlayout.errors import HexlayoutError
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.synth.solve import synthesize
from hexlayout.synth.umma_choice import a_source_costs, register_a_refusal, register_a_source

from .register_a_gemm import BK, K, M, N, gemm_args, load_k_tile, register_a_gemm, walk

KX = 4 * BK + 8           # ragged K: 5 k-tiles, the last one 8 wide (zero-filled)


def two_group_gemm(pending: int = 1):
    """``register_a_gemm`` on 256 threads (two warp groups: no tcgen05.st writes A into TMEM)."""
    return register_a_gemm(f"smem_a_two_groups_w{pending}", 256, pending)


def two_accumulator_gemm():
    """``c = (2 a) @ b^T`` and ``d = a @ b^T``, ``[64, 256]`` each, on one warp group: the two f32
    accumulators take all 512 TMEM columns, so neither register A fits beside them."""

    @hl.kernel(threads=128, name="smem_a_two_accumulators")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N], d: hl.f32[M, N]):
        sb = hl.shared(hl.f16, (256, BK, 2))
        acc = hl.zeros((64, 256), hl.f32)
        acc2 = hl.zeros((64, 256), hl.f32)
        for kt in hl.range(hl.cdiv(a.shape[1], BK)):
            w = load_k_tile(a, b, sb[:, :, kt % 2], kt)
            hl.mma(w + w, sb[:, :, kt % 2], acc)
            hl.mma(w, sb[:, :, kt % 2], acc2)
            hl.wgmma_commit()
            hl.wgmma_wait(0)      # the B stage is refilled two k-tiles on
        hl.copy(acc, c.tile((64, 256), (0, 0)))
        hl.copy(acc2, d.tile((64, 256), (0, 0)))

    return k


@pytest.fixture(scope="module")
def two_groups():
    return synthesize(two_group_gemm().trace(), "sm_100a")


def _mma_choices(syn) -> list[str]:
    return [i for op, i in syn.lowered.choices if type(op).__name__ == "Mma"]


def test_two_warp_groups_stage_a_through_a_shared_ring(two_groups) -> None:
    args, want = gemm_args(KX)
    run(two_groups.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], 2 * want, rtol=1e-5, atol=1e-5)
    (choice,) = _mma_choices(two_groups)
    assert "_SS" in choice and "register A staged through shared memory (64x32 K-major, 64-byte swizzle, " \
        "1 st.shared.b128 per thread, a ring of 2)" in choice, choice
    body = list(walk(two_groups.lowered.kernel.body))
    staged = [i for i in body if i.origin == "st.shared of the register A operand"]
    assert [type(i).__name__ for i in staged] == ["StShared", "FenceProxyAsync", "BarSync", "Tcgen05Fence",
                                                   "Alu"], staged
    assert staged[0].bits == 128
    mmas = [i for i in body if isinstance(i, T.Tcgen05Mma)]
    assert mmas and all(isinstance(i.a, L.SmemDesc) and i.a.swizzle == 2 for i in mmas)   # 64-byte mode
    assert not any(isinstance(i, T.Tcgen05St) and "register A" in i.origin for i in body)
    # wgmma_wait(1): one earlier execution may read A at the store: a ring of two 4096-byte buffers
    (ring,) = [b for b in two_groups.lowered.kernel.smem if b.name.endswith("_stage")]
    assert (ring.nbytes, ring.offset % 1024) == (2 * 64 * BK * 2, 0)
    d = next(d for d in two_groups.decisions if d.subject.startswith("mma at"))
    alt = d.alternatives[0]
    assert alt.what == "A written to TMEM for the _TS atom" and alt.status == "rejected"
    assert "256 threads: tcgen05.st writes A from one warp group's lanes" in alt.reason
    assert "shared memory's 5 instructions (1 st.shared.b128" in alt.reason, alt.reason


def test_a_ring_one_buffer_short_is_reported_by_the_emulator(monkeypatch) -> None:
    """The same kernel with the ring forced to one buffer: k-tile ``k + 1``'s stores overwrite the A
    the MMA of ``k`` (left in flight by ``wgmma_wait(1)``) may still read."""
    import hexlayout.ir.lower.umma as lu

    real = lu.stage_depths
    monkeypatch.setattr(lu, "stage_depths", lambda lw: {u: 1 for u in real(lw)})
    syn = synthesize(two_group_gemm().trace(), "sm_100a")
    assert not [b for b in syn.lowered.kernel.smem if b.name.endswith("_stage") and b.nbytes != 4096]
    with pytest.raises(AsyncHazardError) as e:
        run(syn.lowered.kernel, gemm_args(KX)[0])
    msg = str(e.value)
    assert "while an in-flight" in msg and "smem_a_two_groups_w1" in msg, msg
    assert "hl.mma(w + w, sb[:, :, kt % 4], acc)" in msg, msg


def test_deeper_waits_get_deeper_rings() -> None:
    syn = synthesize(two_group_gemm(pending=2).trace(), "sm_100a")
    (ring,) = [b for b in syn.lowered.kernel.smem if b.name.endswith("_stage")]
    assert ring.nbytes == 3 * 4096
    args, want = gemm_args(KX, seed=41)
    run(syn.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], 2 * want, rtol=1e-5, atol=1e-5)


def test_two_accumulators_of_256_columns_stage_both_register_as() -> None:
    syn = synthesize(two_accumulator_gemm().trace(), "sm_100a")
    choices = _mma_choices(syn)
    assert len(choices) == 2 and all("_SS" in c and "staged through shared memory" in c for c in choices)
    body = list(walk(syn.lowered.kernel.body))
    assert [i.ncols for i in body if isinstance(i, T.TmemAlloc)] == [512]
    # wgmma_wait(0) after each k-tile: no execution in flight at a store, one buffer per mma
    assert sorted(b.nbytes for b in syn.lowered.kernel.smem if b.name.endswith("_stage")) == [4096, 4096]
    alt = next(d for d in syn.decisions if d.subject.startswith("mma at")).alternatives[0]
    assert "A in TMEM needs 16 columns beside the accumulators' 512" in alt.reason, alt.reason
    args, want = gemm_args(3 * BK - 16, n=256, seed=43)
    args["d"] = np.full((64, 256), np.nan, np.float32)
    run(syn.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], 2 * want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(args["d"], want, rtol=1e-5, atol=1e-5)


def test_cost_model_chooses_per_op() -> None:
    f16, f32 = hl.f16, hl.f32
    # one warp group, A beside its accumulator: TMEM (1 tcgen05.st + 4 sync against 2 x 4 + 3)
    assert register_a_source(64, 16, 64, f16, f16, f32, 128)[0] == "tmem"
    c = a_source_costs(64, 64, 16, 256)
    assert "tmem" not in c and (c["smem"].moves, c["smem"].sync) == (4, 3)     # 2 st.shared.v4 per thread
    assert register_a_source(64, 16, 64, f16, f16, f32, 256)[0] == "smem"
    # M = 128, K = 64: 1 tcgen05.st.32x32b per warp (5) against 4 st.shared.v4 per thread (11)
    assert register_a_source(128, 256, 64, f16, f16, f32, 128)[0] == "tmem"
    assert register_a_source(128, 256, 64, f16, f16, f32, 128, other_columns=256)[0] == "smem"
    assert register_a_source(128, 16, 1024, f16, f16, f32, 128)[0] == "smem"     # 512 A columns
    assert "cluster barrier" in register_a_refusal(128, 64, 64, f16, f16, f32, 128, cta_group=2)


def test_a_loop_that_never_waits_is_an_error_naming_the_op() -> None:
    @hl.kernel(threads=256, name="smem_a_no_wait")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sb = hl.shared(hl.f16, (16, BK))
        hl.copy(b.tile((16, BK), (0, 0)), sb)
        hl.commit_group()
        hl.wait_group(0)
        hl.fence_proxy_async()
        hl.syncthreads()
        acc = hl.zeros((64, 16), hl.f32)
        for kt in hl.range(a.shape[1] // BK):
            w = hl.register(hl.f16, (64, BK))
            hl.copy(a.tile((64, BK), (0, kt * BK)), w)
            hl.mma(w, sb, acc)
            hl.wgmma_commit()
        hl.wgmma_wait(0)
        hl.copy(acc, c.tile((64, 16), (0, 0)))

    with pytest.raises(HexlayoutError) as e:
        synthesize(k.trace(), "sm_100a")
    msg = str(e.value)
    assert "smem_a_no_wait" in msg and "hl.mma(w, sb, acc)" in msg, msg
    assert "no wgmma_wait, nor a wait on a barrier its MMAs arrive on" in msg, msg


def test_a_pairs_register_a_is_refused_naming_the_kernel_op_and_line() -> None:
    """The pair form of ``hl.mma`` (``c`` with twice ``b``'s rows in a 2-CTA cluster kernel) on a
    register A: the odd CTA's stores would have to reach the even CTA's issue through a cluster
    barrier, which no lowering places; the language refuses it with the remedy."""
    @hl.kernel(threads=128, cluster=(2, 1, 1), name="smem_a_pair")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        pid = hl.grid(hl.spatial(2 * hl.cdiv(a.shape[0], 256)))
        r = hl.cluster_rank()
        sb = hl.shared(hl.f16, (32, 64))
        hl.copy(hl.view(b, tile=(32, 64), origin=(r * 32, 0)), sb)
        hl.commit_group()
        hl.wait_group(0)
        hl.cluster_sync()
        w = hl.register(hl.f16, (128, 64))
        hl.copy(hl.view(a, tile=(128, 64), origin=(pid * 128, 0)), w)
        acc = hl.register(hl.f32, (128, 64))
        hl.mma(w, sb, acc, accumulate=False)
        hl.wgmma_commit()
        hl.wgmma_wait(0)
        hl.copy(acc, hl.view(c, tile=(128, 64), origin=(pid * 128, 0)))

    with pytest.raises(HexlayoutError) as e:
        synthesize(k.trace(), "sm_100a")
    msg = str(e.value)
    assert "smem_a_pair" in msg and "hl.mma(w, sb, acc, accumulate=False)" in msg, msg
    assert "N differs (32 vs 64)" in msg and "only for shared a and b" in msg and "the pair form" in msg, msg


@pytest.mark.nvrtc
def test_nvrtc_sm100a_stores_a_with_sts_and_multiplies_from_descriptors() -> None:
    """NVRTC for sm_100a: no spills, no local memory; the main loop stores the register A with
    STS.128 and multiplies with UTCHMMA (descriptors for both operands: no STTM of A in the loop,
    the accumulator's zeros are stored into TMEM once before it)."""
    from hexlayout.runtime import build

    b = build(two_group_gemm(), "sm_100a")
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0 and not st.warnings, st.summary()
    counts = b.compiled.sass_counts()
    assert counts.get("STS.128", 0) >= 1 and counts.get("UTCHMMA", 0) >= 1, sorted(counts)
    assert not any(op.startswith(("HMMA", "HGMMA")) for op in counts), sorted(counts)
    ml = st.main_loop.mix if st.main_loop is not None else {}
    assert ml.get("STS", 0) >= 1 and ml.get("UTCHMMA", 0) >= 1 and ml.get("STTM", 0) == 0, ml
    assert ml.get("FENCE", 0) >= 1 and ml.get("BAR", 0) >= 1, ml        # fence.proxy.async, the barrier


@pytest.mark.parametrize(("m", "k", "bits", "threads", "swizzle"), [
    (64, 32, 16, 256, 64), (64, 64, 16, 128, 128), (128, 128, 16, 256, 128), (128, 16, 16, 128, 32),
    (128, 64, 8, 128, 64)])
def test_staged_stores_are_conflict_free_16_byte_vectors(m, k, bits, threads, swizzle) -> None:
    """Each ``st.shared`` of ``smem_a_stage``'s register layout into its swizzled K-major buffer:
    every thread's vector is contiguous in shared memory, and each phase of 8 threads (a 16-byte
    store's) lands in 8 distinct 16-byte bank groups."""
    from hexlayout.layout import size
    from hexlayout.synth.smem_stage import smem_a_stage

    s = smem_a_stage(m, k, bits, threads)
    assert s is not None and s.swizzle == swizzle and s.vector_elems * bits == 128
    tv, lay = s.register_tv, s.layout
    vals = size(tv[1])
    elems = np.asarray(tv.indices()).reshape(vals, threads).T              # [thread, value] -> m + M k
    assert sorted(elems.ravel()) == list(range(m * k))
    addr = np.asarray([lay(int(i)) for i in range(m * k)])[elems] * bits // 8   # byte offsets
    e = s.vector_elems
    for j in range(vals // e):
        vec = addr[:, j * e:(j + 1) * e]
        assert (np.diff(vec, axis=1) == bits // 8).all()                   # one contiguous vector
        for p in range(threads // 8):
            groups = (vec[8 * p:8 * p + 8, 0] // 16) % 8
            assert len(set(groups.tolist())) == 8, (j, p, vec[8 * p:8 * p + 8, 0])
