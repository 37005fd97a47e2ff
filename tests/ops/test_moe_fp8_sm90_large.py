"""The sm_90a large-token fp8 fused-MoE kernels (``moe_fp8_kernels_sm90.*_ws``: tokens on the wgmma M
side, 128 rows per block over two consumer warp groups, TMA weight tiles, cp.async token gathers,
warp-specialized) in the emulator (``HEXLAYOUT_EMULATE_ARCH=sm_90a``) against
``test_moe_fp8``'s float64 reference and tolerance (the activations are quantized with the op's
float32 operations, so ``xq`` matches bit for bit; ``h`` may differ by one bf16 / f16 ulp where
float32 and float64 sums round apart, flipping an element of ``hq`` by one e4m3 ulp: two such flips
per contribution, plus ``2^-7`` of the sum of magnitudes). Routings with more than 64 slots per
expert on average pick these kernels (``fp8_block_m`` = 128, asserted); the cases cover experts
that get no token, an expert map with half the experts remote, per-expert and 128 x 128 block
scales (I a multiple of 64: one scale per tile; I = 176: the up tile straddles two scale blocks;
H = 384: three k-tiles through rings of 2 and 3 stages), bf16 / f16, SiLU / GELU and the router weight
on the input.

Compile evidence for every shipped sm_90a fp8 config (NVRTC, no GPU): the swap-AB kernels at BM
16 / 32 / 64 and the large-token kernels at BM 128 (both scale forms, both activations' paths):
QGMMA e4m3 in the SASS, no spills, no local memory, no ptxas wgmma serialization message
(C7515 / C7510 / ...); the large-token kernels load their weights with TMA (UTMALDG), gather token
rows with cp.async (LDGSTS) and move register budgets with setmaxnreg.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.moe.fp8 import SWAP_STAGES, WS_STAGES, fp8_block_m, fused_moe_fp8, prepare_fp8  # noqa: E402
from test_moe_fp8 import check, make, reference  # noqa: E402


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")


def test_config_by_slots_per_expert() -> None:
    assert fp8_block_m(8 * 65, 8, "sm_90a") == 128
    assert fp8_block_m(8 * 64, 8, "sm_90a") == 32
    assert fp8_block_m(8 * 65, 8, "sm_89") == 64          # sm_89 keeps its mma.sync blocks
    assert fp8_block_m(4096 * 8, 256, "sm_90a") == 128    # DeepSeek-V3 prefill
    assert fp8_block_m(16 * 8, 256, "sm_90a") == 16       # decode


CASES = [
    # seed, T, H, I, E, k, dtype, block, act, stages
    (0, 200, 128, 64, 4, 2, torch.bfloat16, False, "silu", WS_STAGES),
    (1, 140, 256, 176, 4, 2, torch.float16, True, "gelu", WS_STAGES),   # I % 64: up tiles straddle blocks
    # 3 k-tiles (down: 3 tiles of 128 columns) through rings of 2 and 3 stages: stages reused, phases flip
    (2, 280, 384, 128, 4, 1, torch.bfloat16, True, "silu", 2),
    (3, 150, 384, 128, 4, 2, torch.float16, False, "gelu", 3),
]


@pytest.mark.parametrize(("seed", "t", "h", "inter", "e", "k", "dtype", "block", "act", "stages"), CASES)
def test_large_token_kernels_match_float64(seed, t, h, inter, e, k, dtype, block, act, stages,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hexlayout.ops.moe.fp8.WS_STAGES", stages)
    assert fp8_block_m(t * k, e, "sm_90a") == 128
    x, w13, s13, w2, s2, tw, ids = make(seed, t, h, inter, e, k, dtype, block, gne=e - 1)
    assert int(ids.max()) < e - 1                            # the last expert gets no token
    blk = (128, 128) if block else None
    a, b = prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk)
    out = hexlayout.ops.fused_moe(x, a, b, tw, ids, activation=act)
    assert out.dtype == dtype and out.shape == (t, h)
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, block, act))


def test_expert_map_half_remote_and_router_weight_on_input() -> None:
    gne, e, t = 8, 4, 300
    x, w13, s13, w2, s2, tw, ids = make(5, t, 128, 128, e, 1, torch.float16, block=True, gne=gne)
    emap = torch.full((gne,), -1, dtype=torch.int32)
    emap[torch.tensor([6, 1, 3, 4])] = torch.arange(e, dtype=torch.int32)
    assert (emap[ids.long()] < 0).any() and (emap[ids.long()] >= 0).any()
    a, b = prepare_fp8(w13, s13, block=(128, 128)), prepare_fp8(w2, s2, block=(128, 128))
    assert fp8_block_m(t, e, "sm_90a") == 128
    out = fused_moe_fp8(x, a, b, tw, ids, expert_map=emap, global_num_experts=gne,
                        apply_router_weight_on_input=True)
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, True, router=True, emap=emap))


def _no_spills_no_serialization(b) -> None:
    from hexlayout.runtime.stats import SERIALIZATION_CODES

    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
    st = b.stats
    assert st.local_memory_instructions == 0
    assert not st.serialization, st.warnings
    assert not any(c in w for w in st.warnings for c in SERIALIZATION_CODES), st.warnings
    fp8 = [op for op in b.compiled.sass_counts() if op.startswith("QGMMA.64x") and "E4M3.E4M3" in op]
    assert fp8, sorted(b.compiled.sass_counts())
    assert st.main_loop is not None and st.main_loop.mma > 0


@pytest.mark.nvrtc
@pytest.mark.parametrize("block_scale", [False, True])
@pytest.mark.parametrize("bm", [16, 32, 64, 128])
def test_every_sm90_config_compiles_to_qgmma_without_spills_or_wgmma_serialization(bm: int,
                                                                                   block_scale: bool) -> None:
    from hexlayout.ops.moe import fp8_kernels_sm90 as k90

    from hexlayout.lang import bf16
    from hexlayout.runtime import build

    # the constants run_fused_moe_fp8 launches with (fp8_block_m picks bm)
    consts = {"BM": bm, "BN": 64, "BK": 128, "STAGES": SWAP_STAGES, "BLOCK_SCALE": block_scale}
    if bm == 128:
        consts.update(STAGES=WS_STAGES, CONSUMERS=2)
        kernels = (k90.moe_fp8_gate_up_sm90_ws_kernel, k90.moe_fp8_down_sm90_ws_kernel)
    else:
        kernels = (k90.moe_fp8_gate_up_sm90_kernel, k90.moe_fp8_down_sm90_kernel)
    gate_up = [{"TOPK": 2, "GELU": True, "UNIFORM": block_scale}]
    if block_scale:
        gate_up.append({"TOPK": 8, "GELU": False, "UNIFORM": False})   # I % 64 != 0: straddling up tiles
    down = {"ROUTER": False, "BN": 128 if bm == 128 else 64}
    for extra in gate_up:
        _no_spills_no_serialization(build(kernels[0](bf16), "sm_90a", **consts, **extra))
    b = build(kernels[1](bf16), "sm_90a", **{**consts, **down})
    _no_spills_no_serialization(b)
    if bm == 128:
        counts = b.compiled.sass_counts()
        for op in ("UTMALDG", "LDGSTS", "USETMAXREG"):
            assert any(o.startswith(op) for o in counts), (op, sorted(counts))
