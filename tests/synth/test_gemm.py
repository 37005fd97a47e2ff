"""Synthesis of layout-free GEMMs, checked by their decisions and end to end in the emulator.

sm_80: the multistage example (``hexlayout.lang.examples.gemm_sm80``) must become 16-byte
cp.async into conflict-free swizzled stages, ldmatrix and mma.sync m16n8k16 with warps
covering the tile; a bf16 copy of it and a variant whose B is given ``K x N`` (N
contiguous, read through a transposed view) must work too, the latter through
``ldmatrix.trans``. sm_90a: the warp-specialized example must become TMA + wgmma on
128-byte-swizzled stages. Every synthesized kernel runs in the emulator against float64
with zero bank conflicts, ragged sizes included. Synthesis is deterministic.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import Any

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.emulator import run
from hexlayout.ir.types import LayoutVar
from hexlayout.lang import f32
from hexlayout.lang.examples.gemm_sm80 import gemm_sm80
from hexlayout.lang.examples.gemm_sm90 import gemm_sm90
from hexlayout.synth.solve import Synthesis, synthesize

M, N, K = hl.dims("M N K")

SIZES = [(128, 128, 128), (200, 136, 72), (64, 256, 40)]


def make_gemm_sm80(dtype: DType, *, b_kn: bool = False) -> Any:
    """The layout-free sm_80 example for element type ``dtype``; with ``b_kn`` the kernel
    takes ``b`` as ``K x N`` (N contiguous) and copies the transposed view of each k-tile
    into the ``BN x BK`` shared stage (whose rows then run along N)."""
    dt = dtype

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"gemm_sm80_{dtype}{'_kn' if b_kn else ''}")
    def gemm(a: dt[M, K], b: dt[K, N] if b_kn else dt[N, K], c: dt[M, N], *,  # type: ignore[valid-type]
             BM: int = 128, BN: int = 128, BK: int = 32, STAGES: int = 3, WARPS: int = 4):
        M, K = a.shape
        N = b.shape[1] if b_kn else b.shape[0]
        pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(M, BM), hl.cdiv(N, BN)))
        m0, n0 = pid_m * BM, pid_n * BN
        num_k = hl.cdiv(K, BK)
        sa = hl.shared(dt, (BM, BK, STAGES))
        sb = hl.shared(dt, (BN, BK, STAGES))
        acc = hl.zeros((BM, BN), f32)

        def b_tile(k0: Any) -> Any:
            if b_kn:
                return hl.view(b, tile=(BK, BN), origin=(k0, n0)).T
            return hl.view(b, tile=(BN, BK), origin=(n0, k0))

        for s in range(STAGES - 1):
            hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, s * BK)), sa[:, :, s])
            hl.copy(b_tile(s * BK), sb[:, :, s])
            hl.commit_group()
        for k in hl.range(num_k):
            hl.wait_group(STAGES - 2)
            hl.syncthreads()
            kn = k + (STAGES - 1)
            hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, kn * BK)), sa[:, :, kn % STAGES])
            hl.copy(b_tile(kn * BK), sb[:, :, kn % STAGES])
            hl.commit_group()
            s = k % STAGES
            ra = hl.register(dt, (BM, BK))
            rb = hl.register(dt, (BN, BK))
            hl.copy(sa[:, :, s], ra)
            hl.copy(sb[:, :, s], rb)
            hl.mma(ra, rb, acc)
        hl.wait_group(0)
        hl.copy(hl.cast(acc, dt), hl.view(c, tile=(BM, BN), origin=(m0, n0)))

    return gemm


@cache
def _synth(name: str, arch: str, **params: Any) -> Synthesis:
    """One synthesis per (kernel, arch, parameters) for the whole module."""
    kernels = {"sm80": gemm_sm80, "sm90": gemm_sm90,
               "sm80_bf16": make_gemm_sm80(hl.bf16), "sm80_kn": make_gemm_sm80(hl.f16, b_kn=True)}
    return synthesize(kernels[name].trace(**params), arch)


def _choices(s: Synthesis) -> list[str]:
    """Instruction chosen for each copy op, in program order."""
    return [ins for op, ins in s.lowered.choices if type(op).__name__ == "Copy"]


def _shared(s: Synthesis) -> dict[str, str]:
    return {d.subject: d.chosen for d in s.decisions if d.subject.startswith("shared")}


def _emulate(s: Synthesis, dtype: DType, m: int, n: int, k: int, *, b_kn: bool = False) -> Any:
    """Run the synthesized kernel on random data; assert it matches float64 and is conflict-free."""
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    npdt = dtype.numpy()
    a = rng.standard_normal((m, k)).astype(npdt)
    b = rng.standard_normal((k, n) if b_kn else (n, k)).astype(npdt)
    c = np.full((m, n), np.nan, dtype=npdt)
    report = run(s.lowered.kernel, {"a": a, "b": b, "c": c})
    bt = b.astype(np.float64) if b_kn else b.astype(np.float64).T
    ref = a.astype(np.float64) @ bt
    err = np.abs(c.astype(np.float64) - ref) / (np.abs(ref) + 1.0)
    assert err.max() <= 1e-2, f"max relative error {err.max()}"
    assert report.totals["bank_conflicts"] == 0
    assert all(site.bank_conflicts == 0 for site in report.sites)
    return report


def _walk(body: list[Any]) -> Any:
    for ins in body:
        yield ins
        for attr in ("body", "then_body", "else_body"):
            yield from _walk(getattr(ins, attr, []) or [])


def _instr_counts(s: Synthesis) -> Counter[str]:
    return Counter(type(i).__name__ for i in _walk(s.lowered.kernel.body))


# --- sm_80 ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("bk", "swizzle"), [(32, "Sw<2,3,3>"), (64, "Sw<3,3,3>")])
def test_sm80_decisions(bk: int, swizzle: str) -> None:
    s = _synth("sm80", "sm_80", BK=bk)
    chosen = _choices(s)
    g2s = [ins for ins in chosen if ins.startswith("cp.async")]
    assert g2s == ["cp.async.cg.16"] * 6          # a and b: two prologue stages and the main loop
    assert sorted(ins for ins in chosen if "LDSM" in ins) == ["SM75_U32x4_LDSM_N"] * 2
    for subject, lay in _shared(s).items():
        assert lay.startswith(f"{swizzle} o 0 o (128,{bk},3):({bk},1,"), (subject, lay)
        assert "conflict-free" in lay
    (tm,) = s.mma.values()
    assert tm.atom.name == "SM80_16x8x16_F32F16F16F32_TN"
    assert tm.tile_mnk == (128, 128, bk)
    assert tm.warps.num_workers == 4                       # WARPS=4: every warp has a share
    assert s.cost.bank_conflicts == 0


@pytest.mark.parametrize(("m", "n", "k"), SIZES)
def test_sm80_f16_matches_float64(m: int, n: int, k: int) -> None:
    report = _emulate(_synth("sm80", "sm_80"), hl.f16, m, n, k)
    assert any(site.kind == "Ldmatrix" for site in report.sites)


@pytest.mark.parametrize(("m", "n", "k"), SIZES)
def test_sm80_bf16_matches_float64(m: int, n: int, k: int) -> None:
    s = _synth("sm80_bf16", "sm_80")
    (tm,) = s.mma.values()
    assert tm.atom.name == "SM80_16x8x16_F32BF16BF16F32_TN"
    assert set(ins for ins in _choices(s) if ins.startswith("cp.async")) == {"cp.async.cg.16"}
    _emulate(s, hl.bf16, m, n, k)


def test_sm80_bk64_matches_float64() -> None:
    _emulate(_synth("sm80", "sm_80", BK=64), hl.f16, 200, 136, 136)


def test_sm80_b_given_k_by_n_uses_ldmatrix_trans() -> None:
    s = _synth("sm80_kn", "sm_80")
    lds = sorted(ins for ins in _choices(s) if "LDSM" in ins)
    assert lds == ["SM75_U16x8_LDSM_T", "SM75_U32x4_LDSM_N"]
    assert set(ins for ins in _choices(s) if ins.startswith("cp.async")) == {"cp.async.cg.16"}
    sb = _shared(s)["shared %sb"]
    assert "rows along mode 0" in sb and "conflict-free" in sb      # rows run along N


@pytest.mark.parametrize(("m", "n", "k"), [(128, 128, 128), (200, 136, 72)])
def test_sm80_b_given_k_by_n_matches_float64(m: int, n: int, k: int) -> None:
    _emulate(_synth("sm80_kn", "sm_80"), hl.f16, m, n, k, b_kn=True)


# --- sm_90a --------------------------------------------------------------------------------

def test_sm90_decisions() -> None:
    s = _synth("sm90", "sm_90a")
    chosen = _choices(s)
    assert sorted(ins for ins in chosen if ins != "st.global.b32") == ["SM90_TMA_LOAD"] * 2
    (tm,) = s.mma.values()
    assert tm.atom.kind == "wgmma" and tm.atom.name.startswith("SM90_64x")
    assert tm.tile_mnk == (128, 256, 64)
    for subject, lay in _shared(s).items():
        assert lay.startswith("Sw<3,3,3> o 0 o"), (subject, lay)
        assert "128-byte swizzle" in lay
    kinds = _instr_counts(s)
    assert kinds["TmaLoad"] and kinds["Wgmma"] and kinds["MbarWait"]


@pytest.mark.parametrize(("m", "n", "k"), [(128, 256, 128), (200, 136, 72)])
def test_sm90_matches_float64(m: int, n: int, k: int) -> None:
    _emulate(_synth("sm90", "sm_90a"), hl.f16, m, n, k)


# --- determinism ---------------------------------------------------------------------------

def _fingerprint(s: Synthesis) -> tuple[Any, ...]:
    # views of shared roots keep their (numbered) layout variables: the root decides them
    layouts = [(v.name, "view" if isinstance(lay, LayoutVar) else str(lay)) for v, lay in s.layouts()]
    decisions = [(d.subject, d.chosen, [(a.what, a.status) for a in d.alternatives]) for d in s.decisions]
    return layouts, decisions, sorted(_instr_counts(s).items()), s.cost.as_dict()


@pytest.mark.parametrize(("kernel", "arch"), [(gemm_sm80, "sm_80"), (gemm_sm90, "sm_90a")],
                         ids=["sm80", "sm90"])
def test_same_program_same_answer(kernel: Any, arch: str) -> None:
    # a fresh Kernel per synthesis: .trace() is memoized per Kernel object
    first = _fingerprint(synthesize(hl.kernel(kernel.fn, threads=kernel.threads).trace(), arch))
    second = _fingerprint(synthesize(hl.kernel(kernel.fn, threads=kernel.threads).trace(), arch))
    assert first == second
