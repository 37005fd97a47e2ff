"""Synthesis on sm_100a: ``hl.mma`` on shared tiles gets a tcgen05 atom, the accumulator in TMEM
and the tcgen05.ld synthesis ranks; the register layout of the accumulator follows the load."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch.dtypes import BF16, F16, F32
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.synth.umma_choice import _table, umma_refusal, umma_tilings


def test_128x256_on_two_warp_groups_reads_32x32b_rows_per_lane():
    """32x32b: lane l of warp w holds row 32*(w%4) + l, register v column v of its group's
    columns; group g (threads 128g..) holds columns [128g, 128g + 128) (one contiguous block)."""
    tu = umma_tilings(128, 256, 64, BF16, BF16, F32, 256)[0]
    assert (tu.atom.name, tu.n_atoms, tu.k_tiles, tu.ld_shape, tu.ld_num) == \
        ("SM100_128x256x16_F32BF16BF16_SS", 1, 4, "32x32b", 128)
    got = _table(tu.register_tv)
    t = np.arange(256)[:, None]
    v = np.arange(128)[None, :]
    row, col = (t // 32) % 4 * 32 + t % 32, (t // 128) * 128 + v
    assert np.array_equal(got, row + 128 * col)


def test_dealt_columns_spread_every_window_over_both_groups():
    dealt = [tu for tu in umma_tilings(128, 256, 64, F16, F16, F32, 256) if tu.chunk != 128]
    assert dealt
    tu = dealt[0]
    got = _table(tu.register_tv)
    cols = got // 128
    for g in range(2):
        mine = np.unique(cols[128 * g:128 * (g + 1)])
        assert np.array_equal(mine // tu.chunk % 2, np.full(len(mine), g))   # blocks g, g + 2, ...


def test_m64_uses_16_lane_shapes():
    tu = umma_tilings(64, 64, 32, F16, F16, F32, 128)[0]
    assert tu.atom.shape_mnk == (64, 64, 16) and tu.ld_shape.startswith("16x")


@pytest.mark.parametrize(("args", "words"), [
    ((256, 128, 64, F16, F16, F32, 128), "M = 256"),
    ((128, 1024, 64, F16, F16, F32, 128), "TMEM columns"),
    ((128, 128, 64, F16, F16, F32, 96), "whole warp groups"),
])
def test_refusals_name_the_reason(args, words):
    assert words in umma_refusal(*args)
    assert umma_tilings(*args) == []


@pytest.fixture(scope="module")
def sm90_source_on_sm100():
    from hexlayout.ops.gemm.kernels import gemm_sm90_kernel

    from hexlayout.synth.solve import synthesize

    tk = gemm_sm90_kernel(hl.f16, "nk").trace(BM=128, BN=64, BK=64, STAGES=2, CONSUMERS=1)
    return synthesize(tk, "sm_100a")


def test_sm90_kernel_source_lowers_to_tcgen05_on_sm100(sm90_source_on_sm100):
    syn = sm90_source_on_sm100
    mmas = [c for op, c in syn.lowered.choices if type(op).__name__ == "Mma"]
    assert mmas and all(c.startswith("SM100_128x64x16_F32F16F16_SS") for c in mmas), mmas
    instrs = list(L.walk_instrs(syn.lowered.kernel.body))
    kinds = {type(i).__name__ for i in instrs}
    assert not {"Wgmma", "WgmmaCommit", "WgmmaWait"} & kinds
    allocs = [i for i in instrs if isinstance(i, T.TmemAlloc)]
    assert len(allocs) == 1 and allocs[0].ncols == 64
    assert sum(isinstance(i, T.TmemDealloc) for i in instrs) == 1
    assert sum(isinstance(i, T.TmemRelinquish) for i in instrs) == 1
    issues = [i for i in instrs if isinstance(i, T.Tcgen05Mma)]
    assert len(issues) == 8                                          # 2 copies (first k-tile) x 4 k-steps
    elected = [i for i in instrs if isinstance(i, L.IfThen) and any(isinstance(x, T.Tcgen05Mma)
                                                                     for x in i.then_body)]
    assert len(elected) == 2 and all(str(i.cond) == str(elected[0].cond) for i in elected)  # one thread
    assert any(isinstance(i, T.Tcgen05Commit) for i in instrs)
    loads = [i for i in instrs if isinstance(i, T.Tcgen05Ld)]
    assert [(i.shape, i.num) for i in loads] == [("32x32b", 64)]


def test_a_register_p_keeps_the_layout_its_score_load_gives():
    """Attention's P = cast(exp(S)) is the register A of P V: its tcgen05.st candidates hold the
    layout of every S load of the fewest loads. M = 64: S read by 16x256b.x8 (the best load) is
    stored by 16x128b.x8, the third one-store candidate; the first two alone had no such layout."""
    best = umma_tilings(64, 64, 64, F16, F16, F32, 128)[0]
    assert (best.ld_shape, best.ld_num) == ("16x256b", 8)
    stores = {str(tu.a_store.register_tv): tu.a_store for tu in
              umma_tilings(64, 64, 64, F16, F16, F32, 128, a_register=True)}
    got = stores.get(str(best.register_tv))
    assert got is not None and (got.shape, got.num, got.stores) == ("16x128b", 8, 1), sorted(stores)
