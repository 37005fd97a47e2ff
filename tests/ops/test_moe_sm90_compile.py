"""Compile evidence for the sm_90a bf16 / f16 fused-MoE kernels (``ops/moe_kernels_sm90.py``):
every config ``moe_sm90_config`` ships (swap-AB at BM 16 / 32 / 64, the large-token kernels at
BM 128), both activations and both router-weight placements, compiled with NVRTC for sm_90a (no
GPU): HGMMA in the SASS (m64n{BM}k16 swap-AB, m64n64k16 large-token), no spills, no local memory,
no ptxas wgmma serialization message (C7515 / C7510 / ...); the swap-AB kernels gather with
cp.async (LDGSTS), the large-token ones load weights with TMA (UTMALDG) and move register budgets
with setmaxnreg."""

from __future__ import annotations

import re

import pytest


def _check(b, mma: str) -> None:
    from hexlayout.runtime.stats import SERIALIZATION_CODES

    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
    st = b.stats
    assert st.local_memory_instructions == 0
    assert not re.findall(r"\((C75\d\d)\)", b.compiled.log) and not st.serialization, st.warnings
    assert not any(c in w for w in st.warnings for c in SERIALIZATION_CODES), st.warnings
    counts = b.compiled.sass_counts()
    assert any(op.startswith(mma) for op in counts), sorted(counts)
    assert not any(op.startswith("HMMA") for op in counts), sorted(counts)
    assert st.main_loop is not None and st.main_loop.mma > 0 and st.main_loop.mma_opcode.startswith(mma)


def test_the_chooser_ships_these_blocks() -> None:
    from hexlayout.ops.moe.kernels_sm90 import moe_sm90_config

    assert {moe_sm90_config(s, 8)["BM"] for s in range(1, 4096)} == {16, 32, 64, 128}


@pytest.mark.nvrtc
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("bm", [16, 32, 64, 128])
def test_every_sm90_config_compiles_to_hgmma_without_spills_or_serialization(bm: int, dtype: str) -> None:
    from hexlayout.ops.moe import kernels_sm90 as k90

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    dt = getattr(hl, dtype)
    consts = k90.sm90_consts(bm)
    ws = bm == 128
    gate_up = k90.moe_gate_up_sm90_ws_kernel if ws else k90.moe_gate_up_sm90_kernel
    down = k90.moe_down_sm90_ws_kernel if ws else k90.moe_down_sm90_kernel
    mma = "HGMMA.64x64x16" if ws else f"HGMMA.64x{bm}x16"
    gate_ups = (("silu", False), ("gelu", True)) if dtype == "bf16" else (("silu", True),)
    for act, scale_in in gate_ups:
        _check(build(gate_up(dt, act), "sm_90a", **consts, TOPK=8, SCALE_IN=scale_in), mma)
    b = build(down(dt), "sm_90a", **{**consts, "BN": 128 if ws else 64}, SCALE_IN=dtype == "f16")
    _check(b, mma)
    counts = b.compiled.sass_counts()
    for op in ("UTMALDG", "LDGSTS", "USETMAXREG") if ws else ("LDGSTS",):
        assert any(o.startswith(op) for o in counts), (op, sorted(counts))
