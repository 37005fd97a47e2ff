"""The ALU function registry: every function has every rule, and for every function and every
element type it accepts, the CUDA C++ the code generator prints computes what the emulator
computes.

How the printed code is checked without a GPU: each (function, type) case is one ``Alu``
instruction. The emulator runs it in a small lowered kernel (load the operands, the
instruction, store the result). The code generator's printer prints the same instruction,
and the statement is compiled as HOST code with g++ against the CUDA toolkit's own
``cuda_fp16.h`` / ``cuda_bf16.h`` / ``cuda_fp8.h`` (whose host implementations of the
half, bfloat16 and fp8 conversions are NVIDIA's, so the 16- and 8-bit rounding is checked
against NVIDIA's code), then run on the same inputs. Inputs are random values of the type
plus NaN, +-Inf, +-0, the smallest and largest denormals, the largest finite value and, for
integers, the extremes (so sums and products wrap around); every pair of those specials is
an input pair of a binary function.

What is modelled rather than checked: the device-only intrinsics the printed code calls
have host stand-ins in the harness header below (``__float2int_rn`` and friends: nearest
even, saturating, NaN -> 0, as the CUDA Math API documents; ``__frcp_rn``: ``1 / x``;
``rsqrtf``: ``1 / sqrtf``; ``hl_ex2_approx_ftz`` (inline PTX ``ex2.approx.ftz.f32``):
``exp2f`` with subnormal inputs and results flushed to zero; bit casts; integer ``max`` /
``min``), the host math library
(glibc) stands in for CUDA's (``expf``, ``tanhf``, ...), and signed integer overflow is
compiled with ``-fwrapv`` (two's complement, as the PTX instructions nvcc emits wrap).

Comparison: bit for bit, except that any NaN equals any NaN (payloads differ between
host, device and numpy), that ``max`` / ``min`` of +0 and -0 may return either zero (C
leaves it open), and that a function with ``ulp > 0`` (the transcendental ones) may differ
by ``fn.ulp_bound(type)`` units in the last place of the result type (its ``ulp`` for f32 /
f64 results, 1 for narrower types). Integer division excludes a zero divisor and
``MIN / -1`` (undefined in C; the host traps).
"""

from __future__ import annotations

import glob
import inspect
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch.dtypes import BF16, DTYPES, E4M3, E5M2, F16, F32, F64, PRED, S8, S32, S64, U8, U32, DType
from hexlayout.codegen.alu import alu as print_alu
from hexlayout.codegen.ctypes_map import c_type
from hexlayout.codegen.emitter import Emitter
from hexlayout.emulator import run
from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var
from hexlayout.ir.functions import ALU_FUNCTIONS, AluFunction, AluTypeError, kind_of
from hexlayout.ir.functions.base import CDomain
from hexlayout.ir.tile import GlobalParam

#: the register element types an ALU function may compute on (b16 is raw bits, tf32 is stored
#: as f32 and s4 / u4 have no register type)
TYPES = [F16, BF16, F32, F64, E4M3, E5M2, S8, U8, S32, U32, S64, PRED]
THREADS, BLOCKS = 256, 4
N = THREADS * BLOCKS

