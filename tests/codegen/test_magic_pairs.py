"""The magic-number integer -> f16 / bf16 conversions (``i2f16_magic``,
``i2bf16_magic_narrow``) print two elements per statement: the bit patterns ``M + v`` of an
aligned pair in the halves of one 32-bit word, one ``__hsub2`` (HADD2 / HFMA2.BF16) removing
the magic number from both. The printed pair statement, compiled as host code against the
CUDA headers' own half / bfloat16 arithmetic, computes what the emulator (the function's
numpy rule) computes for every 8-bit input and for 32-bit inputs across the range (wrapping
patterns included), and the conversion is exact on the function's stated range; the same
statement compiles for the device (NVRTC, sm_80)."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hexlayout.arch.dtypes import BF16, F16, S8, S32, U8, DType
from hexlayout.codegen.alu import alu as print_alu
from hexlayout.codegen.ctypes_map import c_type
from hexlayout.codegen.emitter import Emitter
from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var
from hexlayout.ir.functions import ALU_FUNCTIONS
from hexlayout.ir.functions.convert import EXACT_RANGE

N = 8   # elements per printed statement group (4 pairs)
CASES = [("i2f16_magic", U8, F16), ("i2f16_magic", S8, F16), ("i2f16_magic", S32, F16),
         ("i2bf16_magic_narrow", U8, BF16), ("i2bf16_magic_narrow", S8, BF16),
         ("i2bf16_magic_narrow", S32, BF16)]


def _registry_harness():
    path = pathlib.Path(__file__).resolve().parents[1] / "ir" / "test_alu_registry.py"
    spec = importlib.util.spec_from_file_location("alu_registry_harness_pairs", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _print(fn: str, src: DType, dst: DType, start: int = 0) -> list[str]:
    a, d = L.RegArray("a", src, N + start), L.RegArray("d", dst, N + start)
    k = L.LoweredKernel("p", [], (1,), 1, Var("t", 0, 1, kind="thread"), (), [], registers=[a, d])
    em = Emitter(k)
    em.add_name(a, "a")
    em.add_name(d, "d")
    return print_alu(em, L.Alu(fn, L.RegRef(d, start, N), (L.RegRef(a, start, N),)))


def _byte_perm() -> str:
    """``__byte_perm`` on the host (the PTX ``prmt`` definition, from ``test_word_unpack``)."""
    path = pathlib.Path(__file__).resolve().parent / "test_word_unpack.py"
    spec = importlib.util.spec_from_file_location("word_unpack_prmt", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PRMT.split("// __hfma2")[0]


def _inputs(src: DType) -> np.ndarray:
    if src.bits == 8:
        return np.arange(256, dtype=np.int64).astype(np.uint8).view(src.numpy())
    info = np.iinfo(np.int32)
    edges = [info.min, info.max, -1, 0, 1, 63, 64, 127, 128, -64, -65, 511, 512, -512, -513, 0xFFFF, 0x10000]
    x = np.concatenate([edges, np.arange(-700, 700),
                        np.random.default_rng(0).integers(info.min, info.max, 4000)])
    return x[: len(x) // N * N].astype(np.int32)


@pytest.mark.parametrize(("fn", "src", "dst"), CASES, ids=lambda x: str(x))
def test_aligned_slices_print_pairs_and_odd_starts_do_not(fn: str, src: DType, dst: DType) -> None:
    lines = _print(fn, src, dst)
    if src.name == "u8" and fn == "i2f16_magic":  # bytes as held: each pair from its (16-byte aligned) word
        assert len(lines) == N // 2 and all("__byte_perm" in ln and "__hsub2" in ln for ln in lines), lines
    else:
        assert len(lines) == 2 and "__hsub2" in lines[1] and f"v < {N // 2}" in lines[1], lines
    odd = _print(fn, src, dst, start=1)                 # a pair would straddle two registers
    assert all("__hsub2" not in ln for ln in odd), odd


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to run the printed code on the host")
@pytest.mark.parametrize(("fn", "src", "dst"), CASES, ids=lambda x: str(x))
def test_printed_pairs_compute_what_the_emulator_computes(fn: str, src: DType, dst: DType, tmp_path) -> None:
    h = _registry_harness()
    inc = h._include_dir()
    if inc is None:
        pytest.skip("needs the CUDA headers")
    lines = _print(fn, src, dst)
    x = _inputs(src)
    (tmp_path / "in.bin").write_bytes(x.tobytes())
    ts, td = c_type(src), c_type(dst)
    prog = h.HARNESS + _byte_perm() + f"""
int main(int argc, char** argv) {{
  size_t n = {len(x)};
  unsigned char* x = load(argv[1], n * sizeof({ts}));
  unsigned char* y = (unsigned char*)std::malloc(n * sizeof({td}));
  for (size_t e = 0; e < n; e += {N}) {{
    {ts} a[{N}]; std::memcpy(a, x + e * sizeof({ts}), {N} * sizeof({ts}));
    {td} d[{N}];
    {chr(10).join(lines)}
    std::memcpy(y + e * sizeof({td}), d, {N} * sizeof({td}));
  }}
  store(argv[2], y, n * sizeof({td}));
  return 0;
}}"""
    (tmp_path / "p.cpp").write_text(prog)
    res = subprocess.run(["g++", "-std=c++17", "-O1", "-fwrapv", "-w", f"-I{inc}", "-o", str(tmp_path / "p"),
                          str(tmp_path / "p.cpp")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    subprocess.run([str(tmp_path / "p"), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    printed = np.frombuffer((tmp_path / "out.bin").read_bytes(), dtype=dst.numpy())
    with np.errstate(invalid="ignore", over="ignore"):      # wrapped patterns: NaN / Inf halves
        emulated = np.asarray(ALU_FUNCTIONS[fn].numpy(x.astype(np.int64)), dtype=dst.numpy())
    nan = np.isnan(printed.astype(np.float32)) & np.isnan(emulated.astype(np.float32))
    np.testing.assert_array_equal(printed.view(np.uint16)[~nan], emulated.view(np.uint16)[~nan])
    lo, hi = EXACT_RANGE[fn]
    inside = (x.astype(np.int64) >= lo) & (x.astype(np.int64) < hi)
    assert inside.sum() >= 64
    np.testing.assert_array_equal(printed[inside].astype(np.float64), x[inside].astype(np.float64))


@pytest.mark.nvrtc
def test_printed_pairs_compile_for_the_device() -> None:
    from hexlayout.runtime.compile import compile_cuda

    body = []
    for k, (fn, src, dst) in enumerate(CASES):
        ts, td = c_type(src), c_type(dst)
        body.append(f"  {{ {ts} a[{N}]; for (int i = 0; i < {N}; ++i) a[i] = static_cast<{ts}>(buf[i]); "
                    f"{td} d[{N}]; {_print(fn, src, dst)[1]} "
                    f"for (int i = 0; i < {N}; ++i) out{k}[i] = d[i]; }}")
    params = ", ".join(f"{c_type(dst)}* out{k}" for k, (_, _, dst) in enumerate(CASES))
    src = "\n".join(["#include <cuda_fp16.h>", "#include <cuda_bf16.h>",
                     f'extern "C" __global__ void pairs(const int* buf, {params}) {{', *body, "}"])
    compile_cuda(src, "sm_80", cache=False)
