"""Global / shared vector loads and stores: predication, zero fill, bounds, alignment, races, sectors."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.emulator import MisalignedAccessError, OutOfBoundsError, RaceError, run
from hexlayout.ir import lowered as L

from .kbuild import KB, gparam, here, rand, rr, sparam


def copy_kernel(vec: int = 8, threads: int = 64, zero_fill_out: bool = False):
    """y[i] = x[i] for i < n, 16-byte vectors of f16, one vector per thread, grid over n."""
    n = sparam("n")
    kb = KB("copy", threads, grid=((n.var + threads * vec - 1) // (threads * vec),))
    x = gparam("x", "f16", (n.var,))
    ylen = sparam("ylen")
    y = gparam("y", "f16", (ylen.var,)) if zero_fill_out else gparam("y", "f16", (n.var,))
    r = kb.reg("r", "f16", vec)
    off = (kb.bid[0] * threads + kb.tid) * vec
    inb = off < n.var
    body = [
        L.LdGlobal(rr(r), L.GlobalRef(x, off), vec * 16, pred=inb, loc=here("r = x[off]"), origin="load x"),
        L.StGlobal(
            L.GlobalRef(y, off),
            rr(r),
            vec * 16,
            pred=None if zero_fill_out else inb,
            loc=here("y[off] = r"),
            origin="store y",
        ),
    ]
    params = [x, y, n] + ([ylen] if zero_fill_out else [])
    return kb.build(params, body)


def test_vector_copy_with_predication_and_ragged_size():
    rng = np.random.default_rng(0)
    n = 1000  # 2 blocks of 512, the second ragged
    x = rand((n,), np.float16, rng)
    y = rand((n,), np.float16, rng)
    rep = run(copy_kernel(), {"x": x, "y": y, "n": n})
    np.testing.assert_array_equal(y, x)
    assert len(rep.blocks) == 2
    ld = rep.find("LdGlobal")[0]
    assert ld.executions == 2
    assert ld.gmem_bytes == n * 2


def test_zero_fill_writes_zeros_for_predicated_off_threads():
    rng = np.random.default_rng(1)
    n, ylen = 1000, 1024
    x = rand((n,), np.float16, rng)
    y = rand((ylen,), np.float16, rng)
    run(copy_kernel(zero_fill_out=True), {"x": x, "y": y, "n": n, "ylen": ylen})
    np.testing.assert_array_equal(y[:n], x)
    np.testing.assert_array_equal(y[n:], 0)


def test_out_of_bounds_global_names_tensor_address_and_line():
    kb = KB("oob", 32)
    x = gparam("x", "f32", (40,))
    r = kb.reg("r", "f32", 4)
    ld = L.LdGlobal(rr(r), L.GlobalRef(x, kb.tid * 4), 128, loc=here("r = x[4*tid]"), origin="load x")
    k = kb.build([x], [ld])
    with pytest.raises(OutOfBoundsError) as e:
        run(k, {"x": np.ones(40, np.float32)})
    err = e.value
    assert err.buffer == "x" and err.address == 40 and err.thread == 10
    assert err.loc == ld.loc and err.instr is ld
    assert f"test_memops.py:{ld.loc.line}" in str(err) and "'x'" in str(err) and "load x" in str(err)


def test_misaligned_vector_is_an_error():
    kb = KB("mis", 32)
    x = gparam("x", "f16", (1024,))
    r = kb.reg("r", "f16", 8)
    ld = L.LdGlobal(rr(r), L.GlobalRef(x, kb.tid * 8 + 4), 128, loc=here("r = x[8*tid+4]"))
    with pytest.raises(MisalignedAccessError) as e:
        run(kb.build([x], [ld]), {"x": np.ones(1024, np.float16)})
    assert e.value.address == 4 and e.value.thread == 0 and "16-byte" in str(e.value)
    assert str(ld.loc) in str(e.value)


def test_shared_out_of_bounds_names_buffer():
    kb = KB("soob", 32)
    s = kb.shared("tile", "f32", 32)
    r = kb.reg("r", "f32", 1)
    st = L.StShared(L.SharedRef(s, kb.tid + 1), rr(r), 32, loc=here("tile[tid+1] = r"))
    with pytest.raises(OutOfBoundsError) as e:
        run(kb.build([], [st]), {})
    assert e.value.buffer == "tile" and e.value.thread == 31 and str(st.loc) in str(e.value)


def _transpose_kernel(sync: bool):
    """Each thread writes one f32 to shared, (optionally) bar.sync, reads its neighbour's."""
    kb = KB("neighbour", 64)
    x = gparam("x", "f32", (64,))
    y = gparam("y", "f32", (64,))
    s = kb.shared("buf", "f32", 64)
    r = kb.reg("r", "f32", 1)
    q = kb.reg("q", "f32", 1)
    store = L.StShared(L.SharedRef(s, kb.tid), rr(r), 32, loc=here("buf[tid] = r"), origin="store buf")
    load = L.LdShared(
        rr(q), L.SharedRef(s, (kb.tid + 1) % 64), 32, loc=here("q = buf[tid+1]"), origin="load buf"
    )
    body = [L.LdGlobal(rr(r), L.GlobalRef(x, kb.tid), 32), store]
    if sync:
        body.append(L.BarSync(loc=here("sync")))
    body += [load, L.StGlobal(L.GlobalRef(y, kb.tid), rr(q), 32)]
    return kb.build([x, y], body), store, load


