"""The ``e2m1`` element type (OCP microscaling FP4) and its cast to f16 / bf16: the 16 codes
against the OCP Microscaling Formats spec's table (v1.0, FP4 E2M1: sign, 2 exponent bits with
bias 1, 1 mantissa bit, no inf / NaN), written here from the spec, in the ALU function's numpy
semantics, in a kernel run by the IR emulator and by the PTX executor on the NVRTC PTX of the
printed code (so the printed bit trick is checked too); ``e2m1`` global tensors are packed two
per byte like ``u4``; refusals."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch.dtypes import get_dtype
from hexlayout.ir.functions import alu_function
from hexlayout.lang import KernelError

M, N, W = hl.dims("M N W")

#: OCP MX spec, FP4 E2M1: code -> value (exponent bias 1; exponent 0 is subnormal: 0.5 * m)
SPEC = {0b0000: 0.0, 0b0001: 0.5, 0b0010: 1.0, 0b0011: 1.5, 0b0100: 2.0, 0b0101: 3.0, 0b0110: 4.0,
        0b0111: 6.0}
SPEC.update({c | 0b1000: -v for c, v in list(SPEC.items())})


def _spec_value(c: int) -> float:
    """The value from the bit fields (the spec's formula), to cross-check the table above."""
    s, e, m = c >> 3, (c >> 1) & 3, c & 1
    mag = 0.5 * m if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
    return -mag if s else mag


def test_the_table_is_the_spec_formula_and_ml_dtypes() -> None:
    for c in range(16):
        assert SPEC[c] == _spec_value(c)
        assert float(np.array([c], np.uint8).view(ml_dtypes.float4_e2m1fn)[0]) == SPEC[c]
    assert np.signbit(SPEC[8])                              # code 8 is -0


def test_the_dtype_is_4_bits_and_named() -> None:
    d = get_dtype("e2m1")
    assert (d.bits, d.kind, d.cute, d.numpy()) == (4, "float", "E2M1", np.dtype(np.uint8))
    assert get_dtype("float4_e2m1fn") is d and hl.e2m1.name == "e2m1"


@pytest.mark.parametrize(("fn", "npd"), [("e2m1_f16", np.float16), ("e2m1_bf16", ml_dtypes.bfloat16)])
def test_the_alu_function_maps_every_code_to_its_spec_value(fn, npd) -> None:
    """On bit patterns (``on_bits``): the 16 codes, and only the low nibble of the byte counts."""
    codes = np.arange(256, dtype=np.uint64)
    bits = alu_function(fn).numpy(codes).astype(np.uint16)
    got = bits.view(npd).astype(np.float64)
    want = np.array([SPEC[c & 15] for c in range(256)])
    assert (got == want).all() and (np.signbit(got) == np.signbit(want)).all()


@hl.kernel(threads=128)
def fp4_cast(w: hl.e2m1[M, N], out_h: hl.f16[M, N], out_b: hl.bf16[M, N]):
    rows, cols = w.shape
    bm, bn = hl.grid(hl.spatial(hl.cdiv(rows, 64), hl.cdiv(cols, 128)))
    q = hl.copy(hl.view(w, tile=(64, 128), origin=(bm * 64, bn * 128)))
    hl.copy(hl.cast(q, hl.f16), hl.view(out_h, tile=(64, 128), origin=(bm * 64, bn * 128)))
    hl.copy(hl.cast(q, hl.bf16), hl.view(out_b, tile=(64, 128), origin=(bm * 64, bn * 128)))


def _codes(m: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Every code at least once, then random ones; packed as vLLM / gpt-oss do (value ``k`` in
    byte ``k // 2``, the low nibble for even ``k``)."""
    c = np.random.default_rng(seed).integers(0, 16, (m, n)).astype(np.uint8)
    c.reshape(-1)[:16] = np.arange(16)
    return c, (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


def test_the_kernel_takes_packed_bytes_and_casts_with_the_bit_trick() -> None:
    from hexlayout.synth.solve import synthesize

    tk = fp4_cast.trace()
    assert tk.params[0].dtype.name == "u8" and str(tk.params[0].shape[-1]) == "N_bytes"
    syn = synthesize(tk, "sm_80")
    fns = {i for _, i in syn.lowered.choices}
    assert {"e2m1_f16", "e2m1_bf16"} <= fns, fns


@pytest.mark.parametrize("mode", ["ir", "ptx"])
@pytest.mark.parametrize(("m", "n"), [(64, 128), (37, 96)])
def test_every_code_casts_to_its_spec_value_in_the_emulators(mode: str, m: int, n: int) -> None:
    torch = pytest.importorskip("torch")
    import hexlayout.runtime as rt

    if mode == "ptx":
        pytest.importorskip("cuda.bindings")
    c, packed = _codes(m, n, m + n)
    oh = torch.full((m, n), float("nan"), dtype=torch.float16)
    ob = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    b = rt.build(fp4_cast, "sm_80", compile=False)
    rt.emulate(b, torch.from_numpy(packed), oh, ob, mode=mode)
    want = torch.tensor([SPEC[int(v)] for v in c.reshape(-1)], dtype=torch.float64).reshape(m, n)
    for out in (oh, ob):
        assert torch.equal(out.double(), want) and torch.equal(out.double().signbit(), want.signbit())


@hl.kernel(threads=128)
def fp4_words(w: hl.u32[M, W], out: hl.f16[M, N]):
    words = hl.register(hl.u32, (64, 8))
    hl.copy(hl.view(w, tile=(64, 8)), words)
    hl.copy(hl.cast(hl.unpack(words, hl.e2m1, axis=1), hl.f16), hl.view(out, tile=(64, 64)))


def test_unpack_of_words_gives_e2m1_codes() -> None:
    """``hl.unpack(words, hl.e2m1)``: field ``i`` of word ``w`` (bits ``4i ..``) is element
    ``8w + i``, an e2m1 code."""
    from hexlayout.emulator import run
    from hexlayout.synth.solve import synthesize

    c = np.random.default_rng(1).integers(0, 16, (64, 64)).astype(np.uint32)
    w = np.zeros((64, 8), np.uint32)
    for i in range(8):
        w |= c[:, i::8] << (4 * i)
    out = np.zeros((64, 64), np.float16)
    run(synthesize(fp4_words.trace(), "sm_80").lowered.kernel, {"w": w, "out": out})
    assert (out.astype(np.float64) == np.array([SPEC[int(v)] for v in c.reshape(-1)]).reshape(64, 64)).all()


def test_e2m1_tiles_cast_to_f16_or_bf16_only() -> None:
    @hl.kernel(threads=128)
    def to_f32(w: hl.e2m1[M, N], out: hl.f32[M, N]):
        q = hl.copy(hl.view(w, tile=(64, 128)))
        hl.copy(hl.cast(q, hl.f32), hl.view(out, tile=(64, 128)))

    with pytest.raises(KernelError, match=r"cast.*e2m1.*f16 or bf16 only, not f32"):
        to_f32.trace()

    @hl.kernel(threads=128)
    def to_e2m1(x: hl.f16[M, N], out: hl.f16[M, N]):
        t = hl.register(hl.f16, (64, 128))
        hl.copy(hl.view(x, tile=(64, 128)), t)
        hl.copy(hl.cast(hl.cast(t, hl.e2m1), hl.f16), hl.view(out, tile=(64, 128)))

    with pytest.raises(KernelError, match=r"cast.*e2m1"):
        to_e2m1.trace()
