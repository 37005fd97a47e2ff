"""The Hopper GEMM main loop at the standard of its peers (issue 10, item 2), from the cubin of
every shipped sm_90a config: ptxas keeps the wgmma pipeline in flight (no C75xx serialization
message), no spills under setmaxnreg, at most 50 non-MMA instructions per k-tile (CUTLASS 44,
Triton 46 for 128x128x64: descriptors advanced by an offset, not rebuilt), and a stage count
that fills the shared memory (6-7 stages where the tile allows)."""

from __future__ import annotations

import re

import pytest
from hexlayout.ops.gemm.config import CONFIGS, SM90_EPILOGUE_SMEM, SM90_MAX_STAGES, sm90_stages
from hexlayout.ops.gemm.op import gemm_build

import hexlayout.lang as hl
from hexlayout.arch import get_arch
from hexlayout.runtime.stats import SERIALIZATION_CODES

SM90 = CONFIGS["sm_90a"]
SMEM_MAX = get_arch("sm_90a").smem_per_block_max


@pytest.mark.nvrtc
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
@pytest.mark.parametrize("cfg", SM90, ids=str)
def test_shipped_sm90_config_keeps_wgmma_in_flight(cfg, b_layout: str) -> None:
    b = gemm_build(hl.bf16, b_layout, (False, False, "none", False), "sm_90a", cfg, 4096, 4096)
    st = b.stats
    coded = re.findall(r"\((C75\d\d)\)", b.compiled.log)
    assert not coded and not st.serialization, (cfg, coded, st.warnings)
    assert not any(c in w for w in st.warnings for c in SERIALIZATION_CODES), st.warnings
    assert not st.spills and st.local_memory_instructions == 0, st.summary()
    alloc = [r for r in st.setmaxnreg if r["kind"] == "alloc"]
    assert alloc and all(r["highest_register"] < r["limit"] for r in alloc), st.setmaxnreg
    lp = st.main_loop
    assert lp is not None and lp.mma_opcode.startswith("HGMMA.64x")
    # one k-tile per iteration: BM*BN*BK / (64*n*16) wgmma per consumer warp group
    n = int(lp.mma_opcode.split(".")[1].split("x")[1])
    assert lp.mma == cfg.BM * cfg.BN * cfg.BK // (64 * n * 16 * cfg.CONSUMERS)
    assert lp.non_mma_per_ktile is not None and lp.non_mma_per_ktile <= 50, st.summary()
    # no 64-bit descriptor rebuilt from vector registers inside the loop
    assert lp.mix.get("R2UR", 0) == 0, lp.mix
    assert b.generated.smem_bytes <= SMEM_MAX


def test_stages_fill_shared_memory() -> None:
    for bm, bn in ((64, 64), (64, 128), (128, 128), (128, 256), (256, 128)):
        s = sm90_stages(bm, bn, 64)
        stage = (bm + bn) * 64 * 2 + 16
        epi = min(bm * bn * 2, SM90_EPILOGUE_SMEM)
        assert 2 <= s <= SM90_MAX_STAGES and epi + s * stage <= SMEM_MAX
        assert s == SM90_MAX_STAGES or epi + (s + 1) * stage > SMEM_MAX
    assert sm90_stages(128, 128, 64) == 6 and sm90_stages(64, 128, 64) == 7 and sm90_stages(128, 256, 64) == 4
    with pytest.raises(ValueError, match="256x256x128"):
        sm90_stages(256, 256, 128)
    for cfg in SM90:
        assert cfg.STAGES == sm90_stages(cfg.BM, cfg.BN, cfg.BK)
    tiles = {(c.BM, c.BN) for c in SM90}
    assert {(128, 256), (256, 128)} <= tiles


@pytest.mark.parametrize("staged", [True, False])
def test_k_zero_writes_a_zero_product(staged: bool) -> None:
    """The consumers start a tile with ``hl.mma(accumulate=False)`` (no zeroed accumulator):
    with no k-tile at all the accumulator is zero-filled after the loop, so c = 0 (emulated;
    c starts as NaN)."""
    import numpy as np
    from hexlayout.ops.gemm.kernels import gemm_sm90_kernel

    from hexlayout.emulator import run
    from hexlayout.synth.solve import synthesize

    consts = {**SM90[3].consts(64, 64), "STAGE_EPILOGUE": staged}
    syn = synthesize(gemm_sm90_kernel(hl.f16, "nk").trace(**consts), "sm_90a")
    c = np.full((64, 64), np.nan, np.float16)
    run(syn.lowered.kernel, {"a": np.zeros((64, 0), np.float16), "b": np.zeros((64, 0), np.float16), "c": c})
    assert np.all(c == 0)
