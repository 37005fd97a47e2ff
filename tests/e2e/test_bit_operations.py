"""Bit operations on integer register tiles (``<< >> & | ^ ~``), run in the emulator and
compared with numpy on random words; their refusals name the kernel, the op and the line."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.synth.solve import synthesize

R, C, N = hl.dims("R C N")
RNG = np.random.default_rng(7)


def _words(dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max, shape, endpoint=True, dtype=np.int64).astype(dt)


def _kernel(t: hl.DType):
    @hl.kernel(threads=128)
    def bits(x: t[R, C], n: t[R, C], y: t[R, C, 6]):
        a = hl.register(t, (64, 32))
        s = hl.register(t, (64, 32))
        hl.copy(hl.view(x, tile=(64, 32)), a)
        hl.copy(hl.view(n, tile=(64, 32)), s)
        out = hl.view(y, tile=(64, 32, 6))
        hl.copy(a >> s, out[:, :, 0])
        hl.copy(a << s, out[:, :, 1])
        hl.copy((a >> 4) & 0xF, out[:, :, 2])
        hl.copy(a | (s ^ a), out[:, :, 3])
        hl.copy(~a, out[:, :, 4])
        b = hl.register(t, (64, 32))
        hl.assign(b, a)
        b <<= 3
        b |= 1
        b ^= s
        b >>= 2
        b &= 0x7F
        hl.copy(b, out[:, :, 5])
    return bits


@pytest.mark.parametrize("dt", ["s32", "u32", "s8", "u8"])
def test_bit_operations_match_numpy(dt: str) -> None:
    t = getattr(hl, dt)
    npd = np.dtype(t.numpy())
    x = _words(npd, (64, 32))
    # shift amounts: mostly in range, some at and past the width (and negative ones)
    n = np.where(RNG.random((64, 32)) < 0.8, RNG.integers(0, t.bits, (64, 32)),
                 RNG.integers(t.bits, 2 * t.bits, (64, 32))).astype(npd)
    if npd.kind == "i":
        n[0, :4] = [-1, -7, np.iinfo(npd).min, np.iinfo(npd).max]
    y = np.zeros((64, 32, 6), dtype=npd)
    run(synthesize(_kernel(t).trace(), "sm_80").lowered.kernel, {"x": x, "n": n, "y": y})

    # reference in Python integers: the type's own bits, amounts read unsigned, past the width clamped
    bits = t.bits
    mask = (1 << bits) - 1

    def wrap(v: int) -> int:
        v &= mask
        return v - (1 << bits) if npd.kind == "i" and v >> (bits - 1) else v

    def shr(a: int, k: int) -> int:
        k &= mask                                  # the amount read unsigned
        return a >> min(k, bits)                   # Python >> is arithmetic for negatives

    def shl(a: int, k: int) -> int:
        k &= mask
        return wrap(a << k) if k < bits else 0

    xs, ns = x.astype(np.int64).ravel().tolist(), n.astype(np.int64).ravel().tolist()
    want = np.zeros((64 * 32, 6), dtype=np.int64)
    for i, (a, k) in enumerate(zip(xs, ns)):
        b = wrap(a << 3) | 1
        b = wrap(b ^ k)
        b = shr(b, 2) & 0x7F
        want[i] = [shr(a, k), shl(a, k), shr(a, 4) & 0xF, wrap(a | (k ^ a)), wrap(~a), b]
    np.testing.assert_array_equal(y.reshape(-1, 6).astype(np.int64), want)


def test_logical_operators_on_predicates_stay_logical() -> None:
    @hl.kernel(threads=128)
    def window(x: hl.s32[R, C], y: hl.s32[R, C]):
        a = hl.register(hl.s32, (64, 32))
        hl.copy(hl.view(x, tile=(64, 32)), a)
        keep = ((a >= 0) & (a < 10)) | ~(a > -3)
        hl.copy(hl.where(keep, a, 0), hl.view(y, tile=(64, 32)))

    x = RNG.integers(-20, 20, (64, 32)).astype(np.int32)
    y = np.zeros_like(x)
    run(synthesize(window.trace(), "sm_80").lowered.kernel, {"x": x, "y": y})
    np.testing.assert_array_equal(y, np.where(((x >= 0) & (x < 10)) | (x <= -3), x, 0))


def test_refusals_name_the_op_and_line() -> None:
    @hl.kernel(threads=128)
    def float_shift(x: hl.f32[R, C]):
        a = hl.register(hl.f32, (64, 32))
        b = a >> 2  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"float_shift.*b = a >> 2.*shr needs a signed integer or "
                                             r"unsigned integer tile, %a f32"):
        float_shift.trace()

    @hl.kernel(threads=128)
    def float_mask(x: hl.s32[R, C]):
        a = hl.register(hl.s32, (64, 32))
        b = a & 0.5  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"float_mask.*b = a & 0.5.*bitand takes no floating-point"):
        float_mask.trace()

    @hl.kernel(threads=128)
    def mixed(x: hl.s32[R, C]):
        a = hl.register(hl.s32, (64, 32))
        u = hl.register(hl.u32, (64, 32))
        b = a ^ u  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"mixed.*b = a \^ u.*element types differ"):
        mixed.trace()


def test_bitcast_keeps_the_bits() -> None:
    import ml_dtypes

    @hl.kernel(threads=128)
    def reinterpret(x: hl.f32[N], h: hl.f16[N], b: hl.u8[N], y: hl.u32[N], z: hl.bf16[N], e: hl.e4m3[N],
                    f: hl.f32[N]):
        t = hl.register(hl.f32, (256,))
        hl.copy(x.tile((256,), (0,)), t)
        bits = hl.bitcast(t, hl.u32)
        hl.copy(bits >> 23 & 0xFF, y.tile((256,), (0,)))              # the biased exponents
        hl.copy(hl.bitcast(bits ^ 0x80000000, hl.f32), f.tile((256,), (0,)))   # -x
        r = hl.register(hl.f16, (256,))
        hl.copy(h.tile((256,), (0,)), r)
        hl.copy(hl.bitcast(r, hl.bf16), z.tile((256,), (0,)))
        q = hl.register(hl.u8, (256,))
        hl.copy(b.tile((256,), (0,)), q)
        hl.copy(hl.bitcast(q, hl.e4m3), e.tile((256,), (0,)))

    x = (RNG.standard_normal(256) * 2.0 ** RNG.integers(-60, 60, 256)).astype(np.float32)
    x[:4] = [np.inf, -0.0, np.nan, 1e-45]
    h = RNG.standard_normal(256).astype(np.float16)
    b = RNG.integers(0, 256, 256).astype(np.uint8)
    out = {"y": np.zeros(256, np.uint32), "z": np.zeros(256, ml_dtypes.bfloat16),
           "e": np.zeros(256, ml_dtypes.float8_e4m3fn), "f": np.zeros(256, np.float32)}
    run(synthesize(reinterpret.trace(), "sm_80").lowered.kernel, {"x": x, "h": h, "b": b, **out})
    np.testing.assert_array_equal(out["y"], (x.view(np.uint32) >> 23) & 0xFF)
    np.testing.assert_array_equal(out["f"].view(np.uint32), x.view(np.uint32) ^ np.uint32(0x80000000))
    np.testing.assert_array_equal(out["z"].view(np.uint16), h.view(np.uint16))
    np.testing.assert_array_equal(out["e"].view(np.uint8), b)


def test_bitcast_refuses_other_widths_and_predicates() -> None:
    @hl.kernel(threads=128)
    def widen(x: hl.f16[R, C]):
        a = hl.register(hl.f16, (64, 32))
        b = hl.bitcast(a, hl.f32)  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"widen: bitcast at .*%a f16\(64,32\) register has 16-bit "
                                             r"elements, f32 32-bit ones"):
        widen.trace()

    @hl.kernel(threads=128)
    def of_pred(x: hl.s32[R, C]):
        a = hl.register(hl.s32, (64, 32))
        b = hl.bitcast(a > 0, hl.u8)  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"of_pred: bitcast at .*pred has no bit pattern"):
        of_pred.trace()


@pytest.mark.parametrize("make", ["register", "shared", "cast", "full"])
def test_four_bit_tiles_are_refused_with_the_packed_word_route(make: str) -> None:
    @hl.kernel(threads=128)
    def four_bit(x: hl.u4[R, C]):
        if make == "register":
            hl.register(hl.u4, (64, 64))
        elif make == "shared":
            hl.shared(hl.i4, (64, 64))
        elif make == "cast":
            hl.cast(hl.zeros((64, 64), hl.s32), hl.u4)
        else:
            hl.full((64, 64), 3, hl.u4)

    with pytest.raises(hl.KernelError, match=r"four_bit: \w+ at .*tiles of [us]4 elements are not supported: "
                                             r"4-bit values live packed in wider words"):
        four_bit.trace()
