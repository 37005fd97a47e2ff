"""sm_100a: a register tile as the A operand of a pair's (``cta_group::2``) and of a block-scaled
(kind::mxf8f6f4) ``tcgen05.mma``. The pair's A goes, per the cost model, into each CTA's own TMEM
(one warp group: ``tcgen05.st`` of its 128 rows, the ``_2x1SM_..._TS`` atom) or each CTA's own copy
of a shared ring (two warp groups), then a cluster barrier before the even CTA's issue; a
block-scaled op's fp8 A (here converted from f16 in registers) goes into TMEM (the ``[a-tmem]``
form, ``..._UE8M0_TS``) or through a shared ring the same way; a packed e2m1 (MXFP4) register A
(here negated in registers: ``^ 0x88`` flips both nibbles' sign bits) through the shared ring.
Each matches float64 in the emulator on ragged shapes; the emulator reports, in either CTA of the
pair, an A the issuer reads before the odd CTA stored it (no cluster barrier) and an A rewritten
under the in-flight MMA (a ring one set short)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import AsyncHazardError, RaceError, run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.synth.solve import synthesize
from hexlayout.synth.umma_choice import register_a_source

M, N, K, KB, MP, NP = hl.dims("M N K KB MP NP")
BK = 64
PAIR_SHAPE = (200, 56, 3 * BK - 16)   # one pair (rows 0..255), N under the pair's 64, 3 k-tiles
BS_SHAPE = (100, 24, 224)             # M, N under the tile's 128 x 32, K: 2 k-tiles, the last 96 wide


def pair_gemm(threads: int = 128):
    """``c = (2 a) @ b^T`` on pairs of CTAs: CTA ``pid`` holds A's rows ``128 pid ..`` in registers
    (loaded per k-tile, doubled there), its half of B's 64 rows (``32 r ..``, cluster rank ``r``) in
    stage ``k % 2`` of a shared ring, each k-tile's MMA left in flight (``wgmma_wait(1)``: A's ring
    has two sets). 128 threads: A into TMEM; 256 (two warp groups): A staged through shared memory."""

    @hl.kernel(threads=threads, cluster=(2, 1, 1), name=f"pair_reg_a_t{threads}")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        pid = hl.grid(hl.spatial(2 * hl.cdiv(a.shape[0], 256)))
        r = hl.cluster_rank()
        sb = hl.shared(hl.f16, (32, BK, 2))
        acc = hl.register(hl.f32, (128, 64))
        for kt in hl.range(hl.cdiv(a.shape[1], BK)):
            hl.copy(b.tile((32, BK), (r * 32, kt * BK)), sb[:, :, kt % 2])
            hl.commit_group()
            hl.wait_group(0)
            hl.fence_proxy_async()
            hl.cluster_sync()
            w = hl.register(hl.f16, (128, BK))
            hl.copy(a.tile((128, BK), (pid * 128, kt * BK)), w)
            hl.wgmma_fence()
            hl.mma(w + w, sb[:, :, kt % 2], acc, accumulate=kt > 0)
            hl.wgmma_commit()
            hl.wgmma_wait(1)
        hl.wgmma_wait(0)
        hl.copy(acc, c.tile((128, 64), (pid * 128, 0)))

    return k


def bs_gemm(threads: int = 128):
    """``c = sum_kb (e4m3(2 a) 2^(sfa - 127)) @ (b 2^(sfb - 127))^T`` per 32-wide k-block: ``a``'s
    k-tile loaded into registers as f16, doubled and converted to e4m3 there (the register A of the
    block-scaled MMA), ``b`` and the factors (rows padded to 128) through shared tiles. 128 threads:
    A into TMEM (the ``[a-tmem]`` form); 256 (two warp groups): A staged through shared memory."""

    @hl.kernel(threads=threads, name=f"bs_reg_a_t{threads}")
    def k(a: hl.f16[M, K], b: hl.e4m3[N, K], sfa: hl.u8[MP, KB], sfb: hl.u8[NP, KB], c: hl.f32[M, N]):
        sb = hl.shared(hl.e4m3, (32, 128))
        ssa = hl.shared(hl.u8, (128, 4))
        ssb = hl.shared(hl.u8, (128, 4))
        acc = hl.register(hl.f32, (128, 32))
        ra = hl.register(hl.u8, (128, 4))
        rb = hl.register(hl.u8, (128, 4))
        for kt in hl.range(hl.cdiv(a.shape[1], 128)):
            hl.copy(b.tile((32, 128), (0, kt * 128)), sb)
            hl.copy(sfa.tile((128, 4), (0, kt * 4)), ra)
            hl.copy(ra, ssa)
            hl.copy(sfb.tile((128, 4), (0, kt * 4)), rb)
            hl.copy(rb, ssb)
            w = hl.register(hl.f16, (128, 128))
            hl.copy(a.tile((128, 128), (0, kt * 128)), w)
            hl.commit_group()
            hl.wait_group(0)
            hl.fence_proxy_async()
            hl.syncthreads()
            hl.wgmma_fence()
            hl.mma(hl.cast(w * 2.0, hl.e4m3), sb, acc, accumulate=kt > 0, scale_a=ssa, scale_b=ssb)
            hl.wgmma_commit()
            hl.wgmma_wait(0)
            hl.syncthreads()
        hl.copy(acc, c.tile((128, 32), (0, 0)))

    return k


def fp4_gemm():
    """MXFP4: ``c = sum_k (-a[:, k]) sfa[:, k // 32] b[:, k] sfb[:, k // 32]`` over packed e2m1 ``a`` /
    ``b`` (``K / 2`` bytes a row): ``a``'s 128-byte k-tile loaded into a u8 register tile and negated
    there (``^ 0x88``), ``b`` and the UE8M0 factors through shared tiles; one 128 x 32 tile per block."""

    @hl.kernel(threads=128, name="fp4_reg_a")
    def k(a: hl.u8[M, K], b: hl.u8[N, K], sfa: hl.u8[MP, KB], sfb: hl.u8[NP, KB], c: hl.f32[M, N]):
        pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(a.shape[0], 128), hl.cdiv(b.shape[0], 32)))
        m0, n0 = pid_m * 128, pid_n * 32
        sb = hl.shared(hl.u8, (32, 128))
        ssa = hl.shared(hl.u8, (128, 8))
        ssb = hl.shared(hl.u8, (128, 8))
        ra = hl.register(hl.u8, (128, 8))
        rb = hl.register(hl.u8, (128, 8))
        acc = hl.register(hl.f32, (128, 32))
        for kt in hl.range(hl.cdiv(a.shape[1], 128)):
            hl.copy(hl.view(b, (32, 128), (n0, kt * 128)), sb)
            hl.copy(hl.view(sfa, (128, 8), (m0, kt * 8)), ra)
            hl.copy(ra, ssa)
            hl.copy(hl.view(sfb, (128, 8), (n0, kt * 8)), rb)
            hl.copy(rb, ssb)
            w = hl.register(hl.u8, (128, 128))
            hl.copy(hl.view(a, (128, 128), (m0, kt * 128)), w)
            hl.commit_group()
            hl.wait_group(0)
            hl.fence_proxy_async()
            hl.syncthreads()
            hl.wgmma_fence()
            hl.mma(w ^ 0x88, sb, acc, accumulate=kt > 0, scale_a=ssa, scale_b=ssb, packed=hl.e2m1)
            hl.wgmma_commit()
            hl.wgmma_wait(0)
            hl.syncthreads()
        hl.copy(acc, hl.view(c, (128, 32), (m0, n0)))

    return k


#: what ``hexlayout explain tests.emulator.test_tcgen05_register_a_forms:PAIR_TMEM`` explains
PAIR_TMEM = pair_gemm(128)


def pair_args(shape=PAIR_SHAPE, seed: int = 5) -> tuple[dict[str, np.ndarray], np.ndarray]:
    m, n, k = shape
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    want = 2 * a.astype(np.float64) @ b.astype(np.float64).T
    return {"a": a, "b": b, "c": np.full((m, n), np.nan, np.float32)}, want


def bs_args(seed: int = 7) -> tuple[dict[str, np.ndarray], np.ndarray]:
    m, n, k = BS_SHAPE
    kb = 8                                   # k / 32 = 7 blocks, padded to whole 4-byte rows
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-2, 2, (n, k)).astype(ml_dtypes.float8_e4m3fn)
    sa = rng.integers(118, 136, (128, kb)).astype(np.uint8)
    sb = rng.integers(118, 136, (128, kb)).astype(np.uint8)
    a8 = (a.astype(np.float32) * 2).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    fa = np.repeat(np.ldexp(1.0, sa[:m].astype(np.int64) - 127), 32, axis=1)[:, :k]
    fb = np.repeat(np.ldexp(1.0, sb[:n].astype(np.int64) - 127), 32, axis=1)[:, :k]
    want = (a8 * fa) @ (b.astype(np.float64) * fb).T
    return {"a": a, "b": b, "sfa": sa, "sfb": sb, "c": np.full((m, n), np.nan, np.float32)}, want


def fp4_args(seed: int = 9) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Ragged M, N, K (150 x 40 x 320: two row tiles, two column tiles, 3 k-tiles, the last half)."""
    from tests.synth.test_umma_fp4 import _e2m1, _factor

    m, n, k = 150, 40, 320
    rng = np.random.default_rng(seed)
    ca = rng.integers(0, 16, (m, k)).astype(np.uint8)
    cb = rng.integers(0, 16, (n, k)).astype(np.uint8)
    ks = 16                                           # factor rows padded to 16 bytes (the loads')
    sfa = rng.integers(122, 132, (m, ks)).astype(np.uint8)
    sfb = rng.integers(122, 132, (n, ks)).astype(np.uint8)

    def pack(c):
        return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)

    fa = np.repeat(_factor(sfa, "mxfp4"), 32, axis=1)[:, :k]
    fb = np.repeat(_factor(sfb, "mxfp4"), 32, axis=1)[:, :k]
    want = -(_e2m1(ca) * fa) @ (_e2m1(cb) * fb).T
    args = {"a": pack(ca), "b": pack(cb), "sfa": sfa, "sfb": sfb, "c": np.full((m, n), np.nan, np.float32)}
    return args, want


