"""The natural W4A16 GEMM: one 4-bit ``[N, K]`` weight tile, loaded, unpacked, dequantized and
fed to one mma as its B operand, with no layouts and no accumulator per nibble position.

``w: u4[N, K]`` is a torch ``Linear`` weight quantized to 4 bits and packed along K (element
``k`` of a row in byte ``k // 2``, even ``k`` in the low nibble); group-``GROUP`` f16 scales
``s[n, g]`` and zero points ``z[n, g]`` (one byte each) dequantize ``W[n, k] = (q[n, k] -
z[n, k // GROUP]) * s[n, k // GROUP]``, and ``c = a @ W^T``. Synthesis works backward from the
mma's B fragment (``join_source_tv``): each thread holds pairs of consecutive k, i.e. whole
bytes, so the bytes are loaded where the mma wants their nibbles (single-byte loads: the
fragment's byte pairs are 4 bytes apart). Checked: the emulator against a float64 reference
on ragged random data (M from 1 to 16, N not a multiple of the block), no bank conflicts;
NVRTC compiles it without spills or local memory.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.lang import f16, f32
from hexlayout.synth.solve import SynthesisError, synthesize

M, N, K, G, NW, N8 = hl.dims("M N K G NW N8")
GROUP = 128


@hl.kernel(threads=32)
def w4a16_natural(a: f16[M, K], w: hl.u4[N, K], scales: f16[N, G], zeros: hl.u8[N, G], c: f16[M, N], *,
                  BM: int = 16, BN: int = 16, BK: int = 64):
    n0 = hl.grid(hl.spatial(hl.cdiv(w.shape[0], BN))) * BN
    acc = hl.zeros((BM, BN), f32)
    for k in hl.range(hl.cdiv(a.shape[1], BK)):
        g = k * BK // GROUP
        ra = hl.register(f16, (BM, BK))
        hl.copy(hl.view(a, tile=(BM, BK), origin=(0, k * BK)), ra)
        q = hl.copy(hl.view(w, tile=(BN, BK), origin=(n0, k * BK)))       # (BN, BK) u8 in [0, 15]
        s = hl.register(f16, (BN, 1))
        hl.copy(hl.view(scales, tile=(BN, 1), origin=(n0, g)), s)
        z = hl.register(hl.u8, (BN, 1))
        hl.copy(hl.view(zeros, tile=(BN, 1), origin=(n0, g)), z)
        hl.mma(ra, (hl.cast(q, f16) - hl.cast(z, f16)) * s, acc)
    hl.copy(hl.cast(acc, f16), hl.view(c, tile=(BM, BN), origin=(0, n0)))


@hl.kernel(threads=32)
def int4_times_f16(a: f16[M, K], w: hl.i4[N, K], c: f32[M, N]):
    """The smallest case: ``c = a @ w^T`` with signed 4-bit ``w``, the unpacked tile cast and
    used as the mma operand directly."""
    n0 = hl.grid(hl.spatial(hl.cdiv(w.shape[0], 16))) * 16
    acc = hl.zeros((16, 16), f32)
    for k in hl.range(hl.cdiv(a.shape[1], 32)):
        ra = hl.register(f16, (16, 32))
        hl.copy(hl.view(a, tile=(16, 32), origin=(0, k * 32)), ra)
        q = hl.copy(hl.view(w, tile=(16, 32), origin=(n0, k * 32)))
        hl.mma(ra, hl.cast(q, f16), acc)
    hl.copy(acc, hl.view(c, tile=(16, 16), origin=(0, n0)))


def pack_k(q: np.ndarray) -> np.ndarray:
    """Host packing: 4-bit ``q[n, k]`` -> bytes ``[n, k / 2]``, even k in the low nibble."""
    b = (q & 15).astype(np.uint8)
    return (b[:, 0::2] | (b[:, 1::2] << 4)).astype(np.uint8)


@functools.cache
def _synthesized():
    return synthesize(w4a16_natural.trace(), "sm_80")


@pytest.mark.parametrize("m,n", [(1, 40), (7, 72), (16, 24)])
def test_matches_float64_reference_in_the_emulator(m: int, n: int) -> None:
    k = 3 * GROUP
    rng = np.random.default_rng(100 * m + n)
    a = rng.standard_normal((m, k)).astype(np.float16)
    q = rng.integers(0, 16, (n, k))
    z = rng.integers(0, 16, (n, k // GROUP))
    s = rng.uniform(0.002, 0.02, (n, k // GROUP)).astype(np.float16)
    c = np.zeros((m, n), np.float16)
    report = run(_synthesized().lowered.kernel, {"a": a, "w": pack_k(q), "scales": s,
                                                 "zeros": z.astype(np.uint8), "c": c})
    assert report.total("bank_conflicts") == 0
    zz = np.repeat(z, GROUP, axis=1).astype(np.float64)
    ss = np.repeat(s.astype(np.float64), GROUP, axis=1)
    want = a.astype(np.float64) @ ((q - zz) * ss).T
    # f16 rounding of each dequantized weight (half an ulp: 2^-11 relative) and of the output
    bound = np.abs(a.astype(np.float64)) @ (np.abs(ss) * 16.0).T * 2.0 ** -11
    err = np.abs(c.astype(np.float64) - want)
    assert (err <= bound + np.abs(want) * 2.0 ** -11 + 1e-6).all(), float(err.max())


def test_signed_weights_cast_straight_into_the_mma() -> None:
    syn = synthesize(int4_times_f16.trace(), "sm_80")
    rng = np.random.default_rng(5)
    m, n, k = 13, 40, 96
    a = rng.standard_normal((m, k)).astype(np.float16)
    q = rng.integers(-8, 8, (n, k))
    c = np.zeros((m, n), np.float32)
    run(syn.lowered.kernel, {"a": a, "w": pack_k(q), "c": c})
    want = a.astype(np.float64) @ q.T.astype(np.float64)
    assert np.allclose(c, want, rtol=1e-5, atol=1e-3), float(np.abs(c - want).max())


def test_the_bytes_are_loaded_where_the_mma_wants_their_nibbles() -> None:
    choices = _synthesized().lowered.choices
    w_loads = [i for op, i in choices if "hl.view(w," in (op.loc.code or "")]
    assert w_loads == ["ld.global.b8"], choices        # byte pairs of the fragment lie 4 bytes apart
    assert any("SM80_16x8x16_F32F16F16F32_TN" in str(i) for _, i in choices)
    assert any(str(i) == "i2f16_magic" for _, i in choices)


@hl.kernel(threads=32)
def add_int4_to_accumulator(a: f16[M, K], b: f16[N, K], w: hl.i4[M, N].aligned(1), c: f32[M, N]):
    """Loop-carried: the unpacked tile is added into an mma accumulator every iteration, so
    its layout is the accumulator's (fixed by the mma) and the bytes are loaded to match."""
    acc = hl.zeros((16, 16), f32)
    for k in hl.range(hl.cdiv(a.shape[1], 16)):
        ra = hl.register(f16, (16, 16))
        hl.copy(hl.view(a, tile=(16, 16), origin=(0, k * 16)), ra)
        rb = hl.register(f16, (16, 16))
        hl.copy(hl.view(b, tile=(16, 16), origin=(0, k * 16)), rb)
        hl.mma(ra, rb, acc)
        q = hl.copy(hl.view(w, tile=(16, 16)))
        hl.assign(acc, acc + hl.cast(q, f32))
    hl.copy(acc, hl.view(c, tile=(16, 16)))


