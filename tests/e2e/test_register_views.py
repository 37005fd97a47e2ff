"""Register views and regroupings: ``x.T`` is the same registers under the mapped layout
``P o tv`` (no data moves; synthesis propagates it both ways); static windows, reshape,
concat and interleave are new tiles whose values stay in their threads. In the language,
synthesis, lowering, the emulator and the compiled code; windows that would move values
between threads are refused with the line."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.errors import HexlayoutError
from hexlayout.lang import f16, f32
from hexlayout.layout.tv_maps import permute_maps
from hexlayout.runtime import build
from hexlayout.synth.solve import synthesize

M, N, K, P, Q = hl.dims("M N K P Q")


def test_permute_maps_are_inverse_bijections() -> None:
    shape, perm = (4, 6, 5), (2, 0, 1)
    fwd, bwd = permute_maps(shape, perm)
    x = np.arange(120).reshape(shape, order="F")          # colex: element value = its colex index
    y = np.transpose(x, perm)
    for c in np.ndindex(*shape):                          # P maps x's colex index to y's
        c_y = tuple(c[p] for p in perm)
        assert y.flatten(order="F")[fwd(int(x[c]))] == x[c]
        assert bwd(int(np.ravel_multi_index(c_y, y.shape, order="F"))) == x[c]


@hl.kernel(threads=128)
def doubled_transpose(x: f16[M, N], y: f16[N, M]):
    r = hl.register(f16, (64, 32))
    hl.copy(hl.view(x, tile=(64, 32)), r)
    hl.copy(r.T * 2.0, hl.view(y, tile=(32, 64)))


@hl.kernel(threads=128)
def gemm_b_transposed(a: f16[M, K], bt: f16[K, N], c: f32[M, N]):
    ra = hl.register(f16, (64, 32))
    rbt = hl.register(f16, (32, 64))
    hl.copy(hl.view(a, tile=(64, 32)), ra)
    hl.copy(hl.view(bt, tile=(32, 64)), rbt)
    acc = hl.zeros((64, 64), f32)
    hl.mma(ra, rbt.T, acc)            # the (K, N) tile seen as the (N, K) operand b
    hl.copy(acc, hl.view(c, tile=(64, 64)))


def test_transpose_of_a_register_tile_moves_no_data() -> None:
    syn = synthesize(doubled_transpose.trace(), "sm_80")
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float16)
    y = np.zeros((32, 64), np.float16)
    run(syn.lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y, x.T * np.float16(2))
    # r is loaded with 16-byte vectors; its view is stored as it lies (per-element stores)
    assert [i for _, i in syn.lowered.choices] == ["ld.global.b128", "st.global.b16"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_mma_operand_seen_through_a_transpose(arch: str) -> None:
    """The mma gives rbt.T the b-operand layout; rbt's layout is derived backwards (P^-1 o b)."""
    syn = synthesize(gemm_b_transposed.trace(), arch)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 32)).astype(np.float16)
    bt = rng.standard_normal((32, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    run(syn.lowered.kernel, {"a": a, "bt": bt, "c": c})
    np.testing.assert_allclose(c, a.astype(np.float64) @ bt.astype(np.float64), rtol=1e-5, atol=1e-4)


@pytest.mark.nvrtc
def test_register_transpose_compiles_without_spills() -> None:
    b = build(gemm_b_transposed, "sm_80")
    assert b.compiled.resources.spill_stores == 0
    assert b.compiled.sass_counts().get("HMMA.16816.F32", 0) > 0


@hl.kernel(threads=128)
def top_half(x: f16[M, N], y: f16[P, Q]):
    r = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64)), r)
    hl.copy(r[:32, :] * 2.0, hl.view(y, tile=(32, 64)))


@hl.kernel(threads=128)
def right_columns_of_an_accumulator(a: f16[M, K], b: f16[N, K], c: f32[P, Q]):
    ra = hl.register(f16, (64, 32))
    rb = hl.register(f16, (64, 32))
    hl.copy(hl.view(a, tile=(64, 32)), ra)
    hl.copy(hl.view(b, tile=(64, 32)), rb)
    acc = hl.zeros((64, 64), f32)
    hl.mma(ra, rb, acc)
    hl.copy(acc.tile((64, 32), (0, 32)), hl.view(c, tile=(64, 32)))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_static_windows_of_register_tiles(arch: str) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 64)).astype(np.float16)
    y = np.zeros((32, 64), np.float16)
    run(synthesize(top_half.trace(), arch).lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y, x[:32] * np.float16(2))
    # the mma's warps are arranged so that every thread holds part of the right half
    syn = synthesize(right_columns_of_an_accumulator.trace(), arch)
    a = rng.standard_normal((64, 32)).astype(np.float16)
    b = rng.standard_normal((64, 32)).astype(np.float16)
    c = np.zeros((64, 32), np.float32)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    want = (a.astype(np.float64) @ b.astype(np.float64).T)[:, 32:]
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-4)


