"""Every generated ``hl.<fn>`` (one per ALU function with a language name, ``hl.tanh``,
``hl.softplus`` and ``hl.erf`` included) and both forms of ``hl.gelu`` end to end: traced,
lowered over an mma accumulator layout, emulated, and compared with float64 numpy formulas
written here (not the registry's)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch import get_atom
from hexlayout.emulator import run
from hexlayout.ir.functions import ALU_FUNCTIONS
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.synth.solve import synthesize

TM = TiledMma(get_atom("SM80_16x8x16_F32F16F16F32_TN"), hl.spatial(4, 1) * hl.repeat(1, 8), 1)
R, C = hl.dims("R C")

#: float64 references, independent of hexlayout.ir.functions
REFERENCE = {
    "exp": np.exp,
    "exp2": np.exp2,
    # flush-to-zero: results below 2**-126 are 0 (none in the random range; see test_exp2_approx.py)
    "exp2_approx": lambda x: np.where(np.exp2(x) < 2.0 ** -126, 0.0, np.exp2(x)),
    "log": np.log,
    "log2": np.log2,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "erf": np.vectorize(math.erf),
    # hl.gelu(x): x Phi(x) = x / 2 * erfc(-x / sqrt 2) (1 + erf cancels for negative x)
    "gelu": lambda x: 0.5 * x * np.vectorize(math.erfc)(-x / np.sqrt(2.0)),
    # hl.gelu(x, approximate="tanh"): 0.5 x (1 + tanh(y)) with 1 + tanh(y) = 2 / (1 + e**-2y):
    # float64's 1 + tanh(y) cancels to 0 for y < -19, where the function is still ~1e-20, not 0
    "gelu_tanh": lambda x: x / (1.0 + np.exp(-2.0 * np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3))),
    "tanh": np.tanh,
    "softplus": lambda x: np.logaddexp(0.0, x),
}
POSITIVE = {"log", "log2", "sqrt", "rsqrt"}
NAMES = sorted(fn.lang_name for fn in ALU_FUNCTIONS.values() if fn.lang_name) + ["gelu", "gelu_tanh"]


@hl.kernel(threads=128)
def apply(x: hl.f32[R, C], y: hl.f32[R, C], *, FN: str = "exp", DT: object = hl.f32):
    r0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], 64))) * 64
    s = hl.register(hl.f32, (64, 64), layout=TM.c_tv())
    hl.copy(hl.view(x, tile=(64, 64), origin=(r0, 0)), s)
    if FN.startswith("gelu"):                                 # gelu / gelu_tanh: hl.gelu's two forms
        t = hl.gelu(hl.cast(s, DT), approximate=FN[5:] or "none")
    else:
        t = getattr(hl, FN)(hl.cast(s, DT))
    hl.copy(hl.cast(t, hl.f32), hl.view(y, tile=(64, 64), origin=(r0, 0)))


def test_every_language_function_has_a_reference() -> None:
    assert set(NAMES) == set(REFERENCE), "a new hl function needs a reference formula here"


@pytest.mark.parametrize("dt", [hl.f32, hl.f16, hl.bf16], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_function_matches_numpy(name: str, dt: object) -> None:
    prog = synthesize(apply.trace(FN=name, DT=dt), "sm_80").lowered
    rng = np.random.default_rng(sum(map(ord, name)))
    x = rng.uniform(-9.0, 9.0, (128, 64)).astype(np.float32)
    if name in POSITIVE:
        x = np.abs(x) + 1e-3
    x = x.astype(dt.numpy()).astype(np.float32)           # inputs exact in the tile type
    y = np.full_like(x, np.nan)
    run(prog.kernel, {"x": x, "y": y})
    want = REFERENCE[name](x.astype(np.float64))
    rtol = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}[str(dt)]
    np.testing.assert_allclose(y, want, rtol=rtol, atol=1e-30 if str(dt) == "f32" else 1e-6)


def test_tanh_and_softplus_print_their_library_calls() -> None:
    from hexlayout.codegen import generate_cuda

    for name, calls in (("tanh", ("tanhf(",)), ("softplus", ("log1pf(", "expf(", "fmaxf("))):
        src = generate_cuda(synthesize(apply.trace(FN=name), "sm_80").lowered.kernel)
        assert all(c in src for c in calls), name
