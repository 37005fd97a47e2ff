"""Kernel (c) of the serving-language issue: paged decode attention with GQA, written without
layouts (``hexlayout.lang.examples.paged_attention``). The sequence length is read from
memory and bounds the loop; K/V rows are gathered from an NHD KV cache through a shuffled
block table with indices computed in registers. Synthesized for sm_80 and sm_90a, run in the
emulator on ragged random batches against float64, compiled with NVRTC without spills."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from hexlayout.emulator import run
from hexlayout.lang.examples.paged_attention import paged_decode
from hexlayout.synth.solve import Synthesis, synthesize

BLOCK = 16          # KV-cache block size (the kernel's default)


@cache
def _synth(arch: str, block: int = BLOCK) -> Synthesis:
    return synthesize(paged_decode.trace(BLOCK=block), arch)


def _case(seed: int, lens: list[int], kvh: int, g: int, d: int, block: int = BLOCK) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = len(lens)
    blocks = [-(-n // block) for n in lens]
    nb = sum(blocks) + 7                                   # spare blocks nobody owns
    maxb = max(blocks) + 3
    # unused entries hold anything (vLLM pads with garbage or -1): they must never be read
    table = rng.integers(-(10 ** 6), 10 ** 6, size=(b, maxb)).astype(np.int32)
    perm = rng.permutation(nb)
    k = 0
    for s, nbk in enumerate(blocks):
        table[s, :nbk] = perm[k:k + nbk]
        k += nbk
    return {
        "q": rng.standard_normal((b, kvh, g, d)).astype(np.float16),
        "k_cache": rng.standard_normal((nb, block, kvh, d)).astype(np.float16),
        "v_cache": rng.standard_normal((nb, block, kvh, d)).astype(np.float16),
        "block_table": table,
        "seq_lens": np.array(lens, np.int32),
        "o": np.full((b, kvh, g, d), np.nan, np.float16),
    }


def _reference(a: dict[str, np.ndarray], scale: float) -> np.ndarray:
    """float64 attention of each sequence's G query heads per KV head over its keys, found
    through the block table (key j: block table[s, j // block], row j % block)."""
    q, kc, vc = a["q"], a["k_cache"], a["v_cache"]
    block = kc.shape[1]
    out = np.zeros(q.shape)
    for s, n in enumerate(a["seq_lens"]):
        blk = a["block_table"][s, np.arange(n) // block]
        keys = kc[blk, np.arange(n) % block].astype(np.float64)       # [n, KVH, D]
        vals = vc[blk, np.arange(n) % block].astype(np.float64)
        for h in range(q.shape[1]):
            sc = q[s, h].astype(np.float64) @ keys[:, h].T * scale
            e = np.exp(sc - sc.max(axis=1, keepdims=True))
            out[s, h] = (e / e.sum(axis=1, keepdims=True)) @ vals[:, h]
    return out


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(("seed", "lens", "kvh", "d"), [
    (0, [1, 17, 100, 257], 2, 128),        # ragged batch, one-token and multi-block sequences
    (1, [33, 64, 5], 1, 96),               # head size below the padded 128
])
def test_matches_float64(arch: str, seed: int, lens: list[int], kvh: int, d: int) -> None:
    a = _case(seed, lens, kvh, 8, d)
    scale = 1.0 / math.sqrt(d)
    report = run(_synth(arch).lowered.kernel, {**a, "qk_scale": scale * math.log2(math.e)})
    err = np.abs(a["o"].astype(np.float64) - _reference(a, scale))
    assert err.max() <= 2e-3, f"max abs error {err.max()}"
    assert report.totals["bank_conflicts"] == 0


def test_block_size_32_matches_float64() -> None:
    a = _case(2, [40, 7, 95], 2, 8, 128, block=32)
    scale = 1.0 / math.sqrt(128)
    report = run(_synth("sm_80", 32).lowered.kernel, {**a, "qk_scale": scale * math.log2(math.e)})
    err = np.abs(a["o"].astype(np.float64) - _reference(a, scale))
    assert err.max() <= 2e-3, f"max abs error {err.max()}"
    assert report.totals["bank_conflicts"] == 0


def test_gathers_are_cp_async_and_the_loop_bound_is_loaded() -> None:
    s = _synth("sm_80")
    chosen = {ins for _, ins in s.lowered.choices}
    assert "cp.async.cg.16" in chosen
    text = str(s.kernel)
    # seq_lens is signed, so the bound prints with floor semantics (C's / truncates)
    assert "load %seq_lens[" in text
    assert "for j in range(0, ((seq_lens_ld[0] + 63) / 64 - ((seq_lens_ld[0] + 63) % 64 < 0))" in text
    assert ("view %k_cache[0, 0, blockIdx.x, 0] extent (64, min(D, 128)) "
            "gather (%page_2[c0], %row[c0], 0, c1)") in text


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compiles_without_spills(arch: str) -> None:
    from hexlayout.runtime import build

    b = build(paged_decode, arch)
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
    counts = b.compiled.sass_counts()
    assert any(op.startswith("LDGSTS") for op in counts)          # K/V rows gathered by cp.async
    assert any(op.startswith("HMMA.16816") for op in counts)
