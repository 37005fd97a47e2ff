"""Copy lowering: emitted per-thread instructions, run through small models of the PTX
instructions, deliver exactly the tile elements the layouts promise."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch import get_atom
from hexlayout.ir.expr import Var, evaluate
from hexlayout.ir.lower.copy import lower_gmem_to_smem, lower_ldmatrix, lower_reg_mem, lower_stmatrix
from hexlayout.ir.lower.views import GlobalTileView, RegisterTile, SharedTileView
from hexlayout.ir.lowered import CpAsync, LdGlobal, Ldmatrix, RegArray, SmemBuffer, Stmatrix
from hexlayout.ir.mapping import repeat, spatial
from hexlayout.ir.tile import GlobalParam
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.ir.types import f16
from hexlayout.layout import Layout, Swizzle, composition

TID = Var("threadIdx.x", 0, 128, "tid")


def _addr(e, tid: np.ndarray, env=None) -> np.ndarray:
    return np.broadcast_to(np.asarray(evaluate(e, {TID: tid, **(env or {})})), tid.shape)


def _run_ldmatrix(instrs, smem: np.ndarray, threads: int, values: int) -> np.ndarray:
    """Model of ldmatrix.m8n8.x{num}[.trans].b16: registers [t, v] for every thread."""
    tid = np.arange(threads)
    regs = np.full((threads, values), -1, dtype=np.int64)
    for ins in instrs:
        assert isinstance(ins, Ldmatrix)
        rows = _addr(ins.src.offset, tid)
        start = int(evaluate(ins.dst.start, {}))
        for w in range(threads // 32):
            lanes = np.arange(32)
            for j in range(ins.num):
                mat = np.array([smem[rows[32 * w + 8 * j + r] + np.arange(8)] for r in range(8)])
                for lane in lanes:
                    for h in range(2):
                        if ins.trans:
                            val = mat[2 * (lane % 4) + h, lane // 4]
                        else:
                            val = mat[lane // 4, 2 * (lane % 4) + h]
                        regs[32 * w + lane, start + 2 * j + h] = val
    return regs


def _tv_table(tv: Layout, threads: int) -> np.ndarray:
    return tv.indices().reshape(-1, threads).T


def _smem_view(shape, layout) -> tuple[SharedTileView, np.ndarray]:
    buf = SmemBuffer("s", f16, 2 * 8192)
    view = SharedTileView.of(buf, f16, shape, layout)
    n = 1
    for s in shape:
        n *= s
    smem = np.full(8192, -1, dtype=np.int64)
    offs = view.offsets(np.arange(n))
    assert len(set(offs.tolist())) == n
    smem[offs] = np.arange(n)
    return view, smem


TILED = TiledMma(get_atom("SM80_16x8x16_F32F16F16F32_TN"), spatial(2, 2) * repeat(2, 4), 2)


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("operand", ["a", "b"])
def test_ldmatrix_delivers_mma_fragments_from_k_major_smem(operand: str, swizzled: bool) -> None:
    m, n, k = TILED.tile_mnk
    rows = m if operand == "a" else n
    tv = TILED.a_tv() if operand == "a" else TILED.b_tv()
    inner = Layout((rows, k), (k, 1))                       # K-major: k contiguous
    layout = composition(Swizzle(2, 3, 3), inner) if swizzled else inner
    view, smem = _smem_view((rows, k), layout)
    values = tv.size() // 128
    reg = RegisterTile(RegArray("r", f16, values), f16, (rows, k), tv, 128)
    plan = lower_ldmatrix(reg, view, get_atom("SM75_U32x4_LDSM_N"), TID, 16)
    assert not isinstance(plan, str), plan
    assert all(i.num == 4 and not i.trans for i in plan.instrs)
    got = _run_ldmatrix(plan.instrs, smem, 128, values)
    np.testing.assert_array_equal(got, _tv_table(tv, 128))


def test_ldmatrix_trans_for_mn_major_b() -> None:
    m, n, k = TILED.tile_mnk
    tv = TILED.b_tv()
    layout = Layout((n, k), (1, n))                          # N-major: n contiguous
    view, smem = _smem_view((n, k), layout)
    values = tv.size() // 128
    reg = RegisterTile(RegArray("r", f16, values), f16, (n, k), tv, 128)
    assert isinstance(lower_ldmatrix(reg, view, get_atom("SM75_U32x4_LDSM_N"), TID, 16), str)
    plan = lower_ldmatrix(reg, view, get_atom("SM75_U16x8_LDSM_T"), TID, 16)
    assert not isinstance(plan, str), plan
    got = _run_ldmatrix(plan.instrs, smem, 128, values)
    np.testing.assert_array_equal(got, _tv_table(tv, 128))


def test_stmatrix_writes_accumulator_fragments() -> None:
    # C fragments (f16 accumulators) stored through stmatrix into a row-major smem tile.
    tm = TiledMma(get_atom("SM80_16x8x16_F16F16F16F16_TN"), spatial(2, 2) * repeat(2, 4), 1)
    m, n, _ = tm.tile_mnk
    tv = tm.c_tv()
    view, _ = _smem_view((m, n), Layout((m, n), (n, 1)))
    values = tv.size() // 128
    reg = RegisterTile(RegArray("c", f16, values), f16, (m, n), tv, 128)
    plan = lower_stmatrix(reg, view, get_atom("SM90_U32x4_STSM_N"), TID, 16)
    assert not isinstance(plan, str), plan
    smem = np.full(8192, -1, dtype=np.int64)
    regs = _tv_table(tv, 128)
    tid = np.arange(128)
    for ins in plan.instrs:
        assert isinstance(ins, Stmatrix)
        rows = _addr(ins.dst.offset, tid)
        start = int(evaluate(ins.src.start, {}))
        for w in range(4):
            for j in range(ins.num):
                for lane in range(32):
                    for h in range(2):
                        r, c = lane // 4, 2 * (lane % 4) + h
                        smem[rows[32 * w + 8 * j + r] + c] = regs[32 * w + lane, start + 2 * j + h]
    offs = view.offsets(np.arange(m * n))
    np.testing.assert_array_equal(smem[offs], np.arange(m * n))


def test_unaligned_rows_are_rejected_with_a_reason() -> None:
    tv = TILED.a_tv()
    layout = Layout((64, 32), (36, 1))                      # rows padded by 4 elements: 8-byte aligned
    view, _ = _smem_view((64, 32), layout)
    reg = RegisterTile(RegArray("r", f16, tv.size() // 128), f16, (64, 32), tv, 128)
    reason = lower_ldmatrix(reg, view, get_atom("SM75_U32x4_LDSM_N"), TID, 16)
    assert isinstance(reason, str) and "16-byte" in reason


def _global_view(rows: int, cols: int, stride_var: Var, extent_rows, extent_cols) -> GlobalTileView:
    param = GlobalParam("a", f16, (Var("M", 1, None, "size"), stride_var), (stride_var, 1))
    origin = (Var("m0", 0, None, "index"), 0)
    return GlobalTileView(param, f16, (rows, cols), (0, 1), origin, (extent_rows, extent_cols))


def test_cp_async_covers_the_tile_coalesced_and_predicated() -> None:
    K = Var("K", 1, None, "size")
    M = Var("M", 1, None, "size")
    m0 = Var("m0", 0, None, "index")
    param = GlobalParam("a", f16, (M, K), (K, 1))
    g = GlobalTileView(param, f16, (64, 32), (0, 1), (m0, 0), (M - m0, K))
    view, _ = _smem_view((64, 32), composition(Swizzle(2, 3, 3), Layout((64, 32), (32, 1))))
    plan = lower_gmem_to_smem(g, view, TID, 128, 16)
    assert not isinstance(plan, str), plan
    assert plan.vector_elems == 8 and all(isinstance(i, CpAsync) and i.nbytes == 16 for i in plan.instrs)
    kinds = {r.kind for r in plan.requirements}
    assert {"align_bytes", "stride_multiple", "extent_multiple"} <= kinds
    env = {K: 40, M: 50, m0: 10}
    gmem = np.arange(50 * 40)
    smem = np.full(4096, -1)
    tid = np.arange(128)
    for ins in plan.instrs:
        dst = _addr(ins.dst.offset, tid, env)
        src = _addr(ins.src.offset, tid, env)
        ok = _addr(ins.pred, tid, env).astype(bool) if ins.pred is not None else np.ones(128, bool)
        for t in range(128):
            smem[dst[t]:dst[t] + 8] = gmem[src[t]:src[t] + 8] if ok[t] else 0
        # coalesced: within a warp, in-bounds source vectors are consecutive 16-byte chunks per row
        assert np.all(np.diff(src[:4]) == 8)
    offs = view.offsets(np.arange(64 * 32))
    tile = smem[offs].reshape(32, 64).T                      # [m, k]
    for m in range(64):
        for k in range(32):
            want = (10 + m) * 40 + k if (10 + m) < 50 and k < 40 else 0
            assert tile[m, k] == want


def test_register_tile_to_global_uses_widest_vector_and_predicates() -> None:
    tv = TILED.c_tv()
    K = Var("N", 1, None, "size")
    g = _global_view(64, 64, K, Var("ext_m", 0, None, "size"), 64)
    reg = RegisterTile(RegArray("c", f16, tv.size() // 128), f16, (64, 64), tv, 128)
    plan = lower_reg_mem(reg, g, True, TID, 16)
    assert not isinstance(plan, str)
    # accumulator fragments hold pairs of adjacent columns: 32-bit accesses
    assert plan.vector_elems == 2 and all(isinstance(i, LdGlobal) and i.bits == 32 for i in plan.instrs)
    assert all(i.pred is not None for i in plan.instrs)
