"""The sm_90a W4A16 / W8A16 fused MoE (``ops/moe_wna16_kernels_sm90.py``: swap-AB wgmma, the
dequantized weights as the register A operand) through ``hexlayout.ops.moe.wna16`` in the
emulator (``HEXLAYOUT_EMULATE_ARCH=sm_90a``) against the float64 reference of
``test_moe_wna16`` (dequantized from the CHECKPOINT tensors, packed there from the formats'
definitions): AWQ-4, GPTQ-4, GPTQ-8; groups 32 / 64 / 128 / -1; f16 and bf16; T 1 / 3 / 16 / 100;
E 8 / 64; k 1 / 2 / 6 / 8; experts without tokens; half the experts remote; the router weight on the
input; the decode, medium and large-token configs (``wna16_sm90_config``; one warp group: the
weights' offline layout is a 64-row tile's)."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

from hexlayout.ops.moe.wna16 import wna16_sm90_config  # noqa: E402
from test_moe_wna16 import _bound, _run, checkpoint, reference, reference_alignment, routing  # noqa: E402

_LAUNCHED: list[str] = []


@pytest.fixture(autouse=True)
def _emulate_sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    # the alignment kernel has its own tests; a reference alignment keeps the emulated runs short
    monkeypatch.setattr("hexlayout.ops.moe.pipeline.run_moe_align", reference_alignment)
    # record which kernels run (the sm_90a ones, not the mma.sync fallback)
    attention_args = importlib.import_module("hexlayout.ops.host.launch")
    build_for = attention_args.build_for

    def spy(kernel, device, consts):
        _LAUNCHED.append(f"{kernel.name} BM={consts.get('BM')} WG={consts.get('WG')}")
        return build_for(kernel, device, consts)

    monkeypatch.setattr(attention_args, "build_for", spy)
    _LAUNCHED.clear()


CASES = [
    # fmt, bits, group, dtype, T, E, k, act, routing
    ("awq", 4, 32, torch.float16, 16, 8, 2, "silu", "random"),
    ("awq", 4, 128, torch.bfloat16, 1, 64, 8, "gelu", "single"),
    ("gptq", 4, 128, torch.float16, 3, 64, 2, "silu", "random"),
    ("gptq", 8, 32, torch.bfloat16, 100, 8, 1, "silu", "random"),
    ("gptq", 8, -1, torch.float16, 16, 8, 6, "gelu", "one"),
]


def _check(out, want, dtype) -> None:
    assert out.dtype == dtype and out.shape == want.shape
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(dtype) * want.abs().max().item(), (err, want.abs().max().item())


@pytest.mark.parametrize(("fmt", "bits", "group", "dtype", "t", "e", "k", "act", "kind"), CASES)
def test_matches_the_float64_reference_on_sm90(fmt, bits, group, dtype, t, e, k, act, kind) -> None:
    out, want = _run(fmt, bits, group, dtype, t, e, k, act, kind, seed=t * 100 + e + k + 1)
    _check(out, want, dtype)
    assert len(_LAUNCHED) == 2 and all("_sm90_" in n for n in _LAUNCHED), _LAUNCHED


def test_expert_map_with_half_the_experts_remote_and_ragged_sizes() -> None:
    # H = 160, I = 96: not multiples of a block's 64 columns (the last block half empty)
    kw = {"seed": 17, "emap_half": True, "h": 160, "i": 96}
    out, want = _run("awq", 4, 32, torch.float16, 16, 8, 2, "silu", "random", **kw)
    _check(out, want, torch.float16)


def test_router_weight_on_input() -> None:
    out, want = _run("gptq", 4, 32, torch.bfloat16, 16, 8, 1, "gelu", "random", seed=19, on_input=True)
    _check(out, want, torch.bfloat16)


@pytest.mark.parametrize(
    ("t", "k", "h", "i", "bm", "wg13", "wg2"),
    [
        (100, 2, 64, 64, 32, 1, 1),  # medium: 50 rows per expert on average
        # large-token: BM 64 on one warp group (the weights' offline layout is the one of a
        # 64-row tile: two warp groups would copy 128-row tiles, another storage order)
        (160, 2, 128, 128, 64, 1, 1),
        (128, 2, 64, 128, 64, 1, 1),
    ],
)
def test_medium_and_large_token_configs(t, k, h, i, bm, wg13, wg2) -> None:
    e = 4  # routing "random" uses the first half: 2 experts with tokens, 2 without
    out, want = _run("awq", 4, 64, torch.bfloat16, t, e, k, "silu", "random", seed=t + k, h=h, i=i)
    _check(out, want, torch.bfloat16)
    assert wna16_sm90_config(t * k, e, i) == {"BM": bm, "WG": wg13}
    assert _LAUNCHED == [
        f"moe_wna16_gate_up_sm90_bf16_w4_k64 BM={bm} WG={wg13}",
        f"moe_wna16_down_sm90_bf16_w4_k64 BM={bm} WG={wg2}",
    ], _LAUNCHED


def test_configs_from_the_average_rows_per_expert() -> None:
    assert wna16_sm90_config(8, 64, 1024) == {"BM": 16, "WG": 1}  # decode
    assert wna16_sm90_config(31 * 8, 8, 1024) == {"BM": 16, "WG": 1}
    assert wna16_sm90_config(32 * 8, 8, 1024) == {"BM": 32, "WG": 1}
    assert wna16_sm90_config(64 * 8, 8, 1024) == {"BM": 64, "WG": 1}  # large-token: one 64-row tile
    assert wna16_sm90_config(64 * 8, 8, 1000) == {"BM": 64, "WG": 1}


@pytest.mark.parametrize(
    ("fmt", "bits", "group", "dtype", "h", "i", "split"),
    [
        # gate-up K = 384: one unrolled iteration of 4 k-tiles (two groups of 128, each loaded once
        # and shared by its second k-tile) and a tail of 2 (its second k-tile shares the first's
        # group); down K = 128: a tail of 2 in one group, two 64-column tiles per block over H = 384
        ("gptq", 4, 128, torch.float16, 384, 128, 1),
        # split-K 2 of the down GEMM's K = 448 (7 k-tiles): split 0 one whole iteration, split 1 a
        # tail of 3 k-tiles (splits start on whole iterations); per-channel zero points
        ("awq", 4, -1, torch.bfloat16, 64, 448, 2),
    ],
)
def test_the_unrolled_loop_and_its_tails(monkeypatch, fmt, bits, group, dtype, h, i, split) -> None:
    """The decode k loop (``sm90_unroll(16)`` = 4 k-tiles per iteration, one stage of the ring)
    with the tails past it (traced once more, nested): the only sm_90a case with a whole iteration
    and a tail in one block, and with a split of whole iterations."""
    from hexlayout.ops.moe.wna16 import fused_moe_wna16, prepare_wna16
    from hexlayout.ops.moe.wna16_kernels_sm90 import sm90_unroll

    u = sm90_unroll(16)
    kt = max(h, i) // 64
    assert u == 4 and kt > u and kt % u > 1
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", str(split))
    gen = torch.Generator().manual_seed(h + i)
    t, e, k = 3, 2, 1
    ck13, w13 = checkpoint(fmt, bits, e, h, 2 * i, group, dtype, gen)
    ck2, w2 = checkpoint(fmt, bits, e, i, h, group, dtype, gen)
    p13 = prepare_wna16(*ck13, quant_format=fmt, bits=bits, group_size=group, gate_up=True, arch="sm_90a")
    p2 = prepare_wna16(*ck2, quant_format=fmt, bits=bits, group_size=group, arch="sm_90a")
    x = torch.randn(t, h, generator=gen).to(dtype)
    ids = routing("random", t, e, k, gen)
    tw = torch.rand(t, k, generator=gen)
    out = fused_moe_wna16(x, p13, p2, tw, ids)
    _check(out, reference(x, w13, w2, tw, ids, "silu", False, None), dtype)
    assert sum("_sm90_" in n for n in _LAUNCHED) == 2, _LAUNCHED
    assert all(n.endswith("WG=1") for n in _LAUNCHED if "_sm90_" in n), _LAUNCHED
