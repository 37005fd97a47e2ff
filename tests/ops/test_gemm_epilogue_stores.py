"""GEMM kernels that stage their epilogue through shared memory (issue 10 item 3).

``stage_epilogue=True``, which ``hexlayout.ops.gemm`` chooses whenever rows of ``c`` are
16-byte aligned (``N % 8 == 0``; else the registers' 4-byte stores). Read from the SASS by
``hexlayout.runtime.stats``
(``epilogue_stores``: the stores after the main loop): on sm_90a ``stmatrix`` then TMA
stores (STSM + UTMASTG), on sm_80 32-bit shared stores then 16-byte shared loads and
global stores (STG.128; stmatrix is an sm_90 instruction, PTX ISA), for every shipped
config (both B layouts, with a fused epilogue through the host path's build), without spills;
the values against float64 in the emulator, and the host path's choice by N.
"""

from __future__ import annotations

import numpy as np
import pytest
from hexlayout.ops.gemm.config import CONFIGS
from hexlayout.ops.gemm.kernels import gemm_sm80_kernel, gemm_sm90_kernel

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.runtime.build import build
from hexlayout.synth.solve import synthesize

KERNELS = {"sm_80": gemm_sm80_kernel, "sm_90a": gemm_sm90_kernel}


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch,cfg", [(a, c) for a in ("sm_80", "sm_90a") for c in CONFIGS[a]],
                         ids=lambda x: str(x))
def test_staged_epilogue_store_widths(arch: str, cfg) -> None:
    b = build(KERNELS[arch](hl.bf16, "nk", stage_epilogue=True), arch, **cfg.consts(4096, 4096))
    res, stores = b.compiled.resources, b.stats.epilogue_stores
    assert res.spill_stores == 0 and res.spill_loads == 0, (str(cfg), res)
    if arch == "sm_90a":
        # stmatrix .x4 writes 16 bytes per thread: a consumer thread's BM*BN / (128*CONSUMERS)
        # 2-byte outputs in 16-byte pieces; the TMA stores by one thread
        assert set(stores) == {"STSM", "UTMASTG"}, (str(cfg), stores)
        assert stores["STSM"] == cfg.BM * cfg.BN * 2 // (16 * 128 * cfg.CONSUMERS), (str(cfg), stores)
    else:
        # BM*BN 2-byte outputs in 16-byte global stores over 32*WARPS threads
        assert set(stores) == {"STG.128"}, (str(cfg), stores)
        assert stores["STG.128"] == cfg.BM * cfg.BN * 2 // (16 * 32 * cfg.WARPS), (str(cfg), stores)
        assert b.compiled.sass_counts().get("STS", 0) > 0


@pytest.mark.parametrize("arch,cfg", [("sm_80", CONFIGS["sm_80"][0]), ("sm_90a", CONFIGS["sm_90a"][0]),
                                      ("sm_90a", CONFIGS["sm_90a"][4])], ids=lambda x: str(x))
