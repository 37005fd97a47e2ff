"""The GEMM on sm_100a (``gemm_sm100_kernel``: the sm_90a kernel source, tcgen05 synthesized):
the emulator against float64 on ragged shapes, dispatch by ``HEXLAYOUT_EMULATE_ARCH``, and the
NVRTC build for sm_100a (no spills, UTCHMMA and LDTM in the SASS)."""

from __future__ import annotations

import numpy as np
import pytest
from hexlayout.ops.gemm.kernels import gemm_sm100_kernel

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.synth.solve import synthesize


def _check(dtype, consts, m, n, k, seed=1, b_layout="nk", a_layout="mk"):
    """f16 in the emulator (bf16 runs through the op: ``test_gemm_op_dispatches_to_sm100``)."""
    tk = gemm_sm100_kernel(dtype, b_layout, a_layout=a_layout).trace(**consts)
    assert tk.name.startswith("gemm_sm100_")
    syn = synthesize(tk, "sm_100a")
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    args = {"a": a if a_layout == "mk" else np.ascontiguousarray(a.T),
            "b": b if b_layout == "nk" else np.ascontiguousarray(b.T),
            "c": np.full((m, n), np.nan, np.float16)}
    run(syn.lowered.kernel, args)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(args["c"].astype(np.float64), want, rtol=1e-2, atol=1e-2)


def test_one_tile_ragged_f16():
    _check(hl.f16, dict(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1), 100, 56, 152)


def test_persistent_four_tiles_on_two_blocks():
    _check(hl.f16, dict(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1, GRID=2), 200, 120, 136)


@pytest.mark.parametrize("consts,shape", [
    (dict(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1, GRID=1), (200, 120, 136)),   # 4 tiles: stages wrap
    (dict(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1, GRID=2), (300, 120, 72)),    # 3 tiles per CTA
    (dict(BM=64, BN=128, BK=64, STAGES=3, CONSUMERS=2, GRID=1, STAGE_EPILOGUE=True), (70, 136, 136)),
])
def test_persistent_accumulator_stages_rotate_and_wrap(consts, shape):
    """The persistent kernel's MMA warp group fills accumulator stage ``j % 2`` with the CTA's
    ``j``-th tile while the epilogue warp groups drain the other; ragged M, N and K."""
    _check(hl.f16, consts, *shape)


def test_persistent_mma_role_runs_ahead_of_the_epilogue():
    """Warp group 0 loads (TMA), warp group 1 issues the MMAs, warp groups 2.. run the epilogue.
    After committing tile ``j`` onto ``acc_full[s]`` the MMA group goes on to tile ``j + 1`` in the
    other stage: before its MMAs it waits only for the ring and for ``acc_empty`` of *that* stage
    (tile ``j - 1``'s epilogue), never for the epilogue of tile ``j``; the epilogue groups issue
    no MMA and wait on ``acc_full`` before their tcgen05.ld."""
    from hexlayout.ir import lowered as L
    from hexlayout.ir import lowered_tcgen05 as T

    syn = synthesize(gemm_sm100_kernel(hl.f16, "nk").trace(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1,
                                                           GRID=2), "sm_100a")
    lk = syn.lowered.kernel
    assert lk.threads == 384
    producer = next(i for i in lk.body if isinstance(i, L.IfThen) and i.else_body)
    roles = next(i for i in producer.else_body if isinstance(i, L.IfThen) and i.else_body)
    mma, epilogue = list(L.walk_instrs(roles.then_body)), list(L.walk_instrs(roles.else_body))
    assert any(isinstance(i, T.Tcgen05Mma) for i in mma)
    assert not any(isinstance(i, (T.Tcgen05Mma, T.Tcgen05Commit)) for i in epilogue)
    events = [(type(i).__name__, i.bar.name, str(i.bar.index)) for i in mma
              if isinstance(i, (L.MbarWait, T.Tcgen05Commit)) and i.bar.name.startswith("acc_")]
    assert events == [("MbarWait", "acc_empty", "0"), ("Tcgen05Commit", "acc_full", "0"),
                      ("MbarWait", "acc_empty", "1"), ("Tcgen05Commit", "acc_full", "1")]
    assert not any(isinstance(i, L.MbarWait) and i.bar.name in ("acc_full", "tc_done") for i in mma)
    first_ld = next(n for n, i in enumerate(epilogue) if isinstance(i, T.Tcgen05Ld))
    assert any(isinstance(i, L.MbarWait) and i.bar.name == "acc_full" for i in epilogue[:first_ld])


def test_mn_major_a_and_b():
    """A stored K x M and B stored K x N: MN-major shared stages, read through MN-major descriptors
    (instruction-descriptor bits 15 and 16)."""
    _check(hl.f16, dict(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1), 104, 56, 136, b_layout="kn",
           a_layout="km")


