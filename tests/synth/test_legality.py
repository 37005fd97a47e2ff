"""The seam between synthesis and lowering (``hexlayout.ir.lower.legality``): synthesis asks
each op's legality rule whether a partial assignment is legal; a check builds only the views
the op reads; synthesis borrows no layout helper from the lowering (they live beside
``hexlayout/layout/tv.py``); the assignment lives beside the tile IR."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hexlayout.lang as hl
from hexlayout.ir.assignment import EMPTY, Assignment
from hexlayout.ir.lower.kernel import LoweringError
from hexlayout.ir.lower.legality import LEGALITY, Legality
from hexlayout.ir.tile import Alloc, Copy, Elementwise, GlobalView, Mma, Permute, Slice, SubTile
from hexlayout.ir.types import Scope
from hexlayout.lang import f16
from hexlayout.lang.examples import gemm_sm80
from hexlayout.synth.solve import synthesize

M, N = hl.dims("M N")
SYNTH = Path(__file__).resolve().parents[2] / "hexlayout" / "synth"


@hl.kernel(threads=128)
def two_buffers(x: f16[M, N], y: f16[M, N]):
    a = hl.shared(f16, (64, 64))
    b = hl.shared(f16, (64, 64))
    hl.copy(hl.view(x, tile=(64, 64)), a)
    hl.copy(hl.view(x, tile=(64, 64), origin=(64, 0)), b)
    hl.syncthreads()
    r = hl.register(f16, (64, 64))
    hl.copy(a, r)
    s = hl.register(f16, (64, 64))
    hl.copy(b, s)
    hl.copy(r + s, hl.view(y, tile=(64, 64)))


def _shared(tk) -> list:
    return [op.result for op in tk.body.walk() if isinstance(op, Alloc) and op.result.scope == Scope.SHARED]


def test_every_copy_and_view_has_a_legality_rule() -> None:
    for cls in (Copy, GlobalView, Alloc, Slice, SubTile, Permute):
        assert cls in LEGALITY, cls.__name__
    assert Elementwise not in LEGALITY and Mma not in LEGALITY      # their lowering rule decides


def test_a_check_builds_only_the_views_its_op_reads() -> None:
    syn = synthesize(two_buffers.trace(), "sm_80")
    tk = two_buffers.trace()
    a, b = _shared(tk)
    into_a = next(op for op in tk.body.walk() if isinstance(op, Copy) and op.dst is a)
    leg = Legality(tk, "sm_80", Assignment(syn.assignment.layouts))
    instrs = leg.check(into_a)
    assert instrs and leg.copy_choices[into_a.uid][0]
    assert a.id in leg.lw.views and b.id not in leg.lw.views       # b's buffer was never allocated
    assert len(leg.lw.smem) == 1


def test_an_open_shared_layout_is_undecided_not_illegal() -> None:
    tk = two_buffers.trace()
    a, _ = _shared(tk)
    leg = Legality(tk, "sm_80", EMPTY)
    alloc = next(op for op in tk.body.walk() if isinstance(op, Alloc) and op.result is a)
    assert leg.check(alloc) == [] and leg.view_of(a) is None
    into_a = next(op for op in tk.body.walk() if isinstance(op, Copy) and op.dst is a)
    with pytest.raises(LoweringError, match=r"two_buffers: copy at \S+:\d+ .*shared tile %a has no layout"):
        leg.check(into_a)                                            # needs the layout it lacks


def test_synthesis_borrows_no_layout_helper_from_the_lowering() -> None:
    """What synthesis imports from ``hexlayout.ir.lower``: the legality oracle, the lowering
    entry point and its error, rejections, and the declared vector width of a global view;
    the TV layouts of derived tiles come from ``hexlayout.layout.tv_maps``."""
    allowed = {"legality": {"Legality"}, "kernel": {"LoweringError", "LoweredProgram", "lower_kernel"},
               "rejection": {"Rejection"}, "copy": {"declared_vector_bits"}}
    for path in SYNTH.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hexlayout.ir.lower."):
                mod = node.module.rsplit(".", 1)[1]
                names = {a.name for a in node.names}
                assert names <= allowed.get(mod, set()), f"{path.name} imports {names} from {node.module}"


def test_the_assignment_lives_beside_the_tile_ir() -> None:
    import hexlayout.ir.assignment as mod

    assert Assignment.__module__ == mod.__name__ == "hexlayout.ir.assignment"
    assert not (SYNTH.parent / "ir" / "lower" / "assignment.py").exists()


def test_synthesis_assigns_every_register_value_and_copy() -> None:
    """The lowering derives nothing: the synthesized assignment names a layout for every
    register tile and an instruction for every copy of the program."""
    tk = gemm_sm80.trace()
    s = synthesize(tk, "sm_80")
    regs = {v.id for op in tk.body.walk() for v in op.values() if v.scope == Scope.REGISTER}
    assert regs <= set(s.assignment.layouts) | {v.id for op in tk.body.walk() for v in op.values()
                                                if v.type.layout is not None}
    assert {op.uid for op in tk.body.walk() if isinstance(op, Copy)} <= set(s.assignment.copies)