def walk(body):
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from walk(getattr(i, sub, None) or [])


def _choice(syn) -> str:
    (c,) = [c for op, c in syn.lowered.choices if type(op).__name__ == "Mma"]
    return c


def _alternative(syn):
    d = next(d for d in syn.decisions if d.subject.startswith("mma at"))
    return d.alternatives[0]


@pytest.fixture(scope="module")
def pair_tmem():
    return synthesize(pair_gemm(128).trace(), "sm_100a")


@pytest.fixture(scope="module")
def pair_smem():
    return synthesize(pair_gemm(256).trace(), "sm_100a")


@pytest.fixture(scope="module")
def scaled():
    return {t: synthesize(bs_gemm(t).trace(), "sm_100a") for t in (128, 256)}


def test_pair_register_a_in_each_ctas_tmem_matches_float64(pair_tmem) -> None:
    args, want = pair_args()
    run(pair_tmem.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5)
    c = _choice(pair_tmem)
    assert c.startswith("SM100_2x1SM_256x64x16_F32F16F16_TS x1 (N) x4 (K)"), c
    assert "A from TMEM (2 sets of 32 columns" in c and "tcgen05.st.32x32b.x32" in c, c
    body = list(walk(pair_tmem.lowered.kernel.body))
    stores = [i for i in body if i.origin == "tcgen05.st of the register A operand"]
    assert [type(i).__name__ for i in stores] == ["Tcgen05St", "Tcgen05Wait", "Tcgen05Fence",
                                                  "ClusterBarrier", "Tcgen05Fence", "Alu"], stores
    assert not stores[3].init_fence
    mmas = [i for i in body if isinstance(i, T.Tcgen05Mma)]
    assert mmas and all(isinstance(i.a, T.TmemRef) for i in mmas)
    alt = _alternative(pair_tmem)
    assert alt.status == "rejected" and "shared memory 19 instructions (8 st.shared.b128" in alt.reason, \
        alt.reason
    assert "against TMEM's 5 (1 tcgen05.st.32x32b.x32 per warp, wait::st, fence::before_thread_sync, " \
        "cluster barrier, fence::after_thread_sync; 64 columns in 2 sets)" in alt.reason, alt.reason


