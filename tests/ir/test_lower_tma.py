"""TMA lowering: box loads, run through a model of cp.async.bulk.tensor (box read with
out-of-bounds zero fill, written densely with the byte swizzle), fill the shared tile
exactly as its layout says."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch.gmma import gmma_smem_atom
from hexlayout.ir.expr import Var, evaluate
from hexlayout.ir.lower.copy import lower_tma_load
from hexlayout.ir.lower.views import GlobalTileView, SharedTileView
from hexlayout.ir.lowered import MbarRef, SmemBuffer, TmaLoad
from hexlayout.ir.tile import GlobalParam
from hexlayout.ir.types import f16
from hexlayout.layout import Layout, tile_to_shape

TID = Var("threadIdx.x", 0, 128, "tid")
M, K = Var("M", 1, None, "size"), Var("K", 1, None, "size")
M0, K0 = Var("m0", 0, None, "index"), Var("k0", 0, None, "index")


def _run_tma(plan, gmem: np.ndarray, env: dict, smem_size: int) -> np.ndarray:
    smem = np.full(smem_size, -7.0)
    rows, cols = gmem.shape
    for ins in plan.instrs:
        assert isinstance(ins, TmaLoad)
        c_in, c_out = (int(evaluate(c, env)) for c in ins.coords)
        b_in, b_out = ins.desc.box
        start = int(evaluate(ins.dst.offset, env))
        sw = {0: None, 32: 1, 64: 2, 128: 3}[ins.desc.swizzle_bytes]
        for r in range(b_out):
            for c in range(b_in):
                gr, gc = c_out + r, c_in + c
                val = gmem[gr, gc] if gr < rows and gc < cols else 0.0
                lin = c + b_in * r
                if sw is not None:                      # Swizzle<sw,3,3> on 16-bit elements
                    lin ^= (lin & (((1 << sw) - 1) << 6)) >> 3
                smem[start + lin] = val
    return smem


@pytest.mark.parametrize(("tile_k", "swizzle"), [(64, 128), (128, 128), (32, 64), (16, 32), (32, 0)])
def test_tma_box_loads_fill_the_shared_tile(tile_k: int, swizzle: int) -> None:
    param = GlobalParam("a", f16, (M, K), (K, 1))
    g = GlobalTileView(param, f16, (64, tile_k), (0, 1), (M0, K0), (M - M0, K - K0))
    if swizzle:
        lay = tile_to_shape(gmma_smem_atom(16, "K", swizzle), (64, tile_k))
    else:
        lay = Layout((64, tile_k), (tile_k, 1))
    view = SharedTileView.of(SmemBuffer("sa", f16, 2 * 64 * tile_k), f16, (64, tile_k), lay)
    res = lower_tma_load(g, view, MbarRef("full", 0, 1), TID.eq(0), 16, "tma_a")
    assert not isinstance(res, str), res
    plan, desc = res
    assert desc.swizzle_bytes == swizzle and desc.dims == (1, 0)
    rng = np.random.default_rng(1)
    gmem = rng.standard_normal((100, 200))
    env = {M: 100, K: 200, M0: 64, K0: 200 - tile_k // 2, TID: 0}
    smem = _run_tma(plan, gmem, env, 64 * tile_k)
    offs = view.offsets(np.arange(64 * tile_k))
    tile = smem[offs].reshape(tile_k, 64).T
    want = np.zeros((64, tile_k))
    rows = gmem[64:, 200 - tile_k // 2:]
    want[:rows.shape[0], :rows.shape[1]] = rows
    np.testing.assert_array_equal(tile, want)


def test_tma_rejects_a_layout_it_does_not_write() -> None:
    param = GlobalParam("a", f16, (M, K), (K, 1))
    g = GlobalTileView(param, f16, (64, 64), (0, 1), (M0, K0), (M - M0, K - K0))
    view = SharedTileView.of(SmemBuffer("sa", f16, 2 * 64 * 72), f16, (64, 64), Layout((64, 64), (72, 1)))
    reason = lower_tma_load(g, view, MbarRef("full"), TID.eq(0), 16, "tma_a")
    assert isinstance(reason, str) and "not the layout TMA writes" in reason
