"""``hl.exp2_approx``: ``2**x`` as PTX ``ex2.approx.ftz.f32`` computes it, subnormal inputs and
results flushed to zero, emulated against float64 and printed as the one inline-PTX
instruction (one MUFU.EX2 in the SASS, no subnormal fix-up around it)."""

from __future__ import annotations

import numpy as np

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.synth.solve import synthesize

N = hl.dims("N")


@hl.kernel(threads=32)
def ex2(x: hl.f32[N], y: hl.f32[N], *, APPROX: bool = True):
    t = hl.register(hl.f32, (64,))
    hl.copy(hl.view(x, tile=(64,), origin=(0,)), t)
    hl.copy(hl.exp2_approx(t) if APPROX else hl.exp2(t), hl.view(y, tile=(64,), origin=(0,)))


def _inputs() -> np.ndarray:
    tiny = np.float32(2.0 ** -140)                       # a subnormal input: 2**0 = 1
    special = [-130.0, -127.5, -126.0, -125.5, -149.0, tiny, -tiny, 0.0, -0.0, 1.0, 127.9, 128.5,
               -np.inf, np.inf, np.nan]
    rng = np.random.default_rng(7)
    rand = rng.uniform(-140, 130, 64 - len(special)).astype(np.float32)
    return np.concatenate([np.array(special, np.float32), rand])


def test_exp2_approx_matches_float64_with_subnormals_flushed() -> None:
    x = _inputs()
    y = np.full_like(x, -1.0)
    run(synthesize(ex2.trace(), "sm_80").lowered.kernel, {"x": x, "y": y})
    x64 = x.astype(np.float64)
    want = np.exp2(np.where(np.abs(x64) < 2.0 ** -126, 0.0, x64))
    want = np.where(want < 2.0 ** -126, 0.0, want)        # ftz: a subnormal result is +0
    with np.errstate(over="ignore"):
        want = np.where(want > np.finfo(np.float32).max, np.inf, want)
    np.testing.assert_allclose(y, want, rtol=2.0 ** -22, atol=0.0)
    assert y[0] == 0.0 and y[4] == 0.0 and y[1] == 0.0   # 2**-130, 2**-149, 2**-127.5: flushed
    assert y[2] == np.float32(2.0 ** -126)               # the smallest normal survives
    assert y[5] == 1.0 and y[6] == 1.0                     # subnormal inputs count as 0


def test_exp2_approx_prints_one_ex2_instruction() -> None:
    from hexlayout.codegen import generate_cuda

    approx = generate_cuda(synthesize(ex2.trace(), "sm_80").lowered.kernel)
    exact = generate_cuda(synthesize(ex2.trace(APPROX=False), "sm_80").lowered.kernel)
    assert "ex2.approx.ftz.f32" in approx and "hl_ex2_approx_ftz(" in approx and "exp2f(" not in approx
    assert "ex2.approx" not in exact and "exp2f(" in exact