# --- the registry is complete -----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ALU_FUNCTIONS))
def test_every_function_has_every_rule(name: str) -> None:
    fn = ALU_FUNCTIONS[name]
    cls = type(fn)
    assert isinstance(fn, AluFunction) and fn == name and str(fn) == name
    assert fn.doc, f"{name}: no docstring stating the math"
    assert fn.arity >= 1
    assert fn.accepts and fn.accepts <= {"float", "int", "uint", "pred"}, fn.accepts
    assert fn.result in ("same", "pred", "dst") or fn.result in DTYPES      # a type name: always that type
    assert cls.numpy is not AluFunction.numpy, f"{name}: no emulator semantics"
    assert cls.cuda is not AluFunction.cuda, f"{name}: no CUDA printing"
    assert len(inspect.signature(fn.numpy).parameters) == fn.arity, f"{name}: numpy arity"
    assert len(inspect.signature(fn.cuda).parameters) == fn.arity + 1, f"{name}: cuda arity"
    assert fn.issue(1) > 0 and fn.issue(64) >= fn.issue(1)
    assert fn.ulp >= 0 and fn.device_ulp >= 0
    if fn.ulp:
        assert fn.floating, f"{name}: only floating functions may be inexact"
    if fn.lang_name:
        f = getattr(hl, fn.lang_name)
        assert f.__name__ == fn.lang_name and fn.doc.splitlines()[0] in f.__doc__
    # the typing rule: every accepted type types, every other is refused
    for dt in TYPES:
        ops: list[DType | None] = [dt] * fn.arity
        if fn.condition:
            ops[0] = PRED
        if kind_of(dt) in fn.accepts:
            want = {"pred": PRED, "dst": F32, "same": dt}.get(fn.result) or DTYPES[fn.result]
            assert fn.result_dtype(ops, dst=F32) == want
        else:
            with pytest.raises(AluTypeError) as e:
                fn.result_dtype(ops, dst=F32)
            assert e.value.requirement == "kind"


def test_the_language_functions_come_from_the_registry() -> None:
    assert {fn.lang_name for fn in ALU_FUNCTIONS.values() if fn.lang_name} >= {
        "exp", "exp2", "log", "log2", "rsqrt", "sqrt", "silu", "erf", "tanh", "softplus"}
    assert {"tanh", "softplus", "erf", "gelu"} <= set(hl.__all__)


# --- inputs -------------------------------------------------------------------------------


def _specials(dt: DType) -> np.ndarray:
    npd = np.dtype(dt.numpy())
    if dt.is_float:
        fi = ml_dtypes.finfo(npd)
        vals = [np.nan, np.inf, -np.inf, 0.0, -0.0, float(fi.smallest_subnormal),
                -float(fi.smallest_subnormal), float(fi.smallest_normal) - float(fi.smallest_subnormal),
                float(fi.max), -float(fi.max), 1.0, -1.0, 0.5, 2.5]
        if dt in (E4M3,):
            vals = [v for v in vals if not np.isinf(v)]
        return np.array(vals, dtype=np.float64).astype(npd)
    if dt == PRED:
        return np.array([False, True])
    info = np.iinfo(npd)
    vals = {0, 1, info.max, info.min, info.max - 1, info.min + 1} | ({-1} if info.min else {2})
    return np.array(sorted(vals), dtype=npd)


def _random(dt: DType, rng: np.random.Generator, n: int) -> np.ndarray:
    npd = np.dtype(dt.numpy())
    if dt.is_float:
        fi = ml_dtypes.finfo(npd)
        lo, hi = int(np.log2(float(fi.smallest_subnormal))), int(np.log2(float(fi.max)))
        mag = np.where(rng.random(n) < 0.6, rng.uniform(-8, 8, n), rng.uniform(lo, hi, n))
        x = np.sign(rng.random(n) - 0.5) * 2.0 ** mag
        return x.astype(npd)
    if dt == PRED:
        return rng.random(n) < 0.5
    info = np.iinfo(npd)
    wide = rng.integers(info.min, info.max, n, dtype=np.int64, endpoint=True) if dt.bits < 64 else \
        rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    small = rng.integers(max(info.min, -40), 40, n, dtype=np.int64)
    return np.where(rng.random(n) < 0.5, wide, small).astype(npd)


