"""TiledMma TV layouts agree with the atom layouts placed by the task mapping."""

from __future__ import annotations

import pytest

from hexlayout.arch import get_atom
from hexlayout.ir.mapping import repeat, spatial
from hexlayout.ir.tiled_mma import TiledMma


def _decode(idx: int, extent: int) -> tuple[int, int]:
    return idx % extent, idx // extent


CASES = [
    ("SM80_16x8x16_F32F16F16F32_TN", spatial(2, 2) * repeat(2, 4), 2),
    ("SM80_16x8x16_F32F16F16F32_TN", repeat(2, 4) * spatial(2, 2), 1),
    ("SM80_16x8x8_F16F16F16F16_TN", spatial(4, 1) * repeat(1, 2), 3),
    ("SM80_16x8x32_S32S8S8S32_TN", spatial(1, 2) * repeat(2, 2), 2),
    ("SM90_64x64x16_F32F16F16_RS", spatial(2, 1) * repeat(1, 2), 2),
]


@pytest.mark.parametrize("k_inner", [True, False])
@pytest.mark.parametrize(("atom_name", "warps", "k_tiles"), CASES, ids=lambda x: str(x))
def test_tiled_tv_layouts_match_atom_placement(atom_name: str, warps, k_tiles: int, k_inner: bool) -> None:
    atom = get_atom(atom_name)
    tm = TiledMma(atom, warps, k_tiles, k_inner)
    big_m, big_n, big_k = tm.tile_mnk
    m_a, n_a, k_a = atom.shape_mnk
    at = atom.num_threads
    c_tv, a_tv = tm.c_tv(), tm.a_tv()
    b_tv = tm.b_tv() if atom.b_source == "rmem" else None
    nt = tm.threads
    assert c_tv.size() == nt * atom.values_c * warps.tasks_per_worker
    seen_c = set()
    for inst in tm.instances():
        for w in range(warps.num_workers):
            am, an = warps.worker_tasks(w)[inst.r]
            for lane in range(at):
                t = w * at + lane
                for i in range(atom.values_c):
                    ma, na = _decode(atom.c_layout(lane + at * i), m_a)
                    want = (am * m_a + ma) + big_m * (an * n_a + na)
                    v = i + atom.values_c * inst.r
                    assert c_tv(t + nt * v) == want
                    seen_c.add(want)
                for i in range(atom.values_a):
                    ma, ka = _decode(atom.a_layout(lane + at * i), m_a)
                    want = (am * m_a + ma) + big_m * (inst.k * k_a + ka)
                    v = i + atom.values_a * tm.a_start(inst)
                    assert a_tv(t + nt * v) == want
                for i in range(atom.values_b if b_tv is not None else 0):
                    nb, kb = _decode(atom.b_layout(lane + at * i), n_a)
                    want = (an * n_a + nb) + big_n * (inst.k * k_a + kb)
                    v = i + atom.values_b * tm.b_start(inst)
                    assert b_tv(t + nt * v) == want
    assert len(seen_c) == big_m * big_n
    assert a_tv.size() // nt == atom.values_a * tm.tasks_m * k_tiles
    if b_tv is not None:
        assert b_tv.size() // nt == atom.values_b * tm.tasks_n * k_tiles


def test_tiled_mma_rejects_bad_mappings() -> None:
    atom = get_atom("SM80_16x8x16_F32F16F16F32_TN")
    with pytest.raises(ValueError, match="2-D"):
        TiledMma(atom, spatial(4), 1)
    with pytest.raises(ValueError, match="shared memory"):
        TiledMma(get_atom("SM90_64x64x16_F32F16F16_SS"), spatial(1, 1), 1).a_tv()
