"""sm_100a: a register A operand written to tensor memory gets a ring of ``R`` column sets, ``R`` one
more than the executions of its mma that may be in flight at its ``tcgen05.st`` (``ir.mma_in_flight``:
commits and ``wgmma_wait``, the tensor cores' arrivals on barriers and the waits on them), so no
store rewrites the A an MMA in flight still reads (``ir.lower.umma``: execution ``e`` writes set
``e % R``).

A k-loop with one register-A mma left in flight by ``wgmma_wait(n)`` (the program that rewrote
its A under the previous MMA before the ring) matches float64 in the emulator with the race
checks on; the same kernel with the ring forced to one set is reported; ``R`` follows the waits
(``n + 1``) and is 1 where every execution is retired at the store (``wgmma_wait(0)``, the MoE
pipelines' stage barriers); the sets count against the 512 columns in the choice."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import AsyncHazardError, run
from hexlayout.errors import HexlayoutError
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.synth.solve import synthesize
from hexlayout.synth.umma_choice import register_a_source

M, N, K = hl.dims("M N K")
BK = 32
KX = 4 * BK + 16          # ragged K: 5 k-tiles, the last one half wide (zero-filled)


def ring_gemm(pending: int = 1, bk: int = BK):
    """``c[64, 16] = (2 a)[64, K] @ b[16, K]^T`` on one warp group: each k-tile of ``a`` loaded into
    registers and doubled there (the register A of one mma op, not unrolled), ``b``'s k-tile into
    stage ``k % 4`` of a shared ring, ``wgmma_wait(pending)`` after each k-tile's commit (``pending``
    earlier executions of the mma may read A at its store); k-tiles of ``bk``."""

    @hl.kernel(threads=128, name=f"tmem_a_ring_w{pending}" + ("" if bk == BK else f"_k{bk}"))
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sb = hl.shared(hl.f16, (16, bk, 4))
        acc = hl.zeros((64, 16), hl.f32)
        for kt in hl.range(hl.cdiv(a.shape[1], bk)):
            hl.copy(b.tile((16, bk), (0, kt * bk)), sb[:, :, kt % 4])
            hl.commit_group()
            hl.wait_group(0)
            hl.fence_proxy_async()
            hl.syncthreads()
            w = hl.register(hl.f16, (64, bk))
            hl.copy(a.tile((64, bk), (0, kt * bk)), w)
            hl.wgmma_fence()
            hl.mma(w + w, sb[:, :, kt % 4], acc)
            hl.wgmma_commit()
            hl.wgmma_wait(pending)
        hl.wgmma_wait(0)
        hl.copy(acc, c.tile((64, 16), (0, 0)))

    return k


def released_gemm():
    """The same product in the MoE pipelines' form (``ops.moe.blocks.wgmma_pipeline`` on sm_100a):
    unrolled by 2, each slot's mma releasing what it read with ``hl.arrive(done, s, who="mma")``
    and no ``wgmma_wait`` in the loop; slot ``s`` waits on ``done[s]`` (the same slot one iteration
    back) before it rewrites its A, while the other slot's MMA stays in flight."""

    @hl.kernel(threads=128, name="tmem_a_released")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sb = hl.shared(hl.f16, (16, BK, 2))
        done = hl.mma_stages(2)
        acc = hl.zeros((64, 16), hl.f32)
        hl.syncthreads()
        for j in hl.range(a.shape[1] // (2 * BK)):
            for s in range(2):
                kt = 2 * j + s
                hl.wait(done, s, phase=(j % 2) ^ 1)     # the slot's mma of iteration j - 1 completed
                hl.copy(b.tile((16, BK), (0, kt * BK)), sb[:, :, s])
                hl.commit_group()
                hl.wait_group(0)
                hl.fence_proxy_async()
                hl.syncthreads()
                w = hl.register(hl.f16, (64, BK))
                hl.copy(a.tile((64, BK), (0, kt * BK)), w)
                hl.wgmma_fence()
                hl.mma(w + w, sb[:, :, s], acc)
                hl.arrive(done, s, who="mma")
        hl.wgmma_commit()
        hl.wgmma_wait(0)
        hl.copy(acc, c.tile((64, 16), (0, 0)))

    return k


def gemm_args(seed: int = 61, kx: int = KX) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (64, kx)).astype(np.float16)
    b = rng.uniform(-1, 1, (16, kx)).astype(np.float16)
    want = 2 * a.astype(np.float64) @ b.astype(np.float64).T
    return {"a": a, "b": b, "c": np.full((64, 16), np.nan, np.float32)}, want


