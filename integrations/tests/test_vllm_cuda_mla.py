"""The CUDA MLA backend (``HEXLAYOUT_MLA``, :mod:`hexlayout.integrations.vllm.cuda_mla`) on CPU
tensors in the emulator: a mixed decode / prefill batch with ragged context lengths and a
shuffled block table through vLLM's common MLA metadata builder (the plugin's subclass),
``do_kv_cache_update`` and the decode path ``forward_mqa`` against float64; a decode batch under
a mocked CUDA-graph capture; the fallbacks; the selector's view; and ``register()`` on a (faked)
CUDA device adding ``AttentionBackendEnum.HEXLAYOUT_MLA``.
"""

from __future__ import annotations

import math
import pickle
from types import SimpleNamespace

import hexlayout.integrations.vllm as plugin
import pytest
import torch
from hexlayout.integrations.vllm import config
from hexlayout.integrations.vllm.cuda_mla import (
    HexlayoutCUDAMLABackend,
    HexlayoutCUDAMLAImpl,
    HexlayoutMLADecodeMetadata,
    decode_fallback_reason,
)
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata

H, RANK, ROPE, BS, NB = 4, 512, 64, 16, 10
D = RANK + ROPE
SCALE = 0.07
PATH = "hexlayout.integrations.vllm.cuda_mla.HexlayoutCUDAMLABackend"


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


class Prefill:
    """vLLM's MLA prefill backend as the builder sees it (``clone`` / ``prepare_metadata``)."""

    def clone(self) -> Prefill:
        return self

    def prepare_metadata(self, metadata: object) -> None:
        pass


def vllm_config() -> SimpleNamespace:
    """The parts of vLLM's config the common MLA builder reads: one MLA layer, bf16, no
    parallelism, no speculative decoding."""
    layer = SimpleNamespace(q_lora_rank=None, kv_lora_rank=RANK, qk_nope_head_dim=32, qk_rope_head_dim=ROPE,
                            v_head_dim=32, prefill_backend=Prefill())
    return SimpleNamespace(
        model_config=SimpleNamespace(dtype=torch.bfloat16, max_model_len=256, get_head_size=lambda: D,
                                     get_num_attention_heads=lambda _: H),
        parallel_config=SimpleNamespace(prefill_context_parallel_size=1, decode_context_parallel_size=1,
                                        cp_kv_cache_interleave_size=1),
        compilation_config=SimpleNamespace(static_forward_context={"l0": layer}),
        cache_config=SimpleNamespace(cache_dtype="auto", block_size=BS),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        attention_config=SimpleNamespace(use_prefill_query_quantization=False),
        speculative_config=None,
    )


def builder() -> object:
    spec = SimpleNamespace(block_size=BS)
    return HexlayoutCUDAMLABackend.get_builder_cls()(spec, ["l0"], vllm_config(), torch.device("cpu"))


def impl(kv_cache_dtype: str = "auto", rope: int = ROPE) -> HexlayoutCUDAMLAImpl:
    """A layer's impl as vLLM's MLA layer builds it (inside a default vLLM config)."""
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        return HexlayoutCUDAMLAImpl(H, RANK + rope, SCALE, 1, None, None, kv_cache_dtype, None,
                                    AttentionType.DECODER, None, q_lora_rank=None, kv_lora_rank=RANK,
                                    qk_nope_head_dim=32, qk_rope_head_dim=rope, qk_head_dim=32 + rope,
                                    v_head_dim=32, kv_b_proj=None)


def batch(qlens: list[int], klens: list[int],
          gen: torch.Generator) -> tuple[CommonAttentionMetadata, list[int]]:
    """vLLM's metadata of a batch (requests in order, shuffled blocks) and its new tokens' slots."""
    perm = torch.randperm(NB, generator=gen).tolist()
    tables, used = [], 0
    for k in klens:
        nb = math.ceil(k / BS)
        tables.append(perm[used: used + nb])
        used += nb
    width = max(map(len, tables))
    slots = [tables[b][p // BS] * BS + p % BS for b, (nq, nk) in enumerate(zip(qlens, klens))
             for p in range(nk - nq, nk)]
    qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(klens, dtype=torch.int32)
    cm = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq_lens, num_reqs=len(qlens),
        num_actual_tokens=sum(qlens), max_query_len=max(qlens), max_seq_len=max(klens),
        block_table_tensor=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64), seq_lens_cpu_upper_bound=seq_lens,
    )
    return cm, slots


