"""``WarpSync`` (``bar.warp.sync``: ``__syncwarp()``, the sync before ``hl.arrive(who="warp")``'s
lane-0 arrival) in the emulator: on a whole warp it joins the lanes' vector clocks, so lane 0's
later release publishes every lane's earlier shared-memory writes; on a partial warp (divergent
lanes) it is a divergence error naming the missing lane."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.emulator import DivergenceError, RaceError, run
from hexlayout.ir import lowered as L

from .kbuild import KB, gparam, here, rr


def _kernel(sync: bool, writers: int = 32):
    """Warp 0's lanes ``< writers`` write ``buf[tid] = x[tid]`` (then ``__syncwarp`` with ``sync``)
    and lane 0 arrives on an mbarrier; warp 1 waits on it and copies ``buf`` to ``y``."""
    kb = KB("warp_sync", 64)
    x = gparam("x", "f32", (32,))
    y = gparam("y", "f32", (32,))
    s = kb.shared("buf", "f32", 32)
    bar = kb.mbar("bar")
    r = kb.reg("r", "f32", 1)
    tid = kb.tid
    produce = [L.LdGlobal(rr(r), L.GlobalRef(x, tid), 32),
               L.StShared(L.SharedRef(s, tid), rr(r), 32, loc=here("buf[tid] = x[tid]"))]
    if sync:
        produce.append(L.WarpSync(loc=here("__syncwarp()")))
    body = [
        L.MbarInit(bar, 1, pred=tid.eq(0), loc=here("mbarrier.init")),
        L.BarSync(),
        L.IfThen(tid < writers, produce),
        L.IfThen(tid < 32, [L.MbarArrive(bar, pred=tid.eq(0), loc=here("lane 0 arrives"))]),
        L.IfThen(tid >= 32, [
            L.MbarWait(bar, 0, loc=here("wait")),
            L.LdShared(rr(r), L.SharedRef(s, tid - 32), 32, loc=here("r = buf[tid - 32]")),
            L.StGlobal(L.GlobalRef(y, tid - 32), rr(r), 32),
        ]),
    ]
    return kb.build([x, y], body)


def _args(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(32).astype(np.float32), "y": np.full(32, np.nan, np.float32)}


def test_warp_sync_on_a_whole_warp_joins_the_lanes_clocks():
    """With ``__syncwarp`` lane 0's arrival releases lane 5's write too: warp 1 reads all 32 values."""
    args = _args(3)
    run(_kernel(sync=True), args)
    np.testing.assert_array_equal(args["y"], args["x"])


def test_without_warp_sync_lane_0_releases_only_its_own_write():
    """No ``__syncwarp``: lane 1's write is not ordered before warp 1's read (a race naming both)."""
    with pytest.raises(RaceError, match=r"r = buf\[tid - 32\]") as e:
        run(_kernel(sync=False), _args(4))
    assert e.value.thread == 33 and e.value.other_thread == 1


def test_warp_sync_on_a_partial_warp_is_a_divergence_error():
    """``__syncwarp`` reached by lanes 0..15 of warp 0 only: a divergence error naming lane 16."""
    with pytest.raises(DivergenceError, match=r"bar\.warp\.sync \(__syncwarp\) needs all 32 threads of its "
                       r"warp 0 active, thread 16 is not"):
        run(_kernel(sync=True, writers=16), _args(5))
