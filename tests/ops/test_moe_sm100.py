"""The bf16 / f16 fused-MoE grouped GEMMs on sm_100a: the sm_90a kernel sources
(``ops/moe/kernels_sm90.py``) built for Blackwell - synthesis gives their ``hl.mma`` tcgen05 with
the accumulators in tensor memory - named ``moe_*_sm100_*``, run by ``fused_moe`` under
``HEXLAYOUT_EMULATE_ARCH=sm_100a`` in the emulator against ``test_moe_op``'s float64 reference on
ragged routings (experts with no token, H and I not multiples of the 64-wide tiles), and compiled
with NVRTC for sm_100a: UTCHMMA and tensor-memory loads in the SASS, no spills."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from test_moe_op import close, make, reference  # noqa: E402

import hexlayout.lang as hl  # noqa: E402
import hexlayout.ops  # noqa: E402,F401 - registers torch.ops.hexlayout.fused_moe
from hexlayout.ops import fused_moe  # noqa: E402
from hexlayout.ops.moe import kernels_sm90 as k90  # noqa: E402


@pytest.mark.parametrize(("t", "h", "i", "e", "k", "dt", "act", "used", "ws"), [
    (3, 96, 80, 8, 2, torch.bfloat16, "silu", 5, False),        # swap-AB, BM 16; H, I ragged
    (2, 352, 328, 8, 2, torch.float16, "silu", 2, False),       # 6 k-tiles: the 4-stage ring wraps
    (40, 64, 72, 2, 4, torch.float16, "gelu", 2, True),         # large-token kernels (80 slots per expert)
])
def test_fused_moe_on_sm100_matches_float64(t, h, i, e, k, dt, act, used, ws, built) -> None:
    x, w13, w2, tw, ids = make(t, h, i, e, k, dt, seed=t + 27, experts_used=used)
    w13, w2 = w13 * 2, w2 * 2
    out = fused_moe(x, w13, w2, tw, ids, activation=act)
    close(out, reference(x, w13, w2, tw, ids, act), dt)
    gemms = [n for n in built if n.startswith(("moe_gate_up", "moe_down"))]
    assert len(gemms) == 2 and all(("_sm100_ws_" if ws else "_sm100_") in n for n in gemms), built


def test_names_carry_the_architecture() -> None:
    assert k90.moe_gate_up_sm90_kernel(hl.bf16, "silu", "sm_100a").trace(**k90.sm90_consts(16)).name \
        == "moe_gate_up_sm100_bf16_silu"
    assert k90.moe_down_sm90_ws_kernel(hl.bf16, "sm_90a").trace(**k90.sm90_consts(128)).name \
        == "moe_down_sm90_ws_bf16"
    with pytest.raises(ValueError, match="sm_90a or sm_100a, not sm_80"):
        k90.moe_down_sm90_kernel(hl.bf16, "sm_80")


@pytest.mark.nvrtc
@pytest.mark.parametrize("bm", [16, 128])
def test_compiles_for_sm100_with_tcgen05_and_no_spills(bm: int) -> None:
    from hexlayout.runtime import build

    consts = k90.sm90_consts(bm)
    ws = bm == 128
    gate_up = k90.moe_gate_up_sm90_ws_kernel if ws else k90.moe_gate_up_sm90_kernel
    down = k90.moe_down_sm90_ws_kernel if ws else k90.moe_down_sm90_kernel
    for b in (build(gate_up(hl.bf16, "silu", "sm_100a"), "sm_100a", **consts, TOPK=8),
              build(down(hl.bf16, "sm_100a"), "sm_100a", **{**consts, "BN": 128 if ws else 64})):
        res = b.compiled.resources
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
        counts = b.compiled.sass_counts()
        for op in ("UTCHMMA", "LDTM"):
            assert any(o.startswith(op) for o in counts), (b.generated.name, op, sorted(counts))
        assert not any(o.startswith(("HGMMA", "HMMA")) for o in counts), sorted(counts)