def reference(q: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
              klens: list[int]) -> torch.Tensor:
    """float64 MQA of each decode request's query ``[H, D]`` over its ``klens[b]`` latent rows."""
    outs = []
    for b, nk in enumerate(klens):
        rows = cache[block_table[b, : math.ceil(nk / BS)].long()].reshape(-1, D)[:nk].double()
        p = torch.softmax(SCALE * q[b].double() @ rows.T, dim=-1)
        outs.append(p @ rows[:, :RANK])
    return torch.stack(outs)


def test_mixed_batch_decode_matches_float64() -> None:
    """Decodes (1 new token of 21, of 40, of 3) and prefills (19 of 19, 7 new of 30): the builder
    puts the decodes' views into the decode metadata; the cache write lands every new row at its
    slot (bit-exact) and touches nothing else; ``forward_mqa`` of the decodes (q as vLLM's
    ``(q_nope, q_pe)`` pair) against float64."""
    gen = torch.Generator().manual_seed(26)
    qlens, klens = [1, 1, 1, 19, 7], [21, 40, 3, 19, 30]
    cm, slots = batch(qlens, klens, gen)
    md = builder().build(0, cm)
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (3, 2, 3)
    dec = md.decode
    assert isinstance(dec, HexlayoutMLADecodeMetadata)
    assert dec.query_start_loc.tolist() == [0, 1, 2, 3]
    assert dec.block_table.data_ptr() == cm.block_table_tensor.data_ptr()      # views, not copies

    attn = impl()
    assert attn.hexlayout_reason is None
    cache = torch.randn(NB, BS, D, generator=gen).to(torch.bfloat16)
    old = cache.clone()
    n = sum(qlens)
    kv_c = torch.randn(n, RANK, generator=gen).to(torch.bfloat16)
    k_pe = torch.randn(n, 1, ROPE, generator=gen).to(torch.bfloat16)
    attn.do_kv_cache_update(kv_c, k_pe, cache, md.slot_mapping, "auto", torch.tensor(1.0))
    expect = old.view(-1, D).clone()
    expect[slots] = torch.cat([kv_c, k_pe[:, 0]], dim=-1)
    assert torch.equal(cache.view(-1, D), expect)

    q = torch.randn(3, H, D, generator=gen).to(torch.bfloat16)
    out, lse = attn.forward_mqa((q[..., :RANK], q[..., RANK:]), cache, md, None)
    assert out.shape == (3, H, RANK) and lse.shape == (3, H)
    err = (out.double() - reference(q, cache, dec.block_table, klens[:3])).abs().max().item()
    assert err < 2e-2, err


def test_decode_graph_capture_builds_nothing_and_replays() -> None:
    """A decode batch: warm-up (eager) builds the kernels, a (mocked) capture builds none and
    syncs nothing; another step's lengths and blocks through the same code match float64."""
    from hexlayout.runtime import clear_builds, launch_log, mock_capture

    assert HexlayoutCUDAMLABackend.get_builder_cls()._cudagraph_support.name == "UNIFORM_BATCH"
    gen = torch.Generator().manual_seed(5)
    bld, attn = builder(), impl()
    clear_builds()
    for step, klens in enumerate(([9, 33], [50, 2])):
        cm, _ = batch([1, 1], klens, gen)
        md = bld.build(0, cm)
        cache = torch.randn(NB, BS, D, generator=gen).to(torch.bfloat16)
        q = torch.randn(2, H, D, generator=gen).to(torch.bfloat16)
        if step == 0:
            attn.forward_mqa(q, cache, md, None)
            continue
        with launch_log() as ran, mock_capture():
            out, _ = attn.forward_mqa(q, cache, md, None)
        assert ran
        assert (out.double() - reference(q, cache, md.decode.block_table, klens)).abs().max().item() < 2e-2