def test_staged_epilogue_matches_float64(arch: str, cfg) -> None:
    consts = cfg.consts(200, 264)
    if "GRID" in consts:
        consts["GRID"] = 2          # persistent: a block walks several tiles (sc reused)
    syn = synthesize(KERNELS[arch](hl.f16, "nk", stage_epilogue=True).trace(**consts), arch)
    rng = np.random.default_rng(11)
    m, n, k = 200, 264, 96
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    want = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.all(np.isfinite(c)) and (np.abs(c - want) / (np.abs(want) + 1)).max() < 1e-2


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_fused_epilogue_math_in_registers_then_staged(arch: str) -> None:
    """``hexlayout.fusion`` fuses bias + ReLU into the staged store: the math on the f32
    accumulator in registers, then the same staged stores (the last two choices)."""
    from hexlayout.ops.gemm.op import gemm_epilogue

    from hexlayout.fusion.mechanism import InputSpec, TilePlan, fuse

    nodes, outputs, raw = gemm_epilogue(True, False, "relu", False)
    inputs = tuple(InputSpec("tensor", "f16", x[1]) for x in raw)
    plan = TilePlan("c", ((0, "a"), (1, "b")), (), nodes, outputs, ("f16",), inputs)
    cfg = CONFIGS[arch][1]
    consts = {**cfg.consts(200, 256), **({"GRID": 0} if arch == "sm_90a" else {})}
    prog = fuse(KERNELS[arch](hl.f16, "nk", stage_epilogue=True).trace(**consts), plan, "bias_relu")
    assert [p.name for p in prog.kernel.params] == ["a", "b", "in0", "out0"]
    syn = synthesize(prog.kernel, arch)
    chosen = [i for _, i in syn.lowered.choices]
    staged = ["SM90_U32x4_STSM_N", "SM90_TMA_STORE"] if arch == "sm_90a" else \
        ["st.shared.b32", "ld.shared.b128+st.global.b128"]
    assert chosen[-2:] == staged, chosen
    rng = np.random.default_rng(12)
    m, n, k = 200, 256, 64
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    bias = rng.standard_normal((1, n)).astype(np.float16)
    out = np.full((m, n), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": a, "b": b, "in0": bias, "out0": out})
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64).T + bias.astype(np.float64), 0)
    assert np.all(np.isfinite(out)) and (np.abs(out - want) / (np.abs(want) + 1)).max() < 1e-2


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch,cfg", [(a, c) for a in ("sm_80", "sm_90a") for c in CONFIGS[a]],
                         ids=lambda x: str(x))
def test_host_path_builds_stage_a_fused_epilogue_without_spills(arch: str, cfg) -> None:
    """The builds ``hexlayout.ops.gemm`` launches for N % 8 == 0: a K x N B with bias + ReLU
    fused (64x64x64 on sm_80 spilled 8 B with 64-column windows)."""
    from hexlayout.ops.gemm.op import gemm_build

    b = gemm_build(hl.bf16, "kn", (True, False, "relu", False), arch, cfg, 4096, 4096)
    res, stores = b.compiled.resources, b.stats.epilogue_stores
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, (str(cfg), res)
    assert set(stores) == ({"STSM", "UTMASTG"} if arch == "sm_90a" else {"STG.128"}), (str(cfg), stores)


@pytest.mark.nvrtc
def test_host_path_stages_only_16_byte_aligned_rows() -> None:
    from hexlayout.ops.gemm.op import gemm_build, stage_epilogue

    assert [n for n in range(2, 34, 2) if stage_epilogue(n)] == [8, 16, 24, 32]
    cfg = CONFIGS["sm_80"][0]
    staged = gemm_build(hl.f16, "nk", (False, False, "none", False), "sm_80", cfg, 256, 264)
    plain = gemm_build(hl.f16, "nk", (False, False, "none", False), "sm_80", cfg, 256, 262)
    assert set(staged.stats.epilogue_stores) == {"STG.128"}
    assert "STG.128" not in plain.stats.epilogue_stores and plain.stats.epilogue_stores


@pytest.mark.parametrize("n", [264, 262])
def test_host_path_gemm_with_and_without_staging_matches_float64(n: int, monkeypatch) -> None:
    """``hexlayout.ops.gemm`` on CPU tensors (the emulator runs the same build's program):
    N = 264 staged, N = 262 stored from registers; bias + residual + ReLU + scale fused."""
    import torch
    from hexlayout.ops.gemm.op import gemm

    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv("HEXLAYOUT_EMULATE_ARCH", raising=False)
    g = torch.Generator().manual_seed(n)
    m, k = 70, 64
    a = torch.randn(m, k, generator=g).half()
    b = torch.randn(n, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    res = torch.randn(m, n, generator=g).half()
    c = gemm(a, b, bias, res, "relu", 0.5)
    want = torch.relu(0.5 * (a.double() @ b.double().T) + bias.double()) + res.double()
    assert c.shape == (m, n) and torch.isfinite(c).all()
    assert ((c.double() - want).abs() / (want.abs() + 1)).max() < 1e-2
