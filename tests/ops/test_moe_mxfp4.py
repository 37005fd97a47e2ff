"""MXFP4 expert weights (``hexlayout.ops.prepare_mxfp4``; OCP microscaling as gpt-oss ships its
experts) through ``fused_moe`` in the emulator, on sm_80 and sm_90a (``HEXLAYOUT_EMULATE_ARCH``),
f16 and bf16, against a float64 reference dequantized from the CHECKPOINT tensors (uint8
``[E, N, K/2]`` e2m1 codes, low nibble for even k, and e8m0 scales ``[E, N, K/32]``: the
packing and the e2m1 table written here from the spec); every validation error, eager and fake."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hexlayout.ops import fused_moe, prepare_mxfp4  # noqa: E402
from test_moe_wna16 import _bound, reference, reference_alignment, routing  # noqa: E402

from hexlayout.errors import HexlayoutError  # noqa: E402

#: OCP MX v1.0 FP4 (E2M1): code -> value
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setattr("hexlayout.ops.moe.pipeline.run_moe_align", reference_alignment)


def mxfp4_checkpoint(e: int, n: int, k: int, gen: torch.Generator, lo: int = 116, hi: int = 124):
    """``(weight, scales)`` of ``y = x @ W`` as gpt-oss stores them (``W^T``: ``[E, N, K/2]``
    bytes, ``[E, N, K/32]`` e8m0 exponents in ``[lo, hi)``) and ``W`` ``[E, K, N]`` float64."""
    c = torch.randint(0, 16, (e, n, k), generator=gen)
    s = torch.randint(lo, hi, (e, n, k // 32), generator=gen)
    weight = (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)
    wt = E2M1[c] * torch.exp2(s.double() - 127).repeat_interleave(32, 2)
    return (weight, s.to(torch.uint8)), wt.transpose(1, 2)


def _run(dtype, t, e, k, *, h, i, seed, act="silu"):
    gen = torch.Generator().manual_seed(seed)
    (w13, s13), ref13 = mxfp4_checkpoint(e, 2 * i, h, gen)
    (w2, s2), ref2 = mxfp4_checkpoint(e, h, i, gen)
    p13, p2 = prepare_mxfp4(w13, s13, dtype=dtype, gate_up=True), prepare_mxfp4(w2, s2, dtype=dtype)
    assert (p13.quant_format, p13.bits, p13.group_size, p13.zeros) == ("mxfp4", 4, 32, None)
    x = torch.randn(t, h, generator=gen).to(dtype)
    ids = routing("random", t, e, k, gen)
    tw = torch.rand(t, k, generator=gen)
    out = fused_moe(x, p13, p2, tw, ids, activation=act)
    return out, reference(x, ref13, ref2, tw, ids, act, False, None)


CASES = [
    # dtype, T, E, k, H, I, act: several k-tiles (BK 32); N ragged against the 64-column tile
    (torch.float16, 5, 4, 2, 160, 96, "silu"),
    (torch.bfloat16, 3, 4, 2, 96, 160, "gelu"),
    (torch.bfloat16, 70, 2, 2, 128, 64, "silu"),     # the large-token config (BM 64)
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(("dtype", "t", "e", "k", "h", "i", "act"), CASES)
def test_mxfp4_matches_the_float64_reference(monkeypatch, arch, dtype, t, e, k, h, i, act) -> None:
    if arch == "sm_90a":
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    out, want = _run(dtype, t, e, k, h=h, i=i, seed=t + h + i, act=act)
    assert out.dtype == dtype and out.shape == want.shape and not out.isnan().any()
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(dtype) * want.abs().max().item(), (err, want.abs().max().item())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_mxfp4_with_split_k(monkeypatch, arch) -> None:
    """The decode path a GPU takes (split-K partials): ``HEXLAYOUT_MOE_SPLIT_K=2`` forces it."""
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", "2")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    out, want = _run(torch.bfloat16, 2, 4, 2, h=128, i=64, seed=22)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.bfloat16) * want.abs().max().item(), err


def test_mxfp4_on_sm89_runs_the_mma_sync_kernels(monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    out, want = _run(torch.bfloat16, 4, 4, 2, h=64, i=96, seed=89)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.bfloat16) * want.abs().max().item(), err


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prepared_weights_dequantize_to_the_checkpoint(dtype) -> None:
    """The prepared codes (the synthesized offline layout, undone by its own permutation) times
    ``2^(s - 127)`` of the prepared scales (the checkpoint's e8m0 bytes, transposed) are the
    checkpoint's ``W`` exactly; bf16 takes every e8m0 scale."""
    from hexlayout.ops.host.launch import lang_dtype
    from hexlayout.ops.moe.wna16_layout import group_view, offline_key, wna16_offline_layouts

    from hexlayout.lang import e2m1

    gen = torch.Generator().manual_seed(3)
    e, n, k = 2, 24, 128
    lo, hi = (103, 143) if dtype == torch.float16 else (0, 255)
    (w, s), want = mxfp4_checkpoint(e, n, k, gen, lo, hi)
    p = prepare_mxfp4(w, s, dtype=dtype, arch="sm_80")
    lays = wna16_offline_layouts("sm_80", lang_dtype(dtype), 4, k, 32, False, e2m1, zero=-1)
    assert p.layout_key == offline_key(lays) and sorted(lays) == ["q", "s"]
    lay = lays["q"]
    q = p.qweight.to(torch.int64)
    q = torch.stack([q & 15, q >> 4], -1).flatten(-2)           # even elements in the low nibble
    rows, cols = q.shape
    assert rows == e * 64 and cols == k                          # N = 24 padded to the 64-row tile
    logical = q.reshape(-1)[torch.from_numpy(lay.permutation((rows, cols)))].reshape(e, 64, k)
    assert not logical[:, n:].any()                              # padded rows are 0
    q = logical[:, :n].transpose(1, 2)
    assert p.scales.dtype == torch.uint8 and tuple(p.scales.shape) == (e, k // 32, n) and p.dtype == dtype
    flat = group_view(p.scales)                                  # the offline [E * 64, K / 32] bytes
    perm = torch.from_numpy(lays["s"].permutation(tuple(flat.shape)))
    scales = flat.reshape(-1)[perm].reshape(e, 64, k // 32)
    assert not scales[:, n:].any()                               # padded rows are 0
    scales = scales[:, :n].transpose(1, 2)
    assert torch.equal(scales, s.transpose(1, 2))                # one byte per 32 weights, as stored
    got = E2M1[q] * torch.exp2(scales.double() - 127).repeat_interleave(32, 1)
    assert torch.equal(got, want)


# ---- validation ----


def _ck(e=2, n=16, k=64):
    return mxfp4_checkpoint(e, n, k, torch.Generator().manual_seed(0))[0]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda w, s: (w.to(torch.int32), s, torch.float16), r"'weight'.*uint8"),
        (lambda w, s: ([1, 2], s, torch.float16), r"'weight'.*expected a uint8 tensor"),
        (lambda w, s: (w[0], s, torch.float16), r"'weight'.*\[E, N, K/2\]"),
        (lambda w, s: (w[:, :, :8], s[:, :, :0], torch.float16), r"'weight'.*K = 16 must be a multiple of 3"),
        (lambda w, s: (w[:, :12], s[:, :12], torch.float16), r"'weight'.*N = 12.*of 8"),
        (lambda w, s: (w, s[:, :, :1], torch.float16), r"'scales'.*\[E, N, K/32\] = \[2, 16, 2\]"),
        (lambda w, s: (w, s.float(), torch.float16), r"'scales'.*uint8"),
        (lambda w, s: (w, s, torch.float32), r"'dtype'.*float16 or torch.bfloat16"),
        (lambda w, s: (w, torch.where(s == s.max(), 255, s).to(torch.uint8), torch.bfloat16),
         r"'scales'.*255.*NaN"),
        (lambda w, s: (w, torch.full_like(s, 102), torch.float16), r"'scales'.*2\^-25.*2\^-24 \.\. 2\^15"),
        (lambda w, s: (w, torch.full_like(s, 143), torch.float16), r"'scales'.*2\^16"),
    ],
)
def test_prepare_names_the_bad_argument(change, match) -> None:
    w, s, dtype = change(*_ck())
    with pytest.raises(HexlayoutError, match=match):
        prepare_mxfp4(w, s, dtype=dtype)


