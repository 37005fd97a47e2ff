"""The pipeline building blocks (``hl.pipeline``, ``hl.Ring``, ``hl.OnlineSoftmax``): each
emits the program a kernel would spell out by hand, and kernels written on them are right in
the emulator (against float64, with rings that wrap) on sm_80 and sm_90a."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.ir.printer import format_kernel
from hexlayout.runtime import build
from hexlayout.runtime.emulate import emulate

M, K = hl.dims("M K")


def _norm(text: str) -> str:
    """The program text without source lines and with value names numbered in order."""
    text = re.sub(r"\s+# [^\n]*", "", text)
    names: dict[str, str] = {}
    return re.sub(r"%[A-Za-z_]\w*", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), text)


def _kernels(stages: int, ahead: int, fence: bool):
    @hl.kernel(threads=128, name="blocks")
    def with_block(a: hl.f16[M, K], c: hl.f32[M, K]):
        sa = hl.shared(hl.f16, (64, 32, stages))
        acc = hl.zeros((64, 32), hl.f32)

        def load(k, s):
            hl.copy(a.tile((64, 32), (0, k * 32)), sa[:, :, s])

        for _k, s in hl.pipeline(hl.cdiv(a.shape[1], 32), stages, load, ahead=ahead, async_proxy=fence):
            r = hl.register(hl.f16, (64, 32))
            hl.copy(sa[:, :, s], r)
            acc += hl.cast(r, hl.f32)
        hl.copy(acc, c.tile((64, 32), (0, 0)))

    @hl.kernel(threads=128, name="blocks")
    def by_hand(a: hl.f16[M, K], c: hl.f32[M, K]):
        sa = hl.shared(hl.f16, (64, 32, stages))
        acc = hl.zeros((64, 32), hl.f32)

        def load(k, s):
            hl.copy(a.tile((64, 32), (0, k * 32)), sa[:, :, s])

        for j in range(ahead):
            load(j, j)
            hl.commit_group()
        for _k in hl.range(hl.cdiv(a.shape[1], 32)):        # the loop variable named as the block's
            hl.wait_group(ahead - 1)
            if fence:
                hl.fence_proxy_async()
            hl.syncthreads()
            kn = _k + ahead
            load(kn, kn % stages)
            hl.commit_group()
            s = _k % stages
            r = hl.register(hl.f16, (64, 32))
            hl.copy(sa[:, :, s], r)
            acc += hl.cast(r, hl.f32)
        hl.wait_group(0)
        hl.copy(acc, c.tile((64, 32), (0, 0)))

    return with_block, by_hand


@pytest.mark.parametrize("stages,ahead,fence", [(3, 2, False), (4, 2, True), (2, 1, False)])
def test_pipeline_emits_the_hand_written_loop(stages: int, ahead: int, fence: bool) -> None:
    block, hand = _kernels(stages, ahead, fence)
    assert _norm(format_kernel(block.trace())) == _norm(format_kernel(hand.trace()))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("stages,ahead", [(3, 2), (2, 1)])
def test_pipeline_sums_k_tiles_with_the_ring_wrapping(arch: str, stages: int, ahead: int) -> None:
    block, _ = _kernels(stages, ahead, False)
    rng = np.random.default_rng(stages)
    k = 32 * 7 + 8                          # 8 k-tiles over 2 or 3 stages: the ring wraps; ragged tail
    a = rng.standard_normal((64, k)).astype(np.float16)
    c = np.full((64, k), np.nan, dtype=np.float32)
    emulate(build(block, arch, compile=False), a, c)
    want = np.zeros((64, 32))
    padded = np.zeros((64, 32 * 8))
    padded[:, :k] = a.astype(np.float64)
    for t in range(8):
        want += padded[:, 32 * t:32 * (t + 1)]
    np.testing.assert_allclose(c[:, :32], want, rtol=1e-5, atol=1e-5)


def test_pipeline_refuses_a_ring_it_cannot_run() -> None:
    @hl.kernel(threads=128)
    def bad(a: hl.f16[M, K]):
        for _k, _s in hl.pipeline(4, 3, lambda k, s: None, ahead=3):
            pass

    with pytest.raises(ValueError, match="ahead=3"):
        bad.trace()


N = hl.dims("N")


@hl.kernel(threads=128)
def streamed_softmax(s: hl.f32[M, N], o: hl.f32[M, N], lse: hl.f32[M], *, BLOCKS: int = 4):
    sm = hl.OnlineSoftmax(64)
    acc = hl.zeros((64, 32), hl.f32)
    for j in range(BLOCKS):
        sc = hl.register(hl.f32, (64, 32))
        hl.copy(s.tile((64, 32), (0, 32 * j)), sc)
        acc += sm.step(sc, acc, 1.4426950408889634)
    hl.copy(sm.out(acc), o.tile((64, 32), (0, 0)))
    hl.copy(hl.reshape(sm.lse(), (64,)), lse.tile((64,), (0,)))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_online_softmax_matches_float64(arch: str) -> None:
    """``acc`` accumulates ``p`` block by block: ``out(acc)[i, c] = sum_j softmax(s_i)[32 j + c]``;
    a row whose scores are all ``-inf`` gives 0 and an ``lse`` of ``-inf``."""
    rng = np.random.default_rng(1)
    s = (4 * rng.standard_normal((64, 128))).astype(np.float32)
    s[3, :] = -np.inf                       # a row with no visible key
    s[5, 40:] = -np.inf                     # a row masked from its second block on
    o = np.full((64, 128), np.nan, dtype=np.float32)
    lse = np.full((64,), np.nan, dtype=np.float32)
    emulate(build(streamed_softmax, arch, compile=False), s, o, lse)
    x = s.astype(np.float64)
    with np.errstate(invalid="ignore"):
        mx = np.max(x, axis=1, keepdims=True)
        e = np.where(np.isfinite(mx), np.exp(x - np.where(np.isfinite(mx), mx, 0)), 0.0)
    tot = e.sum(axis=1, keepdims=True)
    p = np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0.0)
    want = p.reshape(64, 4, 32).sum(axis=1)
    np.testing.assert_allclose(o[:, :32], want, rtol=2e-5, atol=1e-6)   # exp2_approx: MUFU.EX2
    want_lse = np.where(tot[:, 0] > 0, np.log(np.where(tot[:, 0] > 0, tot[:, 0], 1)) + mx[:, 0], -np.inf)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    assert lse[3] == -np.inf and np.all(o[3, :32] == 0)


@hl.kernel(threads=128)
def split_softmax(s: hl.f32[M, N], o: hl.f32[M, N], lse: hl.f32[M]):
    """The blocks of ``streamed_softmax`` over two states: even blocks by ``step``, odd ones by
    ``step_scores`` (the caller rescales), then ``merge``."""
    a, b = hl.OnlineSoftmax(64), hl.OnlineSoftmax(64)
    acc, acc2 = hl.zeros((64, 32), hl.f32), hl.zeros((64, 32), hl.f32)
    for j in range(4):
        sc = hl.register(hl.f32, (64, 32))
        hl.copy(s.tile((64, 32), (0, 32 * j)), sc)
        if j % 2 == 0:
            acc += a.step(sc, acc, 1.4426950408889634)
        else:
            p, alpha = b.step_scores(sc, 1.4426950408889634)
            acc2 *= alpha
            acc2 += p
    a.merge(acc, b.m, b.l, acc2)
    hl.copy(a.out(acc), o.tile((64, 32), (0, 0)))
    hl.copy(hl.reshape(a.lse(), (64,)), lse.tile((64,), (0,)))


@pytest.mark.parametrize("kernel", [streamed_softmax, split_softmax], ids=["one", "split"])
def test_online_softmax_split_and_merged_matches_float64(kernel) -> None:
    """Two states over alternate blocks, merged, give the one-state result (float64 reference):
    a row with no visible key (0, ``-inf``), a row whose odd blocks are all masked."""
    rng = np.random.default_rng(2)
    s = (4 * rng.standard_normal((64, 128))).astype(np.float32)
    s[3, :] = -np.inf
    s[5, 40:] = -np.inf                     # the second state sees keys 32..39 only
    s[6, 32:64] = s[6, 96:] = -np.inf       # the second state sees nothing
    o = np.full((64, 128), np.nan, dtype=np.float32)
    lse = np.full((64,), np.nan, dtype=np.float32)
    emulate(build(kernel, "sm_80", compile=False), s, o, lse)
    x = s.astype(np.float64)
    with np.errstate(invalid="ignore"):
        mx = np.max(x, axis=1, keepdims=True)
        e = np.where(np.isfinite(mx), np.exp(x - np.where(np.isfinite(mx), mx, 0)), 0.0)
    tot = e.sum(axis=1, keepdims=True)
    want = np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0.0).reshape(64, 4, 32).sum(axis=1)
    np.testing.assert_allclose(o[:, :32], want, rtol=2e-5, atol=1e-6)
    want_lse = np.where(tot[:, 0] > 0, np.log(np.where(tot[:, 0] > 0, tot[:, 0], 1)) + mx[:, 0], -np.inf)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


@hl.kernel(threads=256)
def ring_copy(a: hl.f16[M, K], c: hl.f16[M, K], *, STAGES: int = 2):
    sa = hl.shared(hl.f16, (64, 64, STAGES))
    r = hl.Ring(STAGES, producers=1, consumers=128)      # every consumer thread releases its reads
    hl.syncthreads()
    num_k = hl.cdiv(a.shape[1], 64)
    with hl.warp_group(0):
        for k in hl.range(num_k):
            r.acquire(k)
            r.fill(k, tx_bytes=sa[:, :, 0].nbytes)
            hl.copy(a.tile((64, 64), (0, k * 64)), sa[:, :, k % STAGES], mbarrier=r.full[k % STAGES])
    with hl.else_():
        for k in hl.range(num_k):
            r.wait_full(k)
            x = hl.register(hl.f16, (64, 64))
            hl.copy(sa[:, :, k % STAGES], x)
            r.release(k % STAGES, who="thread")
            hl.copy(x, c.tile((64, 64), (0, k * 64)))


@pytest.mark.parametrize("stages", [2, 3])
def test_ring_moves_every_k_tile_through_wrapping_stages(stages: int) -> None:
    rng = np.random.default_rng(stages)
    a = rng.standard_normal((64, 64 * 7)).astype(np.float16)
    c = np.full_like(a, np.nan)
    emulate(build(ring_copy, "sm_90a", compile=False, STAGES=stages), a, c)
    np.testing.assert_array_equal(c, a)


def test_ring_without_release_deadlocks_in_the_emulator() -> None:
    """The phase arithmetic matters: a consumer that never releases stalls the producer once
    the ring has gone round, which the emulator reports rather than hanging."""

    @hl.kernel(threads=256)
    def stuck(a: hl.f16[M, K], c: hl.f16[M, K]):
        sa = hl.shared(hl.f16, (64, 64, 2))
        r = hl.Ring(2, producers=1, consumers=128)
        hl.syncthreads()
        num_k = hl.cdiv(a.shape[1], 64)
        with hl.warp_group(0):
            for k in hl.range(num_k):
                r.acquire(k)
                r.fill(k, tx_bytes=sa[:, :, 0].nbytes)
                hl.copy(a.tile((64, 64), (0, k * 64)), sa[:, :, k % 2], mbarrier=r.full[k % 2])
        with hl.else_():
            for k in hl.range(num_k):
                r.wait_full(k)
                x = hl.register(hl.f16, (64, 64))
                hl.copy(sa[:, :, k % 2], x)
                hl.copy(x, c.tile((64, 64), (0, k * 64)))

    a = np.ones((64, 64 * 4), dtype=np.float16)
    with pytest.raises(Exception, match="(?i)deadlock|never|hang|stuck"):
        emulate(build(stuck, "sm_90a", compile=False), a, np.zeros_like(a))
