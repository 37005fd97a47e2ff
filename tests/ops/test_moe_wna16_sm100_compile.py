"""Compile evidence for the sm_100a W4A16 / W8A16 MoE kernels (``ops/moe/wna16_kernels_sm100.py``):
configs ``wna16_sm90_config`` hands out on sm_100a (decode ``BM`` 16, medium 32, large-token 64),
4- and 8-bit, MXFP4, groups of 32 (``BK`` 32) and per channel, the split-K form, compiled with
NVRTC for sm_100a (no GPU needed): no spills, no local memory; the SASS unpacks with LOP3 / PRMT,
writes the dequantized tile into tensor memory with STTM (tcgen05.st; no STS.128 of the weights),
multiplies with UTCHMMA (tcgen05.mma with A from TMEM, the ``_TS`` atom; no HMMA / HGMMA) and reads
the accumulator with LDTM; each thread loads its weights as one run of 16-byte vectors (the
offline layout)."""

from __future__ import annotations

import pytest
from hexlayout.ops.moe.wna16 import ONE_GROUP
from hexlayout.ops.moe.wna16_kernels_sm100 import moe_wna16_down_sm100_kernel, moe_wna16_gate_up_sm100_kernel

from hexlayout.ir.tile import GlobalView
from hexlayout.ir.walk import walk
from hexlayout.lang import bf16, e2m1, f16
from hexlayout.runtime import build

KERNELS = {"gate_up": moe_wna16_gate_up_sm100_kernel, "down": moe_wna16_down_sm100_kernel}
#: (kernel, bits / "fp4", dtype, split, constants)
CONFIGS = [
    ("gate_up", 4, bf16, False, {"BM": 16, "BK": 64, "ZERO": 0}),
    ("down", 8, f16, False, {"BM": 32, "BK": 64, "ZERO": 128, "GROUP": ONE_GROUP}),
    ("gate_up", "fp4", bf16, False, {"BM": 64, "BK": 32, "GROUP": 32, "ZERO": -1, "GELU": True}),
    ("down", 4, f16, True, {"BM": 16, "BK": 32, "GROUP": 32, "ZERO": 8, "SPLIT_K": 4}),
]


@pytest.mark.nvrtc
@pytest.mark.parametrize(("kernel", "bits", "dtype", "split", "consts"), CONFIGS,
                         ids=["gate_up_w4_bm16", "down_w8_channel_bm32", "gate_up_fp4_bm64",
                              "down_w4_splitk"])
def test_compiles_to_tcgen05_with_a_from_tmem_without_spills(kernel, bits, dtype, split, consts) -> None:
    wt = e2m1 if bits == "fp4" else None
    nbits = 4 if bits == "fp4" else bits
    extra = {c: v for c, v in consts.items() if c != "BK"}
    if kernel == "gate_up":
        extra["TOPK"] = 2
    b = build(KERNELS[kernel](dtype, nbits, consts["BK"], split, wt), "sm_100a", WG=1, **extra)
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0, st.summary()
    assert not st.warnings, st.warnings     # e.g. NVRTC's #549-D, a register stored to TMEM unset
    counts = b.compiled.sass_counts()

    def n(prefix: str) -> int:
        return sum(v for op, v in counts.items() if op.startswith(prefix))

    assert n("UTCHMMA") > 0 and n("LDTM") > 0 and n("STTM") > 0, sorted(counts)
    assert n("HMMA") == 0 and n("HGMMA") == 0, sorted(counts)   # no mma.sync / wgmma fallback
    assert n("LOP3") > 0 and n("PRMT") > 0 and n("I2F") == 0, sorted(counts)
    assert n("STS.128") == 0, sorted(counts)          # the weights never go through shared memory
    ml = st.main_loop.mix if st.main_loop is not None else {}
    assert ml.get("STTM", 0) > 0 and ml.get("STS", 0) == 0, ml
    assert st.main_loop is not None and st.main_loop.mma > 0, st.summary()
    choices = b.synthesis.lowered.choices
    assert all("SM100_64x" in i and "_TS" in i and "A from TMEM" in i
               for op, i in choices if type(op).__name__ == "Mma"), choices
    views = {op.result.id for op in walk(b.tile_kernel)
             if isinstance(op, GlobalView) and op.param.name == "q"}
    loads = [i for op, i in choices if getattr(getattr(op, "src", None), "id", None) in views]
    width = min(128, 64 * consts["BK"] * nbits // 128)
    assert loads and set(loads) == {f"ld.global.b{width} (offline)"}, loads
