"""Compile evidence for the fp8 fused-MoE kernels (issue 11): the gate-up and down grouped GEMMs
(per-expert and 128 x 128 block scales, decode and prefill row blocks) and the quantization
compile with NVRTC for sm_89 (e4m3 ``mma.sync``: QMMA.16832 in the SASS) and sm_90a
(e4m3 ``wgmma``: QGMMA.64xNx32) without spills or local memory, rows gathered with cp.async."""

from __future__ import annotations

import pytest


def _no_spills(b) -> None:
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
    assert b.stats.local_memory_instructions == 0


@pytest.mark.nvrtc
@pytest.mark.parametrize("block_scale", [False, True])
@pytest.mark.parametrize(("arch", "bm"), [("sm_89", 16), ("sm_89", 64), ("sm_90a", 16), ("sm_90a", 64)])
def test_grouped_gemms_compile_to_fp8_mma_without_spills(arch: str, bm: int, block_scale: bool) -> None:
    from hexlayout.ops.moe.fp8 import SWAP_STAGES
    from hexlayout.ops.moe.fp8_kernels_sm89 import moe_fp8_down_kernel, moe_fp8_gate_up_kernel
    from hexlayout.ops.moe.fp8_kernels_sm90 import moe_fp8_down_sm90_kernel, moe_fp8_gate_up_sm90_kernel

    from hexlayout.lang import bf16
    from hexlayout.runtime import build

    consts = {"BM": bm, "BN": 64, "BK": 128, "STAGES": 2, "BLOCK_SCALE": block_scale}
    if arch == "sm_90a":  # the swap-AB kernels' ring: one stage more for the wgmma group in flight
        consts["STAGES"] = SWAP_STAGES
        kernels, mma = (moe_fp8_gate_up_sm90_kernel(bf16), moe_fp8_down_sm90_kernel(bf16)), "QGMMA.64x"
    else:
        kernels, mma = (moe_fp8_gate_up_kernel(bf16), moe_fp8_down_kernel(bf16)), "QMMA.16832"
        consts["WARPS"] = 4
    for kern, extra in zip(kernels, ({"TOPK": 2, "GELU": True, "UNIFORM": block_scale}, {"ROUTER": False})):
        b = build(kern, arch, **consts, **extra)
        _no_spills(b)
        counts = b.compiled.sass_counts()
        fp8 = [op for op in counts if op.startswith(mma) and "E4M3.E4M3" in op]
        assert fp8, sorted(counts)
        assert not any(op.startswith("HMMA") for op in counts), sorted(counts)
        assert any(op.startswith("LDGSTS") for op in counts)
        loop = b.stats.main_loop
        assert loop is not None and loop.mma > 0
        assert not any(op.startswith("F2FP") for op in loop.mix), loop.mix   # no fp8 -> f16 emulation


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_quantize_compiles_without_spills(arch: str) -> None:
    from hexlayout.ops.moe.fp8_kernels_sm89 import moe_fp8_quant_kernel

    from hexlayout.lang import f16
    from hexlayout.runtime import build

    q = build(moe_fp8_quant_kernel(f16), arch, ROWS=4, BK=256, WARPS=4, ROUTER=True)
    _no_spills(q)
    ops = sorted(q.compiled.sass_counts())
    assert any(op.startswith("F2FP") for op in ops), ops   # the f32 -> e4m3 conversions
