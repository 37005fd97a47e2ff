"""The 2-CTA GEMM on sm_100a (``gemm_sm100_kernel`` with ``CLUSTER=2``): a pair of CTAs per
``tcgen05.mma.cta_group::2`` (each CTA its 128 rows of A and half of the pair's B tile), in the
emulator against float64 on ragged shapes with the stage ring wrapping, both CTAs' loads on the
even CTA's barrier and the broken pipeline (each CTA's loads on its own barrier) rejected, the
config in the shipped space and chosen for large problems, and the NVRTC build (no spills,
UTCHMMA.2CTA and the multicast commit in the SASS)."""

from __future__ import annotations

import numpy as np
import pytest
from hexlayout.ops.gemm.config import CONFIGS, choose_config
from hexlayout.ops.gemm.kernels import gemm_sm100_kernel

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.ir.lowered import walk_instrs
from hexlayout.synth.solve import synthesize

PAIR = [c for c in CONFIGS["sm_100a"] if c.cluster == 2]
SMALL = dict(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1, CLUSTER=2)


def _args(m, n, k, b_layout, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    return a, b, {"a": a, "b": b if b_layout == "nk" else np.ascontiguousarray(b.T),
                  "c": np.full((m, n), np.nan, np.float16)}


@pytest.mark.parametrize(("b_layout", "shape", "consts"), [
    ("nk", (300, 104, 200), SMALL),
    ("kn", (136, 72, 136), {**SMALL, "STAGE_EPILOGUE": True}),       # N-major B halves, TMA-store epilogue
    ("nk", (130, 136, 264), {**SMALL, "BN": 128, "STAGES": 3, "CONSUMERS": 2}),
    ("nk", (600, 136, 136), {**SMALL, "GRID": 2}),    # persistent: 2 pairs walk 3 x 3 tiles (5 and 4)
    ("nk", (600, 56, 136), {**SMALL, "GRID": 1}),     # 3 tiles on one pair: accumulator stages 0, 1, 0
    ("nk", (300, 200, 136), {**SMALL, "BN": 128, "STAGES": 3, "CONSUMERS": 2, "GRID": 1,
                             "STAGE_EPILOGUE": True}),    # 4 tiles, two epilogue warp groups, TMA stores
])
def test_emulated_pair_gemm_matches_float64(b_layout, shape, consts):
    """M = 300: the second pair's odd CTA holds rows 384.. past M (it still runs its half of the
    MMA); N = 104: a ragged second tile; K = 200: 4 k-tiles on 2 stages (the ring wraps twice);
    two consumer warp groups reading 64 columns each of a pair's N = 128."""
    m, n, k = shape
    syn = synthesize(gemm_sm100_kernel(hl.f16, b_layout).trace(**consts), "sm_100a")
    lk = syn.lowered.kernel
    assert lk.cluster == (2, 1, 1)
    bn = consts["BN"]
    assert {i.atom for i in walk_instrs(lk.body) if isinstance(i, T.Tcgen05Mma)} == \
        {f"SM100_2x1SM_256x{bn}x16_F32F16F16_SS"}
    a, b, args = _args(m, n, k, b_layout, m + n + k)
    rep = run(lk, args)
    assert len(rep.blocks) == 2 * (consts.get("GRID") or -(-m // 256) * -(-n // bn))
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(args["c"].astype(np.float64), want, rtol=1e-2, atol=1e-2)


def test_without_the_pair_barrier_the_emulator_rejects_the_pipeline():
    """Each CTA's loads complete on its own barrier (``peer_release=False``), the even CTA waits on
    its own only: its MMA runs before the odd CTA's producer even filled the stage, the MMA's
    release (multicast to both CTAs) lands on the odd CTA's empty barrier ahead of its producer's
    first wait, and the phases no longer match: the odd CTA's producer waits forever."""
    from hexlayout.emulator import DeadlockError

    syn = synthesize(gemm_sm100_kernel(hl.f16, "nk", peer_release=False).trace(**SMALL), "sm_100a")
    loads = [i for i in walk_instrs(syn.lowered.kernel.body) if isinstance(i, L.TmaLoad)]
    assert loads and not any(i.pair_bar for i in loads)
    with pytest.raises(DeadlockError) as e:
        run(syn.lowered.kernel, _args(256, 64, 128, "nk", 5)[2])
    assert "block (1,) threads 0-127" in str(e.value) and "ring_empty[0]: phase 1" in str(e.value)


def test_both_ctas_loads_complete_on_the_even_ctas_barrier():
    """The pair's TMA loads carry the pair barrier (cta_group::2), only the even CTA's producer
    expects bytes (both CTAs'), and no CTA arrives on its peer's stage barriers in the k-loop."""
    syn = synthesize(gemm_sm100_kernel(hl.f16, "nk").trace(**SMALL), "sm_100a")
    body = list(walk_instrs(syn.lowered.kernel.body))
    loads = [i for i in body if isinstance(i, L.TmaLoad)]
    assert len(loads) == 2 and all(i.pair_bar for i in loads)
    expects = [i for i in body if isinstance(i, L.MbarArrive) and i.tx_bytes]
    assert [i.tx_bytes for i in expects] == [2 * (128 * 64 + 32 * 64) * 2]
    assert not any(isinstance(i, L.MbarArrive) and i.cta is not None and i.bar.name.startswith("ring")
                   for i in body)


def test_the_pair_configs_are_shipped_and_the_persistent_one_chosen_for_large_problems():
    assert [(c.BM, c.BN, c.CONSUMERS, c.persistent, c.STAGES) for c in PAIR] == \
        [(128, 256, 2, False, 6), (128, 256, 2, True, 6)]
    cfg = PAIR[1]
    consts = cfg.consts(4096, 4096)
    assert consts["CLUSTER"] == 2 and consts["GRID"] == 74 and str(cfg).endswith("persistent cluster 2")
    assert cfg.consts(512, 768)["GRID"] == 6                           # 2 x 3 tiles of 256x256: 6 pairs
    assert PAIR[0].consts(4096, 4096)["GRID"] == 0
    assert choose_config("sm_100a", 4096, 4096, 4096) == cfg
    assert choose_config("sm_100a", 512, 512, 4096).cluster == 1      # too few tiles to fill the SMs
    assert choose_config("sm_100a", 4096, 128, 4096).cluster == 1     # N narrower than the pair's tile
    with pytest.raises(ValueError, match="BM=128 rows per CTA"):
        gemm_sm100_kernel(hl.f16).trace(**{**SMALL, "BM": 64})


@pytest.mark.nvrtc
def test_pair_config_builds_for_sm100_with_2cta_sass():
    """The shipped pair config through the op's build: NVRTC for sm_100a, no spills; the SASS has
    the pair's MMA (UTCHMMA.2CTA), its multicast commit, the pair's allocator and the TMEM loads."""
    from hexlayout.ops.gemm.op import gemm_build

    bld = gemm_build(hl.bf16, "nk", (False, False, "none", False), "sm_100a", PAIR[1], 4096, 4096)
    res = bld.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and 0 < res.registers <= 255, res
    counts = bld.compiled.sass_counts()
    assert counts.get("UTCHMMA.2CTA", 0) >= 4, sorted(counts)
    assert counts.get("UTCBAR.2CTA.MULTICAST", 0) >= 1, sorted(counts)
    assert any(op.startswith("UTCATOMSWS.2CTA") for op in counts), sorted(counts)
    assert any(op.startswith("LDTM") for op in counts) and any(op.startswith("UTMALDG") for op in counts)
    # the MMA loop: the even CTA's one full barrier, the issue guarded by the elected lane (no ELECT
    # loop per UTCHMMA), the stage released by the commit: at or below CuTe DSL's persistent 2x1
    # figure (44.5 per k-tile, benchmarks/results/static-sm100.md; 35 here, in the MMA warp group)
    assert len(bld.stats.setmaxnreg) == 3, bld.stats.setmaxnreg     # producer, MMA issuer, epilogue
    lp = bld.stats.main_loop
    assert lp.mma_opcode.startswith("UTCHMMA.2CTA") and lp.mix.get("ELECT", 0) == 0, lp
    assert lp.non_mma_per_ktile is not None and lp.non_mma_per_ktile <= 44.5, lp


def test_op_build_of_a_pair_config_with_a_fused_epilogue_matches_float64():
    """The op's build (``gemm_fused``: bias + ReLU fused after the tcgen05.ld) of a small pair
    config, bf16, ragged M and N, emulated for sm_100a."""
    from hexlayout.ops.gemm.config import GemmConfig
    from hexlayout.ops.gemm.op import _arg_order, gemm_fused

    m, n, k = 200, 88, 136
    ep = (True, False, "relu", False)
    cfg = GemmConfig("sm_100a", 128, 64, 64, 2, CONSUMERS=1, cluster=2)
    bld, prog = gemm_fused(hl.bf16, "nk", ep, "sm_100a", cfg, m, n, compile=False)
    assert bld.lowered.cluster == (2, 1, 1) and "gemm_sm100_bf16" in bld.generated.name
    rng = np.random.default_rng(m + n + k)
    npdt = hl.bf16.numpy()
    a = rng.standard_normal((m, k)).astype(npdt)
    b = rng.standard_normal((n, k)).astype(npdt)
    bias = rng.standard_normal(n).astype(npdt)
    c = np.full((m, n), np.nan, npdt)
    by_role = {"a": a, "b": b, "c": c, "bias": bias.reshape(1, n), "residual": None, "scale": 0.5}
    roles = ["a", "b", "c", "bias", "residual", "scale"]
    names = [p.name for p in bld.tile_kernel.params]
    run(bld.lowered, {name: by_role[roles[i]] for name, i in zip(names, _arg_order(prog, ep))})
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64).T + bias.astype(np.float64), 0)
    err = np.abs(c.astype(np.float64) - want) / (np.abs(want) + 1)
    assert err.max() < 1e-2


# --- the persistent pair: an MMA warp group runs ahead of both CTAs' epilogues ---------------------

PERSISTENT = {**SMALL, "GRID": 1}


@pytest.fixture(scope="module")
def persistent_pair():
    return synthesize(gemm_sm100_kernel(hl.f16, "nk").trace(**PERSISTENT), "sm_100a").lowered.kernel


def test_persistent_pair_k_zero_writes_a_zero_product(persistent_pair):
    c = np.full((300, 104), np.nan, np.float16)
    z = {"a": np.zeros((300, 0), np.float16), "b": np.zeros((104, 0), np.float16)}
    run(persistent_pair, {**z, "c": c})
    assert np.all(c == 0)


def test_persistent_pair_roles(persistent_pair):
    """Warp group 0 loads, warp group 1 of the even CTA issues the pair's MMAs (the odd CTA's only
    exits), warp groups 2.. of both CTAs run the epilogue. The MMA group commits tile ``j`` onto
    ``acc_full[s]`` (multicast to both CTAs) and waits only on ``acc_empty`` of the stage it is
    about to write; each epilogue warp releases the stage on the even CTA's ``acc_empty`` (after
    its loads' ``wait::ld`` and ``fence::before_thread_sync``, a ``__syncwarp`` and lane 0's remote
    arrive with cluster-scope release); the barrier expects both CTAs' epilogue warps."""
    lk = persistent_pair
    assert lk.threads == 384 and lk.cluster == (2, 1, 1)
    producer = next(i for i in lk.body if isinstance(i, L.IfThen) and i.else_body)
    roles = next(i for i in producer.else_body if isinstance(i, L.IfThen) and i.else_body)
    mma, epilogue = list(walk_instrs(roles.then_body)), list(walk_instrs(roles.else_body))
    commits = [i for i in mma if isinstance(i, T.Tcgen05Commit) and i.bar.name == "acc_full"]
    assert len(commits) == 2 and all(i.cta_group == 2 and i.multicast is not None for i in commits)
    events = [(type(i).__name__, i.bar.name, str(i.bar.index)) for i in mma
              if isinstance(i, (L.MbarWait, T.Tcgen05Commit)) and i.bar.name.startswith("acc_")]
    assert events == [("MbarWait", "acc_empty", "0"), ("Tcgen05Commit", "acc_full", "0"),
                      ("MbarWait", "acc_empty", "1"), ("Tcgen05Commit", "acc_full", "1")]
    assert not any(isinstance(i, (T.Tcgen05Mma, T.Tcgen05Commit)) for i in epilogue)
    releases = [n for n, i in enumerate(epilogue)
                if isinstance(i, L.MbarArrive) and i.bar.name == "acc_empty"]
    assert len(releases) == 2
    for n in releases:
        arrive = epilogue[n]
        assert str(arrive.cta) == "0" and arrive.scope == "cluster" and arrive.pred is not None
        assert isinstance(epilogue[n - 1], L.WarpSync)
        waited = max(j for j, i in enumerate(epilogue[:n])
                     if isinstance(i, T.Tcgen05Wait) and i.kind == "ld")
        assert any(isinstance(i, T.Tcgen05Fence) and i.kind == "before_thread_sync"
                   for i in epilogue[waited:n])
    inits = [i.arrivals for i in walk_instrs(lk.body)
             if isinstance(i, L.MbarInit) and i.bar.name == "acc_empty"]
    assert inits == [2 * 4, 2 * 4]         # per stage: the 4 epilogue warps of each CTA


def _run_logged(lk, monkeypatch, shape=(300, 104, 200)):
    """Run ``lk`` on random data recording, per tile, the clock of each MMA's issuer and the
    (thread, epoch) of each epilogue ``tcgen05.ld`` (the race detector's vector clocks)."""
    from hexlayout.emulator import interpreter

    h = dict(interpreter.HANDLERS)
    state = {"tile": 0, "done": {0: 0, 1: 0}, "mmas": [], "loads": []}

    def mma(m, ins, x):
        if len(x.tids):
            state["mmas"].append((state["tile"], m.shadow.clocks.c[int(x.tids[0])].copy()))
        h[T.Tcgen05Mma](m, ins, x)

    def commit(m, ins, x):
        h[T.Tcgen05Commit](m, ins, x)
        state["tile"] += bool(len(x.tids)) and ins.bar.name == "acc_full"

    def load(m, ins, x):
        cl = m.shadow.clocks
        state["loads"] += [(m.rank, state["done"][m.rank], cl.off + int(t), int(cl.c[t, cl.off + t]))
                           for t in x.tids]
        h[T.Tcgen05Ld](m, ins, x)

    def arrive(m, ins, x):
        h[L.MbarArrive](m, ins, x)
        state["done"][m.rank] += bool(len(x.tids)) and ins.bar.name == "acc_empty"

    for ty, fn in ((T.Tcgen05Mma, mma), (T.Tcgen05Commit, commit), (T.Tcgen05Ld, load),
                   (L.MbarArrive, arrive)):
        monkeypatch.setitem(interpreter.HANDLERS, ty, fn)
    a, b, args = _args(*shape, "nk", 11)
    run(lk, args)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(args["c"].astype(np.float64), want, rtol=1e-2, atol=1e-2)
    return state


def test_persistent_pair_mmas_of_the_next_tile_are_not_ordered_after_the_epilogue(persistent_pair,
                                                                                    monkeypatch):
    """4 tiles on one pair (stages 0, 1, 0, 1), by happens-before: no MMA of tile ``j + 1`` is
    ordered after any tcgen05.ld of tile ``j``'s epilogue in either CTA (the tensor cores may run
    it while both CTAs drain tile ``j``), while every MMA of tile ``j + 2`` (the same TMEM columns)
    is ordered after every load of tile ``j`` in both CTAs (the even CTA's acc_empty)."""
    st = _run_logged(persistent_pair, monkeypatch)
    assert st["tile"] == 4 and st["done"] == {0: 4, 1: 4}

    def seen(j, i, rank):            # per (MMA of tile j, load of tile i in CTA rank): ordered?
        lds = [(g, e) for r, t, g, e in st["loads"] if r == rank and t == i]
        assert lds
        return {bool(clk[g] >= e) for t, clk in st["mmas"] if t == j for g, e in lds}

    for j in range(1, 4):
        for rank in (0, 1):
            assert seen(j, j - 1, rank) == {False}, (j, rank)
            if j >= 2:
                assert seen(j, j - 2, rank) == {True}, (j, rank)


def test_without_the_odd_ctas_release_the_emulator_rejects_the_mma(monkeypatch):
    """Each CTA's epilogue releases its own acc_empty (the arrive on the even CTA's barrier missing
    for the odd CTA, the barrier expecting one CTA's arrivals): the even CTA's MMA into a stage then
    overwrites the odd CTA's TMEM columns unordered with its epilogue's reads - the emulator names
    the odd CTA's reader."""
    from hexlayout.emulator import AsyncHazardError

    lk = synthesize(gemm_sm100_kernel(hl.f16, "nk").trace(**PERSISTENT), "sm_100a").lowered.kernel
    for i in walk_instrs(lk.body):
        if isinstance(i, L.MbarArrive) and i.bar.name == "acc_empty":
            i.cta = None
        if isinstance(i, L.MbarInit) and i.bar.name == "acc_empty":
            i.arrivals //= 2
    with pytest.raises(AsyncHazardError, match=r"in the pair's CTA \(block \(1,\).*reads with tcgen05.ld"):
        run(lk, _args(300, 104, 200, "nk", 3)[2])


def test_without_the_fence_after_the_loads_the_emulator_rejects_the_mma():
    """The epilogue's tcgen05.fence::before_thread_sync after its wait::ld left out: its arrive no
    longer orders the loads before the next MMA into their columns."""
    from hexlayout.emulator import AsyncHazardError

    lk = synthesize(gemm_sm100_kernel(hl.f16, "nk").trace(**PERSISTENT), "sm_100a").lowered.kernel
    body = list(walk_instrs(lk.body))
    for n, i in enumerate(body[:-1]):
        if isinstance(i, T.Tcgen05Wait) and i.kind == "ld" and isinstance(body[n + 1], T.Tcgen05Fence):
            body[n + 1].kind = "after_thread_sync"
    with pytest.raises(AsyncHazardError, match="no tcgen05.fence::before_thread_sync followed"):
        run(lk, _args(300, 104, 200, "nk", 4)[2])


def test_an_elected_arrive_without_its_warp_sync_is_an_emulator_error():
    """Lane 0's arrive releases only its own loads without the ``__syncwarp`` before it: the
    next MMA into the stage is unordered with lanes 1..31's reads."""
    from hexlayout.emulator import AsyncHazardError

    lk = synthesize(gemm_sm100_kernel(hl.f16, "nk").trace(**PERSISTENT), "sm_100a").lowered.kernel

    def drop(body):
        for n, i in enumerate(body):
            if isinstance(i, L.WarpSync):
                body[n] = L.Comment("(no __syncwarp)")
            for attr in ("body", "then_body", "else_body"):
                sub = getattr(i, attr, None)
                if isinstance(sub, list):
                    drop(sub)

    drop(lk.body)
    assert not any(isinstance(i, L.WarpSync) for i in walk_instrs(lk.body))
    with pytest.raises(AsyncHazardError, match="reads with tcgen05.ld"):
        run(lk, _args(300, 104, 200, "nk", 6)[2])
