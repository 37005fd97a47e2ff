"""mma lowering: emitted mma.sync / wgmma issues, run through models of the instructions
(fragments placed by the atom layouts, wgmma operands read through decoded descriptors),
compute the block tile's product."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch import get_atom
from hexlayout.arch.gmma import GmmaDescriptor, gmma_desc_addresses, gmma_smem_atom
from hexlayout.ir.expr import Var, evaluate
from hexlayout.ir.lower.mma import lower_mma
from hexlayout.ir.lower.views import RegisterTile, SharedTileView
from hexlayout.ir.lowered import MmaSync, RegArray, SmemBuffer, Wgmma
from hexlayout.ir.mapping import repeat, spatial
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.ir.types import f16, f32
from hexlayout.layout import tile_to_shape

TID = Var("threadIdx.x", 0, 256, "tid")
RNG = np.random.default_rng(7)


def _regs_from_tile(tile: np.ndarray, tv, threads: int) -> np.ndarray:
    flat = tile.reshape(-1, order="F")
    return flat[tv.indices().reshape(-1, threads).T]


def _tile_from_regs(regs: np.ndarray, tv, shape, threads: int) -> np.ndarray:
    out = np.zeros(int(np.prod(shape)))
    out[tv.indices().reshape(-1, threads).T] = regs
    return out.reshape(shape, order="F")


def _atom_tile(frag: np.ndarray, layout, rows: int, cols: int) -> np.ndarray:
    """Dense rows x cols tile from per-lane fragments [lane, v] placed by an atom TV layout."""
    out = np.zeros(rows * cols)
    nt = frag.shape[0]
    out[layout.indices().reshape(-1, nt).T] = frag
    return out.reshape(rows, cols, order="F")


@pytest.mark.parametrize(("atom_name", "warps", "k_tiles"), [
    ("SM80_16x8x16_F32F16F16F32_TN", spatial(2, 2) * repeat(2, 4), 2),
    ("SM80_16x8x16_F32F16F16F32_TN", repeat(1, 2) * spatial(4, 1), 1),
    ("SM80_16x8x8_F32F16F16F32_TN", spatial(2, 2) * repeat(1, 1), 4),
])
def test_mma_sync_issues_compute_the_tile_product(atom_name: str, warps, k_tiles: int) -> None:
    atom = get_atom(atom_name)
    tm = TiledMma(atom, warps, k_tiles)
    m, n, k = tm.tile_mnk
    nt = tm.threads
    a, b = RNG.standard_normal((m, k)), RNG.standard_normal((n, k))
    tiles = {}
    for name, tv, shape in (("a", tm.a_tv(), (m, k)), ("b", tm.b_tv(), (n, k)), ("c", tm.c_tv(), (m, n))):
        tiles[name] = RegisterTile(RegArray(name, f16, tv.size() // nt), f16, shape, tv, nt)
    instrs = lower_mma(tm, tiles["a"], tiles["b"], tiles["c"], TID, 16)
    assert not isinstance(instrs, str), instrs
    assert len(instrs) == warps.tasks_per_worker * k_tiles and all(isinstance(i, MmaSync) for i in instrs)
    ra, rb = _regs_from_tile(a, tm.a_tv(), nt), _regs_from_tile(b, tm.b_tv(), nt)
    rc = np.zeros((nt, tm.c_tv().size() // nt))
    am, an, ak = atom.shape_mnk
    for ins in instrs:
        for w in range(nt // 32):
            lanes = slice(32 * w, 32 * w + 32)
            fa = ra[lanes, ins.a.start:ins.a.start + ins.a.count]
            fb = rb[lanes, ins.b.start:ins.b.start + ins.b.count]
            fc = rc[lanes, ins.c.start:ins.c.start + ins.c.count]
            d = _atom_tile(fa, atom.a_layout, am, ak) @ _atom_tile(fb, atom.b_layout, an, ak).T
            d += _atom_tile(fc, atom.c_layout, am, an)
            rc[lanes, ins.d.start:ins.d.start + ins.d.count] = d.reshape(-1, order="F")[
                atom.c_layout.indices().reshape(-1, 32).T]
    np.testing.assert_allclose(_tile_from_regs(rc, tm.c_tv(), (m, n), nt), a @ b.T, rtol=1e-12, atol=1e-12)


def test_mma_rejects_a_register_tile_with_another_layout() -> None:
    tm = TiledMma(get_atom("SM80_16x8x16_F32F16F16F32_TN"), spatial(2, 2) * repeat(2, 4), 1)
    m, n, k = tm.tile_mnk
    wrong = tm.c_tv()  # an (m, n) layout where the (n, k) B layout is expected
    tiles = [RegisterTile(RegArray(x, f16, tv.size() // 128), f16, s, tv, 128)
             for x, tv, s in (("a", tm.a_tv(), (m, k)), ("b", wrong, (n, k)), ("c", tm.c_tv(), (m, n)))]
    reason = lower_mma(tm, *tiles, TID, 16)
    assert isinstance(reason, str) and "layout of b" in reason


@pytest.mark.parametrize("swizzle", [128, 64, 32, 0])
def test_wgmma_ss_descriptors_read_the_right_subtiles(swizzle: int) -> None:
    atom = get_atom("SM90_64x64x16_F32F16F16_SS")
    tm = TiledMma(atom, spatial(2, 1) * repeat(1, 2), 4)      # 2 warp groups, 128 x 128 x 64
    m, n, k = tm.tile_mnk
    a_lay = tile_to_shape(gmma_smem_atom(16, "K", swizzle), (m, k))
    b_lay = tile_to_shape(gmma_smem_atom(16, "K", swizzle), (n, k))
    buf_a, buf_b = SmemBuffer("sa", f16, 2 * m * k), SmemBuffer("sb", f16, 2 * n * k, offset=2 * m * k)
    va, vb = SharedTileView.of(buf_a, f16, (m, k), a_lay), SharedTileView.of(buf_b, f16, (n, k), b_lay)
    c = RegisterTile(RegArray("c", f32, tm.c_tv().size() // 256), f32, (m, n), tm.c_tv(), 256)
    instrs = lower_mma(tm, va, vb, c, TID, 16)
    assert not isinstance(instrs, str), instrs
    assert all(isinstance(i, Wgmma) for i in instrs) and len(instrs) == 2 * 4
    a, b = RNG.standard_normal((m, k)), RNG.standard_normal((n, k))
    smem_a, smem_b = np.zeros(m * k), np.zeros(n * k)
    smem_a[a_lay.indices()] = a.reshape(-1, order="F")
    smem_b[b_lay.indices()] = b.reshape(-1, order="F")
    rc = np.zeros((256, tm.c_tv().size() // 256))
    for ins in instrs:
        for wg in range(2):
            sub = []
            for dsc, smem, rows in ((ins.a, smem_a, 64), (ins.b, smem_b, 64)):
                start = int(evaluate(dsc.offset, {TID: 128 * wg}))
                g = GmmaDescriptor(start * 2, dsc.lbo, dsc.sbo, {0: 0, 1: 128, 2: 64, 3: 32}[dsc.swizzle])
                sub.append(smem[gmma_desc_addresses(g, dsc.major, 16, rows, 16) // 2])
            threads = slice(128 * wg, 128 * wg + 128)
            frag = rc[threads, ins.d.start:ins.d.start + ins.d.count]
            d = _atom_tile(frag, atom.c_layout, 64, 64) + sub[0] @ sub[1].T
            rc[threads, ins.d.start:ins.d.start + ins.d.count] = d.reshape(-1, order="F")[
                atom.c_layout.indices().reshape(-1, 128).T]
    np.testing.assert_allclose(_tile_from_regs(rc, tm.c_tv(), (m, n), 256), a @ b.T, rtol=1e-12, atol=1e-12)


def test_wgmma_rejects_a_non_canonical_smem_layout() -> None:
    from hexlayout.layout import Layout

    atom = get_atom("SM90_64x64x16_F32F16F16_SS")
    tm = TiledMma(atom, spatial(1, 1), 1)
    buf = SmemBuffer("s", f16, 4096)
    bad = SharedTileView.of(buf, f16, (64, 16), Layout((64, 16), (17, 1)))   # padded rows
    good = SharedTileView.of(buf, f16, (64, 16), tile_to_shape(gmma_smem_atom(16, "K", 32), (64, 16)))
    c = RegisterTile(RegArray("c", f32, 32), f32, (64, 64), tm.c_tv(), 128)
    reason = lower_mma(tm, bad, good, c, TID, 16)
    assert isinstance(reason, str) and reason.startswith("A operand")
