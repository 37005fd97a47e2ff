"""The plugin's MoE path and CUDA graphs, in the emulator: ``prebuild_experts`` (run at
``process_weights_after_loading`` for vLLM's capture sizes) builds every kernel the experts
need for those token counts and runs none; afterwards a (mocked) capture of those sizes
builds nothing and computes the float64 result, while a layer that was not warmed up fails
inside the capture with a ``CaptureError`` naming the kernel. On the CPU build vLLM captures
nothing: ``capture_sizes()`` is empty."""

from __future__ import annotations

import types

import pytest
import torch
from hexlayout.integrations.vllm.moe import HexlayoutExperts, capture_sizes, prebuild_experts, run_fused_moe
from test_vllm_sharded_moe import check, reference
from vllm.model_executor.layers.fused_moe.activation import MoEActivation

from hexlayout.runtime import CaptureError, clear_builds, launch_log, mock_capture

H, I, E, K = 128, 64, 4, 2


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv("HEXLAYOUT_VLLM_TRACE", raising=False)


def layer(seed: int) -> types.SimpleNamespace:
    """What ``prebuild_experts`` reads of a vLLM ``RoutedExperts``: bf16 weights, the MoE
    config's top-k, dtype and activation, the global expert count and expert map."""
    g = torch.Generator().manual_seed(seed)
    moe = types.SimpleNamespace(experts_per_token=K, in_dtype=torch.bfloat16, activation=MoEActivation.SILU)
    return types.SimpleNamespace(
        moe_config=moe,
        global_num_experts=E,
        expert_map=None,
        w13_weight=(torch.randn(E, 2 * I, H, generator=g) / H**0.5).to(torch.bfloat16),
        w2_weight=(torch.randn(E, H, I, generator=g) / I**0.5).to(torch.bfloat16),
    )


def experts() -> types.SimpleNamespace:
    """:class:`HexlayoutExperts`' ``expert_weights`` (the part ``prebuild_experts`` calls)."""
    def weights(h, w1, w2):
        return HexlayoutExperts.expert_weights(None, h, w1, w2)

    return types.SimpleNamespace(expert_weights=weights)


def captured_call(lay: types.SimpleNamespace, t: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(t)]).to(torch.int32)
    tw = torch.rand(t, K, generator=g).softmax(-1)
    out = torch.empty(t, H, dtype=torch.bfloat16)
    shapes = {"local_experts": E, "hidden": H, "intermediate": I}
    with launch_log() as ran, mock_capture():
        run_fused_moe("moe", out, x, lay.w13_weight, lay.w2_weight, tw, ids, MoEActivation.SILU, E, None,
                      False, shapes)
    assert ran
    check(out, reference(x, lay.w13_weight, lay.w2_weight, tw, ids, None))


def test_no_capture_on_the_cpu_build() -> None:
    assert capture_sizes() == []


def test_warmed_sizes_capture_without_building() -> None:
    lay = layer(1)
    clear_builds()
    with launch_log() as ran:
        assert prebuild_experts(experts(), lay, sizes=[1, 4]) == [1, 4]
    assert ran == [], "the warm-up ran kernels"
    for t in (1, 4):
        captured_call(lay, t, seed=t)


def test_an_unwarmed_layer_fails_inside_the_capture() -> None:
    lay = layer(2)
    clear_builds()
    with pytest.raises(CaptureError, match=r"kernel moe_\w+ for sm_\d+"):
        captured_call(lay, 1, seed=3)
