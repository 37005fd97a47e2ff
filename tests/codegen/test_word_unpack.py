"""Word-level unpack + magic conversion (``hexlayout.codegen.byte_sources`` and
``hexlayout.codegen.alu._word_pair``): when the two elements of a pair that ``i2f16_magic`` /
``i2bf16_magic_narrow`` converts are the low and high nibble of one loaded byte (``shr`` /
``bitand`` / ``cvt`` / ``bitcast`` copies of it), or two consecutive bytes, the printer reads
the 32-bit word of the loaded bytes and prints a byte permute + mask with the magic
exponent (f16: ``(t & 0x00f0000f) | 0x64006400`` and one ``__hfma2`` by ``(1, 1/16)``;
bf16: masks with ``0x43004300`` and ``__hsub2``; f16 bytes: ``PRMT`` with 0x64 bytes). The
printed code, run on the host (``__byte_perm`` by the PTX ``prmt`` definition, ``__hfma2``
by a float fma), computes bit
for bit what the emulator computes for the same lowered instructions on every byte value at
every byte position; a write to the loaded bytes in between, or a loop boundary, falls back
to the per-element form; the statements compile for the device (NVRTC, sm_80). Also
(``MORE``): an interleaved nibble order (one ``lop3`` per pair, no byte permute), a constant
zero point folded into the magic constant (``hexlayout.codegen.fold_zero``: the ``sub``
prints nothing), and bytes to bf16 through the f32 pattern."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hexlayout.arch.dtypes import BF16, F16, U8, DType
from hexlayout.codegen.alu import alu as print_alu
from hexlayout.codegen.ctypes_map import c_type
from hexlayout.codegen.emitter import Emitter
from hexlayout.codegen.fold_zero import array_uses, plan_folds
from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var
from hexlayout.ir.lower.offline import logical_bytes
from hexlayout.ir.offline import INTERLEAVED

NB = 8   # loaded bytes per group (two 32-bit words)
CASES = [("nibbles", "i2f16_magic", F16), ("nibbles", "i2bf16_magic_narrow", BF16),
         ("bytes", "i2f16_magic", F16)]
#: an interleaved nibble order (Marlin's: pair m of a word holds its nibbles m and m + 4: the
#: same nibble of bytes k and k + 2), converted with one LOP3 per pair and no byte permute;
#: and each kind with a constant zero point folded into the magic constant (``fold_zero``)
MORE = [("inter", "i2f16_magic", F16, 0), ("inter", "i2bf16_magic_narrow", BF16, 0),
        ("inter", "i2f16_magic", F16, 8), ("inter", "i2bf16_magic_narrow", BF16, 8),
        ("nibbles", "i2f16_magic", F16, 8), ("nibbles", "i2bf16_magic_narrow", BF16, 8),
        ("bytes", "i2f16_magic", F16, 128),
        # an hl.offline tile stored interleaved: the load gives the logical bytes back by
        # nibble_pair functions (hexlayout.ir.lower.offline), which the printer sees through
        ("stored", "i2f16_magic", F16, 0), ("stored", "i2f16_magic", F16, 8),
        ("stored", "i2bf16_magic_narrow", BF16, 8),
        # bytes to bf16 by the f32 pattern (PRMT of the byte into 0x4B400000), a paired rounding
        ("bytes", "i2bf16_magic", BF16, 0), ("bytes", "i2bf16_magic", BF16, 128)]
PRMT = r"""
// PTX prmt.b32 (default mode): byte i of the result is byte (s >> 4 i) & 7 of {y, x}
static unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = ((unsigned long long)y << 32) | x; unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
// __hfma2 (device only): a * b + c per half, rounded once (the float fma is exact on f16
// operands whose exact result fits a float, as every value here does)
static __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __halves2half2(__float2half_rn(std::fmaf(__low2float(a), __low2float(b), __low2float(c))),
                        __float2half_rn(std::fmaf(__high2float(a), __high2float(b), __high2float(c))));
}
// __int_as_float (device only): the bits of x as a float
static float __int_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
// hl_lop3_and_or (device: one lop3.b32)
template <unsigned MASK, unsigned OR>
static unsigned hl_lop3_and_or(unsigned a) { return (a & MASK) | OR; }
"""


def _nibble(kind: str, e: int) -> tuple[int, int]:
    """(byte, 0 low / 1 high) of element ``e`` of the unpacked nibbles: ``nibbles`` each byte's
    low then high nibble; ``inter`` (and ``stored``: the loaded words) pair ``m`` of word ``w``
    its nibbles ``m`` and ``m + 4``."""
    if kind == "nibbles":
        return e // 2, e % 2
    w, r = divmod(e, 8)
    p = r // 2 + 4 * (r % 2)
    return 4 * w + p // 2, p % 2


def _program(kind: str, fn: str, dst: DType, clobber: bool = False,
             zero: int = 0) -> tuple[list[L.Alu], list[L.RegArray]]:
    """The lowered instructions of ``_dequant``'s unpack (``kind`` nibbles / inter: see
    ``_nibble``; bytes: the bytes in order), then ``fn`` into ``d`` (with ``zero``: ``fn`` into
    ``f``, then ``d = f - z`` with ``z`` a register tile filled with ``zero``)."""
    x = L.RegArray("x", U8, NB)
    n = NB if kind == "bytes" else 2 * NB
    j, d = L.RegArray("j", U8, n), L.RegArray("d", dst, n)
    arrays = [x, j, d]
    ins: list[L.Alu] = []
    src, order = x, kind
    if kind == "stored":   # x holds the words in the interleaved order: the logical bytes first
        src, order = L.RegArray("l", U8, NB), "nibbles"
        arrays.append(src)
        ins += logical_bytes(src, x, INTERLEAVED)
    if kind != "bytes":
        parts = []
        for k, sh in enumerate((0, 4)):
            s, m, c = (L.RegArray(f"{p}{k}", U8, NB) for p in "smc")
            arrays += [s, m, c]
            ins += [L.Alu("shr", L.RegRef(s, 0, NB), (L.RegRef(src, 0, NB), sh)),
                    L.Alu("bitand", L.RegRef(m, 0, NB), (L.RegRef(s, 0, NB), 15)),
                    L.Alu("cvt", L.RegRef(c, 0, NB), (L.RegRef(m, 0, NB),))]
            parts.append(c)
        ins += [L.Alu("bitcast", L.RegRef(j, e, 1), (L.RegRef(parts[hi], b, 1),))
                for e, (b, hi) in ((e, _nibble(order, e)) for e in range(n))]
    else:
        ins.append(L.Alu("cvt", L.RegRef(j, 0, NB), (L.RegRef(x, 0, NB),)))
    if clobber:   # the loaded bytes change between the unpack and the conversion
        ins.append(L.Alu("bitand", L.RegRef(x, 0, NB), (L.RegRef(x, 0, NB), 7)))
    if not zero:
        ins.append(L.Alu(fn, L.RegRef(d, 0, n), (L.RegRef(j, 0, n),)))
        return ins, arrays
    f, z = L.RegArray("f", dst, n), L.RegArray("z", dst, 2)
    arrays += [f, z]
    ins += [L.Alu("mov", L.RegRef(z, 0, 2), (float(zero),)),
            L.Alu(fn, L.RegRef(f, 0, n), (L.RegRef(j, 0, n),))]
    ins += [L.Alu("sub", L.RegRef(d, i, 1), (L.RegRef(f, i, 1), L.RegRef(z, i % 2, 1))) for i in range(n)]
    return ins, arrays


def _print(ins: list[L.Alu], arrays: list[L.RegArray]) -> list[list[str]]:
    k = L.LoweredKernel("p", [], (1,), 1, Var("t", 0, 1, kind="thread"), (), [], registers=arrays)
    em = Emitter(k)
    for a in arrays:
        em.add_name(a, a.name)
    em.add_folds(plan_folds(ins, array_uses(ins)))
    out = []
    for i in ins:
        out.append(print_alu(em, i))
        em.bytes.observe(i)
    return out


def _emulate(ins: list[L.Alu], arrays: list[L.RegArray], x: np.ndarray) -> np.ndarray:
    """The lowered instructions by their functions' numpy rules (what the emulator runs)."""
    regs = {a.name: np.zeros(a.count, dtype=np.int64 if a.dtype.name == "u8" else a.dtype.numpy())
            for a in arrays}
    regs["x"] = x.astype(np.int64)
    for i in ins:
        srcs = [regs[s.array.name][int(s.start): int(s.start) + s.count] if isinstance(s, L.RegRef) else s
                for s in i.srcs]
        val = np.asarray(i.op.numpy(*srcs))
        dst = regs[i.dst.array.name]
        if i.dst.array.dtype.name == "u8":
            val = val.astype(np.int64) & 0xFF
        dst[int(i.dst.start): int(i.dst.start) + i.dst.count] = val.astype(dst.dtype)
    return regs["d"]