def test_extreme_scales_are_exact_in_bf16_and_refused_in_f16() -> None:
    w, s = _ck()
    lo, hi = torch.zeros_like(s), torch.full_like(s, 254)
    assert prepare_mxfp4(w, lo, dtype=torch.bfloat16).scales.eq(0).all()      # 2^-127, kept as its byte
    assert prepare_mxfp4(w, hi, dtype=torch.bfloat16).scales.eq(254).all()    # 2^127
    assert prepare_mxfp4(w, torch.full_like(s, 103), dtype=torch.float16).scales.eq(103).all()  # 2^-24
    with pytest.raises(HexlayoutError, match=r"'scales'.*2\^-127"):
        prepare_mxfp4(w, lo, dtype=torch.float16)


def _op(dtype=torch.float16):
    gen = torch.Generator().manual_seed(6)
    (w13, s13), _ = mxfp4_checkpoint(2, 128, 64, gen)
    (w2, s2), _ = mxfp4_checkpoint(2, 64, 64, gen)
    p13, p2 = prepare_mxfp4(w13, s13, dtype=dtype, gate_up=True), prepare_mxfp4(w2, s2, dtype=dtype)
    x = torch.randn(3, 64, generator=gen).to(dtype)
    ids = torch.tensor([[0, 1], [1, 0], [0, 1]], dtype=torch.int32)
    return x, p13, p2, torch.rand(3, 2, generator=gen), ids