@pytest.mark.parametrize(("consts", "m", "n"), [
    (dict(BM=64, BN=64, BK=64, STAGES=2, CONSUMERS=1), 64, 64),
    (dict(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1, GRID=1), 200, 120),     # persistent: 4 tiles
])
def test_k_zero_writes_a_zero_product(consts, m, n):
    syn = synthesize(gemm_sm100_kernel(hl.f16, "nk").trace(**consts), "sm_100a")
    c = np.full((m, n), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": np.zeros((m, 0), np.float16), "b": np.zeros((n, 0), np.float16), "c": c})
    assert np.all(c == 0)


def test_two_consumer_warp_groups_staged_epilogue_m64():
    _check(hl.f16, dict(BM=64, BN=128, BK=64, STAGES=3, CONSUMERS=2, STAGE_EPILOGUE=True), 70, 136, 136)


def test_gemm_op_dispatches_to_sm100(monkeypatch):
    torch = pytest.importorskip("torch")
    from hexlayout.ops.gemm.op import gemm, gemm_fused

    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_100a")
    g = torch.Generator().manual_seed(3)
    a = torch.randn(100, 152, generator=g).to(torch.bfloat16)
    b = torch.randn(56, 152, generator=g).to(torch.bfloat16)
    c = gemm(a, b)
    want = a.double() @ b.double().t()
    torch.testing.assert_close(c.double(), want, rtol=1e-2, atol=2e-1)
    from hexlayout.ops.gemm.config import choose_config

    bld, _ = gemm_fused(hl.bf16, "nk", (False, False, "none", False), "sm_100a",
                        choose_config("sm_100a", 100, 56, 152), 100, 56, compile=False)
    assert "gemm_sm100_bf16" in bld.generated.name


def _checked_build(cfg):
    """``gemm_build`` of ``cfg`` (bf16, 4096 x 4096): no spills or local memory, the tcgen05 MMA, TMEM
    load and commit and the TMA load in the SASS, and a main loop of UTCHMMA with at most 38
    non-MMA instructions per k-tile (CuTe DSL's dense 128x128 example 73, its persistent one 35.5:
    benchmarks/results/static-sm100.md). Returns the build's stats and SASS opcode counts."""
    from hexlayout.ops.gemm.op import gemm_build

    from hexlayout.runtime.sass import count_prefix

    b = gemm_build(hl.bf16, "nk", (False, False, "none", False), "sm_100a", cfg, 4096, 4096)
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0, st.summary()
    counts = b.compiled.sass_counts()
    for prefix in ("UTCHMMA", "LDTM", "UTCBAR", "UTMALDG"):
        assert count_prefix(counts, prefix) >= 1, (prefix, sorted(counts))
    lp = st.main_loop
    assert lp.mma_opcode.startswith("UTCHMMA"), lp
    assert lp.non_mma_per_ktile is not None and lp.non_mma_per_ktile <= 38, lp
    return st, counts


@pytest.mark.nvrtc
def test_builds_for_sm100_with_tcgen05_sass():
    from hexlayout.ops.gemm.config import CONFIGS

    from hexlayout.runtime.sass import count_prefix

    st, counts = _checked_build(CONFIGS["sm_100a"][1])      # 128x128x64, one consumer warp group
    assert count_prefix(counts, "HGMMA") == 0
    # the MMA loop (two k-tiles per iteration): full-barrier wait, 4 UTCHMMA and the stage's commit
    # guarded by the elected lane's predicate (no ELECT loop per instruction, no branch, no wait on
    # the MMAs): 35 non-MMA per k-tile here
    assert st.main_loop.mix.get("ELECT", 0) == 0, st.main_loop


@pytest.mark.nvrtc
def test_persistent_builds_for_sm100_with_an_mma_warp_group():
    """The persistent config (128x128x64, an MMA warp group and one epilogue warp group beside
    the producer): no spills, the tcgen05 MMA and loads in the SASS, the MMA loop as short as
    the non-persistent kernel's (benchmarks/results/static-sm100.md)."""
    from hexlayout.ops.gemm.config import CONFIGS

    cfg = CONFIGS["sm_100a"][0]
    assert cfg.persistent and cfg.cluster == 1
    st, _ = _checked_build(cfg)
    assert len(st.setmaxnreg) == 3, st.setmaxnreg         # producer, MMA issuer, epilogue
    assert st.main_loop.k_tiles == 2, st.main_loop


def test_zeroed_accumulator_is_stored_to_tmem_once():
    """The sm_90a example (``hl.zeros`` then ``hl.mma`` accumulating, ``wgmma_wait(0)``) on
    sm_100a: the zeroed registers go to TMEM by one tcgen05.st before the k-loop (not per k-tile),
    two consumer warp groups."""
    from hexlayout.ir import lowered as L
    from hexlayout.ir import lowered_tcgen05 as T
    from hexlayout.lang.examples.gemm_sm90 import gemm_sm90

    syn = synthesize(gemm_sm90.trace(BM=128, BN=64, BK=64, STAGES=2), "sm_100a")
    loops = [i for i in L.walk_instrs(syn.lowered.kernel.body) if isinstance(i, L.ForLoop)]
    assert not any(isinstance(i, T.Tcgen05St) for lp in loops for i in L.walk_instrs(lp.body))
    assert sum(isinstance(i, T.Tcgen05St) for i in L.walk_instrs(syn.lowered.kernel.body)) == 1
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (100, 200)).astype(np.float16)
    b = rng.uniform(-1, 1, (56, 200)).astype(np.float16)
    c = np.full((100, 56), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c.astype(np.float64), want, rtol=1e-2, atol=1e-2)


