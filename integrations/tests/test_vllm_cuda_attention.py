"""The CUDA attention backend (``CUSTOM``, :mod:`hexlayout.integrations.vllm.cuda_attention`) on
CPU tensors in the emulator: a mixed prefill / decode batch through the metadata builder,
``do_kv_cache_update`` and ``forward`` against a float64 reference, the profile run, the
selector's view of the backend, and ``register()`` on a (faked) CUDA device registering it as
``AttentionBackendEnum.CUSTOM``.
"""

from __future__ import annotations

import json
import math

import hexlayout.integrations.vllm as plugin
import pytest
import torch
from hexlayout.integrations.vllm import config
from hexlayout.integrations.vllm.cuda_attention import (
    HexlayoutAttentionUnsupported,
    HexlayoutCUDAAttentionBackend,
    HexlayoutCUDAAttentionImpl,
)
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata
from vllm.v1.attention.backends.registry import AttentionBackendEnum

H, KVH, D, BS, NB = 4, 2, 64, 16, 12
BACKEND_PATH = "hexlayout.integrations.vllm.cuda_attention.HexlayoutCUDAAttentionBackend"


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


class Layer(torch.nn.Module):
    layer_name = "model.layers.0.self_attn.attn"


def make_cache(gen: torch.Generator) -> torch.Tensor:
    """A layer's cache as vLLM's CUDA build hands it: the logical ``[NB, KVH, BS, 2*D]`` view of
    a token-major ``[NB, BS, KVH, 2*D]`` allocation, filled with random old keys / values."""
    phys = torch.randn(NB, BS, KVH, 2 * D, generator=gen).to(torch.bfloat16)
    return phys.transpose(1, 2)


