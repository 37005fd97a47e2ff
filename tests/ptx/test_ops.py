"""Serving ops under ``HEXLAYOUT_EMULATE=ptx``: their kernels' PTX runs in the executor (each
launch counted) and the results match float64 / exact references."""

from __future__ import annotations

import pytest
import torch

import hexlayout.ptx.execute as X
from hexlayout.ptx import handled, parse_ptx
from tests.ops.test_kv_cache import _caches, _reference
from tests.ops.test_paged_attention_op import _check, make_case, reference


@pytest.fixture
def ptx_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``HEXLAYOUT_EMULATE=ptx``, and the kernels the PTX executor ran."""
    runs: list[str] = []
    real = X.run_ptx

    def counting(ptx, *args, **kw):
        runs.append(kw.get("kernel", ""))
        module = parse_ptx(ptx) if isinstance(ptx, str) else ptx
        ops = {i.opcode for i in module.entry(kw.get("entry")).body}
        unhandled = sorted(o for o in ops if not handled(o))
        assert not unhandled, f"{runs[-1]}: its PTX holds opcodes the executor does not handle: {unhandled}"
        return real(ptx, *args, **kw)

    monkeypatch.setattr(X, "run_ptx", counting)
    monkeypatch.setattr("hexlayout.ptx.run_ptx", counting)
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "ptx")
    return runs


def test_reshape_and_cache_hnd_halves(ptx_runs: list[str]) -> None:
    from hexlayout.ops.kv_cache import reshape_and_cache

    g = torch.Generator().manual_seed(1)
    t, kvh, nb, bs, d = 21, 2, 4, 16, 64
    qkv = torch.randn(t, 4 * kvh, d, generator=g).bfloat16()
    key, value = qkv[:, 2 * kvh: 3 * kvh], qkv[:, 3 * kvh:]
    slots = torch.randperm(nb * bs, generator=g)[:t]
    slots[[0, 7]] = -1
    kc, vc = _caches("HND", nb, bs, kvh, d, torch.bfloat16)
    want_k, want_v = _reference(kc, key, slots, "HND"), _reference(vc, value, slots, "HND")
    reshape_and_cache(key, value, kc, vc, slots, kv_layout="HND")
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert ptx_runs and all(r.startswith("reshape_and_cache") for r in ptx_runs)


def test_paged_attention_gqa_causal(ptx_runs: list[str]) -> None:
    from hexlayout.ops.attention import paged_attention

    a = make_case(11, [1, 3], [9, 20], 2, 1, 64, 16, "NHD", torch.float16)
    out, lse = paged_attention(**a, return_lse=True)
    _check(out, lse, reference(a), a["q"].shape[0], 2e-3)
    assert ptx_runs


def test_fused_moe_bf16(ptx_runs: list[str]) -> None:
    """Routing (moe_align), gate-up with SiLU, down, and the top-k sum, all from their PTX."""
    from hexlayout.ops import fused_moe

    from tests.ops.test_moe_op import close, make
    from tests.ops.test_moe_op import reference as moe_reference

    x, w13, w2, tw, ids = make(5, 64, 64, 8, 2, torch.bfloat16, seed=9, experts_used=6)
    out = fused_moe(x, w13, w2, tw, ids, activation="silu")
    close(out, moe_reference(x, w13, w2, tw, ids, "silu"), torch.bfloat16)
    assert {"moe_gate_up_bf16_silu", "moe_down_bf16", "moe_sum_bf16"} <= set(ptx_runs)


def test_fused_moe_w4a16_bf16_awq(ptx_runs: list[str]) -> None:
    """The int4 dequantization (prmt, lop3-style bit tricks, bf16x2 fma from cuda_bf16.hpp's
    inline asm with its own ``.reg .b32 c``) runs from PTX: the case that found the parser's
    scoped-register bug."""
    from tests.ops.test_moe_wna16 import _bound, _run

    out, want = _run("awq", 4, 64, torch.bfloat16, 3, 8, 2, "silu", "random", seed=17)
    assert (out.double() - want).abs().max().item() <= _bound(torch.bfloat16) * want.abs().max().item()
    assert any(r.startswith("moe_wna16_gate_up_bf16_w4") for r in ptx_runs)


def test_fused_moe_mxfp4_f16(ptx_runs: list[str]) -> None:
    """MXFP4 (e2m1 codes, e8m0 scales) as W4A16: the e2m1 bit trick (shifts, masks and a packed
    f16 multiplication by 2^14) runs from the NVRTC PTX of the printed kernels."""
    from hexlayout.ops import fused_moe, prepare_mxfp4

    from tests.ops.test_moe_wna16 import _bound, routing
    from tests.ops.test_moe_wna16 import reference as wna16_reference

    g = torch.Generator().manual_seed(23)
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                          dtype=torch.float64)                # OCP MX FP4 (e2m1): code -> value

    def checkpoint(kk: int, nn: int):
        c = torch.randint(0, 16, (4, nn, kk), generator=g)
        s = torch.randint(116, 124, (4, nn, kk // 32), generator=g)
        w = values[c] * torch.exp2(s.double() - 127).repeat_interleave(32, 2)
        prepared = prepare_mxfp4((c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8), s.to(torch.uint8),
                                 dtype=torch.float16)
        return prepared, w.transpose(1, 2)

    (p13, w13), (p2, w2) = checkpoint(64, 128), checkpoint(64, 64)
    x = torch.randn(3, 64, generator=g).half()
    ids, tw = routing("random", 3, 4, 2, g), torch.rand(3, 2, generator=g)
    out = fused_moe(x, p13, p2, tw, ids)
    want = wna16_reference(x, w13, w2, tw, ids, "silu", False, None)
    assert (out.double() - want).abs().max().item() <= _bound(torch.float16) * want.abs().max().item()
    assert any(r.startswith("moe_wna16_gate_up_f16_wfp4") for r in ptx_runs)


def test_fused_moe_fp8_sm89(ptx_runs: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """FP8 (e4m3) MoE on sm_89: activation quantization (cvt.rn.satfinite.e4m3x2.f32) and
    mma.sync m16n8k32 e4m3, from their PTX."""
    import hexlayout.ops
    from hexlayout.ops.moe.fp8 import prepare_fp8

    from tests.ops.test_moe_fp8 import check
    from tests.ops.test_moe_fp8 import make as fp8_make
    from tests.ops.test_moe_fp8 import reference as fp8_reference

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    x, w13, s13, w2, s2, tw, ids = fp8_make(0, 1, 128, 64, 8, 1, torch.bfloat16, False)
    out = hexlayout.ops.fused_moe(x, prepare_fp8(w13, s13), prepare_fp8(w2, s2), tw, ids, activation="silu")
    check(out, *fp8_reference(x, w13, s13, w2, s2, tw, ids, False, "silu"))
    assert any("fp8_gate_up" in r for r in ptx_runs) and any("fp8_quant" in r for r in ptx_runs)


def test_attention_varlen_causal_ragged(ptx_runs: list[str]) -> None:
    """Varlen prefill (sm_80 kernel) with q / k / v strided views of a fused QKV tensor."""
    from hexlayout.ops import attention_varlen

    from tests.ops.test_attention_varlen_op import _check as varlen_check
    from tests.ops.test_attention_varlen_op import make_case as varlen_case
    from tests.ops.test_attention_varlen_op import reference as varlen_reference

    a = varlen_case(5, [3, 17, 0], [3, 17, 0], 4, 2, 64, torch.float16)
    out, lse = attention_varlen(**a, causal=True, return_lse=True)
    varlen_check(out, lse, varlen_reference(a, None, True), a["q"].shape[0], torch.float16)
    assert ptx_runs
