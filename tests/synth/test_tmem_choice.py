"""sm_100a: the synthesized way an accumulator leaves tensor memory (tcgen05.ld shape, repetition,
register layout), checked element by element against the TMEM layout and the ld fragments."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch.sm90 import c_layout_64xn
from hexlayout.arch.tmem import TMEM_SHAPES, accumulator_layout, tmem_copy_layout
from hexlayout.synth.tmem_choice import choose_tmem_epilogue, tmem_epilogue_candidates


def _check(e) -> None:
    """Every register of every epilogue thread holds the element the TMEM cell it loads holds."""
    rows = e.m // e.cta_group
    s = TMEM_SHAPES[e.shape]
    tv = e.register_tv.indices().reshape(-1, 128).T  # [thread, value] -> i + rows * j
    addr = np.asarray(accumulator_layout(e.m, e.n, e.cta_group).indices())
    frag = tmem_copy_layout(e.shape, e.num).indices().reshape(-1, 32).T
    per = s.regs * e.num
    for t in range(0, 128, 7):
        w, lane = t // 32, t % 32
        for v in range(0, tv.shape[1], 3):
            cell = addr[tv[t, v]]
            load, r = v // per, v % per
            lane_in, col_in = frag[lane, r] % s.lanes, frag[lane, r] // s.lanes
            assert (cell >> 16) - lane_in >= 32 * w and (cell >> 16) - lane_in < 32 * w + 32  # own quarter
            assert ((cell & 0xFFFF) - col_in) % (s.columns * e.num) == 0, (e.shape, t, v, load)
    assert sorted(tv.reshape(-1).tolist()) == list(range(rows * e.n))


def test_m128_loads_one_row_per_thread_with_32x32b():
    best = choose_tmem_epilogue(128, 64)
    assert (best.shape, best.num, best.loads, str(best.register_tv)) == ("32x32b", 64, 1, "(128,64):(1,128)")
    assert str(best.accumulator) == "(128,64):(65536,1)"
    _check(best)
    narrow = choose_tmem_epilogue(128, 256, max_regs=32)  # register budget: 8 loads of 32 columns
    assert (narrow.shape, narrow.num, narrow.loads) == ("32x32b", 32, 8)


def test_m64_gives_the_hopper_accumulator_layout():
    """M = 64 keeps rows in the first 16 lanes of each quarter: only 16-lane shapes load it, and
    16x256b puts the elements exactly where wgmma's m64nN accumulator has them."""
    cands = tmem_epilogue_candidates(64, 32)
    assert cands and all(c.shape.startswith("16x") for c in cands)
    best = cands[0]
    assert (best.shape, best.num, best.loads) == ("16x256b", 4, 1)
    assert best.register_tv == c_layout_64xn(32)
    for e in cands[:3]:
        _check(e)


@pytest.mark.parametrize(("m", "n", "group"), [(256, 64, 2), (128, 64, 2)])
def test_cta_pairs(m, n, group):
    best = choose_tmem_epilogue(m, n, group)
    assert best.shape == "32x32b" and best.loads == 1
    _check(best)


def test_no_candidate_names_the_accumulator():
    with pytest.raises(ValueError, match="no tcgen05.ld shape loads an 64 x 32 accumulator"):
        choose_tmem_epilogue(64, 32, max_regs=0)