def reference(q, cache, block_table, qlens, klens, scale, window, softcap, sinks=None):
    """float64 causal (bottom-right) attention of each sequence over its cached keys (``sinks``:
    one logit per head joining the softmax denominator)."""
    kv = cache.transpose(1, 2).double()  # [NB, BS, KVH, 2D]
    outs = []
    start = 0
    for b, (nq, nk) in enumerate(zip(qlens, klens)):
        blocks = block_table[b, : math.ceil(nk / BS)]
        rows = kv[blocks].reshape(-1, KVH, 2 * D)[:nk]
        k, v = rows[..., :D], rows[..., D:]
        k = k.repeat_interleave(H // KVH, dim=1)
        v = v.repeat_interleave(H // KVH, dim=1)
        qb = q[start : start + nq].double()
        s = torch.einsum("qhd,khd->hqk", qb, k) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(nq)[:, None] + (nk - nq)
        j = torch.arange(nk)[None, :]
        mask = j > i
        if window >= 0:
            mask |= j < i - window
        s = s.masked_fill(mask, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.double()[:, None, None].expand(-1, nq, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :nk]
        outs.append(torch.einsum("hqk,khd->qhd", p, v))
        start += nq
    return torch.cat(outs)


def impl(sliding_window: int | None = None, softcap: float | None = None) -> HexlayoutCUDAAttentionImpl:
    return HexlayoutCUDAAttentionImpl(
        num_heads=H,
        head_size=D,
        scale=D**-0.5,
        num_kv_heads=KVH,
        alibi_slopes=None,
        sliding_window=sliding_window,
        kv_cache_dtype="auto",
        logits_soft_cap=softcap,
    )


@pytest.mark.parametrize("sliding_window,softcap", [(None, None), (9, 30.0)])
def test_mixed_batch_matches_float64(
    sliding_window: int | None, softcap: float | None, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("HEXLAYOUT_VLLM_TRACE", str(tmp_path))
    gen = torch.Generator().manual_seed(14)
    # Sequences: a decode (1 new token of 21), a prefill from scratch (19 of 19), a decode
    # (1 of 40), a chunked prefill (7 new of 30); 3 padding tokens after them.
    qlens, klens = [1, 19, 1, 7], [21, 19, 40, 30]
    n = sum(qlens)
    pad = 3
    perm = torch.randperm(NB, generator=gen)
    tables, used = [], 0
    for k in klens:
        nb = math.ceil(k / BS)
        tables.append(perm[used : used + nb].tolist())
        used += nb
    width = max(map(len, tables))
    block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    slots = []
    for b, (nq, nk) in enumerate(zip(qlens, klens)):
        for pos in range(nk - nq, nk):
            slots.append(tables[b][pos // BS] * BS + pos % BS)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)  # vLLM's slot mapping is unpadded
    qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    cm = CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(klens, dtype=torch.int32),
        num_reqs=len(qlens),
        num_actual_tokens=n,
        max_query_len=max(qlens),
        max_seq_len=max(klens),
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
    )
    builder = HexlayoutCUDAAttentionBackend.get_builder_cls()(None, ["l0"], None, torch.device("cpu"))
    md = builder.build(0, cm)

    cache = make_cache(gen)
    old = cache.clone()
    query = torch.randn(n + pad, H, D, generator=gen).to(torch.bfloat16)
    key = torch.randn(n + pad, KVH, D, generator=gen).to(torch.bfloat16)
    value = torch.randn(n + pad, KVH, D, generator=gen).to(torch.bfloat16)
    output = torch.full((n + pad, H, D), 7.0, dtype=torch.bfloat16)

    attn = impl(sliding_window, softcap)
    layer = Layer()
    attn.do_kv_cache_update(layer, key, value, cache, md.slot_mapping)
    # The cache: the new rows at their slots, every other row untouched.
    expect = old.transpose(1, 2).clone()  # [NB, BS, KVH, 2D]
    for t, s in enumerate(slots):
        expect[s // BS, s % BS, :, :D] = key[t]
        expect[s // BS, s % BS, :, D:] = value[t]
    assert torch.equal(cache.transpose(1, 2), expect)

    got = attn.forward(layer, query, key, value, cache, md, output)
    assert got is output
    window = (sliding_window or 0) - 1
    ref = reference(query[:n], cache, block_table, qlens, klens, D**-0.5, window, softcap or 0.0)
    err = (output[:n].double() - ref).abs().max().item()
    assert err < 2e-2, err  # bf16 output: half an ulp at |x| < 4 is 2^-7
    assert torch.all(output[n:] == 7.0)  # padding rows untouched

    lines = [json.loads(x) for f in tmp_path.iterdir() for x in f.read_text().splitlines()]
    by_kernel = {x["kernel"]: x["shapes"] for x in lines}
    decode, prefill = by_kernel["attention_decode"], by_kernel["attention_prefill"]
    assert (decode["num_seqs"], decode["num_tokens"], decode["max_seqlen_k"]) == (2, 2, 40)
    assert (prefill["num_seqs"], prefill["num_tokens"], prefill["max_seqlen_k"]) == (2, 26, 30)
    assert (prefill["num_heads"], prefill["num_kv_heads"], prefill["head_size"], prefill["block_size"]) == (
        H, KVH, D, BS
    )


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_cache_and_sinks_match_float64(kv_cache_dtype: str) -> None:
    """An FP8 cache (uint8, as vLLM allocates it) written by ``do_kv_cache_update`` with the
    layer's ``_k_scale`` / ``_v_scale`` and read by ``forward``, with attention sinks (bf16, as
    gpt-oss loads them): against float64 attention over the dequantized cache."""
    fp8 = torch.float8_e5m2 if kv_cache_dtype == "fp8_e5m2" else torch.float8_e4m3fn
    gen = torch.Generator().manual_seed(3)
    qlens, klens = [1, 5], [21, 5]
    n = sum(qlens)
    block_table = torch.tensor([[4, 7], [2, 0]], dtype=torch.int32)
    slots = [7 * BS + 4] + [2 * BS + i for i in range(5)]
    qsl = torch.tensor([0, 1, 6], dtype=torch.int32)
    cm = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=torch.tensor(klens, dtype=torch.int32),
        num_reqs=2, num_actual_tokens=n, max_query_len=5, max_seq_len=21, block_table_tensor=block_table,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
    )
    md = HexlayoutCUDAAttentionBackend.get_builder_cls()(None, ["l0"], None, torch.device("cpu")).build(0, cm)
    old = torch.randn(NB, BS, KVH, 2 * D, generator=gen).to(fp8)
    cache = old.view(torch.uint8).clone().transpose(1, 2)          # logical [NB, KVH, BS, 2D] bytes
    query = torch.randn(n, H, D, generator=gen).to(torch.bfloat16)
    key = torch.randn(n, KVH, D, generator=gen).to(torch.bfloat16)
    value = torch.randn(n, KVH, D, generator=gen).to(torch.bfloat16)
    sinks = (torch.randn(H, generator=gen) * 2).to(torch.bfloat16)
    attn = HexlayoutCUDAAttentionImpl(H, D, D**-0.5, KVH, None, None, kv_cache_dtype, sinks=sinks)
    layer = Layer()
    layer._k_scale, layer._v_scale = torch.tensor(0.5), torch.tensor(0.25)
    attn.do_kv_cache_update(layer, key, value, cache, md.slot_mapping)
    output = torch.zeros(n, H, D, dtype=torch.bfloat16)
    attn.forward(layer, query, key, value, cache, md, output)
    deq = cache.view(fp8).double()
    deq[..., :D] *= 0.5
    deq[..., D:] *= 0.25
    for t, s in enumerate(slots):                                   # the new rows: fp8(x / scale)
        got = cache[s // BS, :, s % BS, :D].view(fp8).double()
        assert torch.equal(got, (key[t].float() / 0.5).to(fp8).double())
    ref = reference(query, deq, block_table, qlens, klens, D**-0.5, -1, 0.0, sinks.float())
    err = (output.double() - ref).abs().max().item()
    assert err < 2e-2, err


def test_profile_run_writes_zeros() -> None:
    output = torch.full((5, H, D), 3.0, dtype=torch.bfloat16)
    cache = make_cache(torch.Generator().manual_seed(1))
    x = torch.randn(5, H, D).to(torch.bfloat16)
    impl().forward(Layer(), x, x[:, :KVH], x[:, :KVH], cache, None, output)
    assert torch.all(output == 0)


def test_unsupported_layers_are_clear_errors() -> None:
    with pytest.raises(HexlayoutAttentionUnsupported, match="ALiBi slopes"):
        HexlayoutCUDAAttentionImpl(H, D, 0.1, KVH, [0.5] * H, None, "auto")
    with pytest.raises(HexlayoutAttentionUnsupported, match="head size 72 with an FP8 KV cache"):
        HexlayoutCUDAAttentionImpl(H, 72, 0.1, KVH, None, None, "fp8")
    with pytest.raises(HexlayoutAttentionUnsupported, match="KV cache dtype fp8_inc"):
        HexlayoutCUDAAttentionImpl(H, D, 0.1, KVH, None, None, "fp8_inc")
    with pytest.raises(HexlayoutAttentionUnsupported, match="encoder_only attention"):
        HexlayoutCUDAAttentionImpl(H, D, 0.1, KVH, None, None, "auto", attn_type=AttentionType.ENCODER_ONLY)


def test_selector_view() -> None:
    """What vLLM's CUDA selector checks (``validate_configuration``)."""
    from vllm.platforms.interface import DeviceCapability

    def reasons(**kw):
        args = dict(
            head_size=D, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=False,
            has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
            device_capability=DeviceCapability(9, 0), attn_type=AttentionType.DECODER,
        )
        return HexlayoutCUDAAttentionBackend.validate_configuration(**{**args, **kw})

    assert reasons() == []
    assert reasons(has_sliding_window=True, device_capability=DeviceCapability(8, 9)) == []
    assert reasons(dtype=torch.float32)
    assert reasons(head_size=260)
    assert reasons(kv_cache_dtype="fp8") == reasons(kv_cache_dtype="fp8_e5m2") == []
    assert reasons(kv_cache_dtype="fp8", head_size=72)
    assert reasons(head_size=72) == []
    assert reasons(block_size=8)
    assert reasons(has_sink=True) == []
    assert reasons(device_capability=DeviceCapability(10, 0)) == []    # B200: the mma.sync kernels
    assert reasons(device_capability=DeviceCapability(12, 0))
    assert reasons(attn_type=AttentionType.ENCODER_ONLY)


def test_register_on_cuda_selects_custom(monkeypatch: pytest.MonkeyPatch) -> None:
    """register() with the plugin's platform probe answering "CUDA 9.0": CUSTOM is hexlayout's
    backend (the CPU_ATTN entry is left alone)."""
    monkeypatch.setenv("HEXLAYOUT_VLLM", "attention")
    monkeypatch.setattr(config, "vllm_platform", lambda: ("cuda", (9, 0)))
    monkeypatch.setattr(plugin, "_STATE", None)
    cpu_before = AttentionBackendEnum.CPU_ATTN.get_path()
    try:
        plugin.register()
        assert AttentionBackendEnum.CUSTOM.get_path() == BACKEND_PATH
        assert AttentionBackendEnum.CUSTOM.get_class() is HexlayoutCUDAAttentionBackend
        assert AttentionBackendEnum.CPU_ATTN.get_path() == cpu_before
        mla = ("MultiHeadLatentAttentionWrapper -> hexlayout.integrations.vllm.mla.HexlayoutMLAWrapper "
               "(logs only)")
        assert plugin.registered()[:2] == (mla, f"attention backend CUSTOM -> {BACKEND_PATH} (select it with "
                                           "attention_backend=CUSTOM)")
    finally:
        AttentionBackendEnum.CUSTOM.clear_override()


def test_register_on_unsupported_cuda_device_keeps_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_VLLM", "attention")
    monkeypatch.setattr(config, "vllm_platform", lambda: ("cuda", (7, 5)))
    monkeypatch.setattr(plugin, "_STATE", None)
    plugin.register()
    assert plugin.registered() == ()
    assert not AttentionBackendEnum.CUSTOM.is_overridden()


def test_cpu_backend_serves_sinks_and_fp8_caches() -> None:
    """The CPU backend's (``CPU_ATTN``) reasons to keep vLLM's kernels: sinks and FP8 caches are
    served now; an FP8 cache with a head size not a multiple of 16 is not."""
    from types import SimpleNamespace

    from hexlayout.integrations.vllm.attention import unsupported_reason

    def impl(**kw):
        base = dict(attn_type=AttentionType.DECODER, alibi_slopes=None, sinks=torch.zeros(H),
                    is_fp8_kv_cache=False, kv_cache_dtype="auto", head_size=D)
        return SimpleNamespace(**{**base, **kw})

    assert unsupported_reason(impl(), torch.bfloat16) is None
    assert unsupported_reason(impl(is_fp8_kv_cache=True, kv_cache_dtype="fp8_e5m2"), torch.bfloat16) is None
    assert "multiples of 16" in unsupported_reason(
        impl(is_fp8_kv_cache=True, kv_cache_dtype="fp8", head_size=72), torch.bfloat16
    )
    assert "ALiBi" in unsupported_reason(impl(alibi_slopes=torch.ones(H)), torch.bfloat16)


def decode_batch(klens: list[int], tables: list[list[int]]) -> CommonAttentionMetadata:
    """A uniform decode batch (one new token per sequence) as vLLM's runner builds it."""
    qsl = torch.arange(len(klens) + 1, dtype=torch.int32)
    width = max(map(len, tables))
    slots = [t[(k - 1) // BS] * BS + (k - 1) % BS for t, k in zip(tables, klens)]
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=torch.tensor(klens, dtype=torch.int32),
        num_reqs=len(klens), num_actual_tokens=len(klens), max_query_len=1, max_seq_len=max(klens),
        block_table_tensor=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
    )


def test_decode_graph_captured_once_replays_at_other_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full CUDA graphs of decode batches, in the emulator: vLLM's eager warm-up of the capture
    size builds every kernel; the (mocked) capture then builds nothing; replays with other
    context lengths (a longer and a shorter one, other blocks) give the float64 result, because
    the split count is fixed for the graph (not chosen from ``max_seq_len``) and the kernels
    read the lengths from the batch's tensors."""
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode

    from hexlayout.runtime import clear_builds, launch_log, mock_capture

    backend_cls = HexlayoutCUDAAttentionBackend
    assert backend_cls.get_builder_cls()._cudagraph_support.name == "UNIFORM_BATCH"
    cfg = SimpleNamespace(compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
                                                             max_cudagraph_capture_size=8),
                          model_config=SimpleNamespace(max_model_len=2048))
    builder = backend_cls.get_builder_cls()(None, ["l0"], cfg, torch.device("cpu"))
    gen = torch.Generator().manual_seed(21)
    attn, layer = impl(), Layer()
    clear_builds()
    for step, klens in enumerate(([5, 33], [70, 2], [17, 80])):       # warm-up, capture, replays
        perm = torch.randperm(NB, generator=gen).tolist()
        tables = [perm[:5], perm[5:10]]
        md = builder.build(0, decode_batch(klens, tables))
        assert md.num_splits == 2                                      # 2048 keys: 2 splits, always
        cache = make_cache(gen)
        q = torch.randn(2, H, D, generator=gen).to(torch.bfloat16)
        kv = torch.randn(2, KVH, D, generator=gen).to(torch.bfloat16)
        out = torch.empty(2, H, D, dtype=torch.bfloat16)
        if step == 0:                                                 # eager: builds
            attn.do_kv_cache_update(layer, kv, kv, cache, md.slot_mapping)
            attn.forward(layer, q, kv, kv, cache, md, out)
            continue
        with launch_log() as ran, mock_capture():
            attn.do_kv_cache_update(layer, kv, kv, cache, md.slot_mapping)
            attn.forward(layer, q, kv, kv, cache, md, out)
        assert ran
        ref = reference(q, cache, md.block_table, [1, 1], klens, D**-0.5, -1, 0.0)
        assert (out.double() - ref).abs().max().item() < 2e-2, klens