def _bad_op_calls():
    """(name, change of the op's arguments, match): ``args`` the positional tuple."""
    def consts(fmt=None, bits=None, g13=None):
        def f(args, kw):
            a = list(args)
            a[9] = fmt or a[9]                        # x, 6 weight tensors, tw, ids, then the constants
            a[10] = bits or a[10]
            a[11] = g13 or a[11]
            return tuple(a), kw
        return f

    def zeros(args, kw):
        a = list(args)
        a[3] = a[2]                                   # w13_zeros: the scales' shape and dtype
        return tuple(a), kw

    def perm(args, kw):
        return args, {**kw, "w13_perm": torch.arange(64, dtype=torch.int32).expand(2, -1).contiguous()}

    return [
        ("group", consts(g13=128), r"w13_group_size.*one of 32 for mxfp4, got 128"),
        ("bits", consts(bits=8), r"'bits'.*4 \(AWQ, MXFP4\)"),
        ("format", consts(fmt="fp4"), r"quant_format.*'mxfp4'"),
        ("zeros", zeros, r"w13_zeros.*mxfp4 weights have no zero points"),
        ("perm", perm, r"w13_perm.*GPTQ.*not mxfp4"),
    ]


@pytest.mark.parametrize("fake", [False, True])
@pytest.mark.parametrize(("name", "change", "match"), _bad_op_calls(), ids=[c[0] for c in _bad_op_calls()])
def test_the_op_names_the_bad_argument(fake, name, change, match) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, p13, p2, tw, ids = _op()
    tensors, consts = p13.op_args(p2)
    args, kw = change((x, *tensors, tw, ids, *consts), {})
    if fake:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
            kw = {n: mode.from_tensor(v) for n, v in kw.items()}
            with pytest.raises(HexlayoutError, match=match):
                torch.ops.hexlayout.fused_moe_wna16(*args, **kw)
        return
    with pytest.raises(HexlayoutError, match=match):
        torch.ops.hexlayout.fused_moe_wna16(*args, **kw)


def test_mxfp4_and_gptq_weights_do_not_mix() -> None:
    from test_moe_wna16 import _op_args

    x, p13, _, tw, ids = _op()
    _, _, g2, _, _ = _op_args(t=3, k=2, e=2)
    with pytest.raises(HexlayoutError, match=r"'w2'.*gptq 4-bit, w13 mxfp4 4-bit"):
        fused_moe(x, p13, g2, tw, ids)


def test_the_fake_path_returns_the_output_shape() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, p13, p2, tw, ids = _op(torch.bfloat16)
    tensors, consts = p13.op_args(p2)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in (x, *tensors, tw, ids)]
        out = torch.ops.hexlayout.fused_moe_wna16(*args, *consts)
        assert tuple(out.shape) == (3, 64) and out.dtype == torch.bfloat16


# ---- compile evidence: the e2m1 kernels through NVRTC ----


def _kernels():
    from hexlayout.ops.moe.wna16_kernels_sm80 import moe_wna16_down_kernel, moe_wna16_gate_up_kernel
    from hexlayout.ops.moe.wna16_kernels_sm90 import (
        moe_wna16_down_sm90_kernel,
        moe_wna16_gate_up_sm90_kernel,
    )

    return {("gate_up", "sm_80"): moe_wna16_gate_up_kernel, ("down", "sm_80"): moe_wna16_down_kernel,
            ("gate_up", "sm_90a"): moe_wna16_gate_up_sm90_kernel,
            ("down", "sm_90a"): moe_wna16_down_sm90_kernel}


@pytest.mark.nvrtc
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("kernel", ["gate_up", "down"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_e2m1_kernels_compile_without_spills(arch, kernel, dtype) -> None:
    """The decode config with MXFP4's constants (group 32: BK 32, ``ZERO = -1``): no spills or
    local memory, no I2F and no table load (the bit trick: LOP3 / shifts and a packed multiply),
    the weights named ``_wfp4`` apart from the int4 kernels."""
    from hexlayout.lang import bf16, e2m1, f16
    from hexlayout.runtime import build
    from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts

    dt = f16 if dtype == "f16" else bf16
    k = _kernels()[kernel, arch](dt, 4, 32, False, e2m1)
    assert "_wfp4_k32" in k.name
    consts = {"BM": 16, "GROUP": 32, "ZERO": -1}
    if kernel == "gate_up" or arch == "sm_80":
        consts["TOPK"] = 2
    b = build(k, arch, **consts)
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0, st.summary()
    counts = opcode_counts(disassemble(b.compiled.cubin))
    assert count_prefix(counts, "I2F") == 0 and count_prefix(counts, "LOP3") > 0, counts
    assert count_prefix(counts, "HMMA" if arch == "sm_80" else "HGMMA") > 0, counts