def walk(body):
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from walk(getattr(i, sub, None) or [])


def a_stores(syn) -> list[T.Tcgen05St]:
    body = walk(syn.lowered.kernel.body)
    return [i for i in body if isinstance(i, T.Tcgen05St) and "register A" in i.origin]


def alloc(syn) -> list[int]:
    return [i.ncols for i in walk(syn.lowered.kernel.body) if isinstance(i, T.TmemAlloc)]


def mma_choices(syn) -> list[str]:
    return [i for op, i in syn.lowered.choices if type(op).__name__ == "Mma"]


@pytest.fixture(scope="module")
def in_flight_one():
    return synthesize(ring_gemm(1).trace(), "sm_100a")


def test_an_mma_left_in_flight_gets_two_column_sets_and_matches_float64(in_flight_one) -> None:
    args, want = gemm_args()
    run(in_flight_one.lowered.kernel, args)          # race checks on: no A rewritten under its MMA
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5)
    (choice,) = mma_choices(in_flight_one)
    assert "_TS" in choice and "A from TMEM (2 sets of 16 columns, one per execution in flight at its " \
        "store plus one: 32) written by tcgen05.st.16x64b.x8" in choice, choice
    # the accumulator's 16 columns, then A's two sets of 16: 48, allocated as 64; the store's and the
    # MMA's A column rotate with the execution counter
    assert alloc(in_flight_one) == [64]
    (st,) = a_stores(in_flight_one)
    assert "_aset" in str(st.taddr) and "& 1" in str(st.taddr), st.taddr
    mmas = [i for i in walk(in_flight_one.lowered.kernel.body) if isinstance(i, T.Tcgen05Mma)]
    assert mmas and all("_aset" in str(i.a.addr) for i in mmas)
    # explain: the choice names the sets, the rejected shared staging counts its ring too
    d = next(d for d in in_flight_one.decisions if d.subject.startswith("mma at"))
    assert "2 sets of 16 columns" in d.chosen, d.chosen
    alt = d.alternatives[0]
    assert alt.status == "rejected" and "32 columns in 2 sets" in alt.reason, alt.reason
    assert "8192 bytes in 2 sets" in alt.reason, alt.reason


def test_a_ring_of_one_set_is_reported_by_the_emulator(monkeypatch) -> None:
    """The same kernel with every A forced to one set (the lowering before the ring): k-tile
    ``k + 1``'s ``tcgen05.st`` rewrites the A the MMA of ``k`` (left in flight) may still read."""
    import hexlayout.ir.lower.umma as lu

    real = lu.a_ranges

    def one_set(lw):
        ranges, depth, sets = real(lw)
        return ranges, {u: 1 for u in depth}, {r: 1 for r in sets}

    monkeypatch.setattr(lu, "a_ranges", one_set)
    syn = synthesize(ring_gemm(1).trace(), "sm_100a")
    assert alloc(syn) == [32]
    with pytest.raises(AsyncHazardError) as e:
        run(syn.lowered.kernel, gemm_args()[0])
    msg = str(e.value)
    assert "which an in-flight tcgen05.mma reads as its A operand" in msg and "tmem_a_ring_w1" in msg, msg


