"""Task mappings: worker_tasks follows Hidet's definition; tv_layout agrees with it."""

from __future__ import annotations

import itertools

import pytest

from hexlayout.ir.mapping import repeat, spatial


def _colex(coord: tuple[int, ...], shape: tuple[int, ...]) -> int:
    idx, scale = 0, 1
    for c, s in zip(coord, shape):
        idx += c * scale
        scale *= s
    return idx


def test_spatial_is_row_major_over_workers() -> None:
    m = spatial(2, 3)
    assert m.num_workers == 6 and m.tasks_per_worker == 1
    assert [m.worker_tasks(w)[0] for w in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_repeat_is_row_major_over_tasks() -> None:
    assert repeat(2, 2).worker_tasks(0) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_composition_outer_task_scales_inner() -> None:
    m = spatial(2, 2) * repeat(2, 4)
    assert m.task_shape == (4, 8) and m.num_workers == 4 and m.tasks_per_worker == 8
    # worker 1 = spatial coordinate (0, 1): columns 4..7 of rows 0..1
    assert m.worker_tasks(1) == [(r, c) for r in range(2) for c in range(4, 8)]
    m2 = repeat(2, 4) * spatial(2, 2)
    # interleaved: worker 1 = (0, 1) inside each 2x2 block
    assert m2.worker_tasks(1)[:2] == [(0, 1), (0, 3)]


MAPPINGS = [
    spatial(4, 8), repeat(3, 2), spatial(2, 2) * repeat(2, 4), repeat(2, 4) * spatial(2, 2),
    spatial(2, 1) * repeat(1, 2) * spatial(4, 8), spatial(8) * repeat(4), repeat(2, 2, 2) * spatial(1, 2, 3),
]


@pytest.mark.parametrize("m", MAPPINGS, ids=str)
def test_tv_layout_matches_worker_tasks(m) -> None:
    tv = m.tv_layout()
    assert tv.size() == m.num_workers * m.tasks_per_worker
    seen = set()
    for w, i in itertools.product(range(m.num_workers), range(m.tasks_per_worker)):
        want = _colex(m.worker_tasks(w)[i], m.task_shape)
        assert tv(w + m.num_workers * i) == want
        seen.add(want)
    assert len(seen) == tv.size()


def test_bad_mappings_are_rejected() -> None:
    with pytest.raises(ValueError, match="positive"):
        spatial(0, 2)
    with pytest.raises(ValueError, match="ranks"):
        spatial(2, 2) * repeat(2)
    with pytest.raises(ValueError, match="out of range"):
        spatial(2).worker_tasks(2)


@pytest.mark.parametrize(("m", "dim"), [(m, d) for m in MAPPINGS for d in range(m.rank)], ids=str)
def test_projection_onto_one_dimension(m, dim) -> None:
    tv = m.tv_layout(dims=(dim,))
    nw = m.num_workers
    per = tv.size() // nw
    for w in range(nw):
        want = sorted({t[dim] for t in m.worker_tasks(w)})
        got = sorted(tv(w + nw * i) for i in range(per))
        assert got == want