def test_pair_register_a_staged_in_each_ctas_shared_ring_matches_float64(pair_smem) -> None:
    args, want = pair_args(seed=6)
    run(pair_smem.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5)
    c = _choice(pair_smem)
    assert c.startswith("SM100_2x1SM_256x64x16_F32F16F16_SS x1 (N) x4 (K)"), c
    assert "register A staged through shared memory (128x64 K-major, 128-byte swizzle, 4 st.shared.b128 " \
        "per thread, a ring of 2)" in c, c
    body = list(walk(pair_smem.lowered.kernel.body))
    staged = [i for i in body if i.origin == "st.shared of the register A operand"]
    assert [type(i).__name__ for i in staged] == ["StShared"] * 4 + ["FenceProxyAsync", "ClusterBarrier",
                                                                     "Tcgen05Fence", "Alu"], staged
    assert all(isinstance(i.a, L.SmemDesc) for i in body if isinstance(i, T.Tcgen05Mma))
    assert "256 threads: tcgen05.st writes A from one warp group's lanes" in _alternative(pair_smem).reason


def _unsynchronized(monkeypatch) -> None:
    """The lowering with a CTA barrier where the cluster barrier goes: the odd CTA's stores are not
    ordered before the even CTA's issue."""
    import hexlayout.ir.lower.umma as lu

    monkeypatch.setattr(lu.TmemState, "a_barrier", lambda self, lw, op: lw.region_barrier())


