"""The FP8 fused-MoE grouped GEMMs on sm_100a: the sm_90a kernel sources
(``ops/moe/fp8_kernels_sm90.py``) built for Blackwell - e4m3 ``tcgen05.mma`` (kind f8f6f4) with
the accumulators in tensor memory, per-128 block scales applied in registers after each k-tile's
load - named ``moe_fp8_*_sm100_*``, under ``HEXLAYOUT_EMULATE_ARCH=sm_100a`` in the emulator
against ``test_moe_fp8``'s float64 reference on ragged routings, and the NVRTC sm_100a build
(tcgen05 MMA and tensor-memory loads in the SASS, no spills)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.moe import fp8_kernels_sm90 as f90  # noqa: E402
from hexlayout.ops.moe.fp8 import SWAP_STAGES, fp8_block_m, prepare_fp8  # noqa: E402
from test_moe_fp8 import check, make, reference  # noqa: E402


@pytest.mark.parametrize(("seed", "t", "h", "inter", "e", "k", "dtype", "block", "bm"), [
    (7, 5, 256, 176, 4, 2, torch.bfloat16, True, 16),     # swap-AB; I % 64: up tiles straddle scale blocks
    (8, 140, 256, 64, 2, 1, torch.float16, False, 128),   # large-token, warp-specialized
])
def test_fp8_moe_on_sm100_matches_float64(seed, t, h, inter, e, k, dtype, block, bm, built) -> None:
    assert fp8_block_m(t * k, e, "sm_100a") == bm
    x, w13, s13, w2, s2, tw, ids = make(seed, t, h, inter, e, k, dtype, block, gne=e)
    blk = (128, 128) if block else None
    a, b = prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk)
    out = hexlayout.ops.fused_moe(x, a, b, tw, ids, activation="silu")
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, block, "silu"))
    gemms = [n for n in built if n.startswith(("moe_fp8_gate_up", "moe_fp8_down"))]
    assert len(gemms) == 2 and all("_sm100_" in n for n in gemms), built


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
