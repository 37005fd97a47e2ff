"""sm_100a: a tcgen05 accumulator issued by one warp role and read by another
(``hexlayout.ir.accumulator_handoff``): warp group 0 issues the MMAs of column tile ``t`` into
accumulator stage ``t % 2`` and commits onto ``acc_full[s]``; warp group 1 waits on it, stores the
tile and arrives on ``acc_empty[s]``, which the MMA role waits on before reusing the stage. Four
tiles, so the two stages rotate and wrap; emulated against float64 on random data, and the two
missing orders are emulator errors (a read before the commit's arrival, an MMA into columns an
unordered tcgen05.ld reads)."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import AsyncHazardError, run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.synth.solve import synthesize

M, N, K = hl.dims("M N K")
TILES = 4


def handoff(mode: str = "ok"):
    """``mode``: ``"ok"``; ``"no_full_wait"`` - the readers do not wait for the commit;
    ``"early_release"`` - they arrive on ``acc_empty`` before reading."""

    @hl.kernel(threads=256, name=f"handoff_{mode}")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sa = hl.shared(hl.f16, (128, 64))
        sb = hl.shared(hl.f16, (64, 64, TILES))
        full = hl.mbarrier(2, name="acc_full")
        empty = hl.mbarrier(2, name="acc_empty")
        for s in range(2):
            hl.mbarrier_init(full, s, arrivals=1)
            hl.mbarrier_init(empty, s, arrivals=128)
        hl.copy(a.tile((128, 64), (0, 0)), sa)
        for t in range(TILES):
            hl.copy(b.tile((64, 64), (t * 64, 0)), sb[:, :, t])
        hl.commit_group()
        hl.wait_group(0)
        hl.fence_proxy_async()
        hl.syncthreads()
        accs = [hl.register(hl.f32, (128, 64)) for _ in range(2)]
        with hl.warp_group(0):
            for u in hl.range(TILES // 2):
                for s in range(2):
                    with hl.if_(u > 0):
                        hl.wait(empty, s, phase=(u - 1) % 2)
                    hl.wgmma_fence()
                    hl.mma(sa, sb[:, :, 2 * u + s], accs[s], accumulate=False)
                    hl.arrive(full, s, who="mma")
        with hl.else_():
            for u in hl.range(TILES // 2):
                for s in range(2):
                    if mode != "no_full_wait":
                        hl.wait(full, s, phase=u % 2)
                    if mode == "early_release":
                        hl.arrive(empty, s)
                    hl.copy(accs[s], c.tile((128, 64), (0, (2 * u + s) * 64)))
                    if mode != "early_release":
                        hl.arrive(empty, s)

    return k


def _run(mode: str):
    syn = synthesize(handoff(mode).trace(), "sm_100a")
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (128, 64)).astype(np.float16)
    b = rng.uniform(-1, 1, (64 * TILES, 64)).astype(np.float16)
    c = np.full((128, 64 * TILES), np.nan, np.float32)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    return syn, c, a.astype(np.float64) @ b.astype(np.float64).T


def _walk(body):
    return list(L.walk_instrs(body))


def test_stages_rotate_between_the_mma_role_and_the_readers():
    syn, c, want = _run("ok")
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    lk = syn.lowered.kernel
    role = next(i for i in lk.body if isinstance(i, L.IfThen) and i.else_body)
    mma_role, readers = role.then_body, role.else_body          # warp group 0, warp group 1
    assert any(isinstance(j, T.Tcgen05Mma) for j in _walk(mma_role))
    assert not any(isinstance(j, (T.Tcgen05Mma, T.Tcgen05Commit)) for j in _walk(readers))
    # the two stages: one 128-column allocation, MMAs into columns 0.. and 64..
    assert [i.ncols for i in _walk(lk.body) if isinstance(i, T.TmemAlloc)] == [128]
    assert {str(i.d) for i in _walk(mma_role) if isinstance(i, T.Tcgen05Mma)} == {"tmem_base[0]",
                                                                                  "tmem_base[0] + 64"}
    # the readers load inside their loop (each iteration, after the author's wait), the whole
    # warp group's lanes (tcgen05.ld.32x32b), and hand the columns back by the author's arrive:
    # no named barrier of their own; the MMA role never waits on acc_full
    loop = next(i for i in _walk(readers) if isinstance(i, L.ForLoop))
    body = _walk(loop.body)
    loads = [i for i in body if isinstance(i, T.Tcgen05Ld)]
    assert len(loads) == 2 and all(ld.shape == "32x32b" for ld in loads)
    first_wait = next(n for n, i in enumerate(body) if isinstance(i, L.MbarWait))
    assert first_wait < body.index(loads[0])
    assert not any(isinstance(i, L.BarSync) for i in body)
    assert not any(isinstance(i, L.MbarWait) and i.bar.name == "acc_full" for i in _walk(mma_role))


def test_a_read_before_the_commit_arrived_is_an_emulator_error():
    with pytest.raises(AsyncHazardError, match="before its tcgen05.commit arrived"):
        _run("no_full_wait")


def test_an_mma_into_columns_still_being_read_is_an_emulator_error():
    """The readers release the stage before their tcgen05.ld: the MMA role's next MMA into it is
    not ordered after the load."""
    with pytest.raises(AsyncHazardError, match="reads with tcgen05.ld, without the issuing thread"):
        _run("early_release")

