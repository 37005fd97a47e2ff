"""``hl.unpack`` / ``hl.pack``: the sub-word elements of integer words along a mode, checked
in the emulator against numpy's own reading of the words' bytes (little-endian fields), and
round-tripped; the words move with 128-bit vector loads and stores, and the program compiles."""


import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.synth.solve import synthesize

R, C, R2, C2 = hl.dims("R C R2 C2")

#: element type -> (elements per u32 word, the type the elements are held as in registers)
CASES = {"u4": (8, "u8"), "i4": (8, "s8"), "u8": (4, "u8"), "s8": (4, "s8"), "f16": (2, "f16"),
         "bf16": (2, "bf16"), "e4m3": (4, "e4m3"), "e5m2": (4, "e5m2")}


def _kernel(elem: str, axis: int):
    t = getattr(hl, elem)
    k, held = CASES[elem][0], getattr(hl, CASES[elem][1])
    shape = (64, 8) if axis == 1 else (8, 64)
    wide = (64, 8 * k) if axis == 1 else (8 * k, 64)

    @hl.kernel(threads=128)
    def roundtrip(x: hl.u32[R, C], y: held[R2, C2], z: hl.u32[R, C]):
        w = hl.register(hl.u32, shape)
        hl.copy(hl.view(x, tile=shape), w)
        u = hl.unpack(w, t, axis=axis)
        hl.copy(u, hl.view(y, tile=wide))
        hl.copy(hl.pack(u, hl.u32, axis=axis, bits=t.bits), hl.view(z, tile=shape))
    return roundtrip


def _fields(x: np.ndarray, elem: str, axis: int) -> np.ndarray:
    """numpy's reading of the words: field ``i`` is bits ``[b i, b (i + 1))``, stacked after
    the word along ``axis``; 4-bit fields as integers (sign-extended for i4), wider ones as the
    bytes of the type (checked against a view of the words' memory for the last mode)."""
    k, held = CASES[elem]
    b = 32 // k
    f = np.stack([(x >> np.uint32(b * i)) & np.uint32((1 << b) - 1) for i in range(k)], axis=axis + 1)
    shape = list(x.shape)
    shape[axis] *= k
    f = f.reshape(shape)
    npd = getattr(hl, held).numpy()
    if k == 8:
        return (((f.astype(np.int64) ^ 8) - 8) if elem == "i4" else f).astype(npd)
    out = f.astype({8: np.uint8, 16: np.uint16}[b]).view(npd)
    if axis == 1:      # little-endian: the fields are the words' bytes in memory order
        np.testing.assert_array_equal(out.view(np.uint8 if b == 8 else np.uint16),
                                      x.view(np.uint8 if b == 8 else np.uint16))
    return out


@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("elem", sorted(CASES))
def test_unpack_reads_the_fields_and_pack_restores_the_words(elem: str, axis: int) -> None:
    syn = synthesize(_kernel(elem, axis).trace(), "sm_80")
    x = np.random.default_rng(len(elem) + axis).integers(0, 2**32, (64, 8) if axis == 1 else (8, 64),
                                                         dtype=np.uint64).astype(np.uint32)
    k, held = CASES[elem]
    y = np.zeros((64, 8 * k) if axis == 1 else (8 * k, 64), getattr(hl, held).numpy())
    z = np.zeros_like(x)
    run(syn.lowered.kernel, {"x": x, "y": y, "z": z})
    raw = np.uint8 if y.dtype.itemsize == 1 else np.uint16
    np.testing.assert_array_equal(y.view(raw), _fields(x, elem, axis).view(raw))
    np.testing.assert_array_equal(z, x)
    if axis == 1:           # each thread keeps its words' fields: whole rows of words move as vectors
        assert sorted({i for _, i in syn.lowered.choices}) == ["ld.global.b128", "st.global.b128"]


@pytest.mark.nvrtc
def test_unpack_and_pack_compile() -> None:
    from hexlayout.runtime import build

    st = build(_kernel("u4", 1), "sm_80").stats
    assert not st.spills, st


def test_refusals_name_the_op() -> None:
    @hl.kernel(threads=128)
    def float_words(x: hl.f32[R, C]):
        w = hl.register(hl.f32, (64, 8))
        hl.unpack(w, hl.f16)

    with pytest.raises(hl.KernelError, match=r"float_words: unpack at .*integer type of 8 or more bits, "
                                             r"not f32"):
        float_words.trace()

    @hl.kernel(threads=128)
    def ragged(x: hl.u32[R, C]):
        h = hl.zeros((64, 7), hl.f16)
        hl.pack(h, hl.u32, axis=1)

    with pytest.raises(hl.KernelError, match=r"ragged: pack at .*7 elements along mode 1, "
                                             r"not a multiple of 2"):
        ragged.trace()

    @hl.kernel(threads=128)
    def too_wide(x: hl.u32[R, C]):
        w = hl.register(hl.u8, (64, 8))
        hl.unpack(w, hl.f16)

    with pytest.raises(hl.KernelError, match=r"too_wide: unpack at .*u8 words do not hold a whole "
                                             r"number of f16"):
        too_wide.trace()
