"""Floating-point math functions: exp exp2 exp2_approx log log2 sqrt rsqrt silu erf gelu gelu_tanh tanh
softplus.

Each computes in ``float`` (``double`` for f64 destinations) with the C math library
function named in its printing; ``numpy`` evaluates the same expression step by step in
the same precision, each library call correctly rounded (``libm``), so the two differ only
by the C math library's rounding (``ulp``; glibc on the host, CUDA's on the device).
``device_ulp`` is the maximum error CUDA documents for the device function (CUDA C++
Programming Guide, "Mathematical Functions", single precision), composed through the
expression for silu, gelu, gelu_tanh and softplus (an estimate, not measured on a device; it also
allows for NVRTC / nvcc contracting ``a * b + c`` into an fma, ``--fmad=true`` by default,
which the host check of ``tests/ir/test_alu_registry.py`` compiles without).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hexlayout.arch.dtypes import DType

from .base import FLOAT, AluFunction, CDomain, function_class, libm

__all__ = ["Exp", "Exp2", "Exp2Approx", "Log", "Log2", "Sqrt", "Rsqrt", "Silu", "Erf", "Gelu", "GeluTanh",
           "Tanh", "Softplus"]


class _Transcendental(AluFunction):
    """A floating-point function (operands and result floating; integers are converted)."""

    accepts = FLOAT
    floating = True


class _MathCall(_Transcendental):
    """A function that is one C math-library call named ``name`` (``expf``, ``exp``, ... by
    type): the emulator evaluates ``libm_fn`` as the host libm does (unless the function
    defines its own ``numpy``)."""

    libm_fn: Any = None

    def numpy(self, x: Any) -> Any:
        return libm(self.libm_fn, x)

    def cuda(self, c: CDomain, x: str) -> str:
        return f"{c.math(self.name)}({x})"


def _math_call(cls: str, libm_fn: Any, ulp: int, device_ulp: int, doc: str) -> type[_MathCall]:
    """The function of ``doc`` that is the C math call ``cls.lower()`` (also its ``hl`` name),
    ``libm_fn`` in the emulator, with its ``ulp`` / ``device_ulp`` bounds."""
    return function_class(cls, _MathCall, doc, __name__, lang_name=cls.lower(), ulp=ulp,
                          device_ulp=device_ulp, libm_fn=staticmethod(libm_fn))


Exp = _math_call("Exp", np.exp, 1, 2, "``e**x``.")
Exp2 = _math_call("Exp2", np.exp2, 1, 2, "``2**x`` (prefer it with a log2(e)-scaled argument).")


_F32_MIN_NORMAL = np.float32(2.0 ** -126)


def _flush(x: Any) -> Any:
    """``x`` with subnormal values replaced by zero of the same sign (float32's ``.ftz``)."""
    return np.where(np.abs(x) < _F32_MIN_NORMAL, np.copysign(np.float32(0), x), x).astype(np.float32)


class Exp2Approx(_Transcendental):
    """``2**x`` by the hardware approximation, flushing subnormals to zero: PTX
    ``ex2.approx.ftz.f32`` (one MUFU.EX2; ``exp2`` adds the subnormal-range fix-up around
    it). Computed in float32 whatever the destination: a subnormal input counts as 0 (2**0 =
    1) and a result below 2**-126 (x < -126) is +0; ``2**-inf = 0``, ``2**inf = inf``, NaN
    stays NaN. The device result is within a relative error of 2**-22 of ``2**x`` (PTX ISA,
    ``ex2``: at most 4 float32 ulps); the emulator computes the correctly rounded ``2**x``."""

    name = "exp2_approx"
    lang_name = "exp2_approx"
    ulp = 1
    device_ulp = 4
    helper = "ex2_approx_ftz"

    def ulp_bound(self, dst: DType) -> int:
        """Computed in float32 for every destination: ``ulp`` float32 ulps, which are 2**29
        f64 ulps."""
        return self.ulp << 29 if dst.bits > 32 else super().ulp_bound(dst)

    def numpy(self, x: Any) -> Any:
        x = np.asarray(x)
        r = _flush(libm(np.exp2, _flush(x.astype(np.float32))))
        return r.astype(x.dtype) if x.dtype.kind == "f" else r

    def cuda(self, c: CDomain, x: str) -> str:
        r = f"hl_ex2_approx_ftz(static_cast<float>({x}))"
        return r if c.ctype == "float" else f"static_cast<{c.ctype}>({r})"


Log = _math_call("Log", np.log, 1, 1, "``ln x`` (NaN for x < 0, -inf at 0).")
Log2 = _math_call("Log2", np.log2, 1, 1, "``log2 x`` (NaN for x < 0, -inf at 0).")


class Sqrt(_MathCall):
    """``sqrt x``, correctly rounded (numpy's is, in every precision)."""

    name = "sqrt"
    lang_name = "sqrt"

    def numpy(self, x: Any) -> Any:
        return np.sqrt(x)


class Rsqrt(_MathCall):
    """``1 / sqrt x`` (the emulator: the reciprocal of the correctly rounded root)."""

    name = "rsqrt"
    lang_name = "rsqrt"
    ulp = 1
    device_ulp = 2

    def numpy(self, x: Any) -> Any:
        return 1 / np.sqrt(x)


class Silu(_Transcendental):
    """``silu(x) = x * sigmoid(x) = x / (1 + e**-x)``."""

    name = "silu"
    lang_name = "silu"
    ulp = 2
    device_ulp = 4

    def numpy(self, x: Any) -> Any:
        return x / (1 + libm(np.exp, -x))

    def cuda(self, c: CDomain, x: str) -> str:
        return f"({x}) / ({c.one()} + {c.math('exp')}(-({x})))"


def _vectorized(f: Any) -> Any:
    """The scalar ``math`` function ``f`` over a numpy array (float64 results; numpy has no
    ``erf``, and the host's ``math.erf`` is glibc's, what the host check compiles against)."""
    u = np.frompyfunc(f, 1, 1)

    def g(x: Any) -> Any:
        return np.asarray(u(np.asarray(x, dtype=np.float64)), dtype=np.float64)
    return g


_erf = _vectorized(math.erf)
_erfc = _vectorized(math.erfc)


Erf = _math_call("Erf", _erf, 1, 2, """The error function ``erf x = 2 / sqrt(pi) * integral_0^x
e**(-t**2) dt`` (odd; -1 at -inf, 1 at inf).""")


_SQRT1_2 = 0.7071067811865476   # 1 / sqrt(2)


class Gelu(_Transcendental):
    """GELU, exact (erf) form, torch's ``F.gelu(x)`` (``approximate='none'``):
    ``x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2))``, computed as the equal ``x / 2 *
    erfc(-x / sqrt 2)`` (no cancellation for negative x, where ``1 + erf`` loses every digit).
    In f32 the relative error is below 1e-5 for x >= -11 (|gelu| >= 1e-27); further out it
    grows as about ``x**2 * 2**-24`` (the rounding of ``x / sqrt 2`` through erfc's slope)."""

    name = "gelu"
    ulp = 2
    device_ulp = 5

    def numpy(self, x: Any) -> Any:
        return 0.5 * x * libm(_erfc, x * -_SQRT1_2)

    def cuda(self, c: CDomain, x: str) -> str:
        return f"{c.lit(0.5)} * ({x}) * {c.math('erfc')}(({x}) * {c.lit(-_SQRT1_2)})"


_GELU_K = 0.7978845608028654    # sqrt(2 / pi)
_GELU_C = 0.044715


class GeluTanh(_Transcendental):
    """GELU, tanh approximation, torch's ``F.gelu(x, approximate='tanh')``: ``0.5 x (1 +
    tanh(k (x + 0.044715 x**3)))``, ``k = sqrt(2/pi)``, computed as the equal ``x / (1 +
    e**(-2k (x + 0.044715 x**3)))`` (no cancellation for negative x). It differs from the exact
    ``gelu`` by up to 1.5e-3 absolute (about 15 % relative near x = -3.25)."""

    name = "gelu_tanh"
    ulp = 2
    device_ulp = 4

    def numpy(self, x: Any) -> Any:
        return x / (1 + libm(np.exp, -2 * _GELU_K * (x + _GELU_C * x * x * x)))

    def cuda(self, c: CDomain, x: str) -> str:
        return (f"({x}) / ({c.one()} + {c.math('exp')}({c.lit(-2 * _GELU_K)} * (({x}) + "
                f"{c.lit(_GELU_C)} * ({x}) * ({x}) * ({x}))))")


Tanh = _math_call("Tanh", np.tanh, 2, 2, "``tanh x``.")


class Softplus(_Transcendental):
    """``softplus(x) = ln(1 + e**x)``, computed as ``max(x, 0) + ln(1 + e**-|x|)`` (no
    overflow for large x)."""

    name = "softplus"
    lang_name = "softplus"
    ulp = 2
    device_ulp = 3

    def numpy(self, x: Any) -> Any:
        return np.fmax(x, 0) + libm(np.log1p, libm(np.exp, -np.abs(x)))

    def cuda(self, c: CDomain, x: str) -> str:
        return (f"{c.math('fmax')}({x}, {c.lit(0.0)}) + "
                f"{c.math('log1p')}({c.math('exp')}(-{c.math('fabs')}({x})))")
