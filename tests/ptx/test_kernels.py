"""Whole kernels in PTX mode (the NVRTC PTX of the printed source) against float64
references and against IR mode, at small sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import hexlayout.runtime as rt
from hexlayout.lang.examples import flash_attention_fwd, gemm_sm80
from hexlayout.ptx import PtxRunReport
from tests.codegen.kernels import elementwise, row_reduce


@pytest.fixture(scope="module")
def gemm64():
    return rt.build(gemm_sm80, "sm_80", compile=False, BM=64, BN=64)


@pytest.mark.parametrize(("m", "n", "k"), [(64, 64, 32), (100, 72, 40)])
def test_gemm_sm80_matches_float64(gemm64, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * n + k)
    a, b = torch.randn(m, k, generator=g).half(), torch.randn(n, k, generator=g).half()
    c = torch.full((m, n), float("nan"), dtype=torch.float16)
    rep = rt.emulate(gemm64, a, b, c, mode="ptx")
    assert isinstance(rep, PtxRunReport)
    assert rep.opcodes.get("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    torch.testing.assert_close(c.double(), a.double() @ b.double().T, rtol=1e-2, atol=1e-2)


def test_gemm_sm80_bf16_through_the_op(monkeypatch) -> None:
    """``HEXLAYOUT_EMULATE=ptx`` reaches the PTX executor from a torch op."""
    from hexlayout.ops.gemm import gemm

    import hexlayout.ptx.execute as X
    from hexlayout.runtime.launch_log import launch_log

    runs = []
    real = X.run_ptx

    def counting(*args, **kw):
        runs.append(kw.get("kernel"))
        return real(*args, **kw)

    monkeypatch.setattr(X, "run_ptx", counting)
    monkeypatch.setattr("hexlayout.ptx.run_ptx", counting)
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "ptx")
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(33, 72, generator=g).bfloat16(), torch.randn(66, 72, generator=g).bfloat16()
    bias = torch.randn(66, generator=g).bfloat16()
    with launch_log() as log:
        c = gemm(a, b, bias=bias, activation="relu")
    ref = torch.relu(a.double() @ b.double().T + bias.double())
    torch.testing.assert_close(c.double(), ref, rtol=2e-2, atol=5e-2)
    assert log and all(r.device == "cpu" for r in log)
    assert runs and len(runs) == len(log)             # every launch ran in the PTX executor


@pytest.mark.parametrize("fn", ["max", "sum"])
def test_row_reduce_shuffles(fn: str) -> None:
    k = row_reduce("sm_80", fn)
    x = np.random.default_rng(1).standard_normal((100, 64)).astype(np.float32)
    y = np.full((100, 1), np.nan, np.float32)
    rt.emulate(k, x, y, mode="ptx")
    want = x.astype(np.float64).max(1) if fn == "max" else x.astype(np.float64).sum(1)
    np.testing.assert_allclose(y[:, 0], want, rtol=1e-5, atol=1e-5)


def test_elementwise_conversions_agree_with_ir_mode_bit_for_bit() -> None:
    """f16 -> f32, * scale, ex2, a column mask, cvt to bf16 and e4m3: the same bits in both modes."""
    import ml_dtypes

    k = elementwise("sm_89")
    x = (np.random.default_rng(2).standard_normal((40, 64)) * 2).astype(np.float16)
    outs = {}
    for mode in ("ir", "ptx"):
        y = np.full((40, 64), np.nan, ml_dtypes.bfloat16)
        z = np.full((40, 64), np.nan, ml_dtypes.float8_e4m3fn)
        rt.emulate(k, x, y, z, 0.75, mode=mode)
        outs[mode] = (y.view(np.uint16).copy(), z.view(np.uint8).copy())
    assert (outs["ir"][0] == outs["ptx"][0]).all() and (outs["ir"][1] == outs["ptx"][1]).all()
    want = np.where(np.arange(64) < 48, np.exp2(x.astype(np.float64) * 0.75), 0.0)
    np.testing.assert_allclose(outs["ptx"][0].view(ml_dtypes.bfloat16).astype(np.float64), want, rtol=1e-2)


def test_flash_attention_causal_gqa() -> None:
    bld = rt.build(flash_attention_fwd, "sm_80", compile=False, BM=64, BN=32, HEAD_DIM=64, WARPS=4,
                   CAUSAL=True)
    g = torch.Generator().manual_seed(0)
    B, Sq, Sk, H, KVH, D = 1, 24, 40, 2, 1, 64
    q = torch.randn(B, Sq, H, D, generator=g).half()
    k, v = torch.randn(B, Sk, KVH, D, generator=g).half(), torch.randn(B, Sk, KVH, D, generator=g).half()
    o = torch.full((B, Sq, H, D), float("nan")).half()
    rt.emulate(bld, q, k, v, o, 1 / math.sqrt(D) * math.log2(math.e), mode="ptx")
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().expand(B, Sk, H, D)) / math.sqrt(D)
    s = s.masked_fill(~(torch.arange(Sk)[None, :] <= torch.arange(Sq)[:, None] + Sk - Sq), float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.double().expand(B, Sk, H, D))
    torch.testing.assert_close(o.double(), ref, rtol=1e-2, atol=1e-2)