@pytest.mark.parametrize(("pending", "sets", "ncols"), [(0, 1, 32), (2, 3, 64)])
def test_the_sets_follow_the_executions_in_flight(pending, sets, ncols) -> None:
    """``wgmma_wait(0)``: every earlier execution retired at the store, one set (no counter);
    ``wgmma_wait(2)``: two may be in flight, three sets (16 + 3 x 16 = 64 columns)."""
    syn = synthesize(ring_gemm(pending).trace(), "sm_100a")
    (choice,) = mma_choices(syn)
    want = "A from TMEM (16 columns)" if sets == 1 else f"A from TMEM ({sets} sets of 16 columns"
    assert want in choice, choice
    assert alloc(syn) == [ncols]
    (st,) = a_stores(syn)
    assert ("_aset" in str(st.taddr)) == (sets > 1), st.taddr
    args, want_c = gemm_args(seed=67 + pending)
    run(syn.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], want_c, rtol=1e-5, atol=1e-5)


def test_the_mmas_releasing_their_slot_need_one_set_each() -> None:
    """The MoE form: slot ``s``'s wait on ``done[s]`` retires its previous execution before its
    store, so each unrolled mma has one set; the other slot's MMA is in flight at the store, so the
    two take separate columns (16 + 2 x 16 = 48, allocated as 64)."""
    syn = synthesize(released_gemm().trace(), "sm_100a")
    choices = mma_choices(syn)
    assert len(choices) == 2 and all("A from TMEM (16 columns)" in c for c in choices), choices
    assert alloc(syn) == [64]
    stores = a_stores(syn)
    assert len({str(i.taddr) for i in stores}) == 2 and not any("_aset" in str(i.taddr) for i in stores)
    args, want = gemm_args(seed=71, kx=6 * BK)
    run(syn.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5)


def test_a_loop_that_never_waits_is_an_error_naming_the_op() -> None:
    @hl.kernel(threads=128, name="tmem_a_no_wait")
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
    assert "tmem_a_no_wait" in msg and "hl.mma(w, sb, acc)" in msg and "bounds them" in msg, msg
    assert "no ring of TMEM columns or shared buffers holds A" in msg, msg


def pipeline_gemm(stages: int, ahead: int):
    """The product through ``hl.pipeline(..., mma_release=True)``: B's k-tiles ``ahead`` k-tiles ahead
    in a ring of ``stages``, released by the mmas (``hl.arrive(done, k % stages, who="mma")``), the
    refill of a stage waiting on its barrier (``wait_stage_free``: the mmas of ``k + ahead -
    stages``), no ``wgmma_wait`` in the loop: the mmas of the ``stages - ahead - 1`` k-tiles before
    ``k`` may be in flight at its store."""

    @hl.kernel(threads=128, name=f"tmem_a_pipeline_s{stages}_a{ahead}")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sb = hl.shared(hl.f16, (16, BK, stages))
        acc = hl.zeros((64, 16), hl.f32)

        def load(kk, s):
            hl.copy(b.tile((16, BK), (0, kk * BK)), sb[:, :, s])

        hl.syncthreads()
        num_k = hl.cdiv(a.shape[1], BK)
        for kk, s in hl.pipeline(num_k, stages, load, ahead=ahead, async_proxy=True, mma_release=True):
            w = hl.register(hl.f16, (64, BK))
            hl.copy(a.tile((64, BK), (0, kk * BK)), w)
            w2 = w + w
            hl.wgmma_fence()
            hl.mma(w2, sb[:, :, s], acc)
        hl.copy(acc, c.tile((64, 16), (0, 0)))

    return k


@pytest.mark.parametrize(("stages", "ahead", "sets"), [(3, 1, 2), (4, 1, 3), (3, 2, 1)])
def test_a_pipeline_whose_mmas_release_the_stages(stages, ahead, sets) -> None:
    """The stage barriers are a ring (index ``k % stages``): the wait at ``(k + ahead) % stages``
    retires the mmas up to ``k + ahead - stages``, so ``stages - ahead - 1`` executions may be in
    flight at the store: that many sets plus one; matches float64 with the race checks on."""
    syn = synthesize(pipeline_gemm(stages, ahead).trace(), "sm_100a")
    (choice,) = mma_choices(syn)
    want = "A from TMEM (16 columns)" if sets == 1 else f"A from TMEM ({sets} sets of 16 columns"
    assert want in choice, choice
    args, want_c = gemm_args(seed=73 + stages + ahead)
    run(syn.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], want_c, rtol=1e-5, atol=1e-5)


