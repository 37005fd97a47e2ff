"""4-bit global tensors (issue 9 item 1): ``u4[M, N]`` / ``i4[M, N]`` kernel arguments, stored
packed (element ``j`` of a row in byte ``j // 2``, even ``j`` in the low nibble), passed as
``uint8[M, N / 2]``; ``hl.copy`` of a view loads 16-byte vectors and unpacks to ``u8`` / ``s8``.
References are numpy on random data; the packing below is written from the convention, not
taken from the code under test."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.lang import f16
from hexlayout.synth.solve import synthesize

M, N = hl.dims("M N")


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """Host convention: two's-complement nibbles, element 2b in the low half of byte b."""
    b = (q & 15).astype(np.uint8)
    return (b[:, 0::2] | (b[:, 1::2] << 4)).astype(np.uint8)


@hl.kernel(threads=128)
def dequant(w: hl.u4[M, N], v: hl.i4[M, N], out_w: f16[M, N], out_v: f16[M, N]):
    rows, cols = w.shape                                   # cols: 2 * N_bytes
    bm, bn = hl.grid(hl.spatial(hl.cdiv(rows, 64), hl.cdiv(cols, 128)))
    q = hl.copy(hl.view(w, tile=(64, 128), origin=(bm * 64, bn * 128)))
    hl.copy(hl.cast(q, f16), hl.view(out_w, tile=(64, 128), origin=(bm * 64, bn * 128)))
    s = hl.copy(hl.view(v, tile=(64, 128), origin=(bm * 64, bn * 128)))
    hl.copy(hl.cast(s, f16), hl.view(out_v, tile=(64, 128), origin=(bm * 64, bn * 128)))


def test_the_tensor_shows_elements_and_the_kernel_takes_bytes() -> None:
    tk = dequant.trace()
    w = tk.params[0]
    assert w.dtype.name == "u8" and str(w.shape[-1]) == "N_bytes"


@pytest.mark.parametrize("m,n", [(29, 96), (64, 128), (70, 224)])
def test_u4_and_s4_match_numpy_in_the_emulator(m: int, n: int) -> None:
    syn = synthesize(dequant.trace(), "sm_80")
    assert [i for _, i in syn.lowered.choices if i.startswith("ld")] == ["ld.global.b128"] * 2
    rng = np.random.default_rng(m * n)
    qu = rng.integers(0, 16, (m, n))
    qs = rng.integers(-8, 8, (m, n))
    ow = np.zeros((m, n), np.float16)
    ov = np.zeros((m, n), np.float16)
    run(syn.lowered.kernel, {"w": _pack_nibbles(qu), "v": _pack_nibbles(qs), "out_w": ow, "out_v": ov})
    assert (ow == qu).all() and (ov == qs).all()


@hl.kernel(threads=128)
def any_rows(w: hl.u4[M, N].aligned(1), v: hl.i4[M, N].aligned(1), out_w: f16[M, N].aligned(4),
             out_v: f16[M, N].aligned(4)):
    q = hl.copy(hl.view(w, tile=(64, 128)))
    hl.copy(hl.cast(q, f16), hl.view(out_w, tile=(64, 128)))
    s = hl.copy(hl.view(v, tile=(64, 128)))
    hl.copy(hl.cast(s, f16), hl.view(out_v, tile=(64, 128)))


def test_rows_of_any_even_width_with_aligned_1() -> None:
    """Rows of 59 bytes (118 elements): the declared 1-byte alignment gives byte loads."""
    syn = synthesize(any_rows.trace(), "sm_80")
    m, n = 29, 118
    rng = np.random.default_rng(7)
    qu = rng.integers(0, 16, (m, n))
    qs = rng.integers(-8, 8, (m, n))
    ow = np.zeros((m, n), np.float16)
    ov = np.zeros((m, n), np.float16)
    run(syn.lowered.kernel, {"w": _pack_nibbles(qu), "v": _pack_nibbles(qs), "out_w": ow, "out_v": ov})
    assert (ow == qu).all() and (ov == qs).all()


@hl.kernel(threads=128)
def flip(w: hl.u4[M, N], v: hl.i4[M, N], ow: hl.u4[M, N], ov: hl.i4[M, N]):
    q = hl.copy(hl.view(w, tile=(64, 128)))
    hl.copy(15 - q, hl.view(ow, tile=(64, 128)))
    s = hl.copy(hl.view(v, tile=(64, 128)))
    hl.copy(~s, hl.view(ov, tile=(64, 128)))


