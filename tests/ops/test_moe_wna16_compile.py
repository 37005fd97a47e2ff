"""Compile evidence for the shipped W4A16 / W8A16 MoE kernels (``ops/moe_wna16_kernels.py``):
NVRTC for sm_80 and sm_90a (no GPU needed), no spills, no local memory, the SASS unpacks with
LOP3 / PRMT and converts by the magic number (no I2F), multiplies with HMMA (sm_90a runs the
mma.sync kernels too), and loads each thread's weight fragment as one contiguous run of 16-byte
vectors (the synthesized offline layout ``prepare_wna16`` applies)."""

from __future__ import annotations

import pytest
from hexlayout.ops.moe.wna16_kernels_sm80 import moe_wna16_down_kernel, moe_wna16_gate_up_kernel

from hexlayout.ir.tile import GlobalView
from hexlayout.ir.walk import walk
from hexlayout.lang import bf16, f16
from hexlayout.runtime import build
from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts
from hexlayout.synth.solve import synthesize

KERNELS = {"gate_up": moe_wna16_gate_up_kernel, "down": moe_wna16_down_kernel}
#: (kernel, bits, dtype, constants): the decode config (BM 16, BK 64) of every kernel, dtype and
#: width; the prefill config (BM 64) and groups of 32 (BK 32); the GELU and router-on-input epilogues
CONFIGS = [(k, b, d, {"BM": 16, "BK": 64}) for k in KERNELS for b in (4, 8) for d in ("f16", "bf16")] + [
    ("gate_up", 4, "f16", {"BM": 64, "BK": 64, "STAGES": 3, "GELU": True}),
    ("down", 4, "bf16", {"BM": 64, "BK": 32, "STAGES": 3, "GROUP": 32}),
    ("gate_up", 8, "bf16", {"BM": 16, "BK": 32, "GROUP": 32, "ROUTER": True}),
]


def _build(kernel: str, bits: int, dtype: str, consts: dict, arch: str, compile: bool = True):
    dt = f16 if dtype == "f16" else bf16
    k = KERNELS[kernel](dt, bits, consts["BK"])
    extra = {"ZERO": 0 if bits == 4 else 128, "TOPK": 2, **{c: v for c, v in consts.items() if c != "BK"}}
    if not compile:
        tk = k.trace(**extra)
        return tk, synthesize(tk, arch)
    return build(k, arch, **extra)


@pytest.mark.parametrize(("kernel", "bits", "dtype", "consts"), CONFIGS)
def test_weights_load_as_one_vector_per_row_fragment(kernel, bits, dtype, consts) -> None:
    tk, syn = _build(kernel, bits, dtype, consts, "sm_80", compile=False)
    views = {op.result.id for op in walk(tk) if isinstance(op, GlobalView) and op.param.name == "q"}
    loads = [i for op, i in syn.lowered.choices if getattr(getattr(op, "src", None), "id", None) in views]
    # the offline layout: a thread's whole fragment of the (64, BK) tile (128 threads) is one
    # contiguous run of 64 * BK * bits / 128 bits, loaded as 16-byte vectors
    width = min(128, 64 * consts["BK"] * bits // 128)
    assert loads and set(loads) == {f"ld.global.b{width} (offline)"}, syn.lowered.choices
    assert syn.lowered.offline["q"].thread_bytes * 8 == 64 * consts["BK"] * bits // 128


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(("kernel", "bits", "dtype", "consts"), CONFIGS)
def test_compiles_without_spills_and_dequantizes_in_registers(kernel, bits, dtype, consts, arch) -> None:
    b = _build(kernel, bits, dtype, consts, arch)
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0, st.summary()
    counts = opcode_counts(disassemble(b.compiled.cubin))
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert count_prefix(counts, "LOP3") > 0 and count_prefix(counts, "PRMT") > 0, counts
    assert count_prefix(counts, "I2F") == 0, counts
    assert count_prefix(counts, "HMMA") > 0 and st.main_loop is not None and st.main_loop.mma > 0, counts


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_blocks_without_an_expert_skip_the_gemm_in_the_cuda_source(kernel) -> None:
    """``with hl.if_(e >= 0)`` on the loaded (signed) block expert stays a branch in the CUDA
    source: a block of expert -1 (unused, or past the padded total) must not run the GEMM with
    weight offsets of expert -1 (the code generator once gave loaded values a lower bound 0 and
    printed ``if (1)``). The emulator, which evaluates the condition itself, cannot see this."""
    b = build(KERNELS[kernel](f16, 4, 64), "sm_80", compile=False, BM=16, TOPK=2)
    branches = [ln.strip() for ln in b.generated.source.splitlines() if ln.strip().startswith("if (")]
    assert "if (0 <= block_expert_ld[0]) {" in branches, branches[:3]
