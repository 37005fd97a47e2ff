"""Fixtures for the runtime tests: small real builds (NVRTC-compiled where the test launches)
and a hand-assembled kernel with scalar parameters."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import hexlayout.runtime as rt
from hexlayout.codegen import generate
from hexlayout.ir.expr import Var
from hexlayout.ir.lowered import LoweredKernel
from hexlayout.ir.tile import GlobalParam, ScalarParam
from hexlayout.ir.types import f16, f32, i32
from hexlayout.lang.examples import flash_attention_fwd, gemm_sm80, gemm_sm90


@pytest.fixture(scope="session")
def gemm80():
    """The layout-free sm_80 GEMM with 64x64 tiles (not compiled)."""
    return rt.build(gemm_sm80, "sm_80", compile=False, BM=64, BN=64)


@pytest.fixture(scope="session")
def gemm90():
    """The warp-specialized sm_90a GEMM (TMA loads; not compiled)."""
    return rt.build(gemm_sm90, "sm_90a", compile=False)


@pytest.fixture(scope="session")
def attention():
    """FlashAttention forward (4-d tensors, a float scalar, a 3-d grid; not compiled)."""
    return rt.build(flash_attention_fwd, "sm_80", compile=False)


@pytest.fixture(scope="session")
def scalars_kernel():
    """An empty-bodied kernel ``k(x: f32[n, 16], n: i32, alpha: f16, y: f32[R, n])`` whose size
    ``n`` is the scalar ``n`` and whose ``y`` has a free row stride ``LDY``; as a build-like
    object (``generated`` + ``synthesis.lowered``)."""
    n = Var("n", None, None, "scalar")
    r, ldy = Var("R", 1, None, "size"), Var("LDY", 1, None, "size")
    tid, bx = Var("threadIdx.x", 0, 128, "thread"), Var("blockIdx.x", 0, None, "block")
    x = GlobalParam("x", f32, (n, 16), (16, 1))
    y = GlobalParam("y", f32, (r, n), (ldy, 1))
    params = [x, ScalarParam("n", i32, n), ScalarParam("alpha", f16, Var("alpha", None, None, "scalar")), y]
    k = LoweredKernel("scalars", params, ((n + 127) // 128, r), 128, tid, (bx,), [], arch="sm_80")
    return SimpleNamespace(generated=generate(k), synthesis=SimpleNamespace(
        lowered=SimpleNamespace(kernel=k, requirements=[])), compiled=None, lowered=k)
