"""Register math end to end: a row softmax with a causal mask over an mma accumulator layout
(reduce max / sum with warp shuffles, broadcasting, exp2, iota, where), emulated."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch import get_atom
from hexlayout.emulator import run
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.lang import f32
from hexlayout.synth.solve import synthesize

ATOM = get_atom("SM80_16x8x16_F32F16F16F32_TN")
TM = TiledMma(ATOM, hl.spatial(4, 1) * hl.repeat(1, 8), 1)
#: warps split the columns: the row reductions combine two warps through shared memory
TM_SPLIT = TiledMma(ATOM, hl.spatial(2, 2) * hl.repeat(2, 4), 1)
R, C = hl.dims("R C")


@hl.kernel(threads=128)
def causal_softmax(x: f32[R, C], y: f32[R, C], *, CAUSAL: bool = True, SPLIT: bool = False):
    tm = TM_SPLIT if SPLIT else TM
    r0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 64))) * 64
    s = hl.register(f32, (64, 64), layout=tm.c_tv())
    hl.copy(hl.view(x, tile=(64, 64), origin=(r0, 0)), s)
    if CAUSAL:
        rows = hl.iota((64, 64), 0, layout=tm.c_tv()) + r0
        cols = hl.iota((64, 64), 1, layout=tm.c_tv())
        s = hl.where(cols <= rows, s, -1e30)
    m = hl.max_reduce(s, 1)
    p = hl.exp2((s - m) * 1.4426950408889634)
    denom = hl.sum(p, 1)
    hl.copy(p / denom, hl.view(y, tile=(64, 64), origin=(r0, 0)))


@pytest.mark.parametrize("split", [False, True], ids=["warps_along_rows", "warps_split_columns"])
@pytest.mark.parametrize("causal", [True, False])
def test_row_softmax_matches_numpy(causal: bool, split: bool) -> None:
    prog = synthesize(causal_softmax.trace(CAUSAL=causal, SPLIT=split), "sm_80").lowered
    rng = np.random.default_rng(5)
    x = (3 * rng.standard_normal((128, 64))).astype(np.float32)
    y = np.full_like(x, np.nan)
    report = run(prog.kernel, {"x": x, "y": y})
    xs = x.astype(np.float64)
    if causal:
        xs = np.where(np.arange(64)[None, :] <= np.arange(128)[:, None], xs, -np.inf)
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert any(s.kind == "Shfl" for s in report.sites)
    assert any(s.kind == "StShared" for s in report.sites) == split
