"""Synthesis owns every choice: it returns an immutable ``Assignment`` (layout per value, mma
and copy instruction per op), never changes the program it is given, and the lowering takes
the assignment and decides nothing (a different legal instruction in the assignment is used
as given)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hexlayout.codegen import generate
from hexlayout.emulator import run
from hexlayout.ir.assignment import Assignment
from hexlayout.ir.lower.kernel import lower_kernel
from hexlayout.ir.tile import Copy, Mma
from hexlayout.ir.types import LayoutVar
from hexlayout.lang.examples import gemm_sm80, gemm_sm90
from hexlayout.synth.solve import synthesize


def _types(tk) -> dict[int, object]:
    out = {}
    for op in tk.body.walk():
        for v in op.values():
            out[v.id] = v.type
    return out


@pytest.mark.parametrize(("kernel", "arch"), [(gemm_sm80, "sm_80"), (gemm_sm90, "sm_90a")])
def test_synthesis_leaves_the_program_untouched(kernel, arch) -> None:
    tk = kernel.trace()
    types = _types(tk)
    mmas = [(op.atom, op.warps, op.k_inner) for op in tk.body.walk() if isinstance(op, Mma)]
    s = synthesize(tk, arch)
    after = _types(tk)
    assert after.keys() == types.keys()
    assert all(after[k] is types[k] for k in types)         # not even replaced by an equal type
    assert [(op.atom, op.warps, op.k_inner) for op in tk.body.walk() if isinstance(op, Mma)] == mmas
    assert s.kernel is not tk
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.assignment.layouts = {}                            # type: ignore[misc]


def test_lowering_takes_the_assignment_and_decides_nothing() -> None:
    s = synthesize(gemm_sm80.trace(), "sm_80")
    asg = s.assignment
    again = lower_kernel(s.kernel, "sm_80", asg)
    assert generate(again.kernel).source == generate(s.lowered.kernel).source
    copies = [op for op in s.kernel.body.walk() if isinstance(op, Copy) and op.uid in asg.copies]
    ldsm = [op for op in copies if asg.copies[op.uid][1].startswith("SM75_")]
    assert ldsm, asg.copies
    # the assignment, not the lowering, picks the instruction: plain ld.shared where synthesis
    # chose ldmatrix, and the program still computes the same product
    plain = Assignment(asg.layouts, asg.mma,
                       {**asg.copies, **{op.uid: ("ld/st", "ld.shared") for op in ldsm}})
    prog = lower_kernel(s.kernel, "sm_80", plain)
    chosen = dict((id(op), instr) for op, instr in prog.choices)
    assert all(chosen[id(op)].startswith("ld.shared.b") for op in ldsm)
    assert asg.copies[ldsm[0].uid][1].startswith("SM75_")      # the original assignment is unchanged
    rng = np.random.default_rng(1)
    m, n, k = 128, 128, 64
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.zeros((m, n), np.float16)
    run(prog.kernel, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(c, (a.astype(np.float64) @ b.astype(np.float64).T), rtol=2e-2, atol=2e-2)


def test_explain_and_build_read_the_same_synthesis_of_an_explicit_kernel() -> None:
    """A fully explicit kernel is synthesized, not lowered on the side: ``hexlayout explain``
    (cli.kernels.synthesize_kernel) and ``runtime.build`` report the same instructions and
    layouts, and explain has a cost and no 'lowered as written' note."""
    from hexlayout.cli.kernels import resolve, synthesize_kernel
    from hexlayout.lang.examples.explicit import gemm_sm80_explicit
    from hexlayout.runtime.build import build

    result = synthesize_kernel(resolve("gemm_explicit", "sm_80"))
    assert result.notes == [] and result.cost_computed and result.synthesis.cost.total > 0
    built = build(gemm_sm80_explicit(), "sm_80", compile=False).synthesis

    def seen(s) -> tuple:
        layouts = [(v.name, str(lay)) for v, lay in s.layouts() if not isinstance(lay, LayoutVar)]
        return [(type(op).__name__, op.loc.line, instr) for op, instr in s.lowered.choices], layouts

    assert seen(result.synthesis) == seen(built)
    assert generate(result.synthesis.lowered.kernel).source == generate(built.lowered.kernel).source
