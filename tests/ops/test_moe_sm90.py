"""The sm_90a bf16 / f16 fused-MoE kernels (``ops/moe_kernels_sm90.py``: wgmma swap-AB for
decode / medium token counts, the warp-specialized large-token kernels with tokens on the wgmma M
side) through ``hexlayout.ops.fused_moe`` in the emulator (``HEXLAYOUT_EMULATE_ARCH=sm_90a``)
against ``test_moe_op``'s float64 reference and tolerance: random routings (experts with no
token, one token, every token on one expert), T in {1, 3, 16, 100}, E in {8, 64}, k in {1, 2, 8},
bf16 / f16, SiLU / GELU, an expert map with half the experts remote, the router weight on the
input, H and I not multiples of the 64-wide tiles; the config chosen by slots per expert (and the
alignment's block equal to the kernel's row block) is asserted for every case."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers torch.ops.hexlayout.fused_moe
from hexlayout.ops import fused_moe  # noqa: E402
from hexlayout.ops.moe import kernels_sm90 as k90  # noqa: E402
from test_moe_op import close, make, reference  # noqa: E402


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """(kernel name, kernel BM, alignment BM) of every sm_90a GEMM launch."""
    from hexlayout.ops.moe import op as moe
    from hexlayout.ops.moe import pipeline

    seen: list[tuple[str, int, int]] = []
    align = pipeline.run_moe_align

    def spy_align(ids, e, bm, emap):
        seen.append(("align", bm, bm))
        return align(ids, e, bm, emap)

    def spy(name, fn):
        def wrapped(w, run, *rest):
            seen.append((name, k90.sm90_consts(run.cfg["BM"])["BM"], run.cfg["BM"]))
            return fn(w, run, *rest)
        return wrapped

    monkeypatch.setattr(pipeline, "run_moe_align", spy_align)
    monkeypatch.setattr(moe, "run_gate_up_sm90", spy("gate_up", k90.run_gate_up_sm90))
    monkeypatch.setattr(moe, "run_down_sm90", spy("down", k90.run_down_sm90))
    return seen


def _blocks(seen: list[tuple[str, int, int]]) -> set[int]:
    assert [s[0] for s in seen] == ["align", "gate_up", "down"], seen
    assert all(kb == ab for _, kb, ab in seen), seen
    return {s[1] for s in seen}


def test_config_by_slots_per_expert() -> None:
    assert k90.moe_sm90_config(16 * 8, 8)["BM"] == 16            # decode
    assert k90.moe_sm90_config(100 * 2, 8)["BM"] == 32
    assert k90.moe_sm90_config(64 * 8, 8)["BM"] == 64
    assert k90.moe_sm90_config(65 * 8, 8)["BM"] == 128            # prefill: tokens on the M side
    assert k90.moe_sm90_config(4096 * 8, 256)["BM"] == 128        # DeepSeek-V3 prefill
    assert k90.moe_sm90_config(100 * 8, 64)["BM"] == 16


CASES = [  # t, h, i, e, k, dtype, activation, experts used (the rest get no token), block
    (1, 64, 64, 8, 2, torch.float16, "silu", 6, 16),
    (3, 96, 80, 64, 8, torch.bfloat16, "gelu", 40, 16),          # H, I not multiples of 64
    (16, 64, 48, 8, 8, torch.float16, "gelu", 8, 16),
    (100, 72, 64, 8, 4, torch.bfloat16, "silu", 5, 64),           # 50 slots per expert
    (100, 64, 64, 64, 1, torch.float16, "silu", 64, 16),
    (100, 80, 72, 8, 2, torch.bfloat16, "gelu", 4, 32),
]


@pytest.mark.parametrize(("t", "h", "i", "e", "k", "dt", "act", "used", "bm"), CASES)
def test_swap_ab_matches_float64(t, h, i, e, k, dt, act, used, bm, launched) -> None:
    x, w13, w2, tw, ids = make(t, h, i, e, k, dt, seed=t * 7 + k, experts_used=used)
    w13, w2 = w13 * 2, w2 * 2                      # products of magnitude ~1 through the activation
    out = fused_moe(x, w13, w2, tw, ids, activation=act)
    assert out.shape == x.shape and out.dtype == dt
    close(out, reference(x, w13, w2, tw, ids, act), dt)
    assert _blocks(launched) == {bm}


def test_one_token_on_one_expert_and_every_token_on_another(launched) -> None:
    x, w13, w2, tw, _ = make(40, 64, 64, 8, 1, torch.float16, seed=3)
    ids = torch.full((40, 1), 3, dtype=torch.int32)
    ids[17] = 6                                                    # expert 6: one token
    out = torch.ops.hexlayout.fused_moe(x, w13, w2, tw, ids)
    close(out, reference(x, w13, w2, tw, ids), torch.float16)
    assert _blocks(launched) == {16}


def test_expert_map_half_remote_and_router_weight_on_input(launched) -> None:
    x, w13, w2, tw, _ = make(16, 64, 64, 8, 1, torch.bfloat16, seed=5)
    g = torch.Generator().manual_seed(11)
    emap = torch.full((16,), -1, dtype=torch.int32)
    emap[torch.randperm(16, generator=g)[:8]] = torch.randperm(8, generator=g).to(torch.int32)
    ids = torch.randint(0, 16, (16, 1), generator=g, dtype=torch.int32)
    assert (emap[ids.long()] < 0).any() and (emap[ids.long()] >= 0).any()
    out = fused_moe(x, w13, w2, tw, ids, activation="gelu", expert_map=emap, global_num_experts=16,
                    apply_router_weight_on_input=True)
    want = reference(x, w13, w2, tw, ids, "gelu", emap=emap, scale_in=True)
    close(out, want, torch.bfloat16)
    assert (out[(emap[ids.long()] < 0).all(1)] == 0).all()         # tokens with only remote experts: 0
    assert (want - reference(x, w13, w2, tw, ids, "gelu", emap=emap)).abs().max() > 1e-2


LARGE = [  # t, h, i, e, k, dtype, activation, router on input, expert map
    (140, 136, 80, 2, 1, torch.bfloat16, "silu", False, False),   # H: 3 k-tiles, 2 column tiles
    (40, 64, 136, 2, 8, torch.float16, "gelu", False, False),     # I: 3 k-tiles in down
    (300, 64, 64, 2, 1, torch.float16, "gelu", True, True),
]


@pytest.mark.parametrize(("t", "h", "i", "e", "k", "dt", "act", "router", "remote"), LARGE)
def test_large_token_kernels_match_float64(t, h, i, e, k, dt, act, router, remote, launched) -> None:
    x, w13, w2, tw, ids = make(t, h, i, e, k, dt, seed=t + k, experts_used=e)
    emap, gne = None, None
    if remote:                                     # 4 global experts, 2 of them local
        gne = 2 * e
        emap = torch.full((gne,), -1, dtype=torch.int32)
        emap[torch.tensor([3, 0])] = torch.arange(e, dtype=torch.int32)
        ids = torch.randint(0, gne, (t, k), generator=torch.Generator().manual_seed(t), dtype=torch.int32)
        ids[: t // 2] = 3                          # expert 3 (local 0) gets more than 128 slots
    out = fused_moe(x, w13, w2, tw, ids, activation=act, apply_router_weight_on_input=router,
                    expert_map=emap, global_num_experts=gne)
    close(out, reference(x, w13, w2, tw, ids, act, emap=emap, scale_in=router), dt)
    assert _blocks(launched) == {128}
