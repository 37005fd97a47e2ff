"""Synthesis of the layout-free FlashAttention-style forward kernel, run in the emulator.

``hexlayout.lang.examples.flash_attention.flash_attention_fwd`` has no layout anywhere: QK^T
and P.V are mma ops, the online softmax is reductions and elementwise math on the first
mma's accumulator, and P (cast to f16) stays in registers as the A operand of the second
mma. The synthesized kernel must match ``softmax(q k^T * scale) v`` in float64, causal
(bottom-right aligned) or not, with GQA, ragged sequence lengths and a head size below
the padded ``HEAD_DIM``.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
import pytest

from hexlayout.emulator import run
from hexlayout.ir.tile import Cast, Mma
from hexlayout.lang.examples.flash_attention import flash_attention_fwd
from hexlayout.synth.solve import Synthesis, synthesize

LOG2E = math.log2(math.e)


@cache
def _synth(causal: bool, head_dim: int = 64, bm: int = 64) -> Synthesis:
    # unchunked (the example's default chunks S and q: tests/synth/test_attention_chunked.py)
    tk = flash_attention_fwd.trace(BM=bm, BN=64, HEAD_DIM=head_dim, WARPS=4, CAUSAL=causal, CHUNK=0, DCHUNK=0)
    return synthesize(tk, "sm_80")


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool) -> np.ndarray:
    """float64 attention over ``[B, S, H, D]`` tensors; GQA: head ``h`` reads kv head
    ``h // (H // KVH)``; causal masks are bottom-right aligned; fully masked rows give 0."""
    b_, sq, h_, _ = q.shape
    sk, kvh = k.shape[1], k.shape[2]
    out = np.zeros(q.shape, dtype=np.float64)
    for b in range(b_):
        for h in range(h_):
            g = h // (h_ // kvh)
            s = q[b, :, h].astype(np.float64) @ k[b, :, g].astype(np.float64).T * scale
            if causal:
                i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
                s = np.where(j <= i + (sk - sq), s, -np.inf)
            mx = s.max(axis=1, keepdims=True)
            e = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
            den = e.sum(axis=1, keepdims=True)
            out[b, :, h] = (e / np.where(den == 0, 1.0, den)) @ v[b, :, g].astype(np.float64)
    return out


def _emulate(s: Synthesis, b: int, sq: int, sk: int, h: int, kvh: int, d: int, causal: bool) -> Any:
    rng = np.random.default_rng(sq * 31 + sk * 7 + d + h)
    q = rng.standard_normal((b, sq, h, d)).astype(np.float16)
    k = rng.standard_normal((b, sk, kvh, d)).astype(np.float16)
    v = rng.standard_normal((b, sk, kvh, d)).astype(np.float16)
    o = np.full((b, sq, h, d), np.nan, dtype=np.float16)
    scale = 1.0 / math.sqrt(d)
    report = run(s.lowered.kernel, {"q": q, "k": k, "v": v, "o": o, "qk_scale": scale * LOG2E})
    ref = reference(q, k, v, scale, causal)
    err = np.abs(o.astype(np.float64) - ref)
    assert err.max() <= 1e-2, f"max abs error {err.max()}"
    return report


def test_decisions() -> None:
    s = _synth(False)
    mmas = list(s.mma.values())
    # two mmas per key block, traced twice: the unmasked full blocks and the masked rest (loop split)
    assert len(mmas) == 4 and all(tm.atom.name == "SM80_16x8x16_F32F16F16F32_TN" for tm in mmas)
    # QK^T's accumulator is P.V's A operand: both mmas split the 64 query rows over the 4 warps
    assert all(tm.tile_mnk[:2] == (64, 64) and str(tm.warps).startswith("spatial(4, 1)")
               for tm in mmas)
    copies = [ins for op, ins in s.lowered.choices if type(op).__name__ == "Copy"]
    assert {"cp.async.cg.16", "SM75_U32x4_LDSM_N", "SM75_U16x8_LDSM_T"} <= set(copies)
    for d in s.decisions:
        if d.subject.startswith("shared"):
            assert "conflict-free" in d.chosen, d.chosen
    kinds = {type(i).__name__ for i in _walk(s.lowered.kernel.body)}
    assert {"Shfl", "MmaSync", "Ldmatrix", "CpAsync"} <= kinds     # row reductions cross lanes


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("b", "sq", "sk", "h", "kvh", "d"), [
    (1, 64, 64, 1, 1, 64),          # one block
    (1, 100, 130, 2, 1, 48),        # GQA, ragged, head size padded to 64
    (2, 130, 70, 2, 1, 64),         # more queries than keys: causal rows with no key give 0
])
def test_matches_float64(b: int, sq: int, sk: int, h: int, kvh: int, d: int, causal: bool) -> None:
    report = _emulate(_synth(causal), b, sq, sk, h, kvh, d, causal)
    assert report.totals["bank_conflicts"] == 0


def test_head_dim_128_matches_float64() -> None:
    s = _synth(True, 128)
    report = _emulate(s, 1, 80, 96, 2, 1, 128, True)
    assert report.totals["bank_conflicts"] == 0


def test_two_row_blocks_per_warp_matches_float64() -> None:
    """BM=128 on 4 warps: each warp owns two 16-row blocks of S, so the accumulator of QK^T
    can only be P.V's A operand when the k-step is the inner value mode of A (k_inner)."""
    s = _synth(False, 64, 128)
    casts = {op.result.id for op in s.kernel.body.walk() if isinstance(op, Cast)}
    pv = [s.mma[op.uid] for op in s.kernel.body.walk()
          if isinstance(op, Mma) and op.a.id in casts]          # P (cast to f16) @ V
    # one P.V per loop of the split (unmasked full key blocks, masked rest)
    assert len(pv) == 2 and all(m.k_inner and m.tile_mnk[0] == 128 for m in pv)
    report = _emulate(s, 1, 150, 90, 1, 1, 64, False)
    assert report.totals["bank_conflicts"] == 0


def _walk(body: list[Any]) -> Any:
    for ins in body:
        yield ins
        for attr in ("body", "then_body", "else_body"):
            yield from _walk(getattr(ins, attr, []) or [])


@pytest.mark.nvrtc
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_default_config_compiles_without_spills(causal: bool) -> None:
    """The example's defaults (BM=128, BN=32, HEAD_DIM=128, 8 warps) fit in registers."""
    from hexlayout.codegen import generate
    from hexlayout.runtime import compile_generated
    from hexlayout.runtime.sass import count_prefix

    s = synthesize(flash_attention_fwd.trace(CAUSAL=causal), "sm_80")
    ck = compile_generated(generate(s.lowered.kernel), cache=False)
    assert ck.resources is not None and ck.resources.registers > 0, ck.log
    assert not ck.resources.spills and ck.resources.stack_frame == 0, ck.resources
    # per k block S = Q K^T is 128x32x128 and O += P V 128x128x32: m16n8k16 mmas over 8 warps
    per_warp = (128 * 32 * 128 + 128 * 128 * 32) // (16 * 8 * 16) // 8
    assert count_prefix(ck.sass_counts(), "HMMA.16816") >= per_warp
