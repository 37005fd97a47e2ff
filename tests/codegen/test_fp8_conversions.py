"""``cvt`` between fp8 (e4m3, e5m2) and f16 prints the paired hardware conversions: the
printed pair statement, compiled as host code against the CUDA headers' own fp8 conversions,
computes what the emulator computes for every fp8 bit pattern and for f16 values across the
range (NaN, +-Inf, +-0, denormals, values past fp8's range); a kernel casting both ways matches
ml_dtypes in the emulator; on sm_89 / sm_90a the SASS converts two elements per instruction."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch.dtypes import E4M3, E5M2, F16, DType
from hexlayout.codegen.alu import alu as print_alu
from hexlayout.codegen.ctypes_map import c_type
from hexlayout.codegen.emitter import Emitter
from hexlayout.emulator import run
from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var
from hexlayout.ir.tile import GlobalParam
from hexlayout.synth.solve import synthesize

R, C = hl.dims("R C")


def _registry_harness():
    path = pathlib.Path(__file__).resolve().parents[1] / "ir" / "test_alu_registry.py"
    spec = importlib.util.spec_from_file_location("alu_registry_harness", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _inputs(src: DType) -> np.ndarray:
    if src in (E4M3, E5M2):
        return np.arange(256, dtype=np.uint8).view(src.numpy())
    rng = np.random.default_rng(0)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 6e-8, -6e-8, 65504.0, 448.0, 464.0, 57344.0, 61440.0, 1e-3,
               2.0 ** -10]
    x = np.concatenate([special, rng.standard_normal(2000) * 2.0 ** rng.integers(-20, 17, 2000)])
    with np.errstate(over="ignore"):            # some values are past f16's range: +-Inf
        return x[: len(x) // 2 * 2].astype(np.float16)


def _emulate_pairs(src: DType, dst: DType, x: np.ndarray) -> np.ndarray:
    """``cvt`` of count 2 per thread in the emulator."""
    n = len(x) // 2
    tid = Var("tid", 0, n, kind="thread")
    xp, yp = GlobalParam("x", src, (2 * n,), (1,)), GlobalParam("y", dst, (2 * n,), (1,))
    a, d = L.RegArray("a", src, 2), L.RegArray("d", dst, 2)
    body = [L.LdGlobal(L.RegRef(a, 0, 2), L.GlobalRef(xp, tid * 2), 2 * src.bits),
            L.Alu("cvt", L.RegRef(d, 0, 2), (L.RegRef(a, 0, 2),)),
            L.StGlobal(L.GlobalRef(yp, tid * 2), L.RegRef(d, 0, 2), 2 * dst.bits)]
    k = L.LoweredKernel("pairs", [xp, yp], (1,), n, tid, (Var("bid", 0, None, kind="block"),), body,
                        registers=[a, d])
    y = np.zeros(2 * n, dtype=dst.numpy())
    run(k, {"x": x, "y": y}, check_races=False, count=False)
    return y


CASES = [(E4M3, F16), (E5M2, F16), (F16, E4M3), (F16, E5M2)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to run the printed code on the host")
@pytest.mark.parametrize(("src", "dst"), CASES, ids=lambda d: str(d))
def test_paired_conversion_prints_what_the_emulator_computes(src: DType, dst: DType, tmp_path) -> None:
    h = _registry_harness()
    inc = h._include_dir()
    if inc is None:
        pytest.skip("needs the CUDA headers")
    a, d = L.RegArray("a", src, 2), L.RegArray("d", dst, 2)
    k = L.LoweredKernel("p", [], (1,), 1, Var("t", 0, 1, kind="thread"), (), [], registers=[a, d])
    em = Emitter(k)
    em.add_name(a, "a")
    em.add_name(d, "d")
    lines = print_alu(em, L.Alu("cvt", L.RegRef(d, 0, 2), (L.RegRef(a, 0, 2),)))
    assert len(lines) == 2 and "x2" in lines[1], lines            # one paired call
    x = _inputs(src)
    (tmp_path / "in.bin").write_bytes(x.tobytes())
    ts, td = c_type(src), c_type(dst)
    prog = h.HARNESS + f"""
