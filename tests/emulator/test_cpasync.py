"""cp.async commit / wait_group pipelines: results, zero fill, read-before-wait and race errors."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.emulator import AsyncHazardError, RaceError, run
from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var

from .kbuild import KB, gparam, here, rand, rr


def pipeline_kernel(ntiles: int, second_sync: bool = True, first_sync: bool = True):
    """Double-buffered copy: tile k (32 threads x 8 f16) goes global -> smem stage k%2 by cp.async;
    each thread then reads its neighbour's chunk of the tile and writes it out."""
    kb = KB("cp_pipeline", 32)
    x = gparam("x", "f16", (ntiles * 256,))
    y = gparam("y", "f16", (ntiles * 256,))
    s = kb.shared("stages", "f16", 2 * 256)
    r = kb.reg("r", "f16", 8)
    k = Var("k", 0, ntiles)
    tid = kb.tid

    def issue(tile, stage):
        return L.CpAsync(
            L.SharedRef(s, stage * 256 + tid * 8),
            L.GlobalRef(x, tile * 256 + tid * 8),
            16,
            loc=here("cp.async tile"),
            origin="x -> stages",
        )

    body_k = [
        L.IfThen(k + 1 < ntiles, [issue(k + 1, (k + 1) % 2)], loc=here("if k+1 < n")),
        L.CpAsyncCommit(loc=here("commit")),
        L.CpAsyncWait(1, loc=here("wait_group 1")),
    ]
    if first_sync:
        body_k.append(L.BarSync(loc=here("sync after wait")))
    body_k += [
        L.LdShared(
            rr(r),
            L.SharedRef(s, (k % 2) * 256 + ((tid + 1) % 32) * 8),
            128,
            loc=here("r = stage[...]"),
            origin="stages -> regs",
        ),
        L.StGlobal(L.GlobalRef(y, k * 256 + tid * 8), rr(r), 128),
    ]
    if second_sync:
        body_k.append(L.BarSync(loc=here("sync before refill")))
    body = [issue(0, 0), L.CpAsyncCommit(), L.ForLoop(k, 0, ntiles, 1, body_k)]
    return kb.build([x, y], body)


def _expected(x: np.ndarray, ntiles: int) -> np.ndarray:
    t = x.reshape(ntiles, 32, 8)
    return np.roll(t, -1, axis=1).reshape(-1)


def test_cp_async_double_buffer_pipeline():
    rng = np.random.default_rng(10)
    n = 6
    x = rand((n * 256,), np.float16, rng)
    y = np.zeros_like(x)
    rep = run(pipeline_kernel(n), {"x": x, "y": y})
    np.testing.assert_array_equal(y, _expected(x, n))
    cps = rep.find("CpAsync")  # prologue and loop sites
    assert sum(c.executions for c in cps) == n and sum(c.gmem_sectors for c in cps) == n * 16
    assert sum(c.bank_conflicts for c in cps) == 0


def test_missing_sync_before_refill_is_a_write_after_read_race():
    with pytest.raises(RaceError) as e:
        run(
            pipeline_kernel(4, second_sync=False),
            {"x": np.ones(1024, np.float16), "y": np.zeros(1024, np.float16)},
        )
    assert "write-after-read" in str(e.value)
    assert e.value.instr.opname == "CpAsync" and e.value.other_instr.opname == "LdShared"


def test_missing_sync_after_wait_is_a_race():
    with pytest.raises(RaceError) as e:
        run(
            pipeline_kernel(4, first_sync=False),
            {"x": np.ones(1024, np.float16), "y": np.zeros(1024, np.float16)},
        )
    assert e.value.instr.opname == "LdShared" and e.value.other_instr.opname == "CpAsync"


def test_read_before_wait_names_read_and_pending_copy():
    kb = KB("early", 32)
    x = gparam("x", "f32", (128,))
    s = kb.shared("buf", "f32", 128)
    r = kb.reg("r", "f32", 4)
    cp = L.CpAsync(L.SharedRef(s, kb.tid * 4), L.GlobalRef(x, kb.tid * 4), 16, loc=here("cp.async"))
    ld = L.LdShared(rr(r), L.SharedRef(s, kb.tid * 4), 128, loc=here("r = buf[...]"))
    body = [cp, L.CpAsyncCommit(), ld]
    with pytest.raises(AsyncHazardError) as e:
        run(kb.build([x], body), {"x": np.ones(128, np.float32)})
    assert e.value.instr is ld and e.value.other_instr is cp
    assert str(ld.loc) in str(e.value) and str(cp.loc) in str(e.value) and e.value.buffer == "buf"
    # waiting for all but the most recent group is not enough either
    body2 = [cp, L.CpAsyncCommit(), L.CpAsyncWait(1), ld]
    with pytest.raises(AsyncHazardError):
        run(kb.build([x], body2), {"x": np.ones(128, np.float32)})
    body3 = [cp, L.CpAsyncCommit(), L.CpAsyncWait(0), ld]
    run(kb.build([x], body3), {"x": np.ones(128, np.float32)})


def test_cp_async_zero_fill_when_predicated_off():
    rng = np.random.default_rng(11)
    kb = KB("zfill", 32)
    x = gparam("x", "f32", (100,))
    y = gparam("y", "f32", (128,))
    s = kb.shared("buf", "f32", 128)
    r = kb.reg("r", "f32", 4)
    body = [
        L.CpAsync(L.SharedRef(s, kb.tid * 4), L.GlobalRef(x, kb.tid * 4), 16, pred=kb.tid * 4 < 100),
        L.CpAsyncCommit(),
        L.CpAsyncWait(0),
        L.LdShared(rr(r), L.SharedRef(s, kb.tid * 4), 128),
        L.StGlobal(L.GlobalRef(y, kb.tid * 4), rr(r), 128),
    ]
    x_ = rand((100,), np.float32, rng)
    y_ = rand((128,), np.float32, rng)
    run(kb.build([x, y], body), {"x": x_, "y": y_})
    np.testing.assert_array_equal(y_[:100], x_)
    np.testing.assert_array_equal(y_[100:], 0)
