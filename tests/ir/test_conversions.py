"""Fast integer -> f16 / bf16 conversions: the magic-number functions are exact on their
stated ranges, the value-range analysis bounds casts' operands soundly, and the lowering
picks a magic conversion exactly when the operand's values fit (else cvt)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.ir.functions import ALU_FUNCTIONS
from hexlayout.ir.functions.convert import EXACT_RANGE
from hexlayout.ir.lower.conversions import value_range, writers
from hexlayout.ir.tile import Cast
from hexlayout.ir.walk import walk
from hexlayout.synth.solve import synthesize

R, C = hl.dims("R C")


@pytest.mark.parametrize(("name", "npd"), [("i2f16_magic", np.float16),
                                           ("i2bf16_magic_narrow", ml_dtypes.bfloat16),
                                           ("i2bf16_magic", ml_dtypes.bfloat16)])
def test_magic_functions_are_exact_on_their_range(name: str, npd) -> None:
    lo, hi = EXACT_RANGE[name]
    v = np.arange(lo, hi, dtype=np.int64) if hi - lo <= 1 << 16 else \
        np.concatenate([np.arange(lo, lo + 5000), np.arange(-5000, 5000), np.arange(hi - 5000, hi),
                        np.random.default_rng(0).integers(lo, hi, 100000)])
    got = ALU_FUNCTIONS[name].numpy(v)
    np.testing.assert_array_equal(got.view(np.uint16), v.astype(np.float64).astype(npd).view(np.uint16))
    if name == "i2f16_magic":      # below the range the pattern leaves the binade where the ulp is 1
        assert float(ALU_FUNCTIONS[name].numpy(np.array([lo - 1]))[0]) == -512.5   # 1023.5 - 1536, not -513
    if name == "i2bf16_magic_narrow":   # 0x42FF is 127.5 (ulp 1/2 below 128): not -1
        assert float(ALU_FUNCTIONS[name].numpy(np.array([lo - 1]))[0]) == -0.5


def _casts(kernel) -> tuple[dict, list[Cast]]:
    tk = kernel.trace()
    return writers(tk), [op for op in walk(tk) if isinstance(op, Cast)]


def test_value_ranges_follow_masks_shifts_and_differences() -> None:
    @hl.kernel(threads=128)
    def ranges(w: hl.s32[R, C], b: hl.u8[R, C], y: hl.f16[R, C]):
        words = hl.register(hl.s32, (64, 32))
        hl.copy(hl.view(w, tile=(64, 32)), words)
        small = hl.register(hl.u8, (64, 32))
        hl.copy(hl.view(b, tile=(64, 32)), small)
        nib = (words >> 8) & 0xF                     # [0, 15]
        diff = nib - ((words >> 12) & 0xF)           # [-15, 15]
        wide = (words >> 4) & 0x3FFFFF               # [0, 2**22 - 1]
        acc = hl.register(hl.s32, (64, 32))
        hl.assign(acc, nib)
        acc += 1                                     # written twice: the type's range
        for t in (nib, diff, hl.cast(words, hl.s32) >> 28, small, words, acc, wide):
            hl.copy(hl.cast(t, hl.f16), hl.view(y, tile=(64, 32)))

    ws, casts = _casts(ranges)
    got = [value_range(op.src, ws) for op in casts if op.result.type.dtype == hl.f16]
    assert got == [(0, 15), (-15, 15), (-8, 7), (0, 255), (-2**31, 2**31 - 1), (-2**31, 2**31 - 1),
                   (0, 2**22 - 1)]


def _kernel(src_t, dst_t, mask: int | None):
    @hl.kernel(threads=128)
    def conv(x: src_t[R, C], y: dst_t[R, C]):
        t = hl.register(src_t, (64, 32))
        hl.copy(hl.view(x, tile=(64, 32)), t)
        v = t if mask is None else t & mask
        hl.copy(hl.cast(v, dst_t), hl.view(y, tile=(64, 32)))
    return conv


@pytest.mark.parametrize(("src", "dst", "mask", "want"), [
    ("u8", "f16", None, "i2f16_magic"), ("s8", "f16", None, "i2f16_magic"),
    ("u8", "bf16", None, "i2bf16_magic"), ("s8", "bf16", None, "i2bf16_magic"),
    ("s32", "f16", 0x1FF, "i2f16_magic"), ("s32", "f16", 0x3FF, "cvt"), ("s32", "f16", None, "cvt"),
    ("u32", "bf16", 0x3FFFFF, "i2bf16_magic"), ("u32", "bf16", 0x7FFFFF, "cvt"), ("s32", "f32", 0xF, "cvt"),
    ("s32", "bf16", 0x7F, "i2bf16_magic_narrow"), ("u32", "bf16", 0xFF, "i2bf16_magic"),
])
def test_the_lowering_picks_a_magic_conversion_only_where_exact(src: str, dst: str, mask, want: str) -> None:
    st, dt = getattr(hl, src), getattr(hl, dst)
    syn = synthesize(_kernel(st, dt, mask).trace(), "sm_80")
    chosen = [i for op, i in syn.lowered.choices if isinstance(op, Cast)]
    assert chosen == ([] if want == "cvt" else [want])
    info = np.iinfo(st.numpy())
    x = np.random.default_rng(3).integers(info.min, info.max, (64, 32), endpoint=True).astype(st.numpy())
    x.ravel()[:4] = [info.min, info.max, 0, 1]
    y = np.zeros((64, 32), dtype=dt.numpy())
    run(syn.lowered.kernel, {"x": x, "y": y})
    with np.errstate(over="ignore"):           # s32 -> f16 overflows to inf, as cvt does
        ref = (x if mask is None else x & mask).astype(np.float64).astype(dt.numpy())   # one rounding
    np.testing.assert_array_equal(y.view(np.uint16 if dt.bits == 16 else np.uint32),
                                  ref.view(np.uint16 if dt.bits == 16 else np.uint32))


def test_value_ranges_follow_unpacking_regrouping_and_integer_casts() -> None:
    """A u4 value unpacked from words (shifts, masks, an interleaving ``Join``), regrouped
    (``Reshape``, ``Permute``) and widened (u8 -> u32 ``Cast``) stays in [0, 15]: the bf16
    cast of it takes the bf16-only magic conversion; a widening of a value that may wrap
    does not narrow."""
    @hl.kernel(threads=128)
    def unpacked(w: hl.u32[R, C], y: hl.bf16[R, C]):
        words = hl.register(hl.u32, (64, 4))
        hl.copy(hl.view(w, tile=(64, 4)), words)
        q = hl.unpack(words, hl.u4, axis=1)                          # (64, 32) u8 in [0, 15]
        moved = hl.reshape(hl.reshape(q, (64, 2, 16)).permute((0, 2, 1)), (64, 32))
        wide = hl.cast(moved, hl.u32)
        for t in (q, moved, wide):
            hl.copy(hl.cast(t, hl.bf16), hl.view(y, tile=(64, 32)))
        hl.copy(hl.cast(hl.cast(words, hl.u8), hl.bf16), hl.view(y, tile=(64, 4)))

    ws, casts = _casts(unpacked)
    got = [value_range(op.src, ws) for op in casts if op.result.type.dtype == hl.bf16]
    assert got == [(0, 15), (0, 15), (0, 15), (0, 255)]
