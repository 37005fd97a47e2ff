"""Staging through shared memory with the ordinary ``hl.copy``: register -> shared -> register
and register -> shared -> global, a transpose through shared memory (kernel (d) of the
serving-language issue) and a GEMM whose epilogue goes through shared memory (kernel (e)),
synthesized for sm_80 and sm_90a, run in the emulator on ragged random data against a
float64 reference, and compiled with NVRTC (no spills; the SASS has the intended stores)."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.errors import HexlayoutError
from hexlayout.lang import f16, f32
from hexlayout.runtime import build
from hexlayout.synth.solve import synthesize

M, N, K = hl.dims("M N K")
ARCHS = ["sm_80", "sm_90a"]


def _choices(syn) -> list[str]:
    return [ins for _, ins in syn.lowered.choices]


@hl.kernel(threads=128)
def scaled_through_shared(x: f16[M, N], y: f16[M, N]):
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 64), hl.cdiv(x.shape[1], 64)))
    r = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64), origin=(pid_m * 64, pid_n * 64)), r)
    s = hl.shared(f16, (64, 64))
    hl.copy(r + r, s)                  # an elementwise result goes to shared memory
    hl.syncthreads()
    hl.copy(s, hl.view(y, tile=(64, 64), origin=(pid_m * 64, pid_n * 64)))


@hl.kernel(threads=128)
def round_trip(x: f16[M, N], y: f16[M, N]):
    r = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64)), r)
    s = hl.shared(f16, (64, 64))
    hl.copy(r, s)
    hl.syncthreads()
    back = hl.register(f16, (64, 64))
    hl.copy(s, back)
    hl.copy(back * 3.0, hl.view(y, tile=(64, 64)))


@pytest.mark.parametrize("arch", ARCHS)
def test_register_to_shared_to_global(arch: str) -> None:
    """Was 'used before it is defined' (the value copied to shared memory was computed by an
    op the shared-layout check did not lower)."""
    syn = synthesize(scaled_through_shared.trace(), arch)
    chosen = _choices(syn)
    assert chosen[-1] == ("SM90_TMA_STORE" if arch == "sm_90a" else "ld.shared.b128+st.global.b128"), chosen
    rng = np.random.default_rng(1)
    x = rng.standard_normal((100, 88)).astype(np.float16)     # rows 16-byte aligned, ragged tiles
    y = np.full_like(x, np.nan)
    report = run(syn.lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y, x + x)
    assert report.totals["bank_conflicts"] == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_register_to_shared_to_register(arch: str) -> None:
    syn = synthesize(round_trip.trace(), arch)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 64)).astype(np.float16)
    y = np.zeros_like(x)
    report = run(syn.lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y, (x.astype(np.float64) * 3).astype(np.float16))
    assert report.totals["bank_conflicts"] == 0


# --- kernel (d): a transpose through shared memory, written without layouts ------------------
@hl.kernel(threads=128)
def transpose(x: f16[M, N], y: f16[N, M], *, T: int = 64):
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(x.shape[0], T), hl.cdiv(x.shape[1], T)))
    rows = hl.register(f16, (T, T))
    hl.copy(hl.view(x, tile=(T, T), origin=(pid_m * T, pid_n * T)), rows)
    s = hl.shared(f16, (T, T))
    hl.copy(rows, s)                   # write rows ...
    hl.syncthreads()
    cols = hl.register(f16, (T, T))
    hl.copy(s.T, cols)                 # ... read columns
    hl.copy(cols, hl.view(y, tile=(T, T), origin=(pid_n * T, pid_m * T)))


@pytest.mark.parametrize("arch", ARCHS)
def test_transpose_through_shared_memory_is_conflict_free(arch: str) -> None:
    syn = synthesize(transpose.trace(), arch)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((136, 104)).astype(np.float16)      # ragged in both modes
    y = np.full((104, 136), np.nan, np.float16)
    report = run(syn.lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y, x.T.astype(np.float64).astype(np.float16))
    assert report.totals["bank_conflicts"] == 0
    # the chosen shared layout XORs the 16-byte chunk with high row bits (the usual ldmatrix
    # swizzles leave the column reads 8-way conflicting)
    dec = next(d for d in syn.decisions if d.subject == "shared %s")
    assert "Sw<3,3,3>" not in dec.chosen and "Sw<" in dec.chosen, dec.chosen
    assert syn.cost.bank_conflicts == 0


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_transpose_compiles_without_spills(arch: str) -> None:
    b = build(transpose, arch)
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0
    assert b.stats.epilogue_stores.get("STG.128", 0) > 0


# --- kernel (e): a GEMM whose epilogue goes through shared memory -------------------------------
@hl.kernel(threads=128)
def gemm_staged_epilogue(a: f16[M, K], b: f16[N, K], c: f16[M, N], *, BM: int = 64, BN: int = 64,
                         BK: int = 64):
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(a.shape[0], BM), hl.cdiv(b.shape[0], BN)))
    m0, n0 = pid_m * BM, pid_n * BN
    sa = hl.shared(f16, (BM, BK))
    sb = hl.shared(f16, (BN, BK))
    acc = hl.zeros((BM, BN), f32)
    for k in hl.range(hl.cdiv(a.shape[1], BK)):
        hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, k * BK)), sa)
        hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, k * BK)), sb)
        hl.commit_group()
        hl.wait_group(0)
        hl.syncthreads()
        ra = hl.register(f16, (BM, BK))
        rb = hl.register(f16, (BN, BK))
        hl.copy(sa, ra)
        hl.copy(sb, rb)
        hl.mma(ra, rb, acc)
        hl.syncthreads()
    sc = hl.shared(f16, (BM, BN))
    hl.copy(hl.cast(acc, f16), sc)     # registers -> shared
    hl.syncthreads()
    hl.copy(sc, hl.view(c, tile=(BM, BN), origin=(m0, n0)))     # shared -> global


@pytest.mark.parametrize("arch", ARCHS)
def test_gemm_epilogue_through_shared_memory(arch: str) -> None:
    syn = synthesize(gemm_staged_epilogue.trace(), arch)
    chosen = _choices(syn)
    if arch == "sm_90a":
        assert chosen[-2:] == ["SM90_U32x4_STSM_N", "SM90_TMA_STORE"], chosen
    else:       # stmatrix is an sm_90 instruction: 32-bit shared stores of the fragment pairs
        assert chosen[-2:] == ["st.shared.b32", "ld.shared.b128+st.global.b128"], chosen
    rng = np.random.default_rng(4)
    m, n, k = 100, 72, 136
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    report = run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    want = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.all(np.isfinite(c))
    assert (np.abs(c - want) / (np.abs(want) + 1)).max() < 1e-2
    assert report.totals["bank_conflicts"] == 0


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_gemm_staged_epilogue_sass(arch: str) -> None:
    b = build(gemm_staged_epilogue, arch)
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0
    stores = b.stats.epilogue_stores
    if arch == "sm_90a":
        assert stores.get("STSM", 0) > 0 and stores.get("UTMASTG", 0) > 0, stores
        assert "STG.32" not in stores and "STG.128" not in stores, stores
    else:
        assert stores.get("STG.128", 0) > 0 and set(stores) == {"STG.128"}, stores
        assert b.compiled.sass_counts().get("STS", 0) > 0


# --- copies masked by a predicate tile ----------------------------------------------------------
@hl.kernel(threads=128)
def keep_lower_triangle(x: f16[M, N], y: f16[M, N]):
    pid = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 64)))
    r = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64), origin=(pid * 64, 0)), r)
    keep = hl.iota((64, 64), 0) >= hl.iota((64, 64), 1)
    hl.copy(r, hl.view(y, tile=(64, 64), origin=(pid * 64, 0)), mask=keep)


@hl.kernel(threads=128)
def load_upper_triangle(x: f16[M, N], y: f16[M, N]):
    r = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64)), r, mask=hl.iota((64, 64), 0) <= hl.iota((64, 64), 1))
    hl.copy(r, hl.view(y, tile=(64, 64)))


def test_store_masked_by_a_predicate_tile() -> None:
    syn = synthesize(keep_lower_triangle.trace(), "sm_80")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((100, 64)).astype(np.float16)
    y = np.full_like(x, 7.0)
    run(syn.lowered.kernel, {"x": x, "y": y})
    i, j = np.indices(x.shape)
    np.testing.assert_array_equal(y, np.where(i % 64 >= j, x, np.float16(7.0)))


def test_load_masked_by_a_predicate_tile_reads_zeros() -> None:
    syn = synthesize(load_upper_triangle.trace(), "sm_80")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 64)).astype(np.float16)
    y = np.full_like(x, np.nan)
    run(syn.lowered.kernel, {"x": x, "y": y})
    i, j = np.indices(x.shape)
    np.testing.assert_array_equal(y, np.where(i <= j, x, np.float16(0)))


@pytest.mark.nvrtc
def test_masked_store_compiles() -> None:
    b = build(keep_lower_triangle, "sm_80")
    assert b.compiled.resources.spill_stores == 0
    assert "_keep" in b.generated.source or "[" in b.generated.source


@hl.kernel(threads=128)
def masked_shared_read(x: f16[M, N], y: f16[M, N]):
    s = hl.shared(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64)), s)
    hl.syncthreads()
    r = hl.register(f16, (64, 64))
    hl.copy(s, r, mask=hl.iota((64, 64), 0) < 3)
    hl.copy(r, hl.view(y, tile=(64, 64)))


def test_masked_shared_to_register_copy_is_refused_with_the_line() -> None:
    with pytest.raises(HexlayoutError) as e:
        synthesize(masked_shared_read.trace(), "sm_80")
    msg = str(e.value)
    assert "masked_shared_read" in msg and "copy" in msg and "test_staging.py" in msg
    assert "stale" in msg


def test_tma_store_without_the_proxy_fence_is_an_async_hazard() -> None:
    """The emulator checks the fence.proxy.async the TMA store needs: drop it and the store
    reads bytes an ordinary store wrote without fencing them."""
    from hexlayout.emulator.errors import AsyncHazardError
    from hexlayout.ir.lowered import FenceProxyAsync, TmaStore

    syn = synthesize(scaled_through_shared.trace(), "sm_90a")
    body = syn.lowered.kernel.body
    kinds = [type(i) for i in body]
    assert FenceProxyAsync in kinds and kinds.index(FenceProxyAsync) < kinds.index(TmaStore)
    x = np.random.default_rng(8).standard_normal((64, 64)).astype(np.float16)
    run(syn.lowered.kernel, {"x": x, "y": np.zeros_like(x)})        # with the fence: fine
    syn.lowered.kernel.body = [i for i in body if not isinstance(i, FenceProxyAsync)]
    with pytest.raises(AsyncHazardError, match="without a fence.proxy.async"):
        run(syn.lowered.kernel, {"x": x, "y": np.zeros_like(x)})


# --- kernel (e) on sm_90a as it is written there: warp-specialized wgmma, epilogue by TMA store ---
CONSUMERS = 2

@hl.kernel(threads=128 * (1 + CONSUMERS))
def gemm_ws_staged(a: f16[M, K], b: f16[N, K], c: f16[M, N], *, BM: int = 128, BN: int = 128,
                   BK: int = 64, STAGES: int = 3):
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(a.shape[0], BM), hl.cdiv(b.shape[0], BN)))
    m0, n0 = pid_m * BM, pid_n * BN
    num_k = hl.cdiv(a.shape[1], BK)
    sa = hl.shared(f16, (BM, BK, STAGES), layout=hl.auto(swizzle="128B"))
    sb = hl.shared(f16, (BN, BK, STAGES), layout=hl.auto(swizzle="128B"))
    sc = hl.shared(f16, (BM, BN))
    full = hl.mbarrier(STAGES)
    empty = hl.mbarrier(STAGES)
    for s in range(STAGES):
        hl.mbarrier_init(full, s, arrivals=1)
        hl.mbarrier_init(empty, s, arrivals=CONSUMERS)
    hl.syncthreads()
    stage_bytes = sa[:, :, 0].nbytes + sb[:, :, 0].nbytes
    with hl.warp_group(0):
        hl.setmaxnreg(40, increase=False)
        for k in hl.range(num_k):
            s = k % STAGES
            hl.wait(empty, s, phase=((k // STAGES) % 2) ^ 1)
            hl.arrive(full, s, tx_bytes=stage_bytes, who="one")
            hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, k * BK)), sa[:, :, s], mbarrier=full[s])
            hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, k * BK)), sb[:, :, s], mbarrier=full[s])
    with hl.else_():
        hl.setmaxnreg(232, increase=True)
        acc = hl.zeros((BM, BN), f32)
        for k in hl.range(num_k):
            s = k % STAGES
            hl.wait(full, s, phase=(k // STAGES) % 2)
            hl.wgmma_fence()
            hl.mma(sa[:, :, s], sb[:, :, s], acc, warps=hl.spatial(CONSUMERS, 1))
            hl.wgmma_commit()
            hl.wgmma_wait(0)
            hl.arrive(empty, s, who="warpgroup")
        hl.copy(hl.cast(acc, f16), sc)
        hl.syncthreads()
        hl.copy(sc, hl.view(c, tile=(BM, BN), origin=(m0, n0)))


def test_warp_specialized_gemm_stages_its_epilogue_through_stmatrix_and_tma() -> None:
    syn = synthesize(gemm_ws_staged.trace(), "sm_90a")
    assert _choices(syn)[-2:] == ["SM90_U32x4_STSM_N", "SM90_TMA_STORE"]
    rng = np.random.default_rng(9)
    m, n, k = 200, 136, 128
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    report = run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    want = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.all(np.isfinite(c)) and (np.abs(c - want) / (np.abs(want) + 1)).max() < 1e-2
    assert report.totals["bank_conflicts"] == 0


@pytest.mark.nvrtc
def test_warp_specialized_staged_epilogue_sass() -> None:
    b = build(gemm_ws_staged, "sm_90a")
    assert b.compiled.resources.spill_stores == 0
    # wgmma kept in flight: no serialization warning
    assert not any("C7515" in w or "C7510" in w for w in b.stats.warnings), b.stats.warnings
    stores = b.stats.epilogue_stores
    assert stores.get("STSM", 0) > 0 and stores.get("UTMASTG", 0) > 0 and "STG.32" not in stores, stores


@hl.kernel(threads=128)
def unswizzled_transpose(x: f16[M, N], y: f16[N, M]):
    rows = hl.register(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64)), rows)
    s = hl.shared(f16, (64, 64), layout=hl.auto(swizzle="none"))    # no swizzle allowed
    hl.copy(rows, s)
    hl.syncthreads()
    cols = hl.register(f16, (64, 64))
    hl.copy(s.T, cols)
    hl.copy(cols, hl.view(y, tile=(64, 64)))


def test_a_conflicting_shared_layout_says_so() -> None:
    """When every allowed layout conflicts, the decision states the predicted conflicts, and
    the emulator measures the same number."""
    syn = synthesize(unswizzled_transpose.trace(), "sm_80")
    dec = next(d for d in syn.decisions if d.subject == "shared %s")
    x = np.random.default_rng(10).standard_normal((64, 64)).astype(np.float16)
    y = np.zeros_like(x)
    report = run(syn.lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y, x.T)
    measured = report.totals["bank_conflicts"]
    assert measured > 0 and f"{measured} bank conflicts predicted" in dec.chosen, (measured, dec.chosen)