@hl.kernel(threads=128)
def one_column(x: f16[M, N], y: f16[P]):
    r = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64)), r)
    hl.copy(r[:, 5], hl.view(y, tile=(64,)))


@hl.kernel(threads=128)
def moving_window(x: f16[M, N], y: f16[M, N]):
    r = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64)), r)
    for k in hl.range(2):
        hl.copy(r.tile((32, 64), (k * 32, 0)), hl.view(y, tile=(32, 64)))


@pytest.mark.parametrize(("kern", "words"), [
    (one_column, "must give every thread as many"),              # values would leave their threads
    (moving_window, "views of register tiles are not supported with run-time indices"),
])
def test_windows_that_move_values_are_refused_with_the_line(kern, words: str) -> None:
    with pytest.raises(HexlayoutError) as e:
        synthesize(kern.trace(), "sm_80")
    msg = str(e.value)
    assert kern.name in msg and "test_register_views.py" in msg and words in msg


# --- reshape, concat, interleave: new register tiles whose values stay in their threads ------


@hl.kernel(threads=128)
def swapped_halves(x: f16[M, N], y: f16[M, N]):
    a = hl.register(f16, (32, 64))
    b = hl.register(f16, (32, 64))
    hl.copy(hl.view(x, tile=(32, 64), origin=(0, 0)), a)
    hl.copy(hl.view(x, tile=(32, 64), origin=(32, 0)), b)
    hl.copy(hl.concat([b, a], axis=0), hl.view(y, tile=(64, 64)))


@hl.kernel(threads=128)
def woven(x: f16[M, N], y: f16[M, N]):
    a = hl.register(f16, (64, 32))
    b = hl.register(f16, (64, 32))
    hl.copy(hl.view(x, tile=(64, 32), origin=(0, 0)), a)
    hl.copy(hl.view(x, tile=(64, 32), origin=(0, 32)), b)
    hl.copy(hl.interleave([a, b], axis=1), hl.view(y, tile=(64, 64)))


@hl.kernel(threads=128)
def reshaped(x: f16[M, N], y: f16[P, Q]):
    a = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64)), a)
    hl.copy(hl.reshape(a, (32, 128)) * 2.0, hl.view(y, tile=(32, 128)))


CASES = [
    (swapped_halves, lambda x: np.concatenate([x[32:], x[:32]]), (64, 64)),
    (woven, lambda x: np.stack([x[:, :32], x[:, 32:]], axis=2).reshape(64, 64), (64, 64)),
    (reshaped, lambda x: x.reshape(32, 128) * np.float16(2), (32, 128)),
]


@pytest.mark.parametrize(("kern", "ref", "out_shape"), CASES, ids=["concat", "interleave", "reshape"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_regrouped_register_tiles_match_numpy(kern, ref, out_shape, arch: str) -> None:
    syn = synthesize(kern.trace(), arch)
    x = np.random.default_rng(7).standard_normal((64, 64)).astype(np.float16)
    y = np.full(out_shape, np.nan, np.float16)
    run(syn.lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y, ref(x))
    # the values stay in their threads and keep 16-byte runs: every global access is 128-bit
    assert all(i.endswith(".b128") for _, i in syn.lowered.choices), syn.lowered.choices


@pytest.mark.nvrtc
def test_regrouped_tiles_compile_to_plain_vector_accesses() -> None:
    b = build(woven, "sm_80")
    counts = b.compiled.sass_counts()
    assert b.compiled.resources.spill_stores == 0
    assert counts.get("STG.E.128", 0) > 0 and any(k.startswith("LDG.E.128") for k in counts)
    assert not any(k.startswith(("HADD2", "F2F")) for k in counts), counts    # moves, no conversions


@hl.kernel(threads=128)
def bad_reshape():
    hl.reshape(hl.zeros((64, 64), f32), (64, 63))


@hl.kernel(threads=128)
def bad_concat():
    hl.concat([hl.zeros((64, 64), f32), hl.zeros((32, 64), f32)])


@pytest.mark.parametrize(("kern", "words"), [(bad_reshape, "cannot reshape"),
                                             (bad_concat, "differs from tiles[0]")])
def test_invalid_regroupings_name_the_kernel_op_and_line(kern, words: str) -> None:
    with pytest.raises(hl.KernelError) as e:
        kern.trace()
    msg = str(e.value)
    assert kern.name in msg and "test_register_views.py" in msg and words in msg
