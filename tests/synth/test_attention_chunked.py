"""The FlashAttention example with key sub-blocks (``CHUNK``) and head-dimension chunks of
S = Q K^T (``DCHUNK``, q read from shared memory per chunk): the emulated kernel matches
float64 on ragged, grouped-query and causal shapes, and at BN=64 / head dim 128 on sm_80 it
compiles without spills at <= 3.2 non-MMA per HMMA (issue 10, item 4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_attention import LOG2E, reference

from hexlayout.emulator import run
from hexlayout.ir.tile import Mma
from hexlayout.lang.examples.flash_attention import flash_attention_fwd
from hexlayout.synth.solve import synthesize


@pytest.mark.parametrize(("chunk", "dchunk", "causal", "shape"), [
    (32, 32, False, (1, 100, 130, 2, 1, 48)),     # GQA, ragged keys, head size padded to 64
    (32, 0, True, (2, 130, 70, 2, 1, 64)),        # causal rows without a visible key give 0
    (16, 32, True, (1, 64, 64, 1, 1, 64)),
])
def test_chunked_matches_float64(chunk: int, dchunk: int, causal: bool, shape) -> None:
    tk = flash_attention_fwd.trace(BM=64, BN=64, HEAD_DIM=64, WARPS=4, CAUSAL=causal, CHUNK=chunk,
                                   DCHUNK=dchunk)
    loop_mmas = [op for op in tk.body.walk() if isinstance(op, Mma)]
    # the key-block body is traced twice (the loop split: unmasked full blocks, masked rest)
    assert len(loop_mmas) == 2 * ((64 // chunk) * (64 // (dchunk or 64)) + 64 // chunk)
    s = synthesize(tk, "sm_80")
    b, sq, sk, h, kvh, d = shape
    rng = np.random.default_rng(sq + 3 * sk + chunk)
    q = rng.standard_normal((b, sq, h, d)).astype(np.float16)
    k = rng.standard_normal((b, sk, kvh, d)).astype(np.float16)
    v = rng.standard_normal((b, sk, kvh, d)).astype(np.float16)
    o = np.full((b, sq, h, d), np.nan, dtype=np.float16)
    scale = 1.0 / math.sqrt(d)
    report = run(s.lowered.kernel, {"q": q, "k": k, "v": v, "o": o, "qk_scale": scale * LOG2E})
    err = np.abs(o.astype(np.float64) - reference(q, k, v, scale, causal))
    assert err.max() <= 1e-2, f"max abs error {err.max()}"
    assert report.totals["bank_conflicts"] == 0


@pytest.mark.nvrtc
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bn64_head_dim_128_meets_issue_10(causal: bool) -> None:
    """Issue 10 item 4, as a regression guard: BN=64, CHUNK=32, DCHUNK=64 at BM=128 / 8 warps
    on sm_80 compiles without spills and its main loop (the unmasked full key blocks) spends
    at most 3.2 non-MMA instructions per HMMA (3.11 measured when written, both with and
    without CAUSAL: ex2.approx.ftz, the scale folded into an FMA, masking only in the split-off
    masked blocks; 4.91 before; the issue's target is 4)."""
    from hexlayout.runtime import build

    b = build(flash_attention_fwd, "sm_80", BM=128, BN=64, HEAD_DIM=128, WARPS=8, CHUNK=32, DCHUNK=64,
              CAUSAL=causal)
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
    loop = b.stats.to_dict()["main_loop"]
    assert loop["mma"] == 128 and loop["non_mma_per_mma"] <= 3.2, loop
    # no per-element mask (compare + select) and no exp2f fix-up (-126 compare) in the main loop
    assert loop["mix"].get("FSEL", 0) <= 2 and loop["mix"].get("FSETP", 0) <= 2, loop["mix"]
    assert loop["mix"]["MUFU"] == 34, loop["mix"]       # 32 p + 2 alpha exponentials per thread