def _inputs(fn: AluFunction, types: list[DType], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    cols = [_random(dt, rng, N) for dt in types]
    # every pair of specials (operands 0 and 1; further operands special too)
    sp = [_specials(dt) for dt in types]
    if len(types) >= 2:
        grid = np.array(np.meshgrid(np.arange(len(sp[0])), np.arange(len(sp[1])))).reshape(2, -1)
        k = grid.shape[1]
        cols[0][:k], cols[1][:k] = sp[0][grid[0]], sp[1][grid[1]]
        for j in range(2, len(types)):
            cols[j][:k] = sp[j][rng.integers(0, len(sp[j]), k)]
    else:
        cols[0][:len(sp[0])] = sp[0]
    if fn == "div" and not types[0].is_float and types[0] != PRED:
        b = cols[1]
        b[b == 0] = 1
        if np.iinfo(b.dtype).min < 0:
            b[(cols[0] == np.iinfo(cols[0].dtype).min) & (b == -1)] = 1
    return cols


# --- one case: the emulator and the printed code ------------------------------------------


@dataclass
class Case:
    """``dst = fn(srcs...)``; with ``imm`` set, the last operand is that immediate (a Python
    number, printed as a literal) instead of a register of type ``srcs[-1]``."""

    fn: AluFunction
    srcs: list[DType]
    dst: DType
    imm: float | int | None = None

    @property
    def regs(self) -> list[DType]:
        return self.srcs if self.imm is None else self.srcs[:-1]

    @property
    def id(self) -> str:
        last = "" if self.imm is None else f"-imm({self.imm!r})"
        return f"{self.fn}-{'-'.join(map(str, self.srcs))}-{self.dst}{last}"


#: immediates tried as the last operand of every function of two or more operands
IMMEDIATES = {"float": [0.1, -0.0, float("inf"), float("nan"), 1e30], "int": [3, -7, 0], "uint": [3, 250, 0],
              "pred": [1, 0]}


def cases_of(fns: list[AluFunction]) -> list[Case]:
    """Every (function, accepted type) case of ``fns`` (``cvt`` from and to every type), and,
    for functions of several operands, the same with an immediate last operand."""
    out = []
    for fn in fns:
        for dt in TYPES:
            if kind_of(dt) not in fn.accepts:
                continue
            if fn.result == "dst":       # cvt: from every accepted type to every type
                out += [Case(fn, [dt], d) for d in TYPES if kind_of(d) in fn.accepts]
                continue
            srcs = [dt] * fn.arity
            if fn.condition:
                srcs[0] = PRED
            dst = fn.result_dtype(srcs)
            out.append(Case(fn, srcs, dst))
            if fn.arity >= 2:
                imms = IMMEDIATES[kind_of(dt)]
                if fn == "div" and not dt.is_float:
                    imms = [v for v in imms if v != 0]
                out += [Case(fn, srcs, dst, v) for v in imms]
    return out


def _storage(dt: DType) -> DType:
    """Predicates travel through memory as u8."""
    return U8 if dt == PRED else dt


def _emulate(case: Case, fn: AluFunction, inputs: list[np.ndarray]) -> np.ndarray:
    tid = Var("tid", 0, THREADS, kind="thread")
    bid = Var("bid", 0, None, kind="block")
    gi = bid * THREADS + tid
    params, body, regs = [], [], []
    srcs: list[Any] = []
    for j, dt in enumerate(case.regs):
        st = _storage(dt)
        p = GlobalParam(f"x{j}", st, (N,), (1,))
        params.append(p)
        r = L.RegArray(f"r{j}", st, 1)
        regs.append(r)
        body.append(L.LdGlobal(L.RegRef(r, 0, 1), L.GlobalRef(p, gi), st.bits))
        if dt == PRED:
            q = L.RegArray(f"q{j}", PRED, 1)
            regs.append(q)
            body.append(L.Alu("cvt", L.RegRef(q, 0, 1), (L.RegRef(r, 0, 1),)))
            r = q
        srcs.append(L.RegRef(r, 0, 1))
    if case.imm is not None:
        srcs.append(case.imm)
    d = L.RegArray("d", case.dst, 1)
    regs.append(d)
    body.append(L.Alu(fn, L.RegRef(d, 0, 1), tuple(srcs)))
    out_t = _storage(case.dst)
    if case.dst == PRED:
        o = L.RegArray("o", U8, 1)
        regs.append(o)
        body.append(L.Alu("cvt", L.RegRef(o, 0, 1), (L.RegRef(d, 0, 1),)))
        d = o
    y = GlobalParam("y", out_t, (N,), (1,))
    body.append(L.StGlobal(L.GlobalRef(y, gi), L.RegRef(d, 0, 1), out_t.bits))
    k = L.LoweredKernel("alu_case", params + [y], (BLOCKS,), THREADS, tid, (bid,), body, registers=regs)
    args = {f"x{j}": (x.astype(np.uint8) if dt == PRED else x)
            for j, (x, dt) in enumerate(zip(inputs, case.regs))}
    args["y"] = np.zeros(N, dtype=out_t.numpy())
    run(k, args, check_races=False, count=False)
    return args["y"]


def _print(case: Case, fn: AluFunction) -> str:
    """The code generator's statement for ``d[0] = fn(a0[0], ...)`` (one element)."""
    regs = [L.RegArray(f"a{j}", dt, 1) for j, dt in enumerate(case.regs)]
    d = L.RegArray("d", case.dst, 1)
    k = L.LoweredKernel("alu_case", [], (1,), 1, Var("t", 0, 1, kind="thread"), (), [], registers=regs + [d])
    em = Emitter(k)
    for r in regs + [d]:
        em.add_name(r, r.name)
    srcs: list[Any] = [L.RegRef(r, 0, 1) for r in regs] + ([] if case.imm is None else [case.imm])
    (stmt,) = print_alu(em, L.Alu(fn, L.RegRef(d, 0, 1), tuple(srcs)))
    return stmt


HARNESS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <climits>
using std::abs;
// host stand-ins for device-only intrinsics (CUDA Math API semantics)
static float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
static double __longlong_as_double(long long x) { double f; std::memcpy(&f, &x, 8); return f; }
static float __frcp_rn(float x) { return 1.0f / x; }
static float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static double rsqrt(double x) { return 1.0 / sqrt(x); }
// hl_ex2_approx_ftz (codegen helper, PTX ex2.approx.ftz.f32): 2**x, subnormals flushed to zero
static float hl_ftz(float x) { return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.0f, x) : x; }
static float hl_ex2_approx_ftz(float x) { return hl_ftz(exp2f(hl_ftz(x))); }
template <class I> static I sat_rn(float x, double lo, double hi) {
  if (std::isnan(x)) return 0;
  double r = std::nearbyint((double)x);           // the default rounding mode: nearest even
  if (r <= lo) return (I)lo;
  if (r >= hi) return (I)hi;
  return (I)r;
}
static int __float2int_rn(float x) { return sat_rn<int>(x, INT_MIN, INT_MAX); }
static unsigned __float2uint_rn(float x) { return sat_rn<unsigned>(x, 0, UINT_MAX); }
static long long __float2ll_rn(float x) {
  if (std::isnan(x)) return 0;
  if (x >= 9223372036854775808.0f) return LLONG_MAX;
  if (x <= -9223372036854775808.0f) return LLONG_MIN;
  return (long long)std::nearbyint(x);
}
// CUDA's integer max / min overloads (crt/math_functions.hpp), mixed signedness included
static int max(int a, int b) { return a > b ? a : b; }
static int min(int a, int b) { return a < b ? a : b; }
static unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
static unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }
static unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
static unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
static long long max(long long a, long long b) { return a > b ? a : b; }
static long long min(long long a, long long b) { return a < b ? a : b; }
static unsigned char* load(const char* path, size_t n) {
  FILE* f = std::fopen(path, "rb"); unsigned char* p = (unsigned char*)std::malloc(n);
  if (!f || std::fread(p, 1, n, f) != n) { std::fprintf(stderr, "cannot read %s\n", path); std::exit(2); }
  std::fclose(f); return p;
}
static void store(const char* path, const void* p, size_t n) {
  FILE* f = std::fopen(path, "wb"); std::fwrite(p, 1, n, f); std::fclose(f);
}
"""


def _c_case(k: int, case: Case, stmt: str) -> str:
    ts = [c_type(dt) for dt in case.regs]
    td = c_type(case.dst)
    lines = [f"static void case_{k}(const char* dir) {{", "  char path[4096];"]
    for j, t in enumerate(ts):
        lines.append(f'  std::snprintf(path, sizeof path, "%s/in{k}_{j}.bin", dir);')
        lines.append(f"  unsigned char* x{j} = load(path, {N} * sizeof({t}));")
    lines.append(f"  unsigned char* y = (unsigned char*)std::malloc({N} * sizeof({td}));")
    lines.append(f"  for (int e = 0; e < {N}; ++e) {{")
    for j, t in enumerate(ts):
        lines.append(f"    {t} a{j}[1]; std::memcpy(a{j}, x{j} + e * sizeof({t}), sizeof({t}));")
    lines.append(f"    {td} d[1];")
    lines.append(f"    {stmt}")
    lines.append(f"    std::memcpy(y + e * sizeof({td}), d, sizeof({td}));")
    lines.append("  }")
    lines.append(f'  std::snprintf(path, sizeof path, "%s/out{k}.bin", dir);')
    lines.append(f"  store(path, y, {N} * sizeof({td}));")
    lines.append("}")
    return "\n".join(lines)


def _include_dir() -> str | None:
    """A CUDA include directory a host compiler can use (the NVRTC wheel's lacks ``crt/``)."""
    cands: list[str] = []
    try:
        from hexlayout.runtime.toolchain import include_dirs

        cands += list(include_dirs())
    except Exception:  # noqa: BLE001 - no headers found there: look at the toolkits
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(os.path.join(os.environ[env], "include"))
    cands += sorted(glob.glob("/usr/local/cuda*/include"), reverse=True)
    for d in cands:
        if all(os.path.isfile(os.path.join(d, *f)) for f in (("cuda_fp16.h",), ("crt", "host_defines.h"))):
            return d
    return None


def run_printed(cases: list[tuple[Case, AluFunction, list[np.ndarray]]], tmp: Path) -> list[np.ndarray]:
    """Compile the printed statements of ``cases`` into one host program, run it on the
    inputs, return each case's output array."""
    inc = _include_dir()
    src = [HARNESS]
    for k, (case, fn, inputs) in enumerate(cases):
        src.append(_c_case(k, case, _print(case, fn)))
        for j, (x, dt) in enumerate(zip(inputs, case.regs)):
            (tmp / f"in{k}_{j}.bin").write_bytes(np.ascontiguousarray(x.astype(np.bool_) if dt == PRED else x)
                                                 .tobytes())
    src.append("int main(int argc, char** argv) {")
    src += [f"  case_{k}(argv[1]);" for k in range(len(cases))]
    src.append("  return 0;\n}")
    (tmp / "alu.cpp").write_text("\n".join(src))
    cmd = ["g++", "-std=c++17", "-O1", "-fwrapv", "-ffp-contract=off", "-w", f"-I{inc}", "-o",
           str(tmp / "alu"), str(tmp / "alu.cpp")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"the printed code does not compile:\n{res.stderr[-4000:]}"
    subprocess.run([str(tmp / "alu"), str(tmp)], check=True)
    outs = []
    for k, (case, _, _) in enumerate(cases):
        raw = (tmp / f"out{k}.bin").read_bytes()
        outs.append(np.frombuffer(raw, dtype=np.bool_ if case.dst == PRED else case.dst.numpy()))
    return outs


# --- comparison ---------------------------------------------------------------------------

_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


def _ordered(x: np.ndarray, dt: DType) -> np.ndarray:
    """Float bits as integers ordered like the values (-0 and +0 both 0)."""
    b = x.view(_UINT[dt.bits]).astype(np.uint64)
    sign = b >> np.uint64(dt.bits - 1)
    mag = (b & np.uint64((1 << (dt.bits - 1)) - 1)).astype(np.int64)
    return np.where(sign == 1, -mag, mag)


def mismatches(fn: AluFunction, dst: DType, emu: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Indices where the printed code and the emulator disagree (see the module docstring)."""
    emu = np.asarray(emu)
    if dst == PRED:
        emu = emu.astype(np.uint8) != 0
        return np.flatnonzero(emu != c)
    if not dst.is_float:
        return np.flatnonzero(emu != c)
    e64, c64 = emu.astype(np.float64), c.astype(np.float64)
    both_nan = np.isnan(e64) & np.isnan(c64)
    bound = fn.ulp_bound(dst)
    if bound == 0:
        same = emu.view(_UINT[dst.bits]) == c.view(_UINT[dst.bits])
        if fn in ("max", "min"):
            same |= (e64 == 0) & (c64 == 0)
    else:
        same = (np.abs(_ordered(emu, dst) - _ordered(c, dst)) <= bound) & ~np.isnan(e64) & ~np.isnan(c64)
    return np.flatnonzero(~(same | both_nan))


def _report(case: Case, inputs: list[np.ndarray], emu: np.ndarray, c: np.ndarray, bad: np.ndarray) -> str:
    rows = []
    for i in bad[:6]:
        xs = ", ".join([repr(x[i].item()) for x in inputs] + ([] if case.imm is None else [repr(case.imm)]))
        rows.append(f"  {case.fn}({xs}) -> emulator {np.asarray(emu)[i]!r}, printed code {c[i]!r}")
    return f"{case.id}: {len(bad)} of {N} differ\n" + "\n".join(rows)


def check(cases: list[Case], tmp: Path) -> list[str]:
    """Run ``cases`` in the emulator and as printed host code; a report per disagreeing case."""
    work = [(case, case.fn, _inputs(case.fn, case.srcs, seed)[:len(case.regs)])
            for seed, case in enumerate(cases)]
    outs = run_printed(work, tmp)
    failures = []
    for (case, fn, inputs), c in zip(work, outs):
        emu = _emulate(case, fn, inputs)
        bad = mismatches(fn, case.dst, emu, c)
        if len(bad):
            failures.append(_report(case, inputs, emu, c, bad))
    return failures


CASES = cases_of([ALU_FUNCTIONS[n] for n in sorted(ALU_FUNCTIONS)])
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None or _include_dir() is None,
                               reason="needs g++ and the CUDA headers to run the printed code on the host")


@needs_gxx
def test_printed_code_computes_what_the_emulator_computes(tmp_path: Path) -> None:
    failures = check(CASES, tmp_path)
    assert not failures, "\n".join(failures)
    # every function and every type it accepts was exercised
    covered = {(str(c.fn), str(c.srcs[-1])) for c in CASES}
    for fn in ALU_FUNCTIONS.values():
        for dt in TYPES:
            if kind_of(dt) in fn.accepts:
                assert (str(fn), str(dt)) in covered


class _WrongSign(AluFunction):
    """A deliberately wrong function: prints ``a - b`` where numpy computes ``a + b``."""

    arity = 2

    def numpy(self, a: Any, b: Any) -> Any:
        return a + b

    def cuda(self, c: CDomain, a: str, b: str) -> str:
        return f"{a} - ({b})"


class _OffByOneUlp(AluFunction):
    """A deliberately inexact ``exp`` (two ulps off) declared as one ulp."""

    accepts = frozenset({"float"})
    floating = True
    ulp = 1

    def numpy(self, x: Any) -> Any:
        return np.nextafter(np.nextafter(np.exp(x), np.inf), np.inf)

    def cuda(self, c: CDomain, x: str) -> str:
        return f"{c.math('exp')}({x})"


@needs_gxx
def test_the_check_catches_a_wrong_definition(tmp_path: Path) -> None:
    """The comparison is not vacuous: a definition whose printing and semantics disagree (or
    whose error exceeds its stated bound) fails it."""
    wrong, inexact = _WrongSign("wrong_sign"), _OffByOneUlp("off_by_one_ulp")
    assert "wrong_sign" not in ALU_FUNCTIONS          # unnamed classes are not registered
    cases = [(Case(wrong, [S32, S32], S32), wrong), (Case(wrong, [F32, F32], F32), wrong),
             (Case(inexact, [F32], F32), inexact)]
    work = [(case, fn, _inputs(fn, case.srcs, 7)) for case, fn in cases]
    outs = run_printed(work, tmp_path)
    for (case, fn, inputs), c in zip(work, outs):
        emu = _emulate(case, fn, inputs)
        assert len(mismatches(fn, case.dst, emu, c)) > N // 4, case.id


# --- the registry's API and the errors built on it ----------------------------------------


def test_names_resolve_to_the_one_instance_and_unknown_names_are_refused() -> None:
    from hexlayout.errors import HexlayoutError
    from hexlayout.ir.functions import UnknownFunctionError, alu_function

    assert alu_function("silu") is ALU_FUNCTIONS["silu"] is alu_function(ALU_FUNCTIONS["silu"])
    assert L.Alu("add", L.RegRef(L.RegArray("r", F32, 1), 0, 1), ()).op is ALU_FUNCTIONS["add"]
    with pytest.raises(UnknownFunctionError, match="unknown ALU function 'sigmoidd'; known: .*silu") as e:
        alu_function("sigmoidd")
    assert isinstance(e.value, HexlayoutError) and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="defined twice"):
        type("SiluAgain", (AluFunction,), {"name": "silu", "numpy": None, "cuda": None})


def test_typing_refusals_name_the_requirement() -> None:
    sel, exp, land = ALU_FUNCTIONS["select"], ALU_FUNCTIONS["exp"], ALU_FUNCTIONS["and"]
    cases = [(sel, [F32, F32, F32], "condition"), (sel, [PRED, None, None], "tile"),
             (exp, [S32], "kind"), (land, [F32, F32], "kind"), (ALU_FUNCTIONS["add"], [F32, F16], "same")]
    for fn, ops, req in cases:
        with pytest.raises(AluTypeError) as e:
            fn.result_dtype(ops)
        assert e.value.requirement == req, (fn, ops)
    assert sel.result_dtype([PRED, None, F16]) == F16
    assert ALU_FUNCTIONS["cvt"].result_dtype([F32], dst=S8) == S8


DIM_M, DIM_N = hl.dims("M N")


def test_language_errors_come_from_the_typing_rule() -> None:
    @hl.kernel(threads=128)
    def bad_exp(a: hl.s32[DIM_M, DIM_N]):
        x = hl.register(hl.s32, (64, 64))
        hl.copy(a.tile((64, 64), (0, 0)), x)
        y = hl.tanh(x)  # noqa: F841

    with pytest.raises(hl.KernelError, match=r"y = hl.tanh\(x\).*tanh needs a floating-point tile, %x s32"):
        bad_exp.trace()

    @hl.kernel(threads=128)
    def bad_and(a: hl.f32[DIM_M, DIM_N]):
        x = hl.register(hl.f32, (64, 64))
        y = hl.logical_and(x, x)  # noqa: F841

    with pytest.raises(hl.KernelError, match="and needs a predicate tile, %x f32"):
        bad_and.trace()


@pytest.mark.nvrtc
def test_printed_code_compiles_for_the_device() -> None:
    """Every case's statement also compiles as device code with NVRTC (sm_80): overloads and
    intrinsics exist for the device (the host harness above stands in for some of them)."""
    from hexlayout.codegen.helpers import helper_source
    from hexlayout.runtime.compile import compile_cuda

    src = ["#include <cuda_fp16.h>", "#include <cuda_bf16.h>", "#include <cuda_fp8.h>",
           helper_source({fn.helper for fn in ALU_FUNCTIONS.values() if fn.helper}),
           'extern "C" __global__ void alu_cases(unsigned char* buf) {']
    for k, case in enumerate(CASES):
        body = [f"{c_type(dt)} a{j}[1]; a{j}[0] = *reinterpret_cast<const {c_type(dt)}*>(buf + {16 * j});"
                for j, dt in enumerate(case.regs)]
        body += [f"{c_type(case.dst)} d[1];", _print(case, case.fn),
                 f"*reinterpret_cast<{c_type(case.dst)}*>(buf + {64 + 16 * k}) = d[0];"]
        src.append("  { " + " ".join(body) + " }")
    src.append("}")
    compile_cuda("\n".join(src), "sm_80", cache=False)
