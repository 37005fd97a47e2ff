"""Solver corner cases: a kernel without shared memory, and one register tile in two mma roles.

The tile ``x`` is the A operand of one mma and the B operand of another; synthesis must
find atoms and warp arrangements under which both operand layouts are the same function
(or report a conflict), and the result must compute both products correctly.
"""

from __future__ import annotations

import numpy as np

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.ir.printer import format_kernel
from hexlayout.lang import f16, f32
from hexlayout.synth.solve import synthesize

M, N, K = hl.dims("M N K")


@hl.kernel(threads=128)
def two_roles(a: f16[M, K], w: f16[N, K], w2: f16[N, K], c1: f32[M, N], c2: f32[M, N]):
    x = hl.register(f16, (64, 64))
    hl.copy(hl.view(a, tile=(64, 64)), x)
    rw = hl.register(f16, (64, 64))
    hl.copy(hl.view(w, tile=(64, 64)), rw)
    rw2 = hl.register(f16, (64, 64))
    hl.copy(hl.view(w2, tile=(64, 64)), rw2)
    acc1 = hl.zeros((64, 64), f32)
    hl.mma(x, rw, acc1)
    acc2 = hl.zeros((64, 64), f32)
    hl.mma(rw2, x, acc2)
    hl.copy(acc1, hl.view(c1, tile=(64, 64)))
    hl.copy(acc2, hl.view(c2, tile=(64, 64)))


def test_register_only_kernel_with_a_tile_in_two_mma_roles() -> None:
    s = synthesize(two_roles.trace(), "sm_80")
    assert not any(d.subject.startswith("shared") for d in s.decisions)
    # %x is A of one mma and B of the other: the (atom_v, k, m-repeat) values of A never line
    # up with the (atom_v, k, n-repeat) values of B, so one mma takes the k-step-outer order
    outer = [not tm.k_inner for tm in s.mma.values()]
    assert any(outer) and format_kernel(s.kernel).count(" k_outer") == sum(outer)
    rng = np.random.default_rng(0)
    a, w, w2 = (rng.standard_normal((64, 64)).astype(np.float16) for _ in range(3))
    c1 = np.full((64, 64), np.nan, dtype=np.float32)
    c2 = c1.copy()
    run(s.lowered.kernel, {"a": a, "w": w, "w2": w2, "c1": c1, "c2": c2})
    x, y, y2 = (t.astype(np.float64) for t in (a, w, w2))
    np.testing.assert_allclose(c1, x @ y.T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(c2, y2 @ x.T, rtol=1e-4, atol=1e-3)


def test_mma_alternatives_report_what_the_search_checked() -> None:
    """Alternatives before the chosen one were rejected with the conflict; the search stops at
    the first legal choices, so the ones it never checked are "not tried", never "legal"."""
    s = synthesize(two_roles.trace(), "sm_80")
    alts = s.decisions[0].alternatives
    statuses = [a.status for a in alts]
    chosen = statuses.index("chosen")
    assert chosen > 0 and set(statuses[:chosen]) == {"rejected"}
    assert all("%x would need two layouts" in a.reason for a in alts[:chosen])
    assert "not tried" in statuses[chosen + 1:] and "legal" not in statuses
