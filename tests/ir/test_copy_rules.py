"""Copy lowering rules: ``legal_copies`` lists every legal instruction of a copy, best first,
or each rule's reason, and changes nothing; a rule registered in ``COPY_RULES`` is used by
the lowering and synthesis (see also docs/adding-an-op.md, run by tests/test_docs.py)."""

from __future__ import annotations

import numpy as np

from hexlayout.arch import get_arch, get_atom
from hexlayout.ir.expr import Var
from hexlayout.ir.lower.copy_rules import (
    COPY_RULES,
    CopyContext,
    CopyRule,
    CpAsyncRule,
    MatrixRule,
    TmaRule,
    VectorRule,
    ViaRegistersRule,
    legal_copies,
)
from hexlayout.ir.lower.rejection import Rejection
from hexlayout.ir.lower.tma_store import TmaStoreRule
from hexlayout.ir.lower.views import RegisterTile, SharedTileView
from hexlayout.ir.lowered import Ldmatrix, LdShared, RegArray, SmemBuffer
from hexlayout.ir.mapping import repeat, spatial
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.ir.types import f16
from hexlayout.layout import Layout, Swizzle, composition

TID = Var("threadIdx.x", 0, 128, "tid")
TILED = TiledMma(get_atom("SM80_16x8x16_F32F16F16F32_TN"), spatial(2, 2) * repeat(2, 4), 2)


def _ctx(layout, tv: Layout, arch: str = "sm_80") -> CopyContext:
    shape = (64, 32)
    src = SharedTileView.of(SmemBuffer("s", f16, 8192), f16, shape, layout)
    dst = RegisterTile(RegArray("r", f16, tv.size() // 128), f16, shape, tv, 128)
    return CopyContext(src, dst, TID, 128, 16, get_arch(arch), names=("s", "r"))


def test_builtin_rules_in_preference_order() -> None:
    kinds = [type(r) for r in COPY_RULES]
    # the TMA store (hexlayout.ir.lower.tma_store) registers itself ahead of the copies through registers
    assert kinds == [TmaRule, CpAsyncRule, MatrixRule, VectorRule, TmaStoreRule, ViaRegistersRule]


def test_legal_copies_lists_ldmatrix_before_ld_shared_and_mutates_nothing() -> None:
    """K-major 128-byte rows, swizzled: the x4 ldmatrix is legal and preferred; ld.shared
    of 32-bit runs is legal too; the transposed ldmatrix is not (the rows are along K)."""
    lay = composition(Swizzle(2, 3, 3), Layout((64, 32), (32, 1)))
    ctx = _ctx(lay, TILED.a_tv())
    before = (str(ctx.src.full_layout), str(ctx.dst.tv), ctx.dst.array.count)
    res = legal_copies(ctx)
    assert not isinstance(res, Rejection)
    names = [c.instruction for c in res]
    assert names[0] == "SM75_U32x4_LDSM_N"
    assert "SM75_U16x8_LDSM_T" not in names
    assert names[-1].startswith("ld.shared.b")
    assert all(isinstance(i, Ldmatrix) for i in res[0].plan.instrs)
    assert all(isinstance(i, LdShared) for i in res[-1].plan.instrs)
    assert legal_copies(ctx, limit=1)[0].instruction == names[0]
    assert (str(ctx.src.full_layout), str(ctx.dst.tv), ctx.dst.array.count) == before


def test_rejection_names_the_instruction_and_its_requirement() -> None:
    """Asked for ldmatrix on rows along M (mode 0): a K-major A fragment's 8-element matrix
    rows run along K, which is strided here. The reason is a value: instruction, layouts."""
    from dataclasses import replace

    ctx = replace(_ctx(Layout((64, 32), (1, 64)), TILED.a_tv()), want="SM75_U32x4_LDSM_N")
    res = legal_copies(ctx)
    assert isinstance(res, Rejection)
    assert res.requirement == "no instruction can copy %s into %r"
    (alt,) = res.alternatives
    assert alt.instruction == "SM75_U32x4_LDSM_N"
    assert alt.requirement == "the 8 elements of a matrix row are not contiguous in shared memory"
    assert dict(alt.layouts)["shared"] == Layout((64, 32), (1, 64))
    assert str(alt) == f"SM75_U32x4_LDSM_N: {alt.requirement}"
    assert str(res) == f"{res.requirement}: {alt}"


class _OnlyLdShared(CopyRule):
    family = "test"

    def instructions(self, ctx: CopyContext) -> list[str]:
        return ["ld.shared.only"] if ctx.scopes == ("shared", "register") else []

    def lower(self, ctx: CopyContext, name: str):
        from hexlayout.ir.lower.copy import lower_reg_mem

        return lower_reg_mem(ctx.dst, ctx.src, True, ctx.tid, ctx.elem_bits, max_bits=32)


def test_registered_rule_is_preferred_and_removed_again() -> None:
    lay = composition(Swizzle(2, 3, 3), Layout((64, 32), (32, 1)))
    ctx = _ctx(lay, TILED.a_tv())
    with COPY_RULES.added(_OnlyLdShared()):
        first = legal_copies(ctx, limit=1)
        assert first[0].rule == "test" and first[0].instruction == "ld.shared.b32"
    assert legal_copies(ctx, limit=1)[0].instruction == "SM75_U32x4_LDSM_N"
    assert not any(isinstance(r, _OnlyLdShared) for r in COPY_RULES)
    offs = [np.asarray(i.src.offset is not None) for i in first[0].plan.instrs]
    assert len(offs) == TILED.a_tv().size() // 128 // 2     # one 32-bit load per 2 halves
