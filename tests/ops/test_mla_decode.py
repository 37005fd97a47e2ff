"""``hexlayout.ops.mla_decode`` and ``mla_reshape_and_cache`` (MLA, DeepSeek-V2/V3/R1) in the
emulator against a float64 reference written here: ragged contexts through shuffled block
tables, a sequence with no keys, two causal queries per sequence (speculative tokens), NaN in
the cache slots no sequence uses, f16 / bf16, sm_80 and sm_90a, DeepSeek's 512 + 64 latent; the
latent cache written by ``mla_reshape_and_cache`` (negative slots skipped, vLLM's 4-D cache);
an FP8 (E4M3) cache with a scale written by ``mla_reshape_and_cache`` and read by ``mla_decode``;
the fake path; bad arguments named; NVRTC builds without spills."""

from __future__ import annotations

import math

import pytest
import torch
from hexlayout.ops import mla_decode, mla_reshape_and_cache
from hexlayout.ops.attention.mla import mla_decode_consts
from hexlayout.ops.attention.mla_kernels import mla_decode_kernel

from hexlayout.lang import bf16, e4m3
from hexlayout.runtime import build
from hexlayout.runtime.args import ArgumentError


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def reference(q, cache, cu, used, bt, rank, scale) -> torch.Tensor:
    """float64: out[i, h] = sum_j softmax_j(scale q[i, h] . kv_j) kv_j[:rank] over the keys the
    query sees (causal, bottom-right aligned); 0 where it sees none."""
    out = torch.zeros(q.shape[0], q.shape[1], rank, dtype=torch.float64)
    bs = cache.shape[1]
    for s in range(used.shape[0]):
        q0, q1, n = int(cu[s]), int(cu[s + 1]), int(used[s])
        if n == 0:
            continue
        rows = torch.stack([cache[int(bt[s, j // bs]), j % bs] for j in range(n)]).double()
        for i in range(q0, q1):
            vis = n - (q1 - q0) + (i - q0) + 1
            if vis > 0:
                p = torch.softmax((q[i].double() @ rows[:vis].T) * scale, -1)
                out[i] = p @ rows[:vis, :rank]
    return out


def case(lens: list[int], nq: list[int], heads: int, rank: int, rope: int, bs: int, dt: torch.dtype,
         seed: int) -> tuple[torch.Tensor, ...]:
    """Caches of random rows (NaN in every slot no sequence uses), a shuffled block table."""
    g = torch.Generator().manual_seed(seed)
    per = max(-(-n // bs) for n in lens) + 1
    nb = len(lens) * per + 2
    cache = torch.full((nb, bs, rank + rope), float("nan"), dtype=dt)
    bt = torch.randperm(nb, generator=g)[: len(lens) * per].view(len(lens), per).to(torch.int32)
    for s, n in enumerate(lens):
        for j in range(n):
            cache[int(bt[s, j // bs]), j % bs] = torch.randn(rank + rope, generator=g).to(dt)
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(nq), 0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), heads, rank + rope, generator=g).to(dt)
    return q, cache, cu, torch.tensor(lens, dtype=torch.int32), bt


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_ragged_contexts_match_float64(arch: str, dt: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    lens, nq = [5, 37, 0, 16], [1, 2, 1, 1]
    seed = len(arch) + (dt == torch.float16)
    q, cache, cu, used, bt = case(lens, nq, heads=4, rank=128, rope=32, bs=16, dt=dt, seed=seed)
    scale = 0.7 / math.sqrt(160)
    out, lse = mla_decode(q, cache, cu, used, bt, max(nq), max(lens), softmax_scale=scale, kv_lora_rank=128,
                          return_lse=True)
    ref = reference(q, cache, cu, used, bt, 128, scale)
    assert out.shape == (q.shape[0], 4, 128) and out.dtype == dt and lse.shape == (4, q.shape[0])
    err = (out.double() - ref).abs().max().item()
    assert err <= 1e-2 * ref.abs().max().item(), err
    no_keys = int(cu[2])                                  # sequence 2 has no key: 0 and -inf
    assert out[no_keys].abs().max() == 0 and torch.isneginf(lse[:, no_keys]).all()


def test_deepseek_latent_512_rope_64() -> None:
    lens, nq = [3, 70], [1, 1]
    q, cache, cu, used, bt = case(lens, nq, heads=16, rank=512, rope=64, bs=64, dt=torch.bfloat16, seed=5)
    scale = 1 / math.sqrt(192)                            # DeepSeek: 1 / sqrt(qk_nope + qk_rope)
    out = mla_decode(q, cache.unsqueeze(2), cu, used, bt, 1, 70, softmax_scale=scale)   # vLLM's 4-D cache
    ref = reference(q, cache, cu, used, bt, 512, scale)
    assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()


def test_the_latent_cache_writer_then_decode() -> None:
    g = torch.Generator().manual_seed(9)
    rank, rope, bs, t = 128, 32, 16, 20
    cache = torch.full((4, bs, 1, rank + rope), float("nan"), dtype=torch.bfloat16)
    kv_c = torch.randn(t, rank, generator=g).to(torch.bfloat16)
    k_pe = torch.randn(t, 2 * rope, generator=g).to(torch.bfloat16)[:, ::2]    # a strided view
    # keys 0..15 at block 3, 16..18 at block 0 (the block table below); token 16 is padding
    slots = torch.tensor([*range(3 * bs, 4 * bs), -1, 0, 1, 2], dtype=torch.int64)
    mla_reshape_and_cache(kv_c, k_pe, cache, slots)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(cache[s // bs, s % bs, 0], torch.cat([kv_c[i], k_pe[i]]))
    assert torch.isnan(cache[0, 3]).all() and torch.isnan(cache[1]).all()   # untouched slots
    bt = torch.tensor([[3, 0]], dtype=torch.int32)
    used = torch.tensor([19], dtype=torch.int32)
    q = torch.randn(1, 2, rank + rope, generator=g).to(torch.bfloat16)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    out = mla_decode(q, cache, cu, used, bt, 1, 19, kv_lora_rank=rank)
    ref = reference(q, cache[:, :, 0], cu, used, bt, rank, 1 / math.sqrt(rank + rope))
    assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()


def test_fp8_cache_written_and_read_with_its_scale() -> None:
    """``kv_cache_dtype="fp8"`` (E4M3 in a uint8 cache, as vLLM allocates it) with vLLM's
    one-element scale: the writer stores ``fp8(x / k_scale)`` bit for bit, the decode matches
    float64 attention over ``k_scale * fp8`` rows (two ragged sequences, a shuffled table)."""
    g = torch.Generator().manual_seed(3)
    rank, rope, bs, lens = 128, 32, 16, [19, 5]
    bt = torch.tensor([[4, 1], [2, 0]], dtype=torch.int32)
    slots = [int(bt[s, j // bs]) * bs + j % bs for s, n in enumerate(lens) for j in range(n)]
    cache = torch.zeros(6, bs, rank + rope, dtype=torch.uint8)
    kv_c = torch.randn(len(slots), rank, generator=g).to(torch.bfloat16)
    k_pe = torch.randn(len(slots), rope, generator=g).to(torch.bfloat16)
    scale = torch.tensor([0.5])
    mla_reshape_and_cache(kv_c, k_pe, cache, torch.tensor(slots), kv_cache_dtype="fp8", k_scale=scale)
    f8 = cache.view(torch.float8_e4m3fn)
    for i, s in enumerate(slots):
        want = (torch.cat([kv_c[i], k_pe[i]]).float() / 0.5).to(torch.float8_e4m3fn)
        assert torch.equal(f8[s // bs, s % bs].float(), want.float())
    q = torch.randn(2, 2, rank + rope, generator=g).to(torch.bfloat16)
    cu, used = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)
    out = mla_decode(q, cache, cu, used, bt, 1, 19, kv_lora_rank=rank, kv_cache_dtype="fp8", k_scale=scale)
    ref = reference(q, f8.double() * 0.5, cu, used, bt, rank, 1 / math.sqrt(rank + rope))
    assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()


def test_fake_tensors_give_shapes_and_check() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(3, 8, 576, dtype=torch.bfloat16)
        cache = torch.empty(10, 64, 576, dtype=torch.bfloat16)
        cu, used = torch.empty(4, dtype=torch.int32), torch.empty(3, dtype=torch.int32)
        bt = torch.empty(3, 5, dtype=torch.int32)
        out, lse = torch.ops.hexlayout.mla_decode(q, cache, cu, used, bt, 1, 300)
        assert out.shape == (3, 8, 512) and lse.shape == (8, 3) and lse.dtype == torch.float32
        with pytest.raises(ArgumentError, match="kv_lora_rank"):
            torch.ops.hexlayout.mla_decode(q, cache, cu, used, bt, 1, 300, None, 500)


def test_bad_arguments_name_themselves() -> None:
    q, cache, cu, used, bt = case([4], [1], heads=2, rank=128, rope=32, bs=16, dt=torch.bfloat16, seed=1)
    with pytest.raises(ArgumentError, match="kv_cache.*dtype|kv_cache.*float16"):
        mla_decode(q, cache.half(), cu, used, bt, 1, 4, kv_lora_rank=128)
    with pytest.raises(ArgumentError, match="cu_seqlens_q"):
        mla_decode(q, cache, cu[:1], used, bt, 1, 4, kv_lora_rank=128)
    with pytest.raises(ArgumentError, match="max_seqlen_k"):
        mla_decode(q, cache, cu, used, bt, 1, 2, kv_lora_rank=128)
    with pytest.raises(ArgumentError, match="kv_lora_rank"):
        mla_decode(q, cache, cu, used, bt, 1, 4)             # rows of 160 are not 512 + rope
    with pytest.raises(ArgumentError, match="slot_mapping"):
        mla_reshape_and_cache(q[:, 0, :128], q[:, 0, 128:], cache, torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ArgumentError, match="kv_cache.*fp8"):            # an FP8 string, a bf16 cache
        mla_decode(q, cache, cu, used, bt, 1, 4, kv_lora_rank=128, kv_cache_dtype="fp8")
    u8 = cache.view(torch.uint8)[..., :160]
    with pytest.raises(ArgumentError, match="k_scale"):
        mla_decode(q, u8, cu, used, bt, 1, 4, kv_lora_rank=128, kv_cache_dtype="fp8", k_scale=torch.ones(2))
    with pytest.raises(ArgumentError, match="kv_cache_dtype"):
        mla_reshape_and_cache(q[:, 0, :128], q[:, 0, 128:], u8, torch.zeros(1, dtype=torch.int64),
                              kv_cache_dtype="fp8_e4m3fn")


@pytest.mark.parametrize("arch,fp8", [("sm_80", None), ("sm_90a", None), ("sm_80", e4m3), ("sm_100a", None)],
                         ids=["sm_80", "sm_90a", "sm_80-e4m3", "sm_100a"])
def test_compiles_without_spills(arch: str, fp8: object) -> None:
    b = build(mla_decode_kernel(bf16, fp8), arch, **mla_decode_consts(16, 512, 64, 64, 1))
    r = b.compiled.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, r
