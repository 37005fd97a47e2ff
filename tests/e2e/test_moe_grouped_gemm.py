"""Kernel (b) of the serving-language issue: a grouped (mixture-of-experts) W4A16 GEMM, written
without layouts. The routing is vLLM's ``moe_align_block_size`` output: ``sorted_ids`` lists
the tokens of expert 0, then expert 1, ..., each expert's list padded with the out-of-range
id ``T`` to a multiple of ``BM``; block ``b`` of ``BM`` sorted ids is served by expert
``expert_ids[b]``. Each thread block reads its expert id from memory (a scalar load that
places the weight views), gathers its token rows through the sorted ids (padding rows read
as zero and are not stored) and multiplies them by the expert's AWQ-packed int4 weights,
unpacked with shifts and masks and dequantized in registers right before the mma:

    c[t] = a[t] @ W[expert(t)],  W[e, k, n] = (q[e, k, n] - z[e, k // 128, n]) * s[e, k // 128, n]

Built from the scalar loads / gathers (``hexlayout.lang.views``) and the int4 unpacking and
magic-number conversions the W4A16 test uses. Checked in the emulator against float64 on
ragged random routing (T, experts with 0 tokens, N not a multiple of the block), no bank
conflicts, for sm_80 and sm_90a; NVRTC compiles it without spills or local memory."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.lang import f16, f32, i32, s32
from hexlayout.runtime import build
from hexlayout.synth.solve import synthesize

T, K, NW, G, E, EM, NB = hl.dims("T K NW G E EM NB")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)   # nibble i of a word holds column 8 w + AWQ_ORDER[i]
GROUP = 128
ARCHS = ["sm_80", "sm_90a"]


@hl.kernel(threads=lambda c: 32 * c["WARPS"])
def moe_w4a16(a: f16[T, K], sorted_ids: i32[EM], expert_ids: i32[NB], qw: s32[E, K, NW],
              scales: f16[E, G, NW, 8], qz: s32[E, G, NW], c: f16[T, NW, 8], *,
              BM: int = 16, BW: int = 8, BK: int = 128, WARPS: int = 1):
    pid_m, pid_w = hl.grid(hl.spatial(expert_ids.shape[0], hl.cdiv(qw.shape[2], BW)))
    w0 = pid_w * BW
    e = hl.load(expert_ids, (pid_m,))                            # this block's expert
    rows = hl.register(i32, (BM,))
    hl.copy(sorted_ids[pid_m * BM:pid_m * BM + BM], rows)        # its token rows
    accs = [hl.zeros((BM, BW), f32) for _ in range(8)]           # accs[j]: columns 8 w + j
    for k in hl.range(hl.cdiv(a.shape[1], BK)):
        g = k * BK // GROUP
        ra = hl.register(f16, (BM, BK))
        hl.copy(a[rows, k * BK:k * BK + BK], ra)                 # gathered activations
        rw = hl.register(s32, (BW, BK))
        hl.copy(hl.view(qw, tile=(1, BK, BW), origin=(e, k * BK, w0))[0, :, :].T, rw)
        rz = hl.register(s32, (BW, 1))
        hl.copy(hl.view(qz, tile=(1, 1, BW), origin=(e, g, w0))[0, :, :].T, rz)
        for i, j in enumerate(AWQ_ORDER):
            rs = hl.register(f16, (BW, 1))
            hl.copy(hl.view(scales, tile=(1, 1, BW, 8), origin=(e, g, w0, 0))[0, :, :, j].T, rs)
            w = hl.cast(((rw >> 4 * i) & 0xF) - ((rz >> 4 * i) & 0xF), f16) * rs
            hl.mma(ra, w, accs[j])
    for j in range(8):
        hl.copy(hl.cast(accs[j], f16), c[rows, w0:w0 + BW, j])  # scattered back to the tokens


def awq_pack(x: np.ndarray) -> np.ndarray:
    """``[..., N]`` 4-bit values -> ``[..., N / 8]`` int32 words in AWQ's nibble order."""
    words = np.zeros(x.shape[:-1] + (x.shape[-1] // 8,), np.uint32)
    for i, j in enumerate(AWQ_ORDER):
        words |= x[..., j::8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def align_block_size(expert: np.ndarray, experts: int, bm: int) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's moe_align_block_size for top-1 routing: (sorted_ids, expert_ids)."""
    t = len(expert)
    ids: list[int] = []
    eids: list[int] = []
    for e in range(experts):
        toks = [int(x) for x in np.nonzero(expert == e)[0]]
        n = -(-len(toks) // bm) * bm
        ids += toks + [t] * (n - len(toks))
        eids += [e] * (n // bm)
    return np.array(ids, np.int32), np.array(eids, np.int32)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("t", "n"), [(37, 24), (5, 64)])
def test_grouped_int4_gemm_matches_float64(arch: str, t: int, n: int) -> None:
    syn = synthesize(moe_w4a16.trace(), arch)
    rng = np.random.default_rng(t + n)
    k, experts, bm = 256, 4, 16
    a = rng.standard_normal((t, k)).astype(np.float16)
    q = rng.integers(0, 16, (experts, k, n))
    z = rng.integers(0, 16, (experts, k // GROUP, n))
    s = (rng.random((experts, k // GROUP, n)) * 0.02 + 0.005).astype(np.float16)
    expert = rng.integers(0, experts - 1, t)              # the last expert gets no token
    sorted_ids, expert_ids = align_block_size(expert, experts, bm)
    c = np.full((t, n // 8, 8), np.nan, np.float16)
    report = run(syn.lowered.kernel, {"a": a, "sorted_ids": sorted_ids, "expert_ids": expert_ids,
                                      "qw": awq_pack(q), "scales": s.reshape(experts, k // GROUP, n // 8, 8),
                                      "qz": awq_pack(z), "c": c})
    w = (q - np.repeat(z, GROUP, axis=1)) * np.repeat(s.astype(np.float64), GROUP, axis=1)
    want = np.stack([a[i].astype(np.float64) @ w[expert[i]] for i in range(t)])
    got = c.reshape(t, n).astype(np.float64)
    assert np.abs(got - want).max() < 2e-3 * (1 + np.abs(want).max())
    assert report.totals["bank_conflicts"] == 0


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_grouped_int4_gemm_compiles_without_spills(arch: str) -> None:
    b = build(moe_w4a16, arch)
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0
    assert "mma.sync" in b.generated.source
