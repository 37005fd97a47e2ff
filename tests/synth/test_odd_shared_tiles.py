"""Shared tiles whose rows are not a power of two long (64 x 96, 48 x 80, 96 x 40 ...).

Synthesis gives them a shared layout (a swizzle whose period divides the tile, else padded
or plain rows) and thread layouts for their copies (threads spread over rows of, e.g., 12
16-byte vectors when 128 threads cannot take the vectors in order); the kernels run in the
emulator equal to numpy on random data and compile with NVRTC. Tiles that 128 threads
cannot share evenly are refused with a SynthesisError naming the tile and its lines.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.emulator import run
from hexlayout.lang import f16, f32
from hexlayout.lang.examples.gemm_sm80 import gemm_sm80
from hexlayout.layout import ComposedLayout
from hexlayout.layout.tv import copy_thread_layout
from hexlayout.synth.solve import Synthesis, SynthesisError, synthesize
from hexlayout.synth.swizzle import conflict_free_swizzles

M, N = hl.dims("M N")
ODD = [(64, 96), (48, 80), (96, 40), (40, 96)]
NP = {f16: np.float16, f32: np.float32}


def _g2s2x(R: int, C: int, dt: DType, via_registers: bool) -> Any:
    """global -> shared (cp.async) -> registers -> global, or shared -> global directly."""
    @hl.kernel(threads=128, name=f"g2s_{R}x{C}_{dt}_{'reg' if via_registers else 'direct'}")
    def kernel(a: dt[M, N], c: dt[M, N]):  # type: ignore[valid-type]
        M, N = a.shape
        pm, pn = hl.grid(hl.spatial(hl.cdiv(M, R), hl.cdiv(N, C)))
        s = hl.shared(dt, (R, C))
        hl.copy(hl.view(a, tile=(R, C), origin=(pm * R, pn * C)), s)
        hl.commit_group()
        hl.wait_group(0)
        hl.syncthreads()
        if via_registers:
            r = hl.register(dt, (R, C))
            hl.copy(s, r)
            hl.copy(r, hl.view(c, tile=(R, C), origin=(pm * R, pn * C)))
        else:
            hl.copy(s, hl.view(c, tile=(R, C), origin=(pm * R, pn * C)))
    return kernel


def _r2s(R: int, C: int, dt: DType) -> Any:
    """global -> registers -> shared -> global."""
    @hl.kernel(threads=128, name=f"r2s_{R}x{C}_{dt}")
    def kernel(a: dt[M, N], c: dt[M, N]):  # type: ignore[valid-type]
        M, N = a.shape
        pm, pn = hl.grid(hl.spatial(hl.cdiv(M, R), hl.cdiv(N, C)))
        r = hl.register(dt, (R, C))
        hl.copy(hl.view(a, tile=(R, C), origin=(pm * R, pn * C)), r)
        s = hl.shared(dt, (R, C))
        hl.copy(r, s)
        hl.syncthreads()
        hl.copy(s, hl.view(c, tile=(R, C), origin=(pm * R, pn * C)))
    return kernel


def _transpose(R: int, C: int, dt: DType) -> Any:
    """c = a^T through a shared R x C tile, stored through a transposed view of c."""
    @hl.kernel(threads=128, name=f"transpose_{R}x{C}_{dt}")
    def kernel(a: dt[M, N], c: dt[N, M]):  # type: ignore[valid-type]
        M, N = a.shape
        pm, pn = hl.grid(hl.spatial(hl.cdiv(M, R), hl.cdiv(N, C)))
        s = hl.shared(dt, (R, C))
        hl.copy(hl.view(a, tile=(R, C), origin=(pm * R, pn * C)), s)
        hl.commit_group()
        hl.wait_group(0)
        hl.syncthreads()
        hl.copy(s, hl.view(c, tile=(C, R), origin=(pn * C, pm * R)).T)
    return kernel


@cache
def _synth(kind: str, R: int, C: int, dt: DType) -> Synthesis:
    make = {"reg": lambda: _g2s2x(R, C, dt, True), "direct": lambda: _g2s2x(R, C, dt, False),
            "r2s": lambda: _r2s(R, C, dt), "transpose": lambda: _transpose(R, C, dt)}[kind]
    return synthesize(make().trace(), "sm_80")


def _shared_layout(s: Synthesis) -> Any:
    (d,) = [d for d in s.decisions if d.subject.startswith("shared")]
    return d.chosen


def _check_shared_layout(s: Synthesis, R: int, C: int) -> None:
    """The chosen layout maps the R x C tile one-to-one onto offsets [0, R*C), and a swizzle's
    period 2^(B+M+S) divides R*C (computed here from the printed Sw<B,M,S>)."""
    (root,) = [op.result for op in s.kernel.body.walk()
               if getattr(op, "result", None) is not None and op.result.type.scope.value == "shared"]
    lay = root.type.layout
    offs = np.sort(np.asarray(lay.indices()).reshape(-1))
    assert np.array_equal(offs, np.arange(R * C)), lay
    if isinstance(lay, ComposedLayout):
        b, m, sh = (int(x) for x in re.match(r"Sw<(\d+),(\d+),(\d+)>", str(lay)).groups())
        assert (R * C) % (1 << (b + m + sh)) == 0, lay


@pytest.mark.parametrize("kind", ["reg", "direct", "r2s"])
@pytest.mark.parametrize("R, C", ODD)
@pytest.mark.parametrize("dt", [f16, f32], ids=["f16", "f32"])
def test_copies_through_odd_shared_tiles_match_numpy(kind: str, R: int, C: int, dt: DType) -> None:
    s = _synth(kind, R, C, dt)
    _check_shared_layout(s, R, C)
    rng = np.random.default_rng(R * 1000 + C)
    # ragged in both dimensions (rows stay 16-byte aligned: N a multiple of 8)
    a = rng.standard_normal((2 * R + 3, 2 * C + 8)).astype(NP[dt])
    c = np.zeros_like(a)
    report = run(s.lowered.kernel, {"a": a, "c": c})
    np.testing.assert_array_equal(c, a)
    assert report.totals["bank_conflicts"] == 0


@pytest.mark.parametrize("R, C", ODD[:3])
@pytest.mark.parametrize("dt", [f16, f32], ids=["f16", "f32"])
def test_transpose_through_odd_shared_tiles_matches_numpy(R: int, C: int, dt: DType) -> None:
    s = _synth("transpose", R, C, dt)
    _check_shared_layout(s, R, C)
    a = np.random.default_rng(7).standard_normal((2 * R + 8, 2 * C + 8)).astype(NP[dt])
    c = np.zeros(a.T.shape, NP[dt])
    run(s.lowered.kernel, {"a": a, "c": c})
    np.testing.assert_array_equal(c, a.T)


def test_odd_tiles_get_conflict_free_swizzles_and_16_byte_copies() -> None:
    """64 x 96 f16: 192-byte rows are swizzled (Sw<2,3,3>, period 256 | 6144) and read with
    16-byte cp.async; the rows of 12 vectors are spread over 4 threads each."""
    s = _synth("reg", 64, 96, f16)
    assert _shared_layout(s).startswith("Sw<")
    copies = [d.chosen for d in s.decisions if d.subject.startswith("copy")]
    assert copies[0] == "cp.async.cg.16" and copies[1] == "ld.shared.b128"


# --- the pieces -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, order, w", [((64, 96), [1, 0], 8), ((48, 80), [1, 0], 2),
                                             ((96, 40), [0, 1], 2), ((32, 96), [1, 0], 8),
                                             ((64, 96), [0, 1], 8), ((96, 64), [1, 0], 8)])
def test_copy_thread_layout_covers_each_element_once_in_vectors(shape: tuple[int, int], order: list[int],
                                                                w: int) -> None:
    threads = 128
    tv = copy_thread_layout(shape, order, w, threads)
    assert not isinstance(tv, str), tv
    table = np.asarray(tv.indices()).reshape(-1, threads).T          # [thread, value]
    assert np.array_equal(np.sort(table.reshape(-1)), np.arange(shape[0] * shape[1]))
    # each run of w values is w consecutive elements along the contiguous mode order[0]
    colex = (1, shape[0])
    vecs = table.reshape(threads, -1, w)
    assert np.all(np.diff(vecs, axis=2) == colex[order[0]])
    assert np.all((vecs[:, :, 0] // colex[order[0]]) % shape[order[0]] % w == 0)


def test_copy_thread_layout_refuses_uneven_shares_with_a_reason() -> None:
    assert "do not divide evenly" in copy_thread_layout((24, 48), [1, 0], 8, 128)


@pytest.mark.parametrize("row_bytes, rows", [(160, 48), (192, 64), (80, 96), (144, 24), (128, 64)])
def test_swizzle_periods_divide_the_tile(row_bytes: int, rows: int) -> None:
    elems = row_bytes * rows // 2
    sws = conflict_free_swizzles(row_bytes, rows, 16)
    for sw in sws:
        if sw.bits:
            assert elems % (1 << (sw.bits + sw.base + sw.shift)) == 0, sw
            # a bijection of the tile's own offsets
            assert np.array_equal(np.sort(sw(np.arange(elems))), np.arange(elems))
    if row_bytes == 160:   # 3840 elements: periods 128 and 256 fit, 512 (Sw<3,3,3>) does not
        assert all(sw.bits + sw.base + sw.shift <= 8 for sw in sws)


# --- GEMM stages with BK = 48, BK = 24, BN = 96 -------------------------------------------------

@pytest.mark.parametrize("consts", [dict(BK=48), dict(BM=64, BN=96, BK=48), dict(BM=64, BN=64, BK=24)],
                         ids=["BK48", "BN96_BK48", "BK24"])
def test_gemm_with_odd_k_tiles_matches_float64(consts: dict[str, int]) -> None:
    s = synthesize(gemm_sm80.trace(**consts), "sm_80")
    rng = np.random.default_rng(3)
    m, n, k = 100, 136, 120                 # ragged against every tile
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.zeros((m, n), np.float16)
    report = run(s.lowered.kernel, {"a": a, "b": b, "c": c})
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    err = np.abs(c.astype(np.float64) - ref) / (np.abs(ref) + 1.0)
    assert err.max() <= 1e-2
    assert report.totals["bank_conflicts"] == 0
    for d in s.decisions:
        if d.subject.startswith("shared"):
            assert d.chosen.startswith("Sw<"), d.chosen


@pytest.mark.nvrtc
@pytest.mark.parametrize("what", ["copy64x96", "copy48x80", "gemm_BK48"])
def test_odd_tiles_compile_for_sm80(what: str) -> None:
    from hexlayout.codegen import generate
    from hexlayout.runtime import compile_generated

    s = (synthesize(gemm_sm80.trace(BM=64, BN=96, BK=48), "sm_80") if what == "gemm_BK48"
         else _synth("reg", *(64, 96) if what == "copy64x96" else (48, 80), f16))
    ck = compile_generated(generate(s.lowered.kernel), cache=False)
    assert ck.resources is not None and ck.resources.registers > 0, ck.log
    assert not ck.resources.spills


# --- what cannot be done is refused clearly -----------------------------------------------------

def test_a_tile_threads_cannot_share_is_refused_naming_tile_and_lines() -> None:
    """24 x 72 f16 = 1728 elements: no vector width spreads evenly over 128 threads."""
    with pytest.raises(SynthesisError) as err:
        _synth("reg", 24, 72, f16)
    msg = str(err.value)
    assert "24x72" in msg and "test_odd_shared_tiles.py" in msg
    assert "hl.shared" in msg and "copy at" in msg
    assert "spreads evenly over the 128 threads" in msg and "1728 vectors do not divide evenly" in msg


def test_gemm_without_an_mma_arrangement_is_refused_naming_the_mma() -> None:
    with pytest.raises(SynthesisError, match=r"mma at gemm_sm80\.py:\d+.*48x80x16"):
        synthesize(gemm_sm80.trace(BM=48, BN=80, BK=16), "sm_80")
