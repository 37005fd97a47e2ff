"""Compile evidence for the shipped sm_90a W4A16 / W8A16 MoE kernels
(``ops/moe_wna16_kernels_sm90.py``): every config ``wna16_sm90_config`` hands out (decode ``BM``
16, medium 32, large-token 64, all on one warp group) for both widths, both dtypes, k-tiles of
64 and 32 and the GELU / router epilogues, compiled with NVRTC for sm_90a (no GPU needed): no
spills, no local memory, the SASS unpacks with LOP3 / PRMT without I2F and multiplies with HGMMA
whose A operand synthesis took from registers (the RS form: the dequantized weights never touch
shared memory) after loading each thread's fragment as one run of 16-byte vectors (the offline
layout), and ptxas does not serialize the wgmma (no C7515 / C7510)."""

from __future__ import annotations

import pytest
from hexlayout.ops.moe.wna16_kernels_sm90 import moe_wna16_down_sm90_kernel, moe_wna16_gate_up_sm90_kernel

from hexlayout.ir.tile import GlobalView
from hexlayout.ir.walk import walk
from hexlayout.lang import bf16, f16
from hexlayout.runtime import build
from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts

KERNELS = {"gate_up": moe_wna16_gate_up_sm90_kernel, "down": moe_wna16_down_sm90_kernel}
#: (kernel, bits, dtype, constants)
CONFIGS = (
    [(k, b, d, {"BM": 16, "WG": 1, "BK": 64}) for k in KERNELS for b in (4, 8) for d in ("f16", "bf16")]
    + [  # medium
        ("gate_up", 4, "bf16", {"BM": 32, "WG": 1, "BK": 64}),
        ("down", 8, "f16", {"BM": 32, "WG": 1, "BK": 64}),
    ]
    + [  # large-token: one warp group (the weights' offline layout is a 64-row tile's)
        ("gate_up", 4, "bf16", {"BM": 64, "WG": 1, "BK": 64, "GELU": True}),
        ("gate_up", 8, "f16", {"BM": 64, "WG": 1, "BK": 64}),
        ("down", 8, "bf16", {"BM": 64, "WG": 1, "BK": 32, "GROUP": 32}),
        ("down", 4, "bf16", {"BM": 64, "WG": 1, "BK": 64}),
    ]
    + [("gate_up", 8, "bf16", {"BM": 16, "WG": 1, "BK": 32, "GROUP": 32, "ROUTER": True})]
)


@pytest.mark.nvrtc
@pytest.mark.parametrize(("kernel", "bits", "dtype", "consts"), CONFIGS)
def test_compiles_to_register_a_wgmma_without_spills_or_serialization(kernel, bits, dtype, consts) -> None:
    dt = f16 if dtype == "f16" else bf16
    extra = {"ZERO": 0 if bits == 4 else 128, **{c: v for c, v in consts.items() if c != "BK"}}
    if kernel == "gate_up":
        extra["TOPK"] = 2
    b = build(KERNELS[kernel](dt, bits, consts["BK"]), "sm_90a", **extra)
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0, st.summary()
    assert not st.serialization and not any("C7515" in w or "C7510" in w for w in st.warnings), st.warnings
    counts = opcode_counts(disassemble(b.compiled.cubin))
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert count_prefix(counts, "LOP3") > 0 and count_prefix(counts, "PRMT") > 0, counts
    assert count_prefix(counts, "I2F") == 0, counts
    assert count_prefix(counts, "HGMMA") > 0 and st.main_loop is not None and st.main_loop.mma > 0, counts
    assert count_prefix(counts, "HMMA") == 0, counts  # no mma.sync fallback
    choices = b.synthesis.lowered.choices
    mmas = {str(i) for _, i in choices if "SM90_" in str(i)}
    assert mmas and all("_RS x" in i for i in mmas), mmas  # A (the weights) from registers
    # the offline layout: a thread's register-A fragment of the (64 WG, BK) tile is one run of
    # 64 * BK * bits / 128 bits, loaded as 16-byte vectors
    ops = walk(b.tile_kernel)
    views = {op.result.id for op in ops if isinstance(op, GlobalView) and op.param.name == "q"}
    loads = [i for op, i in choices if getattr(getattr(op, "src", None), "id", None) in views]
    width = min(128, 64 * consts["BK"] * bits // 128)
    assert loads and set(loads) == {f"ld.global.b{width} (offline)"}, loads