def test_shared_round_trip_with_barsync():
    rng = np.random.default_rng(2)
    k, _, _ = _transpose_kernel(sync=True)
    x = rand((64,), np.float32, rng)
    y = np.zeros(64, np.float32)
    rep = run(k, {"x": x, "y": y})
    np.testing.assert_array_equal(y, np.roll(x, -1))
    lds = rep.find("LdShared")[0]
    assert lds.smem_wavefronts == 2 and lds.bank_conflicts == 0


def test_missing_barsync_is_a_race_naming_both_lines():
    k, store, load = _transpose_kernel(sync=False)
    with pytest.raises(RaceError) as e:
        run(k, {"x": np.ones(64, np.float32), "y": np.zeros(64, np.float32)})
    err = e.value
    assert err.instr is load and err.other_instr is store
    assert str(load.loc) in str(err) and str(store.loc) in str(err)
    assert err.buffer == "buf" and err.thread == 0 and err.other_thread == 1


def test_write_after_read_race_on_buffer_reuse():
    """Reading a neighbour's value, then overwriting own slot without a barrier between."""
    kb = KB("war", 32)
    s = kb.shared("buf", "f32", 32)
    r = kb.reg("r", "f32", 1)
    body = [
        L.Alu("mov", rr(r), (1.5,)),
        L.StShared(L.SharedRef(s, kb.tid), rr(r), 32),
        L.BarSync(),
        L.LdShared(rr(r), L.SharedRef(s, (kb.tid + 1) % 32), 32, loc=here("r = buf[tid+1]")),
        L.StShared(L.SharedRef(s, kb.tid), rr(r), 32, loc=here("buf[tid] = r")),
    ]
    with pytest.raises(RaceError) as e:
        run(kb.build([], body), {})
    assert "write-after-read" in str(e.value) and e.value.other_instr is body[3]


def test_global_sectors_coalesced_and_strided():
    rng = np.random.default_rng(3)
    kb = KB("sectors", 32)
    x = gparam("x", "f16", (32 * 8 * 8,))
    r = kb.reg("r", "f16", 8)
    coal = L.LdGlobal(rr(r), L.GlobalRef(x, kb.tid * 8), 128, origin="coalesced")
    strided = L.LdGlobal(rr(r), L.GlobalRef(x, kb.tid * 64), 128, origin="strided")
    bcast = L.LdGlobal(rr(r), L.GlobalRef(x, 0), 128, origin="broadcast")
    rep = run(kb.build([x], [coal, strided, bcast]), {"x": rand((2048,), np.float16, rng)})
    c, s, b = (rep.find(origin=o)[0] for o in ("coalesced", "strided", "broadcast"))
    assert (c.gmem_requests, c.gmem_sectors, c.gmem_ideal_sectors, c.gmem_bytes) == (1, 16, 16, 512)
    assert (s.gmem_requests, s.gmem_sectors, s.gmem_ideal_sectors) == (1, 32, 16)
    assert (b.gmem_sectors, b.gmem_ideal_sectors) == (1, 1)
    assert "coalesced" in str(rep) and "total" in str(rep)
