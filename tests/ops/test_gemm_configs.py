"""Evidence without a GPU for every shipped GEMM config: it synthesizes, compiles to a cubin
for its architecture without spills, the SASS holds the intended instructions, and the
synthesized kernel computes the right product (with fused epilogues) in the emulator."""

from __future__ import annotations

import numpy as np
import pytest
from hexlayout.ops.gemm.config import CONFIGS, choose_config
from hexlayout.ops.gemm.kernels import gemm_sm80_kernel, gemm_sm90_kernel
from hexlayout.ops.gemm.op import _arg_order, gemm_fused

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.runtime import build

SASS = {
    "sm_80": ("HMMA.16816", "LDSM", "LDGSTS"),
    "sm_90a": ("HGMMA", "UTMALDG"),
}
FACTORY = {"sm_80": gemm_sm80_kernel, "sm_90a": gemm_sm90_kernel}
CASES = [(arch, cfg, bl) for arch in ("sm_80", "sm_90a") for cfg in CONFIGS[arch] for bl in ("nk", "kn")]


@pytest.mark.nvrtc
@pytest.mark.parametrize(("arch", "cfg", "b_layout"), CASES, ids=lambda x: str(x).replace(" ", "_"))
def test_shipped_config_compiles_without_spills(arch: str, cfg, b_layout: str) -> None:
    b = build(FACTORY[arch](hl.f16, b_layout), arch, **cfg.consts(4096, 4096))
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0, res
    assert 0 < res.registers <= 255
    counts = b.compiled.sass_counts()
    for prefix in SASS[arch]:
        assert any(op.startswith(prefix) for op in counts), (prefix, sorted(counts))


def _reference(a, b, b_layout, bias, res, act, scale):
    y = a.astype(np.float64) @ (b.astype(np.float64).T if b_layout == "nk" else b.astype(np.float64))
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias.astype(np.float64)
    if act == "relu":
        y = np.maximum(y, 0)
    elif act == "gelu":
        y = 0.5 * y * (1 + np.tanh(0.7978845608028654 * (y + 0.044715 * y ** 3)))
    elif act == "silu":
        y = y / (1 + np.exp(-y))
    if res is not None:
        y = y + res.astype(np.float64)
    return y


EMULATED = [
    ("sm_80", CONFIGS["sm_80"][0], "nk", (False, False, "none", False), hl.f16, (200, 136, 72)),
    ("sm_80", CONFIGS["sm_80"][1], "kn", (True, True, "gelu", True), hl.bf16, (130, 152, 136)),
    ("sm_80", CONFIGS["sm_80"][5], "nk", (True, False, "relu", False), hl.f16, (9, 100, 64)),
    ("sm_80", CONFIGS["sm_80"][3], "kn", (False, True, "silu", True), hl.bf16, (64, 136, 40)),
    ("sm_90a", CONFIGS["sm_90a"][0], "nk", (True, True, "gelu", True), hl.f16, (200, 300, 136)),
    ("sm_90a", CONFIGS["sm_90a"][2], "kn", (False, False, "none", False), hl.bf16, (64, 200, 200)),
    # the big tiles: 64x256 per consumer warp group; two 64x128 wgmma rows per consumer
    ("sm_90a", CONFIGS["sm_90a"][4], "nk", (True, False, "relu", False), hl.bf16, (136, 264, 328)),
    ("sm_90a", CONFIGS["sm_90a"][5], "kn", (False, True, "none", True), hl.f16, (264, 136, 200)),
]


@pytest.mark.parametrize(("arch", "cfg", "b_layout", "ep", "dtype", "shape"), EMULATED,
                         ids=lambda x: str(x).replace(" ", "_"))
def test_emulated_gemm_with_epilogue_matches_float64(arch, cfg, b_layout, ep, dtype, shape) -> None:
    m, n, k = shape
    # the epilogue is fused into the anchor's store by hexlayout.fusion (issue 13)
    bld, prog = gemm_fused(dtype, b_layout, ep, arch, cfg, m, n, compile=False)
    rng = np.random.default_rng(m * n + k)
    npdt = dtype.numpy()
    a = rng.standard_normal((m, k)).astype(npdt)
    b = rng.standard_normal((n, k) if b_layout == "nk" else (k, n)).astype(npdt)
    bias = rng.standard_normal(n).astype(npdt)
    res = rng.standard_normal((m, n)).astype(npdt)
    c = np.full((m, n), np.nan, npdt)
    by_role = {"a": a, "b": b, "c": c, "bias": bias.reshape(1, n), "residual": res, "scale": 0.5}
    roles = ["a", "b", "c", "bias", "residual", "scale"]
    names = [p.name for p in bld.tile_kernel.params]
    run(bld.lowered, {name: by_role[roles[i]] for name, i in zip(names, _arg_order(prog, ep))})
    has_bias, has_res, act, has_scale = ep
    want = _reference(a, b, b_layout, bias if has_bias else None, res if has_res else None, act,
                      0.5 if has_scale else None)
    err = np.abs(c.astype(np.float64) - want) / (np.abs(want) + 1)
    assert err.max() < 1e-2


def test_heuristic_picks_small_tiles_for_decode_and_persistent_for_large() -> None:
    assert choose_config("sm_80", 1, 4096, 4096).BM == 16
    assert choose_config("sm_80", 4096, 4096, 4096).BM == 128
    big = choose_config("sm_90a", 8192, 8192, 8192)
    assert big.persistent and big.consts(8192, 8192)["GRID"] == 132
    assert not choose_config("sm_90a", 128, 256, 4096).persistent
    with pytest.raises(ValueError, match="unsupported architecture"):
        choose_config("sm_70", 1, 1, 1)