int main(int argc, char** argv) {{
  size_t n = {len(x)};
  unsigned char* x = load(argv[1], n * sizeof({ts}));
  unsigned char* y = (unsigned char*)std::malloc(n * sizeof({td}));
  for (size_t e = 0; e < n; e += 2) {{
    {ts} a[2]; std::memcpy(a, x + e * sizeof({ts}), 2 * sizeof({ts}));
    {td} d[2];
    {lines[1].replace("#pragma unroll", "")}
    std::memcpy(y + e * sizeof({td}), d, 2 * sizeof({td}));
  }}
  store(argv[2], y, n * sizeof({td}));
  return 0;
}}"""
    (tmp_path / "p.cpp").write_text(prog)
    res = subprocess.run(["g++", "-std=c++17", "-O1", "-w", f"-I{inc}", "-o", str(tmp_path / "p"),
                          str(tmp_path / "p.cpp")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    subprocess.run([str(tmp_path / "p"), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    printed = np.frombuffer((tmp_path / "out.bin").read_bytes(), dtype=dst.numpy())
    emulated = _emulate_pairs(src, dst, x)
    bits = np.uint8 if dst.bits == 8 else np.uint16
    nan = np.isnan(printed.astype(np.float32)) & np.isnan(emulated.astype(np.float32))
    np.testing.assert_array_equal(printed.view(bits)[~nan], emulated.view(bits)[~nan])
    # and both are the conversion itself: exact from fp8, rounded once (saturating) to fp8
    want = x.astype(np.float32)
    if dst != F16:
        lim = float(ml_dtypes.finfo(dst.numpy()).max)
        want = np.where(np.isnan(want), want, np.clip(want, -lim, lim))
    want = want.astype(dst.numpy())
    np.testing.assert_array_equal(emulated.view(bits)[~nan], want.view(bits)[~nan])


def test_a_kernel_casting_both_ways_matches_ml_dtypes() -> None:
    @hl.kernel(threads=128)
    def roundtrip(x: hl.e4m3[R, C], y: hl.f16[R, C], z: hl.e5m2[R, C]):
        t = hl.register(hl.e4m3, (64, 64))
        hl.copy(hl.view(x, tile=(64, 64)), t)
        h = hl.cast(t, hl.f16)
        hl.copy(h, hl.view(y, tile=(64, 64)))
        hl.copy(hl.cast(h, hl.e5m2), hl.view(z, tile=(64, 64)))

    x = np.random.default_rng(1).integers(0, 256, (64, 64)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    y = np.zeros((64, 64), np.float16)
    z = np.zeros((64, 64), ml_dtypes.float8_e5m2)
    run(synthesize(roundtrip.trace(), "sm_80").lowered.kernel, {"x": x, "y": y, "z": z})
    nan = np.isnan(x.astype(np.float32))
    np.testing.assert_array_equal(y[~nan], x.astype(np.float16)[~nan])
    np.testing.assert_array_equal(z.view(np.uint8)[~nan], x.astype(np.float32).astype(ml_dtypes.float8_e5m2)
                                  .view(np.uint8)[~nan])


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_the_sass_converts_pairs(arch: str) -> None:
    from hexlayout.runtime import build
    from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts

    @hl.kernel(threads=128)
    def widen(x: hl.e4m3[R, C], y: hl.f16[R, C]):
        t = hl.register(hl.e4m3, (64, 64))
        hl.copy(hl.view(x, tile=(64, 64)), t)
        hl.copy(hl.cast(t, hl.f16), hl.view(y, tile=(64, 64)))

    counts = opcode_counts(disassemble(build(widen, arch).compiled.cubin))
    # 32 elements per thread: 16 paired conversions, no detour through f32
    assert count_prefix(counts, "F2FP.F16.E4M3.UNPACK_B") == 16, counts
    assert count_prefix(counts, "HADD2.F32") == 0 and count_prefix(counts, "F2FP.F16.F32") == 0, counts
