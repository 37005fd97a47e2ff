"""Proxy fences are the compiler's job (issue 20 item 6). A wgmma reads its shared operands,
and a TMA store its source, through the async proxy; shared memory written through the generic
proxy (st.shared, stmatrix, cp.async) needs ``fence.proxy.async`` in every writing thread
after its writes and before the reader. The lowering inserts it
(``hexlayout.ir.passes.insert_proxy_fences``): once, after the writes, not again where the
program has one (``hl.fence_proxy_async``, the TMA store's own), not inside a loop when the
writes come before it. The emulator's check stays the safety net: a lowered program without
the fence is rejected. sm_80 has no async proxy and lowers the fence to nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import AsyncHazardError, run
from hexlayout.ir.lowered import BarSync, CpAsyncWait, FenceProxyAsync, ForLoop, TmaStore, Wgmma
from hexlayout.synth.solve import synthesize

M, N, K = hl.dims("M N K")


def gathered_product(fence: bool):
    @hl.kernel(threads=128, name="gathered_product")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sa = hl.shared(hl.f16, (64, 64))
        sb = hl.shared(hl.f16, (64, 64))
        rows = hl.iota((64,), 0)
        hl.copy(a[63 - rows, 0:64], sa)  # gathered rows: cp.async, never TMA
        hl.copy(b.tile((64, 64), (0, 0)), sb)
        hl.commit_group()
        hl.wait_group(0)
        if fence:
            hl.fence_proxy_async()
        hl.syncthreads()
        acc = hl.zeros((64, 64), hl.f32)
        hl.wgmma_fence()
        hl.mma(sa, sb, acc)
        hl.wgmma_commit()
        hl.wgmma_wait(0)
        hl.copy(acc, c.tile((64, 64), (0, 0)))

    return k


@hl.kernel(threads=128, name="register_fed_product")
def register_fed_product(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
    """``c = (2 a) @ b^T`` twice over: ``2 a`` computed in registers and copied to shared (the
    generic proxy), read by wgmma in a loop; no fence written."""
    ra = hl.register(hl.f16, (64, 64))
    hl.copy(a.tile((64, 64), (0, 0)), ra)
    sa = hl.shared(hl.f16, (64, 64))
    hl.copy(ra * 2.0, sa)
    sb = hl.shared(hl.f16, (64, 64))
    hl.copy(b.tile((64, 64), (0, 0)), sb)
    hl.commit_group()
    hl.wait_group(0)
    hl.syncthreads()
    acc = hl.zeros((64, 64), hl.f32)
    for _ in hl.range(2):
        hl.wgmma_fence()
        hl.mma(sa, sb, acc)
        hl.wgmma_commit()
        hl.wgmma_wait(0)
    hl.copy(acc, c.tile((64, 64), (0, 0)))


@hl.kernel(threads=128, name="register_fed_store")
def register_fed_store(a: hl.f16[M, N], c: hl.f16[M, N]):
    """``c = 2 a`` through a shared tile written from registers and stored by TMA."""
    r = hl.register(hl.f16, (64, 64))
    hl.copy(a.tile((64, 64), (0, 0)), r)
    s = hl.shared(hl.f16, (64, 64))
    hl.copy(r * 2.0, s)
    hl.syncthreads()
    hl.copy(s, c.tile((64, 64), (0, 0)))


def _flat(body):
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from _flat(getattr(i, sub, None) or [])


def _fences(body) -> int:
    return sum(isinstance(i, FenceProxyAsync) for i in _flat(body))


def _without_fences(body):
    """``body`` with every ``FenceProxyAsync`` removed (a lowered program built without the pass)."""
    out = []
    for i in body:
        if isinstance(i, FenceProxyAsync):
            continue
        subs = {s: _without_fences(getattr(i, s))
                for s in ("body", "then_body", "else_body") if hasattr(i, s)}
        out.append(dataclasses.replace(i, **subs) if subs else i)
    return out


def _operands(seed: int):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((64, 64)).astype(np.float16) for _ in range(2))


def test_the_fence_after_cp_async_is_inserted_once() -> None:
    """Without ``hl.fence_proxy_async`` the lowering puts one fence after the cp.async wait and
    before the barrier; with it, the program keeps its own and gets no second one."""
    a, b = _operands(3)
    want = a[::-1].astype(np.float64) @ b.astype(np.float64).T
    for fence in (False, True):
        syn = synthesize(gathered_product(fence).trace(), "sm_90a")
        body = syn.lowered.kernel.body
        assert any(isinstance(i, Wgmma) for i in _flat(body)) and _fences(body) == 1, fence
        at = next(j for j, i in enumerate(body) if isinstance(i, FenceProxyAsync))
        assert isinstance(body[at - 1], CpAsyncWait) and isinstance(body[at + 1], BarSync), fence
        assert (body[at].origin == "proxy fence (inserted)") != fence
        c = np.zeros((64, 64), np.float32)
        run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
        np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)


def test_the_emulator_still_rejects_a_lowered_program_without_the_fence() -> None:
    """The safety net: the same program with the fence taken out of the lowered kernel (as a
    hand-built lowered program, or a lowering that bypassed the pass, would have it)."""
    a, b = _operands(3)
    syn = synthesize(gathered_product(False).trace(), "sm_90a")
    bad = dataclasses.replace(syn.lowered.kernel, body=_without_fences(syn.lowered.kernel.body))
    assert _fences(bad.body) == 0
    with pytest.raises(AsyncHazardError, match="the wgmma reads shared byte .* without a fence.proxy.async"):
        run(bad, {"a": a, "b": b, "c": np.zeros((64, 64), np.float32)})


def test_a_register_fed_wgmma_runs_with_one_fence_before_its_loop() -> None:
    a, b = _operands(5)
    syn = synthesize(register_fed_product.trace(), "sm_90a")
    body = syn.lowered.kernel.body
    loops = [i for i in body if isinstance(i, ForLoop)]
    assert loops and any(isinstance(i, Wgmma) for i in _flat(loops[0].body))
    assert _fences(body) == 1 and sum(isinstance(i, FenceProxyAsync) for i in body) == 1   # not per iteration
    assert body.index(next(i for i in body if isinstance(i, FenceProxyAsync))) < body.index(loops[0])
    c = np.full((64, 64), np.nan, np.float32)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    want = 4 * a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)


def test_a_register_fed_tcgen05_mma_gets_the_fence_on_sm100() -> None:
    """tcgen05.mma (sm_100a) reads its shared descriptors through the async proxy as wgmma does:
    the same register-fed program gets its one fence before the loop there too (without it the
    emulator rejects the program: the safety net below)."""
    from hexlayout.ir.lowered_tcgen05 import Tcgen05Mma

    a, b = _operands(6)
    syn = synthesize(register_fed_product.trace(), "sm_100a")
    body = syn.lowered.kernel.body
    loops = [i for i in body if isinstance(i, ForLoop)]
    assert loops and any(isinstance(i, Tcgen05Mma) for i in _flat(loops[0].body))
    assert _fences(body) == 1 and body.index(next(i for i in body if isinstance(i, FenceProxyAsync))) \
        < body.index(loops[0])
    c = np.full((64, 64), np.nan, np.float32)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    want = 4 * a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)
    bad = dataclasses.replace(syn.lowered.kernel, body=_without_fences(body))
    with pytest.raises(AsyncHazardError, match="the tcgen05.mma reads shared byte .* without a fence.proxy"):
        run(bad, {"a": a, "b": b, "c": np.zeros((64, 64), np.float32)})


def test_a_register_fed_tma_store_has_its_one_fence() -> None:
    (a, _) = _operands(7)
    syn = synthesize(register_fed_store.trace(), "sm_90a")
    body = syn.lowered.kernel.body
    assert any(isinstance(i, TmaStore) for i in _flat(body)) and _fences(body) == 1
    c = np.full((64, 64), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": a, "c": c})
    np.testing.assert_array_equal(c, (2 * a.astype(np.float32)).astype(np.float16))


@pytest.mark.nvrtc
@pytest.mark.parametrize("kernel,sass", [(register_fed_product, "HGMMA"), (register_fed_store, "UTMASTG")],
                         ids=["wgmma", "tma_store"])
def test_register_fed_async_readers_compile_with_the_fence(kernel, sass: str) -> None:
    from hexlayout.runtime.build import build

    b = build(kernel, "sm_90a")
    assert b.generated.source.count("fence.proxy.async") == 1
    counts = b.compiled.sass_counts()
    assert any(op.startswith(sass) for op in counts), sorted(counts)
    assert sum(n for op, n in counts.items() if op.startswith("FENCE.VIEW.ASYNC.S")) == 1, sorted(counts)


def test_no_fence_before_sm90() -> None:
    @hl.kernel(threads=128, name="staged_copy")
    def staged(a: hl.f16[M, K], c: hl.f16[M, K]):
        sa = hl.shared(hl.f16, (64, 64))
        hl.copy(a.tile((64, 64), (0, 0)), sa)
        hl.commit_group()
        hl.wait_group(0)
        hl.fence_proxy_async()
        hl.syncthreads()
        r = hl.register(hl.f16, (64, 64))
        hl.copy(sa, r)
        hl.copy(r, c.tile((64, 64), (0, 0)))

    fences = {arch: _fences(synthesize(staged.trace(), arch).lowered.kernel.body)
              for arch in ("sm_80", "sm_90a")}
    assert fences == {"sm_80": 0, "sm_90a": 1}
    # and none inserted for a program with no async-proxy reader (sm_80 has no async proxy at all)
    assert _fences(synthesize(register_fed_store.trace(), "sm_80").lowered.kernel.body) == 0


def test_the_pass_places_fences_in_hand_built_programs() -> None:
    """The placement rules on lowered programs: a warp-specialized writer (a branch that
    stores a tile and arrives on an mbarrier, another branch's wgmma reads it) fences in its
    own branch, before the arrive, once per iteration; two buffers the reader does not touch
    get none; a fence already there is kept and not doubled."""
    from hexlayout.arch.dtypes import F16, F32
    from hexlayout.ir.expr import Var
    from hexlayout.ir.lowered import (
        IfThen,
        LoweredKernel,
        MbarArrive,
        MbarRef,
        MbarWait,
        RegArray,
        RegRef,
        SharedRef,
        SmemBuffer,
        SmemDesc,
        StShared,
    )
    from hexlayout.ir.passes import insert_proxy_fences

    tile, other = SmemBuffer("tile", F16, 8192, 0), SmemBuffer("other", F16, 8192, 8192)
    r, d = RegArray("r", F16, 8), RegArray("d", F32, 32)
    bar = MbarRef("full")
    k = Var("k", 0, 4, kind="loop")
    tid = Var("tid", 0, 256, kind="thread")

    def store(buf: SmemBuffer) -> StShared:
        return StShared(SharedRef(buf, tid * 8), RegRef(r, 0, 8), 128)

    producer = [ForLoop(k, 0, 4, 1, [store(tile), store(other), MbarArrive(bar)])]
    consumer = [ForLoop(k, 0, 4, 1, [MbarWait(bar, k % 2),
                                     Wgmma("m64n64k16", RegRef(d, 0, 32), SmemDesc(tile, 0, 1, 16, 1024),
                                           SmemDesc(tile, 0, 1, 16, 1024))])]
    prog = LoweredKernel("ws", [], (1,), 256, tid, (), [IfThen(tid < 128, producer, consumer)], arch="sm_90a")
    body = insert_proxy_fences(prog).body
    loop = body[0].then_body[0]
    assert [type(i).__name__ for i in loop.body] == ["StShared", "StShared", "FenceProxyAsync", "MbarArrive"]
    assert _fences(body[0].else_body) == 0 and _fences(body) == 1
    # already fenced: unchanged (the same object back)
    fenced = [ForLoop(k, 0, 4, 1, [store(tile), FenceProxyAsync(), MbarArrive(bar)])]
    prog2 = dataclasses.replace(prog, body=[IfThen(tid < 128, fenced, consumer)])
    assert insert_proxy_fences(prog2) is prog2
    # nothing reads `other` through the async proxy: no fence for a branch writing only it
    only_other = [ForLoop(k, 0, 4, 1, [store(other), MbarArrive(bar)])]
    prog3 = dataclasses.replace(prog, body=[IfThen(tid < 128, only_other, consumer)])
    assert insert_proxy_fences(prog3) is prog3