@pytest.mark.parametrize(("threads", "k", "error", "words"), [
    (128, 48, AsyncHazardError, "A in the pair's CTA (block (1,), cluster rank 1): reads TMEM cell (lane 0, "
                                "column 64) that no tcgen05.st wrote"),
    (256, 48, RaceError, "block (1,), thread 0:\n  write-after-read race on shared buffer"),
])
def test_without_the_cluster_barrier_the_emulator_reports_the_odd_ctas_a(monkeypatch, threads, k, error,
                                                                          words) -> None:
    """One k-tile: the even CTA's MMA reads the odd CTA's A before it was stored (TMEM: cells no
    ``tcgen05.st`` wrote; shared: the odd CTA's later store races with the MMA's read)."""
    _unsynchronized(monkeypatch)
    syn = synthesize(pair_gemm(threads).trace(), "sm_100a")
    assert not [i for i in walk(syn.lowered.kernel.body) if isinstance(i, L.ClusterBarrier)
                and "register A" in i.origin]
    with pytest.raises(error) as e:
        run(syn.lowered.kernel, pair_args((200, 56, k))[0])
    assert words in str(e.value) and f"pair_reg_a_t{threads}" in str(e.value), str(e.value)


@pytest.mark.parametrize("threads", [128, 256])
def test_a_pairs_ring_one_set_short_is_reported(monkeypatch, threads) -> None:
    """Forced to one set of A (TMEM columns or shared buffer) under ``wgmma_wait(1)``: a store of
    k-tile ``k + 1`` rewrites the A the MMA of ``k`` still reads."""
    import hexlayout.ir.lower.umma as lu

    depths, ranges = lu.stage_depths, lu.a_ranges

    def one_set(lw):
        r, d, s = ranges(lw)
        return r, {u: 1 for u in d}, {i: 1 for i in s}

    monkeypatch.setattr(lu, "stage_depths", lambda lw: {u: 1 for u in depths(lw)})
    monkeypatch.setattr(lu, "a_ranges", one_set)
    syn = synthesize(pair_gemm(threads).trace(), "sm_100a")
    with pytest.raises(AsyncHazardError) as e:
        run(syn.lowered.kernel, pair_args()[0])
    msg = str(e.value)
    assert ("which an in-flight tcgen05.mma reads as its A operand" if threads == 128 else
            "while an in-flight tcgen05.mma reads it") in msg, msg
    assert "hl.mma(w + w, sb[:, :, kt % 2], acc, accumulate=kt > 0)" in msg, msg


