"""The FP8 fused-MoE grouped GEMMs on sm_100a: the sm_90a kernel sources
(``ops/moe/fp8_kernels_sm90.py``) built for Blackwell - e4m3 ``tcgen05.mma`` (kind f8f6f4) with
the accumulators in tensor memory, per-128 block scales applied in registers after each k-tile's
load - named ``moe_fp8_*_sm100_*``, and for UE8M0 block scales (every scale a power of two,
``prepare_fp8``'s ``scale_format="ue8m0"``) ``fp8_kernels_sm100``'s kernels with the scales in the
block-scaled ``tcgen05.mma`` (``moe_fp8_*_sm100_ue8m0_*``); under ``HEXLAYOUT_EMULATE_ARCH=sm_100a``
in the emulator against ``test_moe_fp8``'s float64 reference on ragged routings, and the NVRTC
sm_100a build (tcgen05 MMA and tensor-memory loads in the SASS, no spills)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.moe import fp8_kernels_sm90 as f90  # noqa: E402
from hexlayout.ops.moe.blocks import UNROLL_SM100  # noqa: E402
from hexlayout.ops.moe.fp8 import SWAP_STAGES, fp8_block_m, prepare_fp8  # noqa: E402
from test_moe_fp8 import check, make, reference  # noqa: E402


@pytest.mark.parametrize(("seed", "t", "h", "inter", "e", "k", "dtype", "block", "bm"), [
    (7, 5, 256, 176, 4, 2, torch.bfloat16, True, 16),     # swap-AB; I % 64: up tiles straddle scale blocks
    (8, 140, 256, 64, 2, 1, torch.float16, False, 128),   # large-token, warp-specialized
    (11, 136, 896, 64, 2, 1, torch.bfloat16, True, 128),  # block scales; 7 k-tiles: the 6-stage ring wraps
])
def test_fp8_moe_on_sm100_matches_float64(seed, t, h, inter, e, k, dtype, block, bm, built) -> None:
    assert fp8_block_m(t * k, e, "sm_100a") == bm
    x, w13, s13, w2, s2, tw, ids = make(seed, t, h, inter, e, k, dtype, block, gne=e)
    blk = (128, 128) if block else None
    a, b = prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk)
    out = hexlayout.ops.fused_moe(x, a, b, tw, ids, activation="silu")
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, block, "silu"))
    gemms = [n for n in built if n.startswith(("moe_fp8_gate_up", "moe_fp8_down"))]
    assert len(gemms) == 2 and all("_sm100_" in n and "ue8m0" not in n for n in gemms), built
    assert a.scale_format == b.scale_format == ""          # random scales: not powers of two


def _pow2(s):
    """``s`` rounded to powers of two (UE8M0 block scales)."""
    return torch.exp2(torch.round(torch.log2(s)))


@pytest.mark.parametrize(("seed", "t", "h", "inter", "e", "k", "dtype", "bm", "split"), [
    (9, 5, 256, 176, 4, 2, torch.bfloat16, 16, 1),     # decode; I % 128: up tiles straddle scale blocks
    (9, 5, 256, 176, 4, 2, torch.bfloat16, 16, 2),     # the split-K forms
    (10, 140, 256, 64, 2, 1, torch.float16, 128, 1),   # more than 64 rows per expert: blocks of 64 here
])
def test_ue8m0_block_scales_run_in_the_mma(seed, t, h, inter, e, k, dtype, bm, split, built,
                                           monkeypatch) -> None:
    assert fp8_block_m(t * k, e, "sm_100a") == bm
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", str(split))
    x, w13, s13, w2, s2, tw, ids = make(seed, t, h, inter, e, k, dtype, True, gne=e)
    s13, s2 = _pow2(s13), _pow2(s2)
    s13[0, 0, 0] = 2.0 ** -127          # the smallest UE8M0 factor (an f32 subnormal) is exact too
    a, b = prepare_fp8(w13, s13, block=(128, 128)), prepare_fp8(w2, s2, block=(128, 128))
    assert a.scale_format == b.scale_format == "ue8m0"
    out = hexlayout.ops.fused_moe(x, a, b, tw, ids, activation="silu")
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, True, "silu"))
    gemms = [n for n in built if n.startswith(("moe_fp8_gate_up", "moe_fp8_down"))]
    tag = _tag(dtype) + ("_splitk" if split > 1 else "")
    assert gemms == [f"moe_fp8_gate_up_sm100_ue8m0_{tag}", f"moe_fp8_down_sm100_ue8m0_{tag}"], built


def _tag(dtype):
    return {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]


def test_scale_format_is_recorded_and_checked() -> None:
    from hexlayout.ops.moe.fp8 import check_fused_moe_fp8

    from hexlayout.runtime.args import ArgumentError

    x, w13, s13, w2, s2, tw, ids = make(11, 3, 128, 64, 2, 1, torch.bfloat16, True, gne=2)
    assert prepare_fp8(w13, _pow2(s13), block=(128, 128)).scale_format == "ue8m0"
    assert prepare_fp8(w13, s13, block=(128, 128)).scale_format == ""
    assert prepare_fp8(w13, torch.ones(2), block=None).scale_format == ""          # per-expert scales
    meta = prepare_fp8(w13.to("meta"), _pow2(s13).to("meta"), block=(128, 128))
    assert meta.scale_format == ""                                                  # values unknown
    args = (x, w13, _pow2(s13), w2, s2, tw, ids, [128, 128])
    with pytest.raises(ArgumentError, match="w2_scale.*not a power of two"):
        check_fused_moe_fp8(*args, scale_format="ue8m0")
    with pytest.raises(ArgumentError, match="scale_format.*'' or 'ue8m0'"):
        check_fused_moe_fp8(*args, scale_format="e8m0")
    with pytest.raises(ArgumentError, match="describes block scales"):
        check_fused_moe_fp8(x, w13, torch.ones(2), w2, torch.ones(2), tw, ids, [], scale_format="ue8m0")


@pytest.mark.nvrtc
def test_fp8_swap_ab_compiles_for_sm100_with_tcgen05() -> None:
    from hexlayout.lang import bf16
    from hexlayout.runtime import build

    consts = {"BM": 16, "BN": 64, "BK": 128, "STAGES": SWAP_STAGES, "BLOCK_SCALE": True}
    b = build(f90.moe_fp8_gate_up_sm90_kernel(bf16, False, "sm_100a"), "sm_100a", **consts, TOPK=2)
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
    counts = b.compiled.sass_counts()
    assert any(o.startswith("UTCQMMA") or o.startswith("UTCHMMA") for o in counts), sorted(counts)
    assert any(o.startswith("LDTM") for o in counts), sorted(counts)


@pytest.mark.nvrtc
@pytest.mark.parametrize(("which", "bm", "split"), [("gate_up", 16, False), ("down", 16, False),
                                                    ("gate_up", 64, False), ("gate_up", 32, True)])
def test_ue8m0_kernels_compile_for_sm100_with_the_block_scaled_mma(which, bm, split) -> None:
    """NVRTC sm_100a, at every block size and split the op builds: no spills; the main loop issues
    the factor copies (UTCCP) and the MMAs (UTCQMMA) and scales nothing in registers (no FFMA /
    FMUL: the partial-product path's per-k-tile scaling is gone); the epilogue loads TMEM (LDTM)."""
    from hexlayout.ops.moe import fp8_kernels_sm100 as f100

    from hexlayout.lang import bf16
    from hexlayout.runtime import build
    from hexlayout.runtime.stats import build_stats

    kern = f100.moe_fp8_gate_up_sm100_kernel if which == "gate_up" else f100.moe_fp8_down_sm100_kernel
    consts = {"TOPK": 2} if which == "gate_up" else {}
    if split:
        consts["SPLIT_K"] = 2
    b = build(kern(bf16, split), "sm_100a", BM=bm, BN=128, BK=128, STAGES=SWAP_STAGES, **consts)
    st = build_stats(b)
    assert not st.spills and st.stack_frame == 0, st.summary()
    lp = st.main_loop
    assert lp is not None and lp.mma_opcode.startswith("UTCQMMA"), st.summary()
    # 4 k-steps of 32 per (gate, up) tile and k-tile, UNROLL_SM100 k-tiles per iteration
    assert lp.mma == (8 if which == "gate_up" else 4) * UNROLL_SM100, st.summary()
    assert any(o.startswith("UTCCP") for o in lp.mix)
    assert not any(o.startswith(("FFMA", "FMUL")) for o in lp.mix), lp.mix
    assert any(o.startswith("LDTM") for o in b.compiled.sass_counts())


def test_ue8m0_kernels_refuse_more_than_64_token_rows() -> None:
    from hexlayout.ops.moe import fp8_kernels_sm100 as f100

    from hexlayout.lang import bf16

    with pytest.raises(ValueError, match=r"BM \(128\) a multiple of 8 in \[8, 64\]"):
        f100.moe_fp8_gate_up_sm100_kernel(bf16).trace(BM=128, TOPK=1)
