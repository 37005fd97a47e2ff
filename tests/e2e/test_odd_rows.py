"""Rows of any element alignment (issue 9 item 4) and kernel (g): SiLU-and-mul over rows of
odd length, ``out[t, i] = silu(x[t, i]) * x[t, I + i]`` with ``I`` odd (every row of ``x``
and the second half of each row start only 2-byte aligned).

A tensor declared ``.aligned(n)`` promises ``n``-byte alignment of its data pointer, rows
and view origins, and nothing more: synthesis uses vectors no wider than ``n`` bytes there
(coalesced, consecutive threads on consecutive elements). Without the declaration the
kernel assumes 16-byte vectors: a bare lowered program refuses odd rows at launch, naming
the declaration (a ``Build`` specializes itself instead:
``test_alignment_specialization.py``).
Masked (ragged-edge) 1- and 2-byte loads and stores run in the emulator and compile with
NVRTC."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.errors import HexlayoutError
from hexlayout.lang import bf16, f16, f32, s8, u8
from hexlayout.runtime import build, emulate
from hexlayout.synth.solve import synthesize

T, I, R, C = hl.dims("T I R C")
ARCHS = ["sm_80", "sm_90a"]


@hl.kernel(threads=128)
def silu_and_mul(x: f16[T, 2 * I].aligned(2), out: f16[T, I].aligned(2), *, BT: int = 4, BI: int = 256):
    t0, i0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], BT), hl.cdiv(out.shape[1], BI)))
    n = out.shape[1]
    gate = hl.register(f16, (BT, BI))
    up = hl.register(f16, (BT, BI))
    hl.copy(hl.view(x, tile=(BT, BI), origin=(t0 * BT, i0 * BI)), gate)
    hl.copy(hl.view(x, tile=(BT, BI), origin=(t0 * BT, n + i0 * BI)), up)
    y = hl.silu(hl.cast(gate, f32)) * hl.cast(up, f32)
    hl.copy(hl.cast(y, f16), hl.view(out, tile=(BT, BI), origin=(t0 * BT, i0 * BI)))


@hl.kernel(threads=128)
def silu_and_mul_assumed_aligned(x: f16[T, 2 * I], out: f16[T, I], *, BT: int = 4, BI: int = 256):
    t0, i0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], BT), hl.cdiv(out.shape[1], BI)))
    n = out.shape[1]
    gate = hl.register(f16, (BT, BI))
    up = hl.register(f16, (BT, BI))
    hl.copy(hl.view(x, tile=(BT, BI), origin=(t0 * BT, i0 * BI)), gate)
    hl.copy(hl.view(x, tile=(BT, BI), origin=(t0 * BT, n + i0 * BI)), up)
    y = hl.silu(hl.cast(gate, f32)) * hl.cast(up, f32)
    hl.copy(hl.cast(y, f16), hl.view(out, tile=(BT, BI), origin=(t0 * BT, i0 * BI)))


def _reference(x: np.ndarray) -> np.ndarray:
    xd = x.astype(np.float64)
    n = x.shape[1] // 2
    return xd[:, :n] / (1.0 + np.exp(-xd[:, :n])) * xd[:, n:]


@pytest.mark.parametrize("arch", ARCHS)
def test_silu_and_mul_over_odd_rows_matches_float64(arch: str) -> None:
    syn = synthesize(silu_and_mul.trace(), arch)
    chosen = [ins for _, ins in syn.lowered.choices]
    assert chosen == ["ld.global.b16", "ld.global.b16", "st.global.b16"], chosen
    rng = np.random.default_rng(3)
    for t, i in ((5, 301), (3, 77)):            # odd I: ragged in both modes
        x = (2 * rng.standard_normal((t, 2 * i))).astype(np.float16)
        out = np.full((t, i), np.nan, np.float16)
        report = emulate(syn.lowered, x, out)
        err = np.abs(out.astype(np.float64) - _reference(x)) / (1 + np.abs(_reference(x)))
        assert err.max() < 2e-3
        assert report.totals["bank_conflicts"] == 0
        # consecutive threads on consecutive elements: within 2x of the ideal sector count
        assert report.totals["gmem_sectors"] <= 2 * report.totals["gmem_ideal_sectors"]


def test_odd_rows_without_the_declaration_are_refused_at_launch_naming_it() -> None:
    syn = synthesize(silu_and_mul_assumed_aligned.trace(), "sm_80")
    assert "ld.global.b128" in [ins for _, ins in syn.lowered.choices]
    x = np.zeros((5, 2 * 301), np.float16)
    out = np.zeros((5, 301), np.float16)
    with pytest.raises(HexlayoutError, match=r"aligned\(2\)") as e:
        emulate(syn.lowered, x, out)
    assert "x" in str(e.value) or "out" in str(e.value)
    # even rows of 8 elements keep 16-byte vectors and run
    x = np.ones((5, 2 * 304), np.float16)
    out = np.zeros((5, 304), np.float16)
    emulate(syn.lowered, x, out)
    assert np.allclose(out, 1.0 / (1.0 + np.exp(-1.0)), rtol=2e-3)


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_silu_and_mul_compiles_without_spills(arch: str) -> None:
    b = build(silu_and_mul, arch)
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0


def _ragged_scale(dt):
    @hl.kernel(threads=64)
    def ragged_scale(x: dt[R, C].aligned(dt.bits // 8), y: dt[R, C].aligned(dt.bits // 8)):
        r0, c0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 8), hl.cdiv(x.shape[1], 32)))
        t = hl.register(dt, (8, 32))
        hl.copy(hl.view(x, tile=(8, 32), origin=(r0 * 8, c0 * 32)), t)
        hl.copy(t, hl.view(y, tile=(8, 32), origin=(r0 * 8, c0 * 32)))

    return ragged_scale


NARROW = [(u8, np.uint8), (s8, np.int8), (f16, np.float16), (bf16, ml_dtypes.bfloat16)]


@pytest.mark.parametrize(("dt", "npt"), NARROW, ids=[d.name for d, _ in NARROW])
def test_masked_one_and_two_byte_copies_over_ragged_odd_rows(dt, npt) -> None:
    k = _ragged_scale(dt)
    syn = synthesize(k.trace(), "sm_80")
    assert [ins for _, ins in syn.lowered.choices] == [f"ld.global.b{dt.bits}", f"st.global.b{dt.bits}"]
    rng = np.random.default_rng(5)
    x = rng.integers(-100, 100, (13, 37)).astype(npt)
    y = np.zeros_like(x)
    emulate(syn.lowered, x, y)
    assert np.array_equal(y.view(np.uint8), x.view(np.uint8))


@pytest.mark.nvrtc
@pytest.mark.parametrize(("dt", "npt"), NARROW, ids=[d.name for d, _ in NARROW])
def test_masked_one_and_two_byte_copies_compile(dt, npt) -> None:
    b = build(_ragged_scale(dt), "sm_80")
    assert b.compiled.resources.spill_stores == 0
    ctype = {8: "unsigned char", 16: "unsigned short"}[dt.bits]
    # a predicated (ragged-edge) load of one element, zero where out of bounds
    assert f"? *reinterpret_cast<const {ctype}*>(x + " in b.generated.source


@hl.kernel(threads=128)
def static_odd_rows(x: f16[5, 602], out: f16[5, 301], *, BT: int = 4, BI: int = 256):
    t0, i0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], BT), hl.cdiv(out.shape[1], BI)))
    gate, up = hl.register(f16, (BT, BI)), hl.register(f16, (BT, BI))
    hl.copy(hl.view(x, tile=(BT, BI), origin=(t0 * BT, i0 * BI)), gate)
    hl.copy(hl.view(x, tile=(BT, BI), origin=(t0 * BT, out.shape[1] + i0 * BI)), up)
    hl.copy(hl.cast(hl.silu(hl.cast(gate, f32)) * hl.cast(up, f32), f16),
            hl.view(out, tile=(BT, BI), origin=(t0 * BT, i0 * BI)))


def test_static_odd_rows_get_the_widest_vectors_their_offsets_allow() -> None:
    """Static shapes need no declaration: rows of 602 f16 (1204 bytes) allow 4-byte vectors,
    the second half (origin column 301) and rows of 301 only 2-byte ones (this used to pick
    4-byte loads at an odd origin: a misaligned access)."""
    syn = synthesize(static_odd_rows.trace(), "sm_80")
    assert [ins for _, ins in syn.lowered.choices] == ["ld.global.b32", "ld.global.b16", "st.global.b16"]
    x = np.random.default_rng(4).standard_normal((5, 602)).astype(np.float16)
    out = np.zeros((5, 301), np.float16)
    emulate(syn.lowered, x, out)
    assert np.abs(out.astype(np.float64) - _reference(x)).max() < 1e-2


def _staged_copy(align: int) -> Any:
    def staged_copy(x, y):
        s = hl.shared(f16, (32, 64))
        hl.copy(hl.view(x, tile=(32, 64)), s)
        hl.commit_group()
        hl.wait_group(0)
        hl.syncthreads()
        r = hl.register(f16, (32, 64))
        hl.copy(s, r)
        hl.copy(r, hl.view(y, tile=(32, 64)))

    staged_copy.__annotations__ = {"x": f16[R, C].aligned(align), "y": f16[R, C].aligned(align)}
    return hl.kernel(threads=128, name=f"staged_copy_{align}")(staged_copy)


@pytest.mark.parametrize(("align", "cols", "first"), [(16, 64, "cp.async.cg.16"), (4, 62, "cp.async.ca.4"),
                                                      (2, 61, "ld.global.b16+st.shared.b16")])
def test_global_to_shared_copies_follow_the_declared_alignment(align: int, cols: int, first: str) -> None:
    syn = synthesize(_staged_copy(align).trace(), "sm_80")
    chosen = [ins for _, ins in syn.lowered.choices]
    assert chosen[0] == first, chosen
    x = np.random.default_rng(align).standard_normal((30, cols)).astype(np.float16)
    y = np.zeros_like(x)
    emulate(syn.lowered, x, y)
    assert np.array_equal(x[:, :64], y[:, :64])


@hl.kernel(threads=128)
def up_half_only(x: f16[T, 2 * I], out: f16[T, I].aligned(2), *, BT: int = 4, BI: int = 256):
    """out[t, i] = x[t, I + i]: only the origin of x's view involves I."""
    t0, i0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], BT), hl.cdiv(out.shape[1], BI)))
    up = hl.register(f16, (BT, BI))
    hl.copy(hl.view(x, tile=(BT, BI), origin=(t0 * BT, out.shape[1] + i0 * BI)), up)
    hl.copy(up, hl.view(out, tile=(BT, BI), origin=(t0 * BT, i0 * BI)))


def test_a_size_in_a_view_origin_is_checked_at_launch() -> None:
    """x keeps 16-byte vectors, which need its origin column I to be a multiple of 8: the
    launcher checks that (it used to run into a misaligned access) and names I."""
    syn = synthesize(up_half_only.trace(), "sm_80")
    assert [ins for _, ins in syn.lowered.choices][0] == "ld.global.b128"
    x = np.zeros((3, 2 * 300), np.float16)       # rows of 600: strides and extents allow 8-vectors
    with pytest.raises(HexlayoutError, match=r"size I is 300 .*multiple of 8"):
        emulate(syn.lowered, x, np.zeros((3, 300), np.float16))
    x = np.random.default_rng(6).standard_normal((3, 2 * 304)).astype(np.float16)
    out = np.zeros((3, 304), np.float16)
    emulate(syn.lowered, x, out)
    assert np.array_equal(out, x[:, 304:])