def test_without_the_mmas_releasing_the_stage_the_emulator_rejects_the_pipeline(monkeypatch):
    """Each k-tile's stage is released by its MMAs' commit (``hl.arrive(..., who="mma")``), which
    keeps the producer from refilling a stage an in-flight tcgen05.mma still reads: released by a
    plain arrive at issue instead, the emulator names the hazard."""
    import hexlayout.ir.lower.kernel as lowering
    from hexlayout.emulator import AsyncHazardError
    from hexlayout.ir.lowered import MbarArrive

    monkeypatch.setattr(lowering, "umma_arrive",
                        lambda lw, bar: [MbarArrive(bar, 0, None, pred=lw.elect[-1])])
    syn = synthesize(gemm_sm100_kernel(hl.f16, "nk").trace(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1),
                     "sm_100a")
    rng = np.random.default_rng(2)
    args = {"a": rng.uniform(-1, 1, (100, 200)).astype(np.float16),
            "b": rng.uniform(-1, 1, (56, 200)).astype(np.float16), "c": np.zeros((100, 56), np.float16)}
    with pytest.raises(AsyncHazardError, match="in-flight tcgen05.mma reads it"):
        run(syn.lowered.kernel, args)


def test_the_k_loop_releases_stages_by_commit_without_waiting():
    """sm_100a's k-loop: per k-tile one tcgen05.commit onto the stage's empty barrier, no wait on
    the MMA barriers (the tile's commit and its wait follow the loop); the issue is one elected
    branch, printed as PTX guards (the warp-uniform warp test and the prologue's elect.sync) on
    each tcgen05 instruction."""
    from hexlayout.ir import lowered as L
    from hexlayout.ir import lowered_tcgen05 as T
    from hexlayout.runtime import build

    bld = build(gemm_sm100_kernel(hl.f16, "nk"), "sm_100a", compile=False, BM=128, BN=64, BK=64, STAGES=2,
                CONSUMERS=1)
    k_loop = [i for i in L.walk_instrs(bld.lowered.body)         # the innermost loop of the MMAs
              if isinstance(i, L.ForLoop) and any(isinstance(j, T.Tcgen05Mma) for j in L.walk_instrs(i.body))
              and not any(isinstance(j, L.ForLoop) for j in L.walk_instrs(i.body))]
    assert len(k_loop) == 1
    body = list(L.walk_instrs(k_loop[0].body))
    commits = [i for i in body if isinstance(i, T.Tcgen05Commit)]
    assert [c.bar.name for c in commits] == ["ring_empty"]
    assert not any(isinstance(i, L.MbarWait) and i.bar.name == "tc_done" for i in body)
    issue = [i for i in k_loop[0].body if isinstance(i, L.ElectIf)]
    assert len(issue) == 1 and {type(i) for i in issue[0].then_body} == {T.Tcgen05Mma, T.Tcgen05Commit}
    src = bld.generated.source
    assert "const bool elected = hl_elect_one();" in src
    assert "@q tcgen05.mma" in src and "@q tcgen05.commit" in src and "warp_id == 4 && elected" in src


def test_gemm_op_epilogue_on_sm100(monkeypatch):
    """bias + GELU + residual fused into the sm_100a GEMM's epilogue (after the tcgen05.ld)."""
    torch = pytest.importorskip("torch")
    from hexlayout.ops.gemm.op import gemm

    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_100a")
    g = torch.Generator().manual_seed(4)
    a, w = torch.randn(70, 136, generator=g).half(), torch.randn(120, 136, generator=g).half()
    bias, res = torch.randn(120, generator=g).half(), torch.randn(70, 120, generator=g).half()
    c = gemm(a, w, bias=bias, residual=res, activation="gelu")
    want = torch.nn.functional.gelu(a.double() @ w.double().t() + bias.double()) + res.double()
    torch.testing.assert_close(c.double(), want, rtol=1e-2, atol=5e-2)
