"""TV layouts of derived tiles (``hexlayout.layout.tv_maps``), checked element by element
against numpy: each derived layout sends thread t's value v to the element of the derived
tile that the source layout's (t, v) element becomes."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.layout import Layout
from hexlayout.layout.tv import copy_thread_layout
from hexlayout.layout.tv_maps import (
    colex_strides,
    join_source_tv,
    join_tv,
    permute_maps,
    permuted_tv,
    reduced_tv,
    reshape_maps,
    same_function,
    window_tv,
)

# the accumulator layout of an m16n8 mma (32 threads x 4 values over a 16 x 8 tile)
ACC = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))


def _table(tv: Layout) -> np.ndarray:
    """``[t, v] -> colex index``."""
    threads = tv[0].size()
    return tv.indices().reshape(-1, threads).T


def test_colex_strides() -> None:
    assert colex_strides((4, 3, 5)) == [1, 4, 12]


def test_same_function_compares_maps_not_spellings() -> None:
    assert same_function(Layout((2, 4), (1, 2)), Layout(8, 1))
    assert not same_function(Layout((2, 4), (4, 1)), Layout(8, 1))


def test_reduced_tv_keeps_one_value_per_output_element() -> None:
    red = reduced_tv(ACC, (16, 8), axis=1)
    src = _table(ACC)
    rows = np.unravel_index(src, (16, 8), order="F")[0]        # the row each value is in
    got = _table(red)
    for t in range(32):
        assert set(got[t]) == set(rows[t])                        # a thread keeps its rows


@pytest.mark.parametrize("shape,perm", [((16, 8), (1, 0)), ((2, 4, 8), (2, 0, 1))])
def test_permuted_tv_is_the_transposed_element(shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
    tv = copy_thread_layout(shape, list(range(len(shape))), 1, 16)
    fwd, bwd = permute_maps(shape, perm)
    view = permuted_tv(tv, fwd)
    x = np.arange(int(np.prod(shape))).reshape(shape, order="F")
    y = np.transpose(x, perm)
    src, dst = _table(tv), _table(view)
    assert (x.ravel(order="F")[src] == y.ravel(order="F")[dst]).all()
    assert same_function(permuted_tv(view, bwd), tv)


def test_window_tv_keeps_the_values_in_their_threads() -> None:
    win = window_tv(ACC, 32, (16, 8), (0, 0), (8, 8))        # the top half of the accumulator
    src = _table(ACC)
    r, c = np.unravel_index(src, (16, 8), order="F")
    want = [sorted(int(rr + 8 * cc) for rr, cc in zip(r[t], c[t]) if rr < 8) for t in range(32)]
    assert [sorted(row) for row in _table(win)] == want


def test_window_tv_refuses_uneven_windows() -> None:
    with pytest.raises(ValueError, match="must give every thread"):
        window_tv(ACC, 32, (16, 8), (0, 4), (16, 4))         # columns 4..7: 8 of the 32 threads


def test_reshape_maps_follow_a_row_major_reshape() -> None:
    fwd, bwd = reshape_maps((4, 6), (2, 12))
    x = np.arange(24).reshape(4, 6)
    y = x.reshape(2, 12)
    for i in range(24):
        c = np.unravel_index(i, (4, 6), order="F")
        j = fwd(i)
        assert y.ravel(order="F")[j] == x[c]
        assert bwd(j) == i
    with pytest.raises(ValueError, match="cannot reshape"):
        reshape_maps((4, 6), (5, 5))


@pytest.mark.parametrize("interleave", [False, True])
def test_join_source_tv_inverts_join_tv(interleave: bool) -> None:
    f = copy_thread_layout((8, 4), [0, 1], 2, 8)
    r = join_tv(f, (8, 4), 2, 0, interleave)
    assert same_function(join_source_tv(r, (8, 4), 2, 0, interleave), f)
    # thread t's value v + V j (v j + ... interleaved) is source j's value v, moved to its rows
    src, res = _table(f), _table(r)
    sr, sc = np.unravel_index(src, (8, 4), order="F")
    for j in range(2):
        n = src.shape[1]
        cols = np.arange(j, 2 * n, 2) if interleave else np.arange(j * n, (j + 1) * n)
        rr, rc = np.unravel_index(res[:, cols], (16, 4), order="F")
        assert (rc == sc).all() and (rr == (2 * sr + j if interleave else sr + 8 * j)).all()