def _registry_harness():
    path = pathlib.Path(__file__).resolve().parents[1] / "ir" / "test_alu_registry.py"
    spec = importlib.util.spec_from_file_location("alu_registry_harness_words", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("kind", "fn", "dst"), CASES, ids=str)
def test_unpacked_pairs_print_from_the_loaded_word(kind: str, fn: str, dst: DType) -> None:
    ins, arrays = _program(kind, fn, dst)
    conv = _print(ins, arrays)[-1]
    assert len(conv) == NB * (2 if kind == "nibbles" else 1) // 2, conv
    assert all("reinterpret_cast<const unsigned*>(&x[" in ln for ln in conv), conv
    hfma = kind == "nibbles" and dst is F16        # the 1/16-scaled high nibble
    assert all("__byte_perm" in ln and ("__hfma2" in ln) == hfma for ln in conv), conv
    # the bytes were rewritten in between: nothing read from x's stale word (the converted
    # register's own bytes: their word when they are whole bytes, else the per-pair form)
    ins, arrays = _program(kind, fn, dst, clobber=True)
    conv = _print(ins, arrays)[-1]
    assert conv and all("&x[" not in ln for ln in conv), conv


@pytest.mark.parametrize(("kind", "fn", "dst", "zero"), MORE, ids=str)
def test_interleaved_pairs_take_no_byte_permute_and_zero_points_fold(kind, fn, dst, zero) -> None:
    ins, arrays = _program(kind, fn, dst, zero=zero)
    printed = _print(ins, arrays)
    conv = printed[-(2 * NB + 1) if kind != "bytes" and zero else -(NB + 1) if zero else -1]
    assert len(conv) == (NB if kind == "bytes" else 2 * NB) // 2, conv
    assert all("&x[" in ln for ln in conv), conv
    if kind in ("inter", "stored"):
        assert all("__byte_perm" not in ln and "hl_lop3_and_or" in ln for ln in conv), conv
    if zero:       # the subtractions of z print nothing: the conversion writes d, minus b + z
        assert all(p == [] for p in printed[len(printed) - len(conv) * 2:]), printed[-3:]
        assert all("(&d[" in ln for ln in conv), conv


