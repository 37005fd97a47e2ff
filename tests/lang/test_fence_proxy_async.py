"""``hl.fence_proxy_async``: a wgmma reads its shared operands through the async proxy, so tiles
filled by cp.async (the generic proxy) need the fence in every writing thread before the
barrier that precedes the wgmma. The emulator rejects the read without it and computes the
product with it; sm_80 lowers the fence to nothing."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import AsyncHazardError, run
from hexlayout.ir.lowered import FenceProxyAsync, Wgmma
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


def _flat(body):
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from _flat(getattr(i, sub, []))


def test_wgmma_after_cp_async_needs_the_fence() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    syn = synthesize(gathered_product(True).trace(), "sm_90a")
    instrs = list(_flat(syn.lowered.kernel.body))
    assert any(isinstance(i, Wgmma) for i in instrs) and any(isinstance(i, FenceProxyAsync) for i in instrs)
    c = np.zeros((64, 64), np.float32)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    want = a[::-1].astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)

    bad = synthesize(gathered_product(False).trace(), "sm_90a")
    with pytest.raises(AsyncHazardError, match="the wgmma reads shared byte .* without a fence.proxy.async"):
        run(bad.lowered.kernel, {"a": a, "b": b, "c": np.zeros((64, 64), np.float32)})


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

    fences = {arch: sum(isinstance(i, FenceProxyAsync) for i in _flat(synthesize(staged.trace(), arch)
                                                                     .lowered.kernel.body))
              for arch in ("sm_80", "sm_90a")}
    assert fences == {"sm_80": 0, "sm_90a": 1}
