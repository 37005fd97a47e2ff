"""``hl.offline`` inputs in a small kernel (no MoE): synthesis derives the storage order from
the register layout the copy fills (here the mma B operand), the emulator reads the physical
tensor ``OfflineLayout.apply`` packs and the kernel sees the logical values; misuse is refused
with the kernel, the tensor and the line."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.errors import HexlayoutError
from hexlayout.lang import f16, f32, u4, u8
from hexlayout.synth.solve import synthesize

torch = pytest.importorskip("torch")

M, N, K, G = hl.dims("M N K G")


def _kernel(wt, warps):
    @hl.kernel(threads=32 * warps[0] * warps[1])
    def qmatmul(a: f16[M, K], q: hl.offline(wt[N, K]), c: f32[M, N]):
        """c = a @ q^T for one 16 x 64 block over K = 64 (q's values in [0, 2^bits))."""
        ra = hl.register(f16, (16, 64))
        hl.copy(hl.view(a, (16, 64), (0, 0)), ra)
        if wt is u4:
            rq = hl.copy(hl.view(q, (64, 64), (0, 0)))
        else:
            rq = hl.register(u8, (64, 64))
            hl.copy(hl.view(q, (64, 64), (0, 0)), rq)
        acc = hl.zeros((16, 64), f32)
        hl.mma(ra, hl.cast(rq, f16), acc, warps=warps)
        hl.copy(acc, hl.view(c, (16, 64), (0, 0)))

    return qmatmul


@pytest.mark.parametrize(("wt", "bits"), [(u4, 4), (u8, 8)])
def test_the_kernel_reads_the_logical_values_through_the_synthesized_order(wt, bits) -> None:
    syn = synthesize(_kernel(wt, (1, 4)).trace(), "sm_80")
    lay = syn.lowered.offline["q"]
    assert lay.tile == (64, 64) and lay.bits == bits and lay.threads == 128
    rng = np.random.default_rng(bits)
    a = rng.standard_normal((16, 64)).astype(np.float16)
    vals = rng.integers(0, 2**bits, (64, 64))
    q = lay.apply(torch.from_numpy(vals)).numpy()
    assert q.shape == (64, 64 * bits // 8) and q.dtype == np.uint8
    c = np.full((16, 64), np.nan, np.float32)
    run(syn.lowered.kernel, {"a": a, "q": q, "c": c})
    want = a.astype(np.float64) @ vals.T.astype(np.float64)
    assert np.abs(c - want).max() <= 1e-3 * np.abs(want).max()
    # each thread's fragment is one run, loaded by 16-byte vectors
    assert any("ld.global.b128 (offline)" == ins for _, ins in syn.lowered.choices)


def test_the_warp_arrangement_changes_the_layout() -> None:
    one = synthesize(_kernel(u4, (1, 4)).trace(), "sm_80").lowered.offline["q"]
    two = synthesize(_kernel(u4, (1, 2)).trace(), "sm_80").lowered.offline["q"]
    assert one.key != two.key and (one.thread_bytes, two.thread_bytes) == (16, 32)


def test_copying_an_offline_tensor_into_shared_memory_is_refused() -> None:
    @hl.kernel(threads=128)
    def to_shared(q: hl.offline(u8[N, K]), c: u8[N, K]):
        sq = hl.shared(u8, (64, 64))
        hl.copy(hl.view(q, (64, 64), (0, 0)), sq)
        hl.syncthreads()
        r = hl.register(u8, (64, 64))
        hl.copy(sq, r)
        hl.copy(r, hl.view(c, (64, 64), (0, 0)))

    with pytest.raises(HexlayoutError, match=r"to_shared.*offline tensor q.*register tile") as e:
        synthesize(to_shared.trace(), "sm_80")
    assert "hl.copy(hl.view(q, (64, 64), (0, 0)), sq)" in str(e.value)


def test_offline_types() -> None:
    assert str(hl.offline(u4["R", "K"])) == "offline(u4[R, K])"
    with pytest.raises(ValueError, match="two row-major modes"):
        hl.offline(u8["A", "B", "C"])
    with pytest.raises(TypeError):
        hl.offline("u8")


def test_two_copies_in_two_storage_orders_are_refused() -> None:
    @hl.kernel(threads=128)
    def two_tiles(q: hl.offline(u8[N, K]), c: u8[N, K]):
        r = hl.register(u8, (64, 64))
        hl.copy(hl.view(q, (64, 64), (0, 0)), r)
        hl.copy(r, hl.view(c, (64, 64), (0, 0)))
        r2 = hl.register(u8, (64, 32))
        hl.copy(hl.view(q, (64, 32), (0, 64)), r2)
        hl.copy(r2, hl.view(c, (64, 32), (0, 64)))

    with pytest.raises(HexlayoutError, match=r"two_tiles.*offline tensor q.*earlier copy chose"):
        synthesize(two_tiles.trace(), "sm_80")


def test_a_replicated_column_of_16_bit_scales_is_stored_in_its_owners_order() -> None:
    """A ``(64, 1)`` column of f16 scales that scales the mma's B operand is held by the 4
    threads of each fragment row group alike (a replicated register layout): its storage order
    is its 32 owners', each owner's two columns one 4-byte run that all 4 threads load."""
    @hl.kernel(threads=128)
    def scaled(a: f16[M, K], q: hl.offline(u8[N, K]), s: hl.offline(f16[N, G]), c: f32[M, N]):
        """c = a @ (q * s[:, 1])^T for one 16 x 64 block over K = 64 (group 1 of s)."""
        ra = hl.register(f16, (16, 64))
        hl.copy(hl.view(a, (16, 64), (0, 0)), ra)
        rq = hl.register(u8, (64, 64))
        hl.copy(hl.view(q, (64, 64), (0, 0)), rq)
        st = hl.register(f16, (64, 1))
        hl.copy(hl.view(s, (64, 1), (0, 1)), st)
        acc = hl.zeros((16, 64), f32)
        hl.mma(ra, hl.cast(rq, f16) * st, acc, warps=(1, 4))
        hl.copy(acc, hl.view(c, (16, 64), (0, 0)))

    syn = synthesize(scaled.trace(), "sm_80")
    lay = syn.lowered.offline["s"]
    assert (lay.tile, lay.bits, lay.threads, lay.replicas) == ((64, 1), 16, 32, 4)
    assert (lay.values, lay.thread_bytes, lay.vector_bytes) == (2, 4, 4)
    assert any("ld.global.b32 (offline)" == ins for _, ins in syn.lowered.choices)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 64)).astype(np.float16)
    vals = rng.integers(0, 256, (64, 64))
    sv = (rng.random((64, 3)) / 64 + 1 / 128).astype(np.float16)   # 3 groups; the kernel reads 1
    q = syn.lowered.offline["q"].apply(torch.from_numpy(vals)).numpy()
    s = lay.apply(torch.from_numpy(sv)).numpy()
    assert s.dtype == np.float16 and s.shape == (64, 3)
    # logical element (r, g) sits at perm[3 r + g]; each 64-row group column is one tile
    perm = lay.permutation((64, 3))
    assert sorted(perm) == list(range(64 * 3)) and np.array_equal(s.reshape(-1)[perm], sv.reshape(-1))
    c = np.full((16, 64), np.nan, np.float32)
    run(syn.lowered.kernel, {"a": a, "q": q, "s": s, "c": c})
    w = (vals.astype(np.float16) * sv[:, 1:2]).astype(np.float64)   # the product rounded to f16
    want = a.astype(np.float64) @ w.T
    assert np.abs(c - want).max() <= 1e-3 * np.abs(want).max()


def test_owners_drop_the_threads_that_replicate_others() -> None:
    from hexlayout.ir.lower.offline import owners
    from hexlayout.layout import Layout

    # 128 threads (4, 8, 4) whose first mode (lane % 4) holds the same values; 2 values each
    tv = Layout(((4, 8, 4), (2,)), ((0, 1, 16), (8,)))
    compact, modes = owners(tv, 128)
    assert compact.size() == 64 and modes == [(4, 8, 1), (32, 4, 8)]
    assert sorted(compact.indices().reshape(-1)) == list(range(64))
    for t in (0, 1, 5, 37, 127):   # thread t reads the run of its owner
        own = sum((t // p) % sh * q for p, sh, q in modes)
        assert [tv(t, v) for v in range(2)] == [compact(own, v) for v in range(2)]
    plain = Layout(((4, 8), (2,)), ((16, 1), (8,)))
    assert owners(plain, 32) == (plain, [(1, 32, 1)])
