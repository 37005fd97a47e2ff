"""The default register layout of a tile copied with global memory vectorizes along the
tensor's contiguous mode; a broadcast mode (stride 0) is never that mode (a row of weights
broadcast over the rows of an activation, as fused prologues read their per-column inputs)."""

from __future__ import annotations

import numpy as np

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.ir.tile import Copy
from hexlayout.lang import f16
from hexlayout.synth.solve import synthesize

M, N = hl.dims("M N")


@hl.kernel(threads=128)
def square_row(w: f16[M, N].strides(0, 1), y: f16[M, N]):
    """``y = w * w`` with ``w`` one row broadcast over ``M``; the squares go through shared
    memory, so ``w``'s load alone decides its tile's layout."""
    pid = hl.grid(hl.spatial(hl.cdiv(y.shape[0], 64)))
    rw = hl.register(f16, (64, 64))
    hl.copy(hl.view(w, (64, 64), (pid * 64, 0)), rw)
    s = hl.shared(f16, (64, 64))
    hl.copy(rw * rw, s)
    hl.syncthreads()
    ro = hl.register(f16, (64, 64))
    hl.copy(s, ro)
    hl.copy(ro, hl.view(y, (64, 64), (pid * 64, 0)))


def test_a_broadcast_mode_is_not_the_vector_mode() -> None:
    syn = synthesize(square_row.trace(), "sm_80")
    (load,) = [op for op in syn.kernel.body.walk() if isinstance(op, Copy)
               and op.dst.scope.value == "register" and op.src.scope.value == "global"]
    tv = syn.assignment.layout_of(load.dst)
    # element (m, n) of the 64 x 64 tile is index m + 64 n: a thread's consecutive values step
    # along N (w's contiguous mode), 8 of them (16-byte vectors), not along the broadcast M
    assert [tv(0, v + 1) - tv(0, v) for v in range(7)] == [64] * 7, tv
    rng = np.random.default_rng(3)
    w = np.broadcast_to(rng.standard_normal((1, 64)).astype(np.float16), (100, 64))
    y = np.full((100, 64), np.nan, np.float16)
    run(syn.lowered.kernel, {"w": w, "y": y})
    np.testing.assert_allclose(y.astype(np.float64), w.astype(np.float64) ** 2, rtol=1e-2, atol=1e-3)