def test_an_accumulator_fixes_the_unpacked_layout_across_iterations() -> None:
    syn = synthesize(add_int4_to_accumulator.trace(), "sm_80")
    rng = np.random.default_rng(11)
    m, n, k = 11, 16, 48
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    q = rng.integers(-8, 8, (m, n))
    c = np.zeros((m, n), np.float32)
    run(syn.lowered.kernel, {"a": a, "b": b, "w": pack_k(q), "c": c})
    want = a.astype(np.float64) @ b.T.astype(np.float64) + (k // 16) * q
    assert np.allclose(c, want, rtol=1e-5, atol=1e-3), float(np.abs(c - want).max())


def test_words_whose_nibbles_span_threads_are_refused_naming_the_join() -> None:
    """AWQ-style words unpacked along N (8 consecutive columns per word) cannot feed the mma's
    B fragment (one column per thread per 8-column block) without moving values between
    threads: synthesis says so, naming the unpacking."""

    @hl.kernel(threads=32)
    def words_along_n(a: f16[M, K], qw: hl.u32[K, NW], c: f32[M, N8]):
        acc = hl.zeros((16, 64), f32)
        for k in hl.range(hl.cdiv(a.shape[1], 32)):
            ra = hl.register(f16, (16, 32))
            hl.copy(hl.view(a, tile=(16, 32), origin=(0, k * 32)), ra)
            words = hl.register(hl.u32, (32, 8))
            hl.copy(hl.view(qw, tile=(32, 8), origin=(k * 32, 0)), words)
            q = hl.unpack(words, hl.u4, axis=1)            # (32, 64): column 8 w + i
            hl.mma(ra, hl.cast(q, f16).T, acc)
        hl.copy(acc, hl.view(c, tile=(16, 64)))

    with pytest.raises(SynthesisError, match="words_along_n.*join"):
        synthesize(words_along_n.trace(), "sm_80")


@pytest.mark.nvrtc
def test_compiles_without_spills() -> None:
    from hexlayout.runtime import build
    from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts

    b = build(w4a16_natural, "sm_80")
    assert not b.stats.spills and b.stats.local_memory_instructions == 0, b.stats
    counts = opcode_counts(disassemble(b.compiled.cubin))
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    assert count_prefix(counts, "HMMA") > 0, counts
