"""Data movement beyond plain tiles, synthesized, emulated and compiled: gathered rows (the MoE
pattern ``y[r] = x[ids[r]] @ w^T``, rows of ``x`` read through an index tensor), copies masked
by a condition, and register tiles rearranged between layouts."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.lang import f16, f32, i32
from hexlayout.runtime import build
from hexlayout.synth.solve import synthesize

T, R, N, K = hl.dims("T R N K")


@hl.kernel(threads=128)
def gather_gemm(x: f16[T, K], ids: i32[R], w: f16[N, K], y: f16[R, N], *, BM: int = 64, BN: int = 64,
                BK: int = 32):
    rows_n = ids.shape[0]
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(rows_n, BM), hl.cdiv(w.shape[0], BN)))
    m0, n0 = pid_m * BM, pid_n * BN
    rows = hl.view(ids, tile=(BM,), origin=(m0,))
    sa = hl.shared(f16, (BM, BK))
    sb = hl.shared(f16, (BN, BK))
    acc = hl.zeros((BM, BN), f32)
    for k in hl.range(hl.cdiv(x.shape[1], BK)):
        hl.copy(hl.view(x, tile=(BM, BK), origin=(None, k * BK), rows=rows, valid_rows=rows_n - m0), sa)
        hl.copy(hl.view(w, tile=(BN, BK), origin=(n0, k * BK)), sb)
        hl.commit_group()
        hl.wait_group(0)
        hl.syncthreads()
        ra = hl.register(f16, (BM, BK))
        rb = hl.register(f16, (BN, BK))
        hl.copy(sa, ra)
        hl.copy(sb, rb)
        hl.mma(ra, rb, acc)
        hl.syncthreads()
    hl.copy(hl.cast(acc, f16), hl.view(y, tile=(BM, BN), origin=(m0, n0)))


@pytest.mark.parametrize(("t", "r", "n", "k"), [(300, 100, 72, 64), (50, 64, 64, 40)])
def test_gathered_rows_match_numpy(t: int, r: int, n: int, k: int) -> None:
    syn = synthesize(gather_gemm.trace(), "sm_80")
    chosen = {ins for _, ins in syn.lowered.choices}
    assert "cp.async.cg.16" in chosen
    rng = np.random.default_rng(t + r)
    x = rng.standard_normal((t, k)).astype(np.float16)
    w = rng.standard_normal((n, k)).astype(np.float16)
    ids = rng.integers(0, t, size=r).astype(np.int32)
    y = np.full((r, n), np.nan, np.float16)
    report = run(syn.lowered.kernel, {"x": x, "ids": ids, "w": w, "y": y})
    want = x[ids].astype(np.float64) @ w.astype(np.float64).T
    assert (np.abs(y - want) / (np.abs(want) + 1)).max() < 1e-2
    assert report.totals["bank_conflicts"] == 0


@pytest.mark.nvrtc
def test_gathered_rows_compile_to_index_loads_and_cp_async() -> None:
    b = build(gather_gemm, "sm_80")
    src = b.generated.source
    assert "cp.async" in src and "_rows[" in src
    counts = b.compiled.sass_counts()
    assert any(op.startswith("LDGSTS") for op in counts) and b.compiled.resources.spill_stores == 0


M2, N2 = hl.dims("M2 N2")


@hl.kernel(threads=128)
def masked_copy(x: f16[M2, N2], y: f16[M2, N2], limit: i32):
    r = hl.register(f16, (32, 64))
    hl.copy(hl.view(x, tile=(32, 64), origin=(0, 0)), r)
    hl.copy(r, hl.view(y, tile=(32, 64), origin=(0, 0)), mask=hl.thread_index() < limit)


def test_copy_with_a_condition_only_writes_where_it_holds() -> None:
    syn = synthesize(masked_copy.trace(), "sm_80")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((32, 64)).astype(np.float16)
    y = np.zeros((32, 64), np.float16)
    run(syn.lowered.kernel, {"x": x, "y": y, "limit": 64})
    written = y != 0                    # threads 0..63 own half of the tile, whatever the layout
    assert written.sum() == 32 * 64 // 2 and np.array_equal(y[written], x[written])


@hl.kernel(threads=128)
def transpose_in_registers(x: f16[M2, N2], y: f16[M2, N2]):
    # thread t holds row t % 64, columns 32 * (t // 64) ...
    rows = hl.register(f16, (64, 64), layout=hl.Layout(((64, 2), 32), ((1, 2048), 64)))
    hl.copy(hl.view(x, tile=(64, 64), origin=(0, 0)), rows)
    # ... and after the rearrange column t % 64, rows 32 * (t // 64) ...
    cols = hl.rearrange(rows, layout=hl.Layout(((64, 2), 32), ((64, 32), 1)))
    hl.copy(cols, hl.view(y, tile=(64, 64), origin=(0, 0)))


def test_rearrange_moves_values_between_layouts() -> None:
    syn = synthesize(transpose_in_registers.trace(), "sm_80")
    assert any("through shared memory" in ins for _, ins in syn.lowered.choices)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 64)).astype(np.float16)
    y = np.zeros_like(x)
    run(syn.lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y, x)