def test_stores_pack_two_elements_per_byte() -> None:
    syn = synthesize(flip.trace(), "sm_80")
    assert [i for _, i in syn.lowered.choices if i.startswith("st")] == ["st.global.b128"] * 2
    m, n = 37, 96
    rng = np.random.default_rng(3)
    qu = rng.integers(0, 16, (m, n))
    qs = rng.integers(-8, 8, (m, n))
    ow = np.full((m, n // 2), 0xAB, np.uint8)
    ov = np.full((m, n // 2), 0xAB, np.uint8)
    run(syn.lowered.kernel, {"w": _pack_nibbles(qu), "v": _pack_nibbles(qs), "ow": ow, "ov": ov})
    assert (ow == _pack_nibbles(15 - qu)).all() and (ov == _pack_nibbles(-1 - qs)).all()


def test_the_launcher_takes_uint8_of_half_the_width_and_names_a_mismatch() -> None:
    torch = pytest.importorskip("torch")
    from hexlayout.errors import HexlayoutError
    from hexlayout.runtime.emulate import emulate

    syn = synthesize(dequant.trace(), "sm_80")
    rng = np.random.default_rng(5)
    qu = rng.integers(0, 16, (20, 64))
    qs = rng.integers(-8, 8, (20, 64))
    ow = torch.zeros((20, 64), dtype=torch.float16)
    ov = torch.zeros((20, 64), dtype=torch.float16)
    w, v = torch.from_numpy(_pack_nibbles(qu)), torch.from_numpy(_pack_nibbles(qs))
    emulate(syn.lowered, w, v, ow, ov)
    assert (ow.numpy() == qu).all() and (ov.numpy() == qs).all()
    with pytest.raises(HexlayoutError, match=r"\bv\b.*torch.int8"):
        emulate(syn.lowered, w, v.view(torch.int8), ow, ov)


def test_a_wrong_host_tensor_names_the_argument() -> None:
    from hexlayout.emulator.errors import EmulationError

    syn = synthesize(dequant.trace(), "sm_80")
    q = np.zeros((4, 32), np.int8)                                    # not uint8
    o = np.zeros((4, 64), np.float16)
    with pytest.raises(EmulationError, match="'v'"):
        run(syn.lowered.kernel, {"w": q.view(np.uint8), "v": q, "out_w": o, "out_v": o})


def _trace_error(fn) -> str:
    with pytest.raises(hl.KernelError) as e:
        fn.trace()
    return str(e.value)


def test_half_bytes_are_refused_with_the_tensor_and_line() -> None:
    @hl.kernel(threads=128)
    def odd_tile(w: hl.u4[M, N]):
        hl.copy(hl.view(w, tile=(64, 127)))

    @hl.kernel(threads=128)
    def odd_origin(w: hl.u4[M, N]):
        hl.copy(hl.view(w, tile=(64, 128), origin=(0, 3)))

    @hl.kernel(threads=128)
    def symbolic_origin(w: hl.u4[M, N], k: hl.i32):
        hl.copy(hl.view(w, tile=(64, 128), origin=(0, k)))

    for fn in (odd_tile, odd_origin, symbolic_origin):
        msg = _trace_error(fn)
        assert f"{fn.name}: view at" in msg and "u4 tensor w" in msg and "even" in msg, msg
        assert "test_int4_global.py" in msg, msg


def test_bad_declarations_and_uses_are_refused() -> None:
    @hl.kernel(threads=128)
    def odd_extent(w: hl.u4[64, 127]):
        pass

    @hl.kernel(threads=128)
    def strided(w: hl.u4[M, N].strides(1, M)):
        pass

    assert "argument w" in _trace_error(odd_extent) and "even" in _trace_error(odd_extent)
    assert "argument w" in _trace_error(strided) and "strides" in _trace_error(strided)

    @hl.kernel(threads=128)
    def into_halves(w: hl.u4[M, N]):
        t = hl.register(f16, (64, 128))
        hl.copy(hl.view(w, tile=(64, 128)), t)

    @hl.kernel(threads=128)
    def into_shared(w: hl.u4[M, N]):
        t = hl.shared(hl.u8, (64, 128))
        hl.copy(hl.view(w, tile=(64, 128)), t)

    @hl.kernel(threads=128)
    def element(w: hl.u4[M, N]):
        _ = w[0, 1]

    assert "held in registers as u8" in _trace_error(into_halves)
    assert "register tile of u8" in _trace_error(into_shared)
    assert "element: load at" in _trace_error(element) or "single 4-bit" in _trace_error(element)


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compiles_to_128_bit_loads(arch: str) -> None:
    from hexlayout.runtime import build
    from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts

    b = build(dequant, arch)
    assert not b.stats.spills and b.stats.local_memory_instructions == 0, b.stats
    counts = opcode_counts(disassemble(b.compiled.cubin))
    assert count_prefix(counts, "LDG.E.128") > 0, counts
    assert count_prefix(counts, "I2F") == 0, counts
