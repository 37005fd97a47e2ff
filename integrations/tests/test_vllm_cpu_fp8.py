"""The CPU attention backend with an FP8 KV cache on a host where vLLM's own CPU kernels cannot
read one (x86 without AVX-512 or AMX): vLLM's metadata builder raises there, the plugin's builds
the CPU scheduler metadata as for a cache in the model's dtype (hexlayout's kernels do not read
it) and keeps the real config; a layer the plugin cannot serve raises with its name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hexlayout.integrations.vllm import attention
from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder


def vllm_config(cache_dtype: str) -> SimpleNamespace:
    return SimpleNamespace(cache_config=SimpleNamespace(cache_dtype=cache_dtype), model_config="model")


@pytest.mark.parametrize(("cache_dtype", "reads_fp8", "built_with"),
                         [("fp8", False, "auto"), ("fp8_e5m2", False, "auto"), ("fp8", True, "fp8"),
                          ("auto", False, "auto")])
def test_builder_builds_for_the_model_dtype_where_vllm_cannot_read_fp8(
    monkeypatch: pytest.MonkeyPatch, cache_dtype: str, reads_fp8: bool, built_with: str
) -> None:
    seen = {}

    def parent_init(self, spec, layer_names, config, device):
        seen["dtype"] = config.cache_config.cache_dtype
        self.vllm_config = config

    monkeypatch.setattr(CPUAttentionMetadataBuilder, "__init__", parent_init)
    monkeypatch.setattr(attention, "vllm_reads_fp8_cache", lambda: reads_fp8)
    config = vllm_config(cache_dtype)
    builder = attention.HexlayoutCPUAttentionMetadataBuilder("spec", ["l0"], config, torch.device("cpu"))
    assert seen["dtype"] == built_with
    assert builder.vllm_config is config and config.cache_config.cache_dtype == cache_dtype
    backend = attention.HexlayoutCPUAttentionBackend
    assert backend.get_builder_cls() is attention.HexlayoutCPUAttentionMetadataBuilder


def test_an_unserved_layer_with_an_fp8_cache_raises_where_vllm_cannot_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(attention, "vllm_reads_fp8_cache", lambda: False)
    reason = "block size 16 (hexlayout: 32, 64, 128)"
    impl = SimpleNamespace(_hexlayout_checked=False, hexlayout_reason=reason, is_fp8_kv_cache=True,
                           kv_cache_dtype="fp8")
    layer = SimpleNamespace(layer_name="model.layers.3.self_attn.attn")
    with pytest.raises(NotImplementedError, match=r"model\.layers\.3\.self_attn\.attn: kv_cache_dtype 'fp8'"):
        attention.HexlayoutCPUAttentionImpl._hexlayout(impl, layer, torch.empty(1, 1, 16, 128))
