"""``hexlayout.ops.reshape_and_cache`` / ``torch.ops.hexlayout.reshape_and_cache``: K/V rows
scattered into a paged cache through ``slot_mapping`` (negative slots skip), NHD and HND (the
HND caches as the two strided halves of one ``[NB, KVH, BS, 2·D]`` tensor, as vLLM's CPU
build), f16 / bf16, run in the emulator and compared with a torch indexing reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.kv_cache.op import reshape_and_cache, reshape_and_cache_kernel  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError  # noqa: E402


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def _caches(layout: str, nb: int, bs: int, kvh: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Caches filled with a sentinel (so untouched slots are visible); HND: halves of one tensor."""
    if layout == "NHD":
        return torch.full((nb, bs, kvh, d), 7.0, dtype=dtype), torch.full((nb, bs, kvh, d), 7.0, dtype=dtype)
    kv = torch.full((nb, kvh, bs, 2 * d), 7.0, dtype=dtype)
    return kv[..., :d], kv[..., d:]


def _reference(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, layout: str) -> torch.Tensor:
    want = cache.clone()
    nhd = want if layout == "NHD" else want.transpose(1, 2)
    bs = nhd.shape[1]
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            nhd[s // bs, s % bs] = rows[t]
    return want


@pytest.mark.parametrize(
    ("layout", "dtype", "bs", "d", "via_op"),
    [
        ("NHD", torch.float16, 16, 64, False),
        ("HND", torch.bfloat16, 32, 128, True),
        ("NHD", torch.bfloat16, 16, 128, True),
        ("HND", torch.float16, 16, 96, False),  # head size padded to the 128 tile
    ],
)
def test_round_trip_with_skipped_slots(
    layout: str, dtype: torch.dtype, bs: int, d: int, via_op: bool
) -> None:
    g = torch.Generator().manual_seed(bs + d)
    t, kvh, nb = 37, 2, 5
    qkv = torch.randn(t, 4 * kvh, d, generator=g).to(dtype)  # key / value: strided slices of a fused QKV
    key, value = qkv[:, 2 * kvh : 3 * kvh], qkv[:, 3 * kvh :]
    slots = torch.randperm(nb * bs, generator=g)[:t]
    slots[[0, 5, 36]] = torch.tensor([-1, -7, -1])  # padding tokens: skipped
    kc, vc = _caches(layout, nb, bs, kvh, d, dtype)
    want_k, want_v = _reference(kc, key, slots, layout), _reference(vc, value, slots, layout)
    if via_op:
        torch.ops.hexlayout.reshape_and_cache(key, value, kc, vc, slots, layout)
    else:
        reshape_and_cache(key, value, kc, vc, slots, kv_layout=layout)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    # read back every written row through the slot mapping: the round trip
    nhd_k = kc if layout == "NHD" else kc.transpose(1, 2)
    ok = slots >= 0
    assert torch.equal(nhd_k[slots[ok] // bs, slots[ok] % bs], key[ok])


@pytest.mark.parametrize("layout", ["every_other", "offset"])
def test_key_and_value_of_any_layout_are_written(layout: str) -> None:
    """``key`` / ``value`` that 16-byte row vectors cannot read in place (every other element;
    a view 2 bytes off 16-byte alignment) are read from copies, never refused."""
    g = torch.Generator().manual_seed(3)
    t, kvh, d, bs, nb = 9, 2, 64, 16, 3
    if layout == "every_other":
        key = torch.randn(t, kvh, 2 * d, generator=g).half()[..., ::2]
        value = torch.randn(t, kvh, 2 * d, generator=g).half()[..., 1::2]
    else:
        key = torch.randn(t * kvh * d + 1, generator=g).half()[1:].view(t, kvh, d)
        value = torch.randn(t * kvh * d + 1, generator=g).half()[1:].view(t, kvh, d)
    slots = torch.randperm(nb * bs, generator=g)[:t]
    kc, vc = _caches("NHD", nb, bs, kvh, d, torch.float16)
    want_k, want_v = _reference(kc, key, slots, "NHD"), _reference(vc, value, slots, "NHD")
    reshape_and_cache(key, value, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_fake_tensors_and_no_tokens() -> None:
    with FakeTensorMode():
        k = torch.empty(3, 2, 64, dtype=torch.float16)
        kc = torch.empty(4, 16, 2, 64, dtype=torch.float16)
        torch.ops.hexlayout.reshape_and_cache(k, k, kc, kc.clone(), torch.zeros(3, dtype=torch.int64))
        with pytest.raises(ArgumentError, match="slot_mapping"):
            torch.ops.hexlayout.reshape_and_cache(k, k, kc, kc.clone(), torch.zeros(3, dtype=torch.int32))
    e = torch.empty(0, 2, 64, dtype=torch.float16)
    kc = torch.zeros(2, 16, 2, 64, dtype=torch.float16)
    reshape_and_cache(e, e, kc, kc.clone(), torch.empty(0, dtype=torch.int64))
    assert not kc.any()


def _args(**over: object) -> dict[str, object]:
    k = torch.zeros(3, 2, 64, dtype=torch.float16)
    a: dict[str, object] = {
        "key": k,
        "value": k.clone(),
        "key_cache": torch.zeros(4, 16, 2, 64, dtype=torch.float16),
        "value_cache": torch.zeros(4, 16, 2, 64, dtype=torch.float16),
        "slot_mapping": torch.tensor([0, 5, -1]),
        "kv_layout": "NHD",
    }
    a.update(over)
    return a


@pytest.mark.parametrize(
    ("over", "arg", "match"),
    [
        ({"key": torch.zeros(3, 2, 64)}, "key", "float32"),
        ({"value": torch.zeros(3, 2, 64, dtype=torch.bfloat16)}, "value", "dtype"),
        ({"value_cache": torch.zeros(4, 16, 1, 64, dtype=torch.float16)}, "value_cache", "KVH"),
        ({"value_cache": torch.zeros(4, 32, 2, 64, dtype=torch.float16)}, "value_cache", "block_size"),
        (
            {
                "key_cache": torch.zeros(4, 16, 2, 64, dtype=torch.float16)[..., ::2]
                .contiguous()[..., :32]
                .expand(4, 16, 2, 32)
            },
            "value_cache",
            "head size",
        ),
        (
            {
                "key_cache": torch.zeros(4, 12, 2, 64, dtype=torch.float16),
                "value_cache": torch.zeros(4, 12, 2, 64, dtype=torch.float16),
            },
            "key_cache",
            "block size 12",
        ),
        ({"slot_mapping": torch.tensor([0, 64, 1])}, "slot_mapping", "slot 64"),
        ({"slot_mapping": torch.tensor([0, 1])}, "slot_mapping", "2 entries"),
        ({"kv_layout": "NDH"}, "kv_layout", "NHD"),
        (
            {
                "key": torch.zeros(3, 2, 320, dtype=torch.float16),
                "value": torch.zeros(3, 2, 320, dtype=torch.float16),
                "key_cache": torch.zeros(4, 16, 2, 320, dtype=torch.float16),
                "value_cache": torch.zeros(4, 16, 2, 320, dtype=torch.float16),
            },
            "key_cache",
            "head size 320",
        ),
    ],
)
def test_bad_arguments_name_the_argument(over: dict[str, object], arg: str, match: str) -> None:
    with pytest.raises(ArgumentError, match=match) as e:
        reshape_and_cache(**_args(**over))
    assert e.value.arg == arg
    if "slot 64" in match:  # a content check: not on fake tensors
        return
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(ArgumentError) as e2:
        torch.ops.hexlayout.reshape_and_cache(**_args(**over))
    assert e2.value.arg == arg


def test_not_a_tensor() -> None:
    with pytest.raises(ArgumentTypeError) as e:
        reshape_and_cache(**_args(slot_mapping=[0, 1, 2]))
    assert e.value.arg == "slot_mapping"


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compiles_without_spills(arch: str) -> None:
    from hexlayout.ops.kv_cache.op import reshape_and_cache_consts

    from hexlayout.lang import f16
    from hexlayout.runtime import build

    for hd in (64, 128, 256):
        b = build(reshape_and_cache_kernel(f16), arch, **reshape_and_cache_consts(hd, 16))
        res = b.compiled.resources
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, (hd, res)