def test_the_kernel_printer_reads_words_in_straight_line_code_only() -> None:
    from hexlayout.codegen.kernel import generate_cuda

    ins, arrays = _program("nibbles", "i2bf16_magic_narrow", BF16)
    t = Var("t", 0, 32, kind="thread")
    straight = generate_cuda(L.LoweredKernel("p", [], (1,), 32, t, (), list(ins), registers=arrays))
    assert "&x[0])" in straight and straight.count("__byte_perm") == NB
    # the conversion in a loop body: x may have changed since the unpack (the body runs again)
    loop = L.ForLoop(Var("i", 0, 2), 0, 2, 1, [ins[-1]])
    looped = generate_cuda(L.LoweredKernel("p", [], (1,), 32, t, (), [*ins[:-1], loop], registers=arrays))
    assert "__byte_perm" not in looped and "&x[0])" not in looped


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to run the printed code on the host")
@pytest.mark.parametrize(("kind", "fn", "dst", "zero"), [(*c, 0) for c in CASES] + MORE, ids=str)
def test_printed_words_compute_what_the_emulator_computes(kind: str, fn: str, dst: DType, zero: int,
                                                          tmp_path) -> None:
    h = _registry_harness()
    inc = h._include_dir()
    if inc is None:
        pytest.skip("needs the CUDA headers")
    ins, arrays = _program(kind, fn, dst, zero=zero)
    lines = _print(ins, arrays)
    # every byte value at every byte position, then random groups
    base = np.arange(256, dtype=np.int64)
    groups = [np.roll(base, -p)[: NB * 32].reshape(32, NB) for p in range(NB)]
    x = np.concatenate([np.stack([np.roll(g, p, axis=1) for g in groups]).reshape(-1, NB)
                        for p in range(NB)] + [np.random.default_rng(1).integers(0, 256, (64, NB))])
    n = NB if kind == "bytes" else 2 * NB
    decl = "\n    ".join(f"alignas(16) {c_type(a.dtype)} {a.name}[{a.count}];" for a in arrays)
    body = "\n    ".join(ln for group in lines for ln in group)
    td = c_type(dst)
    prog = h.HARNESS + PRMT + f"""
int main(int argc, char** argv) {{
  size_t g = {len(x)};
  unsigned char* in = load(argv[1], g * {NB});
  unsigned char* y = (unsigned char*)std::malloc(g * {n} * sizeof({td}));
  for (size_t e = 0; e < g; ++e) {{
    {decl}
    std::memcpy(x, in + e * {NB}, {NB});
    {body}
    std::memcpy(y + e * {n} * sizeof({td}), d, {n} * sizeof({td}));
  }}
  store(argv[2], y, g * {n} * sizeof({td}));
  return 0;
}}"""
    (tmp_path / "p.cpp").write_text(prog)
    res = subprocess.run(["g++", "-std=c++17", "-O1", "-fwrapv", "-w", f"-I{inc}", "-o", str(tmp_path / "p"),
                          str(tmp_path / "p.cpp")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    (tmp_path / "in.bin").write_bytes(x.astype(np.uint8).tobytes())
    subprocess.run([str(tmp_path / "p"), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    printed = np.frombuffer((tmp_path / "out.bin").read_bytes(), dtype=dst.numpy()).reshape(len(x), n)
    emulated = np.stack([_emulate(ins, arrays, row) for row in x])
    np.testing.assert_array_equal(printed.view(np.uint16), emulated.view(np.uint16))
    # and the values themselves: the nibbles / bytes, exactly
    if kind == "bytes":
        want = x
    else:
        want = np.stack([(x[:, b] >> 4 * hi) & 15 for b, hi in (_nibble(kind, e) for e in range(n))], axis=1)
    # (stored: element e is logical nibble e, stored at the interleaved position _nibble gives)
    np.testing.assert_array_equal(printed.astype(np.float64), want.astype(np.float64) - zero)


@pytest.mark.nvrtc
def test_printed_words_compile_for_the_device() -> None:
    from hexlayout.codegen.helpers import helper_source
    from hexlayout.runtime.compile import compile_cuda

    body = []
    cases = [(*c, 0) for c in CASES] + MORE
    for k, (kind, fn, dst, zero) in enumerate(cases):
        ins, arrays = _program(kind, fn, dst, zero=zero)
        decl = " ".join(f"__align__(16) {c_type(a.dtype)} {a.name}[{a.count}];" for a in arrays)
        stmts = "\n".join(ln for group in _print(ins, arrays) for ln in group)
        body.append(f"  {{ {decl} for (int i = 0; i < {NB}; ++i) x[i] = buf[i];\n{stmts}\n"
                    f"for (int i = 0; i < {arrays[2].count}; ++i) out{k}[i] = d[i]; }}")
    params = ", ".join(f"{c_type(c[2])}* out{k}" for k, c in enumerate(cases))
    src = "\n".join(["#include <cuda_fp16.h>", "#include <cuda_bf16.h>", helper_source({"lop3_and_or"}),
                     f'extern "C" __global__ void words(const unsigned char* buf, {params}) {{', *body, "}"])
    compile_cuda(src, "sm_80", cache=False)
