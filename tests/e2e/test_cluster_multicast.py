"""Thread-block clusters in every layer: ``hl.cluster_rank``, ``hl.cluster_sync``, arrives on a
peer CTA's mbarrier (``hl.arrive(..., cta=)``) and TMA multicast (``hl.copy(..., multicast=)``),
traced -> synthesized -> lowered -> emulated with a cluster's CTAs running together, printed as
CUDA and compiled with NVRTC for sm_90a (UTMALDG.MULTICAST, cluster barriers in the SASS)."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import ArgumentError, DeadlockError, IllegalInstructionError, run
from hexlayout.runtime import build

M, K, R = hl.dims("M K R")


def multicast_kernel(mask: int = 3, final_sync: bool = True):
    """Each CTA of a pair loads one 64-row half of a 128 x 64 tile of ``x`` by TMA and multicasts
    it (``mask``) into both CTAs' shared tile; every CTA expects the whole tile's bytes, then
    stores the tile it received to its own 128 rows of ``y``."""

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def mc(x: hl.f16[M, K], y: hl.f16[R, K]):
        pid = hl.grid(hl.spatial(2 * hl.cdiv(x.shape[0], 128)))
        r = hl.cluster_rank()
        cl = pid // 2
        s = hl.shared(hl.f16, (128, 64))
        full = hl.mbarrier(1)
        hl.mbarrier_init(full, 0, arrivals=1)
        hl.cluster_sync()
        hl.arrive(full, 0, tx_bytes=s.nbytes, who="one")
        with hl.if_(r.eq(0)):
            hl.copy(hl.view(x, tile=(64, 64), origin=(cl * 128, 0)), s[0:64, :], mbarrier=full[0],
                    multicast=mask)
        with hl.else_():
            hl.copy(hl.view(x, tile=(64, 64), origin=(cl * 128 + 64, 0)), s[64:128, :], mbarrier=full[0],
                    multicast=mask)
        hl.wait(full, 0, phase=0)
        reg = hl.register(hl.f16, (128, 64))
        hl.copy(s, reg)
        hl.copy(reg, hl.view(y, tile=(128, 64), origin=(pid * 128, 0)))
        if final_sync:
            hl.cluster_sync()

    return mc


def pair_kernel(remote: bool = True):
    """Each CTA's barrier expects two arrivals: its own and its peer's (``cta=1 - rank``)."""

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def pair():
        hl.grid(hl.spatial(4))
        empty = hl.mbarrier(1)
        hl.mbarrier_init(empty, 0, arrivals=2)
        hl.cluster_sync()
        hl.arrive(empty, 0, who="one")
        if remote:
            hl.arrive(empty, 0, who="one", cta=1 - hl.cluster_rank())
        hl.wait(empty, 0, phase=0)
        hl.cluster_sync()

    return pair


def _lowered(kernel):
    return build(kernel, "sm_90a", compile=False).lowered


def test_multicast_halves_land_in_both_ctas_of_each_cluster() -> None:
    rng = np.random.default_rng(2026)
    x = rng.standard_normal((200, 64)).astype(np.float16)      # ragged: the last tile is 72 rows
    y = np.full((4 * 128, 64), np.nan, dtype=np.float16)
    rep = run(_lowered(multicast_kernel()), {"x": x, "y": y})
    assert sorted(rep.blocks) == [(0,), (1,), (2,), (3,)]
    xp = np.zeros((256, 64), dtype=np.float16)
    xp[:200] = x
    for block in range(4):                 # both CTAs of cluster c hold x's tile c (zero-filled past M)
        c = block // 2
        np.testing.assert_array_equal(y[block * 128:(block + 1) * 128], xp[c * 128:(c + 1) * 128])


def test_one_block_runs_its_whole_cluster() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 64)).astype(np.float16)
    y = np.zeros((512, 64), dtype=np.float16)
    rep = run(_lowered(multicast_kernel()), {"x": x, "y": y}, blocks=[3])
    assert sorted(rep.blocks) == [(2,), (3,)]
    np.testing.assert_array_equal(y[256:384], x[128:256])
    np.testing.assert_array_equal(y[384:512], x[128:256])
    assert not y[:256].any()


def test_multicast_into_one_cta_leaves_the_other_waiting_for_its_bytes() -> None:
    x = np.random.default_rng(3).standard_normal((128, 64)).astype(np.float16)
    y = np.zeros((256, 64), dtype=np.float16)
    with pytest.raises(DeadlockError, match=r"block \(1,\).*transaction byte"):
        run(_lowered(multicast_kernel(mask=1)), {"x": x, "y": y})


def test_a_cta_exiting_while_its_peer_multicasts_into_it_is_flagged() -> None:
    x = np.random.default_rng(4).standard_normal((128, 64)).astype(np.float16)
    y = np.zeros((256, 64), dtype=np.float16)

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def early():
        hl.grid(hl.spatial(2))
        bar = hl.mbarrier(1)
        hl.mbarrier_init(bar, 0, arrivals=1)
        hl.cluster_sync()
        with hl.if_(hl.cluster_rank().eq(1)):
            hl.arrive(bar, 0, who="one", cta=0)

    with pytest.raises(IllegalInstructionError, match=r"block \(0,\) \(cluster rank 0\) has already exited"):
        run(_lowered(early), {})
    # the same kernel with a cluster barrier before exit runs
    run(_lowered(multicast_kernel()), {"x": x, "y": y})


def test_remote_arrive_completes_the_peer_phase() -> None:
    rep = run(_lowered(pair_kernel()), {})
    assert len(rep.blocks) == 4
    with pytest.raises(DeadlockError, match=r"1/2 arrival\(s\) missing"):
        run(_lowered(pair_kernel(remote=False)), {})


def test_grid_not_a_multiple_of_the_cluster_is_refused() -> None:
    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def odd(n: hl.i32):
        hl.grid(hl.spatial(n))
        hl.cluster_sync()

    with pytest.raises(ArgumentError, match=r"not a multiple of the cluster \(2, 1, 1\)"):
        run(_lowered(odd), {"n": 3})
    assert len(run(_lowered(odd), {"n": 4}).blocks) == 4


def test_cluster_rank_is_the_block_index_within_its_cluster() -> None:
    @hl.kernel(threads=32, cluster=(2, 1, 1))
    def ranks(out: hl.i32[R]):
        pid = hl.grid(hl.spatial(out.shape[0]))
        v = hl.zeros((1,), hl.i32) + hl.cluster_rank()
        hl.copy(v, hl.view(out, tile=(1,), origin=(pid,)))

    out = np.full(6, -1, dtype=np.int32)
    run(_lowered(ranks), {"out": out})
    assert out.tolist() == [0, 1, 0, 1, 0, 1]


def _error(fn) -> str:
    with pytest.raises(hl.KernelError) as e:
        fn.trace()
    return str(e.value)


def test_language_errors_name_the_operation_and_line() -> None:
    @hl.kernel(threads=128)
    def no_cluster():
        hl.grid(hl.spatial(2))
        hl.cluster_rank()

    msg = _error(no_cluster)
    assert "cluster_rank" in msg and "hl.cluster_rank()" in msg and "no cluster" in msg

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def before_grid():
        hl.cluster_rank()

    assert "call hl.grid first" in _error(before_grid)

    @hl.kernel(threads=128)
    def sync_no_cluster():
        hl.cluster_sync()

    assert "cluster_sync" in _error(sync_no_cluster)

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def bad_cta():
        b = hl.mbarrier(1)
        hl.arrive(b, 0, cta=2)

    msg = _error(bad_cta)
    assert "cta=2 is outside the cluster of 2 CTAs" in msg and "hl.arrive(b, 0, cta=2)" in msg

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def cta_with_tx():
        b = hl.mbarrier(1)
        hl.arrive(b, 0, tx_bytes=128, cta=1)

    assert "tx_bytes" in _error(cta_with_tx)

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def mask_out_of_range(x: hl.f16[M, K]):
        s = hl.shared(hl.f16, (64, 64))
        b = hl.mbarrier(1)
        hl.copy(hl.view(x, tile=(64, 64), origin=(0, 0)), s, mbarrier=b[0], multicast=4)

    assert "multicast=4 must be a static mask of CTA ranks in [1, 3]" in _error(mask_out_of_range)

    @hl.kernel(threads=128, cluster=(2, 1, 1))
    def mask_without_barrier(x: hl.f16[M, K]):
        s = hl.shared(hl.f16, (64, 64))
        hl.copy(hl.view(x, tile=(64, 64), origin=(0, 0)), s, multicast=3)

    assert "pass mbarrier=" in _error(mask_without_barrier)


def test_generated_code_uses_the_cluster_instructions() -> None:
    src = build(multicast_kernel(), "sm_90a", compile=False).generated.source
    assert ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" in src
    assert "barrier.cluster.arrive.release.aligned" in src and "fence.mbarrier_init.release.cluster" in src
    src = build(pair_kernel(), "sm_90a", compile=False).generated.source
    assert "mapa.shared::cluster.u32" in src and "mbarrier.arrive.shared::cluster.b64 _, [remote]" in src


@pytest.mark.nvrtc
def test_cluster_kernels_compile_for_sm90a() -> None:
    b = build(multicast_kernel(), "sm_90a")
    res = b.compiled.resources
    assert res.spill_stores == res.spill_loads == 0
    counts = b.compiled.sass_counts()
    assert any(op.startswith("UTMALDG") and "MULTICAST" in op for op in counts), sorted(counts)
    assert "UCGABAR_ARV" in counts and "UCGABAR_WAIT" in counts
    counts = build(pair_kernel(), "sm_90a").compiled.sass_counts()
    assert any(op.startswith("SYNCS.ARRIVE") and "RED" in op for op in counts), sorted(counts)
