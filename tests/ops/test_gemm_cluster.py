"""The sm_90a GEMM in 2-CTA clusters (issue 10, item 2): the two CTAs of a cluster take N-neighbour
tiles that share the A tile; each loads half of every A k-tile by TMA and multicasts it to both,
and a stage is refilled only after the consumers of both CTAs released it. Emulated against
float64 with fused epilogues on ragged shapes; a pipeline that does not release its stages to the
peer is rejected by the emulator; the config compiles for sm_90a with the multicast in the SASS."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hexlayout.ops.gemm.config import CONFIGS, _parse_config, choose_config
from hexlayout.ops.gemm.kernels import gemm_sm90_kernel
from hexlayout.ops.gemm.op import _arg_order, gemm_build, gemm_fused

import hexlayout.lang as hl
from hexlayout.emulator import RaceError, run
from hexlayout.runtime import build
from hexlayout.runtime.stats import SERIALIZATION_CODES

CLUSTERED = [c for c in CONFIGS["sm_90a"] if c.cluster == 2]


def _reference(a, b, b_layout, bias, act):
    y = a.astype(np.float64) @ (b.astype(np.float64).T if b_layout == "nk" else b.astype(np.float64))
    if bias is not None:
        y = y + bias.astype(np.float64)
    if act == "relu":
        y = np.maximum(y, 0)
    return y


def test_the_config_space_has_a_cluster_config() -> None:
    assert len(CLUSTERED) == 1
    cfg = CLUSTERED[0]
    assert (cfg.BM, cfg.BN, cfg.CONSUMERS, cfg.persistent) == (128, 256, 2, False)
    consts = cfg.consts(4096, 4096)
    assert consts["CLUSTER"] == 2 and consts["GRID"] == 0
    assert "CLUSTER" not in CONFIGS["sm_90a"][4].consts(4096, 4096)   # the others are unchanged
    assert str(cfg).endswith("cluster 2")
    # autotuning entries written before configs had a cluster size still load
    raw = {"arch": "sm_90a", "BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "WARPS": 4, "CONSUMERS": 2,
           "persistent": False}
    assert _parse_config(raw) == CONFIGS["sm_90a"][4]
    assert _parse_config({**raw, "cluster": 2}) == cfg
    assert _parse_config({**raw, "cluster": 3}) is None
    assert choose_config("sm_90a", 8192, 8192, 8192).cluster == 1


@pytest.mark.parametrize(("b_layout", "dtype", "ep", "shape"), [
    ("nk", hl.f16, (True, False, "relu", False), (136, 600, 200)),    # 3 tile columns: one idle CTA
    ("kn", hl.bf16, (False, False, "none", False), (264, 520, 136)),
])
def test_emulated_cluster_gemm_matches_float64(b_layout, dtype, ep, shape) -> None:
    m, n, k = shape
    cfg = CLUSTERED[0]
    bld, prog = gemm_fused(dtype, b_layout, ep, "sm_90a", cfg, m, n, compile=False)
    assert bld.lowered.cluster == (2, 1, 1)
    rng = np.random.default_rng(m * n + k)
    npdt = dtype.numpy()
    a = rng.standard_normal((m, k)).astype(npdt)
    b = rng.standard_normal((n, k) if b_layout == "nk" else (k, n)).astype(npdt)
    bias = rng.standard_normal(n).astype(npdt)
    c = np.full((m, n), np.nan, npdt)
    by_role = {"a": a, "b": b, "c": c, "bias": bias.reshape(1, n), "residual": None, "scale": 0.5}
    roles = ["a", "b", "c", "bias", "residual", "scale"]
    names = [p.name for p in bld.tile_kernel.params]
    rep = run(bld.lowered, {name: by_role[roles[i]] for name, i in zip(names, _arg_order(prog, ep))})
    tiles_m, tiles_n = -(-m // 128), -(-n // 256)
    assert len(rep.blocks) == 2 * tiles_m * ((tiles_n + 1) // 2)     # clusters of N-neighbour tiles
    want = _reference(a, b, b_layout, bias if ep[0] else None, ep[2])
    err = np.abs(c.astype(np.float64) - want) / (np.abs(want) + 1)
    assert err.max() < 1e-2


def test_a_stage_not_released_to_the_peer_is_a_race() -> None:
    """Consumers that release a stage only to their own CTA (empty barriers expecting CONSUMERS
    arrivals): the peer refills the stage by multicast while this CTA may still read it."""
    rng = np.random.default_rng(11)
    consts = dict(BM=128, BN=128, BK=64, STAGES=2, CONSUMERS=1, CLUSTER=2)
    a = rng.standard_normal((128, 576)).astype(np.float16)
    b = rng.standard_normal((256, 576)).astype(np.float16)
    good = build(gemm_sm90_kernel(hl.f16, "nk"), "sm_90a", compile=False, **consts).lowered
    c = np.full((128, 256), np.nan, np.float16)
    run(good, {"a": a, "b": b, "c": c})
    assert np.abs(c - a.astype(np.float64) @ b.astype(np.float64).T).max() < 0.1
    bad = build(gemm_sm90_kernel(hl.f16, "nk", peer_release=False), "sm_90a", compile=False, **consts).lowered
    with pytest.raises(RaceError, match=r"TMA multicast issued by thread 0 of block \(\d,\) overwrites bytes "
                                        r"read by thread 128 of block"):
        run(bad, {"a": a, "b": b, "c": np.zeros((128, 256), np.float16)})


def test_cluster_constant_is_checked() -> None:
    k = gemm_sm90_kernel(hl.f16, "nk")
    with pytest.raises(ValueError, match="CLUSTER=2: 1, or 2 with one block per tile"):
        k.trace(CLUSTER=2, GRID=132)
    with pytest.raises(ValueError, match="CLUSTER=3"):
        k.trace(CLUSTER=3)
    assert k.trace(CLUSTER=2).launch.cluster == (2, 1, 1)
    assert k.trace().launch.cluster is None


@pytest.mark.nvrtc
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_cluster_config_compiles_with_multicast(b_layout: str) -> None:
    b = gemm_build(hl.bf16, b_layout, (False, False, "none", False), "sm_90a", CLUSTERED[0], 4096, 4096)
    st = b.stats
    counts = b.compiled.sass_counts()
    assert "UTMALDG.2D.MULTICAST" in counts and "UCGABAR_ARV" in counts, sorted(counts)
    assert not re.findall(r"\((C75\d\d)\)", b.compiled.log) and not st.serialization
    assert not any(c in w for w in st.warnings for c in SERIALIZATION_CODES), st.warnings
    assert not st.spills and st.local_memory_instructions == 0
    lp = st.main_loop
    assert lp.mma_opcode.startswith("HGMMA.64x256") and lp.non_mma_per_ktile <= 50, st.summary()
    assert all(r["highest_register"] < r["limit"] for r in st.setmaxnreg if r["kind"] == "alloc")
    assert "__cluster_dims__(2, 1, 1)" in b.generated.source