def test_the_odd_ctas_a_read_before_its_wait_st_is_reported(monkeypatch) -> None:
    """Only the even CTA's warps wait for their A stores (``tcgen05.wait::st``): the pair's MMA
    reads the odd CTA's cells while its stores are in flight."""
    import hexlayout.ir.lower.umma as lu

    real = lu.TmemState.a_stores_before

    def even_waits(self, lw, ops):
        out = real(self, lw, ops)
        for i in out:
            if isinstance(i, T.Tcgen05Wait):
                i.pred = self.even
        return out

    monkeypatch.setattr(lu.TmemState, "a_stores_before", even_waits)
    syn = synthesize(pair_gemm(128).trace(), "sm_100a")
    with pytest.raises(AsyncHazardError) as e:
        run(syn.lowered.kernel, pair_args()[0])
    msg = str(e.value)
    assert "A in the pair's CTA (block (1,), cluster rank 1): reads TMEM cell" in msg, msg
    assert "written by a tcgen05.st its warp has not waited for" in msg, msg


def test_the_odd_cta_rewriting_a_under_the_inflight_mma_is_reported(monkeypatch) -> None:
    """Only the odd CTA's A stays in set 0 (the even CTA's rotates): its store of k-tile 1 rewrites
    the A the pair's MMA of k-tile 0 (left in flight by ``wgmma_wait(1)``) still reads there."""
    import hexlayout.ir.lower.umma as lu
    from hexlayout.ir.expr import select

    real = lu.TmemState.a_set_column

    def odd_in_set_0(self, lw, op, tu):
        return select(self.even, real(self, lw, op, tu), self.a_column_of(op.uid, tu, lw))

    monkeypatch.setattr(lu.TmemState, "a_set_column", odd_in_set_0)
    syn = synthesize(pair_gemm(128).trace(), "sm_100a")
    with pytest.raises(AsyncHazardError) as e:
        run(syn.lowered.kernel, pair_args()[0])
    msg = str(e.value)
    assert "block (1,)" in msg and "which an in-flight tcgen05.mma reads as its A operand" in msg, msg
    assert "Tcgen05St [tcgen05.st of the register A operand]" in msg, msg


