"""sm_100a: where the lowering puts an accumulator's ``tcgen05.ld`` when a loop reads it before
that iteration's tcgen05 mma (the previous tile's epilogue at the top of the next iteration).

The kernels below are correct sm_90a programs (the register accumulator is read after the
``wgmma_wait`` that covers its mma); on sm_100a each must give the same result - the load after
the commit wait covering the MMAs it depends on, the previous tile's values, not stale
registers - or, where the read cannot be covered, a lowering error naming the op and line.
Emulated against float64 on random data; tiles of 128 x 64 x 64 (one k-tile per output tile)."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.errors import HexlayoutError
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.synth.solve import synthesize

M, N, K = hl.dims("M N K")


def deferred_epilogue(mode: str):
    """``c[:, 64t:64t+64] = a @ b[64t:64t+64]^T`` for each column tile ``t``; tile ``t - 1`` is
    stored at the top of iteration ``t`` (after ``wgmma_wait(0)`` there), the last one after the
    loop. ``mode``: ``"overwrite"`` - each tile's mma with ``accumulate=False``; ``"rezero"`` -
    the epilogue zeroes the accumulator, the mma accumulates; ``"undefined"`` - as
    ``"overwrite"`` with an accumulator no op writes before the loop (``hl.register``);
    ``"uncommitted"`` - the mma is never committed before the top-of-loop read (an error)."""

    @hl.kernel(threads=128, name=f"deferred_{mode}")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sa = hl.shared(hl.f16, (128, 64))
        sb = hl.shared(hl.f16, (64, 64))
        acc = hl.register(hl.f32, (128, 64)) if mode == "undefined" else hl.zeros((128, 64), hl.f32)
        tiles = hl.cdiv(b.shape[0], 64)
        for t in hl.range(tiles):
            with hl.if_(t > 0):
                if mode != "uncommitted":
                    hl.wgmma_wait(0)
                hl.copy(acc, c.tile((128, 64), (0, (t - 1) * 64)))
                if mode == "rezero":
                    hl.assign(acc, hl.zeros((128, 64), hl.f32))
            hl.syncthreads()
            hl.copy(a.tile((128, 64), (0, 0)), sa)
            hl.copy(b.tile((64, 64), (t * 64, 0)), sb)
            hl.commit_group()
            hl.wait_group(0)
            hl.fence_proxy_async()
            hl.syncthreads()
            hl.wgmma_fence()
            hl.mma(sa, sb, acc, accumulate=mode not in ("overwrite", "undefined"))
            if mode != "uncommitted":
                hl.wgmma_commit()
        hl.wgmma_wait(0)
        hl.copy(acc, c.tile((128, 64), (0, (tiles - 1) * 64)))

    return k


def _walk(body):
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from _walk(getattr(i, sub, []))


@pytest.mark.parametrize("mode", ["overwrite", "rezero", "undefined"])
def test_previous_tile_read_at_the_top_of_the_loop_matches_float64(mode):
    syn = synthesize(deferred_epilogue(mode).trace(), "sm_100a")
    rng = np.random.default_rng(27)
    a = rng.uniform(-1, 1, (128, 64)).astype(np.float16)
    b = rng.uniform(-1, 1, (192, 64)).astype(np.float16)          # 3 column tiles
    c = np.full((128, 192), np.nan, np.float32)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    # the accumulator is in TMEM at the loop's start, the read at the top
    # loads it after a wait on the latest commit's barrier (the author's wgmma_wait sits after)
    loop = next(i for i in _walk(syn.lowered.kernel.body) if isinstance(i, L.ForLoop))
    top = next(i for i in loop.body if isinstance(i, (L.IfThen, T.Tcgen05Ld)))
    assert isinstance(top, L.IfThen) and any(isinstance(i, L.MbarWait) for i in _walk(top.then_body))
    before = syn.lowered.kernel.body[:syn.lowered.kernel.body.index(loop)] \
        if loop in syn.lowered.kernel.body else []
    # stored before it, unless no op wrote its registers (TMEM's undefined columns stand for
    # them: a tcgen05.st of unset registers is what NVRTC warns of, #549-D)
    stored = any(isinstance(i, T.Tcgen05St) for i in _walk(before))
    assert stored == (mode != "undefined")


def test_read_of_an_uncommitted_mma_is_a_lowering_error():
    with pytest.raises(HexlayoutError) as e:
        synthesize(deferred_epilogue("uncommitted").trace(), "sm_100a")
    msg = str(e.value)
    assert "deferred_uncommitted" in msg and "%acc" in msg and "not be committed" in msg
    assert "test_lower_umma_loops.py" in msg            # the source line of the op


def _mma_arrive_kernel(tx_bytes: int = 0):
    @hl.kernel(threads=128, name="mma_arrive")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sa = hl.shared(hl.f16, (128, 64))
        sb = hl.shared(hl.f16, (64, 64))
        done = hl.mbarrier(1)
        hl.mbarrier_init(done, 0, arrivals=1)
        hl.syncthreads()
        acc = hl.register(hl.f32, (128, 64))
        hl.mma(sa, sb, acc, accumulate=False)
        hl.arrive(done, 0, tx_bytes=tx_bytes, who="mma")
        hl.wait(done, 0, phase=0)
        hl.wgmma_commit()
        hl.wgmma_wait(0)
        hl.copy(acc, hl.view(c, tile=(128, 64), origin=(0, 0)))

    return k


def test_arrive_by_the_mmas_is_a_commit_on_sm100_and_an_error_elsewhere():
    """``hl.arrive(bar, i, who="mma")``: the issuing thread's ``tcgen05.commit`` onto ``bar[i]``
    on sm_100a (not a commit of the accumulator: the ``tcgen05.ld`` still waits for the
    ``wgmma_commit``); on sm_90a (wgmma) a lowering error naming the op; ``tx_bytes`` with it
    a trace error."""
    lk = synthesize(_mma_arrive_kernel().trace(), "sm_100a").lowered.kernel
    commits = [i for i in L.walk_instrs(lk.body) if isinstance(i, T.Tcgen05Commit)]
    assert [c.bar.name for c in commits] == ["done", "tc_done"]
    issue = [i for i in lk.body if isinstance(i, L.ElectIf)]
    assert issue and isinstance(issue[0].then_body[-1], T.Tcgen05Commit)
    with pytest.raises(HexlayoutError, match=r"who='mma'\) is a tcgen05.commit: the kernel has no tcgen05"):
        synthesize(_mma_arrive_kernel().trace(), "sm_90a")
    with pytest.raises(hl.KernelError, match="who='mma'.*takes no tx_bytes"):
        _mma_arrive_kernel(tx_bytes=16).trace()
