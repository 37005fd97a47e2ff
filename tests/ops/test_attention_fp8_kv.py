"""FP8 KV caches: ``hexlayout.ops.reshape_and_cache(..., kv_cache_dtype=, k_scale=, v_scale=)``
stores ``fp8(x / scale)`` (round to nearest even, saturated to the largest finite value, as
vLLM's ``reshape_and_cache_flash``) bit for bit as torch converts, into uint8 or float8 caches;
``hexlayout.ops.paged_attention(..., kv_cache_dtype=, k_scale=, v_scale=)`` on sm_80 and sm_90a
in the emulator against the float64 reference of ``test_paged_attention_op`` over the
dequantized caches (``scale * fp8``); argument errors name the argument."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
import test_paged_attention_op as paged_case  # noqa: E402

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError  # noqa: E402

FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def quantize(x: torch.Tensor, scale: float, fp8: torch.dtype) -> torch.Tensor:
    """torch's ``fp8(x / scale)`` with saturation (clamped to the largest finite value first)."""
    big = torch.finfo(fp8).max
    return (x.float() / scale).clamp(-big, big).to(fp8)


@pytest.mark.parametrize(("kv_cache_dtype", "storage"), [("fp8", "uint8"), ("fp8_e5m2", "float8")])
def test_reshape_and_cache_quantizes_like_torch(kv_cache_dtype: str, storage: str) -> None:
    """Values past the format's range saturate; negative slots write nothing; HND layout."""
    fp8 = FP8[kv_cache_dtype]
    g = torch.Generator().manual_seed(0)
    t, kvh, d, nb, bs = 6, 2, 64, 3, 16
    key = (torch.randn(t, kvh, d, generator=g) * 100).half()
    key[0, 0, :4] = torch.tensor([1e4, -6e4, 3e4, 0.0]).half()      # saturate (e4m3: 448 * 0.5)
    value = torch.randn(t, kvh, d, generator=g).to(torch.float16)
    dt = torch.uint8 if storage == "uint8" else fp8
    kc = torch.zeros(nb, kvh, bs, d, dtype=dt)
    vc = torch.zeros(nb, kvh, bs, d, dtype=dt)
    slots = torch.tensor([3, 17, -1, 40, 0, 47])
    ks, vs = torch.tensor([0.5]), torch.tensor([0.125])
    torch.ops.hexlayout.reshape_and_cache(key, value, kc, vc, slots, "HND", kv_cache_dtype, ks, vs)
    for i, s in enumerate(slots.tolist()):
        got_k, got_v = kc[s // bs, :, s % bs].view(fp8), vc[s // bs, :, s % bs].view(fp8)
        if s < 0:
            continue
        assert torch.equal(got_k.view(torch.uint8), quantize(key[i], 0.5, fp8).view(torch.uint8))
        assert torch.equal(got_v.view(torch.uint8), quantize(value[i], 0.125, fp8).view(torch.uint8))
    assert int((kc.view(torch.uint8) != 0).sum()) <= 5 * kvh * d        # only the five slots


def fp8_case(seed: int, qlens: list[int], klens: list[int], h: int, kvh: int, d: int, bs: int, layout: str,
             kv_cache_dtype: str, ks: float, vs: float) -> tuple[dict, dict]:
    """A ``test_paged_attention_op`` case with its caches quantized (uint8 storage), and the same
    case with the dequantized caches (for the float64 reference)."""
    a = paged_case.make_case(seed, qlens, klens, h, kvh, d, bs, layout)
    fp8 = FP8[kv_cache_dtype]
    k8 = quantize(a["key_cache"] * 20, ks, fp8)                     # keys of a larger range
    v8 = quantize(a["value_cache"], vs, fp8)
    q8 = {**a, "key_cache": k8.view(torch.uint8), "value_cache": v8.view(torch.uint8)}
    deq = {**a, "key_cache": k8.double() * ks, "value_cache": v8.double() * vs}
    return q8, deq


CASES = [
    # arch, seed, qlens, klens, H, KVH, D, block, layout, kv_cache_dtype, options, splits
    ("sm_80", 0, [1, 5, 1, 17], [17, 9, 1, 40], 4, 2, 64, 16, "NHD", "fp8", {}, 0),
    ("sm_80", 1, [3, 1], [33, 70], 4, 1, 128, 32, "HND", "fp8_e5m2", {"causal": False, "softcap": 5.0}, 2),
    ("sm_90a", 2, [1, 4, 2], [70, 9, 33], 4, 2, 64, 16, "NHD", "fp8_e4m3", {"window_size": (20, 0)}, 2),
    ("sm_90a", 3, [2, 1], [19, 4], 2, 1, 80, 16, "HND", "fp8", {}, 0),
    ("sm_100a", 4, [1, 3], [40, 70], 4, 2, 128, 16, "NHD", "fp8_e4m3", {}, 0),   # the mma.sync kernel
]


@pytest.mark.parametrize(
    ("arch", "seed", "qlens", "klens", "h", "kvh", "d", "bs", "layout", "kv_cache_dtype", "opts", "splits"),
    CASES,
)
def test_paged_attention_fp8_matches_float64(
    arch: str, seed: int, qlens: list[int], klens: list[int], h: int, kvh: int, d: int, bs: int, layout: str,
    kv_cache_dtype: str, opts: dict, splits: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    if arch != "sm_80":
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    q8, deq = fp8_case(seed, qlens, klens, h, kvh, d, bs, layout, kv_cache_dtype, 0.3, 0.05)
    out, lse = torch.ops.hexlayout.paged_attention(
        **q8, **opts, num_splits=splits, kv_cache_dtype=kv_cache_dtype,
        k_scale=torch.tensor([0.3]), v_scale=torch.tensor([0.05]),
    )
    want = paged_case.reference(
        deq, None, opts.get("causal", True), opts.get("window_size", (-1, -1)), opts.get("softcap", 0.0)
    )
    paged_case._check(out, lse, want, q8["q"].shape[0], 2e-3)


def test_cache_then_attend_with_float_scales() -> None:
    """reshape_and_cache into float8 caches, then paged_attention reading them (scales as numbers)."""
    a = paged_case.make_case(4, [3], [3], 2, 1, 64, 16)
    key = torch.randn(3, 1, 64).half()
    value = torch.randn(3, 1, 64).half()
    kc = torch.zeros(2, 16, 1, 64, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    table = torch.tensor([[1, 0]], dtype=torch.int32)
    slots = torch.tensor([16, 17, 18])
    hexlayout.ops.reshape_and_cache(key, value, kc, vc, slots, kv_cache_dtype="fp8", k_scale=0.25,
                                    v_scale=0.5)
    out = hexlayout.ops.paged_attention(
        a["q"], kc, vc, a["cu_seqlens_q"], a["seqused_k"], table, 3, 3,
        kv_cache_dtype="fp8", k_scale=0.25, v_scale=0.5,
    )
    deq = {**a, "key_cache": kc.double() * 0.25, "value_cache": vc.double() * 0.5, "block_table": table}
    want = paged_case.reference(deq)
    assert (out.double() - want[0]).abs().max().item() <= 2e-3


def test_fp8_arguments_checked_and_fake() -> None:
    q8, _ = fp8_case(6, [1, 2], [5, 7], 4, 2, 64, 16, "NHD", "fp8", 1.0, 1.0)
    with pytest.raises(ArgumentError, match="kv_cache_dtype.*'fp8_e4m3'"):
        hexlayout.ops.paged_attention(**q8, kv_cache_dtype="int8")
    with pytest.raises(ArgumentError, match="key_cache.*torch.uint8"):
        hexlayout.ops.paged_attention(**{**q8, "key_cache": q8["key_cache"].half()}, kv_cache_dtype="fp8")
    with pytest.raises(ArgumentError, match="key_cache.*torch.float16"):
        hexlayout.ops.paged_attention(**q8)                          # uint8 caches, kv_cache_dtype "auto"
    with pytest.raises(ArgumentError, match="k_scale.*one float32 element"):
        hexlayout.ops.paged_attention(**q8, kv_cache_dtype="fp8", k_scale=torch.ones(2))
    with pytest.raises(ArgumentError, match="v_scale.*> 0"):
        hexlayout.ops.paged_attention(**q8, kv_cache_dtype="fp8", v_scale=-1.0)
    with pytest.raises(ArgumentTypeError, match="reshape_and_cache.*kv_cache_dtype"):
        hexlayout.ops.reshape_and_cache(torch.zeros(1, 2, 64).half(), torch.zeros(1, 2, 64).half(),
                                        q8["key_cache"], q8["value_cache"], torch.zeros(1, dtype=torch.int64),
                                        kv_cache_dtype=8)
    odd = torch.zeros(2, 16, 1, 72, dtype=torch.uint8)
    with pytest.raises(ArgumentError, match="key_cache.*multiples of 16"):
        hexlayout.ops.reshape_and_cache(torch.zeros(1, 1, 72).half(), torch.zeros(1, 1, 72).half(), odd, odd,
                                        torch.zeros(1, dtype=torch.int64), kv_cache_dtype="fp8")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        out, lse = torch.ops.hexlayout.paged_attention(**q8, kv_cache_dtype="fp8_e4m3", k_scale=torch.ones(1))
        assert out.shape == q8["q"].shape and lse.shape == (4, 3)