def test_the_choice_counts_the_sets_against_the_512_columns() -> None:
    f16, f32 = hl.f16, hl.f32
    # M = 128, K = 64: 32 A columns; beside a 256-column accumulator and 208 other columns one set
    # fits (496), two do not (528): the ring goes to shared memory
    assert register_a_source(128, 256, 64, f16, f16, f32, 128, other_columns=208)[0] == "tmem"
    src, why = register_a_source(128, 256, 64, f16, f16, f32, 128, other_columns=208, a_sets=2)
    assert src == "smem" and "needs 64 columns (2 sets of 32: executions in flight)" in why, why


def test_sets_over_the_a_columns_fall_back_to_the_shared_ring() -> None:
    """k-tiles of 256 (128 A columns per set): ``wgmma_wait(1)`` - two sets, 256 columns, fit;
    ``wgmma_wait(2)`` - three sets, 384 columns, over the 256 an A may take: staged through a shared
    ring of three buffers instead (the choice says why)."""
    syn = synthesize(ring_gemm(1, 256).trace(), "sm_100a")
    (choice,) = mma_choices(syn)
    assert "A from TMEM (2 sets of 128 columns" in choice and alloc(syn) == [512], choice
    syn = synthesize(ring_gemm(2, 256).trace(), "sm_100a")
    (choice,) = mma_choices(syn)
    assert "_SS" in choice and "staged through shared memory" in choice and "a ring of 3" in choice, choice
    (ring,) = [b for b in syn.lowered.kernel.smem if b.name.endswith("_stage")]
    assert ring.nbytes == 3 * 64 * 256 * 2
    alt = next(d for d in syn.decisions if d.subject.startswith("mma at")).alternatives[0]
    assert "A in TMEM needs 384 columns (3 sets of 128: executions in flight)" in alt.reason, alt.reason


def test_explain_shows_the_sets_and_the_columns(capsys) -> None:
    """``hexlayout explain FILE:ring_gemm -D pending=1 --arch sm_100a``: the accumulator's entry
    lists the mma's register A in TMEM with its 16 columns per set and its 2 sets, and the 64
    columns allocated; the text says how the sets rotate."""
    import json

    from hexlayout.cli import main

    spec = f"{__file__}:ring_gemm"
    assert main(["explain", spec, "--arch", "sm_100a", "-D", "pending=1", "--json"]) == 0
    (t,) = json.loads(capsys.readouterr().out)["tmem"]
    (a,) = t["a_in_tmem"]
    assert (a["columns"], a["sets"], t["allocated"]) == (16, 2, 64), t
    assert a["file"].endswith("test_tcgen05_tmem_a_ring.py") and a["line"] > 0
    assert main(["explain", spec, "--arch", "sm_100a", "-D", "pending=1"]) == 0
    text = capsys.readouterr().out
    assert "64 columns allocated" in text, text
    assert "written to TMEM: 2 sets of 16 columns (one per execution of the mma in flight" in text, text


@pytest.mark.nvrtc
def test_nvrtc_sm100a_rotates_the_a_columns_without_spills(in_flight_one) -> None:
    """NVRTC for sm_100a: no spills, no local memory, no warnings; the main loop writes A with STTM
    (tcgen05.st) and multiplies with UTCHMMA, A never through shared memory."""
    from hexlayout.runtime import build

    b = build(ring_gemm(1), "sm_100a")
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0 and not st.warnings, st.summary()
    counts = b.compiled.sass_counts()
    assert counts.get("UTCHMMA", 0) >= 1 and counts.get("STS.128", 0) == 0, sorted(counts)
    ml = st.main_loop.mix if st.main_loop is not None else {}
    assert ml.get("STTM", 0) >= 1 and ml.get("UTCHMMA", 0) >= 1, ml
