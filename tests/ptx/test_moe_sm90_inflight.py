"""The pipelined sm_90a mixed-type MoE main loops (a wgmma group in flight across k-tiles,
``ops/moe/blocks.wgmma_pipeline``) executed from the PTX NVRTC made of the printed source, on
several k-tiles: odd and even counts, the 4-stage ring wrapping, ragged K and N, a forced K split
(the IR-mode twins are in ``tests/ops/test_moe_sm90_inflight.py``)."""

from __future__ import annotations

import pytest
import torch

from .test_ops import ptx_runs  # noqa: F401  (fixture)


@pytest.fixture
def ptx90(ptx_runs: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:  # noqa: F811
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    return ptx_runs


@pytest.mark.parametrize("split", [None, "2"])
def test_wna16_several_k_tiles(ptx90: list[str], split: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.ops.test_moe_wna16 import _bound, _run

    if split:
        monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", split)
    # K = 224 (BK 32: 7 k-tiles, the ring of 4 wraps), I = 96 (half a 64-column block; the down's
    # K: 3 k-tiles); split in 2: 4 + 3 and 2 + 1 k-tiles
    out, want = _run("gptq", 4, -1, torch.float16, 3, 4, 2, "silu", "random", seed=5, h=224, i=96)
    assert (out.double() - want).abs().max().item() <= _bound(torch.float16) * want.abs().max().item()
    assert any("wna16_gate_up_sm90" in r for r in ptx90), ptx90
    assert any(r.endswith("_splitk") for r in ptx90) == bool(split), ptx90


@pytest.mark.parametrize("block", [True, False])
def test_fp8_several_k_tiles(ptx90: list[str], block: bool) -> None:
    import hexlayout.ops
    from hexlayout.ops.moe.fp8 import prepare_fp8

    from tests.ops.test_moe_fp8 import check, make, reference

    # K = 640: 5 k-tiles of 128 (odd: the pair loop and its tail), I = 192: the down's last k-tile ragged
    x, w13, s13, w2, s2, tw, ids = make(6, 3, 640, 192, 4, 2, torch.bfloat16, block)
    blk = (128, 128) if block else None
    w13p, w2p = prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk)
    out = hexlayout.ops.fused_moe(x, w13p, w2p, tw, ids, activation="silu")
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, block, "silu"))
    assert any("fp8_gate_up_sm90" in r for r in ptx90), ptx90
