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

M, N, K = hl.dims("M N K")


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
