"""W4A16 GEMM for decode-sized M (1..16), written without layouts: ``c = a @ dequant(qw)``.

The weights are AWQ-packed: ``qw[k, w]`` is an int32 word whose nibble ``i`` holds the 4-bit
weight of column ``8 w + AWQ_ORDER[i]``; group-``GROUP`` f16 scales ``s[g, n]`` and 4-bit zero
points ``z[g, n]`` (packed like the weights) dequantize ``W[k, n] = (q[k, n] - z[k // GROUP, n])
* s[k // GROUP, n]``. The kernel unpacks nibble ``i`` of every word with a shift and a mask,
dequantizes in registers and multiplies right away: on sm_80 with mma.sync (activations are the A
operand), on sm_90a swap-AB (``c^T = W^T a^T``: the dequantized weights are the register A operand
of an RS wgmma, the activations in shared memory its B operand). Each nibble position holds the
columns ``8 w + j`` of one ``j``, so the kernel keeps one accumulator per ``j`` and the host sees
the scales and ``c`` as ``[rows, N / 8, 8]``. ``w4a16_gptq`` is the same for GPTQ's packing
(weights packed along K, zero points along N).

Checked: the emulator against a float64 reference on ragged random data (M from 1 to 16, N not a
multiple of the block), no shared-memory bank conflicts; NVRTC compiles it without spills and its
SASS has no local-memory traffic, unpacks with LOP3 / PRMT and converts without I2F (the
casts of ``q - z``, known to lie in ``[-15, 15]``, lower to the magic-number conversion).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.lang import f16, f32, s32
from hexlayout.synth.solve import synthesize

M, K, NW, G = hl.dims("M K NW G")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)   # nibble i of a word holds column 8 w + AWQ_ORDER[i]
GROUP = 128


@hl.kernel(threads=lambda c: 32 * c["WARPS"])
def w4a16_sm80(a: f16[M, K], qw: s32[K, NW], scales: f16[G, NW, 8], qz: s32[G, NW], c: f16[M, NW, 8], *,
               BM: int = 16, BW: int = 8, BK: int = 128, WARPS: int = 1):
    w0 = hl.grid(hl.spatial(hl.cdiv(qw.shape[1], BW))) * BW
    accs = [hl.zeros((BM, BW), f32) for _ in range(8)]          # accs[j]: columns 8 w + j
    for k in hl.range(hl.cdiv(a.shape[1], BK)):
        g = k * BK // GROUP
        ra = hl.register(f16, (BM, BK))
        hl.copy(hl.view(a, tile=(BM, BK), origin=(0, k * BK)), ra)
        rw = hl.register(s32, (BW, BK))                          # words, as mma wants B: (N, K)
        hl.copy(hl.view(qw, tile=(BK, BW), origin=(k * BK, w0)).T, rw)
        rz = hl.register(s32, (BW, 1))
        hl.copy(hl.view(qz, tile=(1, BW), origin=(g, w0)).T, rz)
        for i, j in enumerate(AWQ_ORDER):
            rs = hl.register(f16, (BW, 1))
            hl.copy(hl.view(scales, tile=(1, BW, 8), origin=(g, w0, 0))[:, :, j].T, rs)
            w = hl.cast(((rw >> 4 * i) & 0xF) - ((rz >> 4 * i) & 0xF), f16) * rs
            hl.mma(ra, w, accs[j])
    for j in range(8):
        hl.copy(hl.cast(accs[j], f16), hl.view(c, tile=(BM, BW, 8), origin=(0, w0, 0))[:, :, j])


@hl.kernel(threads=lambda c: 32 * c["WARPS"])
def w4a16_sm90(a: f16[M, K], qw: s32[K, NW], scales: f16[G, NW, 8], qz: s32[G, NW], c: f16[M, NW, 8], *,
               BM: int = 16, BW: int = 64, BK: int = 32, WARPS: int = 4):
    w0 = hl.grid(hl.spatial(hl.cdiv(qw.shape[1], BW))) * BW
    accs = [hl.zeros((BW, BM), f32) for _ in range(8)]          # c^T: the weights are the A operand
    sa = hl.shared(f16, (BM, BK))
    for k in hl.range(hl.cdiv(a.shape[1], BK)):
        g = k * BK // GROUP
        hl.copy(hl.view(a, tile=(BM, BK), origin=(0, k * BK)), sa)
        hl.commit_group()
        rw = hl.register(s32, (BW, BK))
        hl.copy(hl.view(qw, tile=(BK, BW), origin=(k * BK, w0)).T, rw)
        rz = hl.register(s32, (BW, 1))
        hl.copy(hl.view(qz, tile=(1, BW), origin=(g, w0)).T, rz)
        hl.wait_group(0)
        hl.fence_proxy_async()                                   # cp.async wrote sa; wgmma reads it
        hl.syncthreads()
        for i, j in enumerate(AWQ_ORDER):
            rs = hl.register(f16, (BW, 1))
            hl.copy(hl.view(scales, tile=(1, BW, 8), origin=(g, w0, 0))[:, :, j].T, rs)
            w = hl.cast(((rw >> 4 * i) & 0xF) - ((rz >> 4 * i) & 0xF), f16) * rs
            hl.wgmma_fence()
            hl.mma(w, sa, accs[j])
            hl.wgmma_commit()
        hl.wgmma_wait(0)                                         # sa is overwritten next iteration
        hl.syncthreads()
    for j in range(8):
        hl.copy(hl.cast(accs[j], f16), hl.view(c, tile=(BM, BW, 8), origin=(0, w0, 0))[:, :, j].T)


KW = hl.dims("KW")


@hl.kernel(threads=lambda c: 32 * c["WARPS"])
def w4a16_gptq(a: f16[M, KW, 8], qw: s32[KW, NW, 8], scales: f16[G, NW, 8], qz: s32[G, NW],
               c: f16[M, NW, 8], *, BM: int = 16, BW: int = 8, BKW: int = 16, WARPS: int = 1):
    """GPTQ's packing: weight nibble ``i`` of ``qw[kw, n]`` is row ``8 kw + i`` (packed along K),
    zero-point nibble ``j`` of ``qz[g, w]`` is column ``8 w + j``. The host sees ``a`` as ``[M,
    K / 8, 8]`` (row ``8 kw + i`` of a k-tile is ``[:, kw, i]``) and ``qw`` as ``[K / 8, N / 8,
    8]``; the mma of nibble ``i`` takes the activations of rows ``8 kw + i``."""
    w0 = hl.grid(hl.spatial(hl.cdiv(qw.shape[1], BW))) * BW
    accs = [hl.zeros((BM, BW), f32) for _ in range(8)]          # accs[j]: columns 8 w + j
    for k in hl.range(hl.cdiv(a.shape[1], BKW)):
        g = k * BKW * 8 // GROUP
        ras = []
        for i in range(8):
            ra = hl.register(f16, (BM, BKW))
            hl.copy(hl.view(a, tile=(BM, BKW, 8), origin=(0, k * BKW, 0))[:, :, i], ra)
            ras.append(ra)
        rz = hl.register(s32, (BW, 1))
        hl.copy(hl.view(qz, tile=(1, BW), origin=(g, w0)).T, rz)
        for j in range(8):
            rw = hl.register(s32, (BW, BKW))
            hl.copy(hl.view(qw, tile=(BKW, BW, 8), origin=(k * BKW, w0, 0))[:, :, j].T, rw)
            rs = hl.register(f16, (BW, 1))
            hl.copy(hl.view(scales, tile=(1, BW, 8), origin=(g, w0, 0))[:, :, j].T, rs)
            z = (rz >> 4 * j) & 0xF
            for i in range(8):
                hl.mma(ras[i], hl.cast(((rw >> 4 * i) & 0xF) - z, f16) * rs, accs[j])
    for j in range(8):
        hl.copy(hl.cast(accs[j], f16), hl.view(c, tile=(BM, BW, 8), origin=(0, w0, 0))[:, :, j])


KERNELS = {"sm_80": w4a16_sm80, "sm_90a": w4a16_sm90, "gptq-sm_80": w4a16_gptq}


def gptq_pack_rows(x: np.ndarray) -> np.ndarray:
    """``[K, N]`` 4-bit values -> ``[K / 8, N]`` int32 words, nibble ``i`` of word ``kw`` row ``8 kw + i``."""
    words = np.zeros((x.shape[0] // 8, x.shape[1]), dtype=np.uint32)
    for i in range(8):
        words |= x[i::8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def gptq_pack_columns(x: np.ndarray) -> np.ndarray:
    """``[G, N]`` 4-bit zero points -> ``[G, N / 8]`` words, nibble ``j`` column ``8 w + j``."""
    words = np.zeros((x.shape[0], x.shape[1] // 8), dtype=np.uint32)
    for j in range(8):
        words |= x[:, j::8].astype(np.uint32) << np.uint32(4 * j)
    return words.view(np.int32)


def awq_pack(x: np.ndarray) -> np.ndarray:
    """``[rows, N]`` 4-bit values -> ``[rows, N / 8]`` int32 words in AWQ's nibble order."""
    words = np.zeros((x.shape[0], x.shape[1] // 8), dtype=np.uint32)
    for i, j in enumerate(AWQ_ORDER):
        words |= x[:, j::8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def problem(m: int, k: int, n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    groups = k // GROUP
    return {"a": rng.standard_normal((m, k)).astype(np.float16),
            "q": rng.integers(0, 16, (k, n)), "z": rng.integers(0, 16, (groups, n)),
            "s": rng.uniform(0.002, 0.02, (groups, n)).astype(np.float16)}


def reference(p: dict[str, np.ndarray]) -> np.ndarray:
    """float64 ``a @ ((q - z) * s)``, the scales and zeros repeated over their groups."""
    z = np.repeat(p["z"], GROUP, axis=0).astype(np.float64)
    s = np.repeat(p["s"].astype(np.float64), GROUP, axis=0)
    return p["a"].astype(np.float64) @ ((p["q"] - z) * s)


@functools.cache
def _synthesized(kernel: str):
    return synthesize(KERNELS[kernel].trace(), kernel.split("-")[-1])


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("m", [1, 7, 16])
def test_matches_float64_reference_in_the_emulator(kernel: str, m: int) -> None:
    arch = kernel.split("-")[-1]
    n = 8 * 13 if arch == "sm_80" else 8 * 24          # ragged: 13 words for blocks of 8, 24 of 64
    k = 3 * GROUP
    p = problem(m, k, n, seed=m)
    c = np.zeros((m, n // 8, 8), dtype=np.float16)
    syn = _synthesized(kernel)
    if kernel.startswith("gptq"):
        args = {"a": p["a"].reshape(m, k // 8, 8), "qw": gptq_pack_rows(p["q"]).reshape(k // 8, n // 8, 8),
                "qz": gptq_pack_columns(p["z"])}
    else:
        args = {"a": p["a"], "qw": awq_pack(p["q"]), "qz": awq_pack(p["z"])}
    report = run(syn.lowered.kernel, {**args, "scales": p["s"].reshape(-1, n // 8, 8), "c": c})
    assert report.total("bank_conflicts") == 0
    want = reference(p)
    # f16 rounding of each dequantized weight (half an ulp: 2^-11 relative) and of the output
    bound = np.abs(p["a"].astype(np.float64)) @ np.abs(np.repeat(p["s"], GROUP, 0) * 16.0) * 2.0 ** -11
    err = np.abs(c.reshape(m, n).astype(np.float64) - want)
    assert (err <= bound + np.abs(want) * 2.0 ** -11 + 1e-6).all(), float(err.max())


def test_the_instructions_synthesis_chose() -> None:
    mma80 = {str(i) for _, i in _synthesized("sm_80").lowered.choices}
    assert any("SM80_16x8x16_F32F16F16F32_TN" in i for i in mma80), mma80
    mma90 = {str(i) for _, i in _synthesized("sm_90a").lowered.choices}
    assert any("SM90_64x16x16_F32F16F16_RS" in i for i in mma90), mma90   # register A: swap-AB
    # q - z lies in [-15, 15]: the casts to f16 convert by the magic number, not cvt (I2F)
    assert "i2f16_magic" in mma80 and "i2f16_magic" in mma90


@pytest.mark.nvrtc
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_compiles_without_local_memory_and_unpacks_with_lop3_prmt(kernel: str) -> None:
    from hexlayout.runtime import build
    from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts

    arch = kernel.split("-")[-1]
    b = build(KERNELS[kernel], arch)
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0, st
    counts = opcode_counts(disassemble(b.compiled.cubin))
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert count_prefix(counts, "LOP3") > 0 and count_prefix(counts, "PRMT") > 0, counts
    assert count_prefix(counts, "I2F") == 0, counts          # the magic-number conversion
    assert count_prefix(counts, "HMMA" if arch == "sm_80" else "HGMMA.64x16x16") > 0, counts