@pytest.mark.parametrize("threads", [128, 256])
def test_block_scaled_register_a_matches_float64(scaled, threads) -> None:
    syn = scaled[threads]
    args, want = bs_args()
    run(syn.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    c = _choice(syn)
    body = list(walk(syn.lowered.kernel.body))
    mmas = [i for i in body if isinstance(i, T.Tcgen05Mma)]
    assert len(mmas) == 4 and all(i.sfa is not None for i in mmas)
    assert sum(isinstance(i, T.Tcgen05Cp) for i in body) == 2
    alt = _alternative(syn)
    assert alt.status == "rejected"
    if threads == 128:      # the [a-tmem] form: one tcgen05.st.32x32b.x32 per warp against 8 st.shared.v4
        assert c.startswith("SM100_128x32x32_F32E4M3E4M3_UE8M0_TS x1 (N) x4 (K)"), c
        assert "A from TMEM (32 columns) written by tcgen05.st.32x32b.x32" in c, c
        assert all(isinstance(i.a, T.TmemRef) for i in mmas)
        assert "shared memory 19 instructions (8 st.shared.b128" in alt.reason, alt.reason
        # TMEM: the accumulator's columns [0, 32), A's [32, 64) (k-step k at 32 + 8 k: 32 e4m3 a
        # column set of 4 bytes), the factors' after them
        assert [str(i.a.addr) for i in mmas] == [f"tmem_base[0] + {32 + 8 * k}" for k in range(4)], \
            [str(i.a.addr) for i in mmas]
        cps = [int(str(i.taddr).rsplit("+", 1)[1]) for i in body if isinstance(i, T.Tcgen05Cp)]
        assert min(cps) >= 64, cps
    else:
        assert c.startswith("SM100_128x32x32_F32E4M3E4M3_UE8M0_SS x1 (N) x4 (K)"), c
        assert "register A staged through shared memory (128x128 K-major, 128-byte swizzle, 4 " \
            "st.shared.b128" in c, c
        assert all(isinstance(i.a, L.SmemDesc) for i in mmas)
        assert "256 threads: tcgen05.st writes A from one warp group's lanes" in alt.reason, alt.reason


def test_fp4_register_a_staged_through_shared_memory_matches_float64() -> None:
    syn = synthesize(fp4_gemm().trace(), "sm_100a")
    args, want = fp4_args()
    run(syn.lowered.kernel, args)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    c = _choice(syn)
    assert c.startswith("SM100_128x32x64_F32E2M1E2M1_UE8M0_VS32_MXF4_SS x1 (N) x4 (K) = 128x32x256 "
                        "(A K-major"), c
    # the packed tile as 128-byte rows of bytes: the buffer a K = 64 step reads 32 bytes of
    assert "register A staged through shared memory (128x128 K-major, 128-byte swizzle, 8 st.shared.b128" \
        in c, c
    alt = _alternative(syn)
    assert "e2m1 A: the block-scaled tcgen05.mma reads A from TMEM (the [a-tmem] form) only for " \
        "kind::mxf8f6f4" in alt.reason, alt.reason


def test_the_choice_for_pairs_and_block_scales() -> None:
    f16, f32, e4m3 = hl.f16, hl.f32, hl.e4m3
    assert register_a_source(128, 64, 64, f16, f16, f32, 128, cta_group=2)[0] == "tmem"
    assert register_a_source(128, 64, 64, f16, f16, f32, 256, cta_group=2)[0] == "smem"
    assert register_a_source(128, 64, 64, f16, f16, f32, 128, cta_group=2, other_columns=448)[0] == "smem"
    assert register_a_source(128, 32, 128, e4m3, e4m3, f32, 128, scaled=True)[0] == "tmem"
    assert register_a_source(128, 32, 128, e4m3, e4m3, f32, 256, scaled=True)[0] == "smem"
    assert register_a_source(128, 32, 128, e4m3, e4m3, f32, 128, scaled=True, other_columns=480)[0] == "smem"
    assert register_a_source(128, 32, 256, hl.e2m1, hl.e2m1, f32, 128, scaled=True)[0] == "smem"
    src, why = register_a_source(64, 64, 64, f16, f16, f32, 128, cta_group=2)
    assert src is None and "128 rows per CTA" in why
    src, why = register_a_source(128, 64, 64, e4m3, e4m3, f32, 128, scaled=True, cta_group=2)
    assert src is None and "block-scaled tcgen05.mma of a pair" in why


def test_a_pairs_register_a_in_a_warp_role_is_refused_naming_the_op() -> None:
    """The cluster barrier after a pair's register A stores needs every thread of both CTAs: an mma
    in a warp-group branch is refused by synthesis, naming kernel, op and line."""
    from hexlayout.errors import HexlayoutError

    @hl.kernel(threads=256, cluster=(2, 1, 1), name="pair_reg_a_role")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        pid = hl.grid(hl.spatial(2 * hl.cdiv(a.shape[0], 256)))
        r = hl.cluster_rank()
        sb = hl.shared(hl.f16, (32, BK))
        hl.copy(b.tile((32, BK), (r * 32, 0)), sb)
        hl.commit_group()
        hl.wait_group(0)
        hl.fence_proxy_async()
        hl.cluster_sync()
        with hl.warp_group(1):
            w = hl.register(hl.f16, (128, BK))
            hl.copy(a.tile((128, BK), (pid * 128, 0)), w)
            acc = hl.register(hl.f32, (128, 64))
            hl.mma(w, sb, acc, accumulate=False)
            hl.wgmma_commit()
            hl.wgmma_wait(0)
            hl.copy(acc, c.tile((128, 64), (pid * 128, 0)))

    with pytest.raises(HexlayoutError) as e:
        synthesize(k.trace(), "sm_100a")
    msg = str(e.value)
    assert "pair_reg_a_role" in msg and "hl.mma(w, sb, acc, accumulate=False)" in msg, msg
    assert "written by the threads running the mma, here threads [128, 256); the cluster barrier" in msg, msg


def test_explain_shows_the_pairs_a_source(capsys) -> None:
    from hexlayout.cli import main

    assert main(["explain", f"{__name__}:PAIR_TMEM", "--arch", "sm_100a"]) == 0
    out = capsys.readouterr().out
    assert "chose SM100_2x1SM_256x64x16_F32F16F16_TS" in out, out
    assert "rejected  A staged through shared memory for the _SS atom: A source by cost per k-tile and " \
        "warp: shared memory 19 instructions" in out, out
    assert "register A of the mma at line" in out and "written to TMEM: 2 sets of 32 columns" in out, out


@pytest.mark.nvrtc
@pytest.mark.parametrize(("which", "want"), [
    ("pair_tmem", {"STTM": 1, "UTCHMMA": 4, "UCGABAR_ARV": 2}),
    ("pair_smem", {"STS": 4, "UTCHMMA": 4, "UCGABAR_ARV": 2}),
    ("scaled_tmem", {"STTM": 1, "UTCQMMA": 4, "UTCCP": 2}),
    ("scaled_smem", {"STS": 4, "UTCQMMA": 4, "UTCCP": 2}),
    ("fp4", {"STS": 8, "UTCOMMA": 4, "UTCCP": 4}),
])
def test_nvrtc_sm100a_builds_without_spills(which, want) -> None:
    """NVRTC for sm_100a: no spills, no local memory; the main loop holds A's stores (STTM: A into
    TMEM; STS.128: the staged ring), the MMAs (UTCHMMA.2CTA for the pair, UTCQMMA block-scaled with
    its factors' UTCCP) and, for the pair, the cluster barrier after the stores besides the
    kernel's own ``cluster_sync``."""
    from hexlayout.runtime import build

    kern = {"pair_tmem": lambda: pair_gemm(128), "pair_smem": lambda: pair_gemm(256),
            "scaled_tmem": lambda: bs_gemm(128), "scaled_smem": lambda: bs_gemm(256),
            "fp4": fp4_gemm}[which]()
    b = build(kern, "sm_100a")
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0 and not st.warnings, st.summary()
    ml = st.main_loop.mix if st.main_loop is not None else {}
    for op, n in want.items():
        assert ml.get(op, 0) >= n, (op, ml)
    counts = b.compiled.sass_counts()
    if which.startswith("pair"):
        assert counts.get("UTCHMMA.2CTA", 0) >= 4, sorted(counts)
    assert (ml.get("STTM", 0) > 0) == which.endswith("tmem"), ml