def test_fp8_cache_decode_matches_float64() -> None:
    """``kv_cache_dtype="fp8"``: the cache write stores ``fp8(x / k_scale)`` into vLLM's uint8
    cache, ``forward_mqa`` reads it as vLLM hands it (viewed as float8_e4m3fn) with the layer's
    ``_k_scale``: float64 attention over the dequantized rows."""
    gen = torch.Generator().manual_seed(8)
    klens = [21, 6]
    cm, slots = batch([1, 1], klens, gen)
    md = builder().build(0, cm)
    attn = impl("fp8")
    cache = torch.zeros(NB, BS, D, dtype=torch.uint8)
    tables = md.decode.block_table.tolist()
    ctx = torch.tensor([tables[b][p // BS] * BS + p % BS for b, k in enumerate(klens) for p in range(k)])
    rows = torch.randn(ctx.shape[0], D, generator=gen).to(torch.bfloat16)
    scale = torch.tensor([0.25])
    attn.do_kv_cache_update(rows[:, :RANK], rows[:, None, RANK:], cache, ctx, "fp8", scale)  # the contexts
    f8 = cache.view(torch.float8_e4m3fn)
    assert torch.equal(f8.view(-1, D)[ctx].float(), (rows.float() / 0.25).to(torch.float8_e4m3fn).float())
    q = torch.randn(2, H, D, generator=gen).to(torch.bfloat16)
    out, _ = attn.forward_mqa(q, f8, md, SimpleNamespace(_k_scale=scale))
    ref = reference(q, f8.double() * 0.25, md.decode.block_table, klens)
    assert len(slots) == 2 and (out.double() - ref).abs().max().item() < 2e-2


def test_fallbacks_name_their_reason() -> None:
    """What runs vLLM's Triton MLA instead, and why (per layer at construction, per batch from
    shapes and flags)."""
    assert impl("fp8").hexlayout_reason is None
    assert "KV cache dtype fp8_ds_mla" in impl("fp8_ds_mla").hexlayout_reason
    assert "rope 48" in impl(rope=48).hexlayout_reason
    attn = impl()
    dec = HexlayoutMLADecodeMetadata(block_table=torch.zeros(2, 1, dtype=torch.int32),
                                     seq_lens=torch.ones(2, dtype=torch.int32), dcp_tot_seq_lens=None,
                                     query_start_loc=torch.arange(3, dtype=torch.int32))
    md = SimpleNamespace(decode=dec, causal=True)
    q = torch.zeros(2, H, D, dtype=torch.bfloat16)
    assert decode_fallback_reason(attn, q, md) is None
    assert "speculative" in decode_fallback_reason(attn, torch.zeros(4, H, D, dtype=torch.bfloat16), md)
    assert "float32" in decode_fallback_reason(attn, q.float(), md)
    assert "non-causal" in decode_fallback_reason(attn, q, SimpleNamespace(decode=dec, causal=False))


def test_selector_view() -> None:
    """What vLLM's CUDA selector checks (``validate_configuration``): MLA layers only, sm_80 to
    sm_90 and sm_100, Triton MLA's dtypes and block sizes."""
    from vllm.platforms.interface import DeviceCapability

    def reasons(**kw):
        args = dict(head_size=D, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=True,
                    has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
                    device_capability=DeviceCapability(9, 0), attn_type=AttentionType.DECODER)
        return HexlayoutCUDAMLABackend.validate_configuration(**{**args, **kw})

    assert reasons() == [] and reasons(device_capability=DeviceCapability(8, 0)) == []
    assert reasons(device_capability=DeviceCapability(10, 0)) == []    # B200: the mma.sync kernel
    assert reasons(use_mla=False) and reasons(device_capability=DeviceCapability(12, 0))
    assert reasons(block_size=8) and reasons(dtype=torch.float32)


def test_register_on_cuda_adds_hexlayout_mla(monkeypatch: pytest.MonkeyPatch) -> None:
    """register() with the platform probe answering "CUDA 8.0": ``AttentionBackendEnum.HEXLAYOUT_MLA``
    resolves to the backend, names it for ``attention_backend``, and pickles to itself."""
    from vllm.config import AttentionConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    monkeypatch.setenv("HEXLAYOUT_VLLM", "attention")
    monkeypatch.setattr(config, "vllm_platform", lambda: ("cuda", (8, 0)))
    monkeypatch.setattr(plugin, "_STATE", None)
    try:
        plugin.register()
        member = AttentionBackendEnum["HEXLAYOUT_MLA"]
        assert member.get_path() == PATH and member.get_class() is HexlayoutCUDAMLABackend
        assert AttentionConfig(backend="HEXLAYOUT_MLA").backend is member
        assert pickle.loads(pickle.dumps(member)) is member
        assert plugin.registered()[-1] == (f"attention backend HEXLAYOUT_MLA -> {PATH} (select it with "
                                           "attention_backend=HEXLAYOUT_MLA)")
    finally:
        AttentionBackendEnum.CUSTOM.clear_override()
