"""Tracing the example kernels: op sequences, types, scopes, source lines, nesting."""

from __future__ import annotations

import pytest

from hexlayout.ir.expr import Var
from hexlayout.ir.tile import (
    Alloc,
    AsyncCommit,
    AsyncWait,
    Cast,
    Copy,
    Elementwise,
    For,
    GlobalView,
    If,
    MbarrierArrive,
    MbarrierWait,
    Mma,
    Permute,
    Reduce,
    SetMaxNReg,
    Slice,
    TileKernel,
    WgmmaCommit,
    WgmmaFence,
    WgmmaWait,
)
from hexlayout.ir.types import LayoutVar, Scope
from hexlayout.lang.examples import flash_attention_fwd, gemm_sm80, gemm_sm90

from .kernels import line_of, loops, ops_of, simple_gemm, top


def test_simple_gemm_ops_types_and_lines() -> None:
    tk = simple_gemm.trace()
    assert isinstance(tk, TileKernel)
    assert top(tk.body) == ["Alloc", "Fill", "For", "Cast", "GlobalView", "Copy"]
    loop = tk.body.ops[2]
    assert isinstance(loop, For)
    assert top(loop.body) == ["Alloc", "Alloc", "GlobalView", "Copy", "GlobalView", "Copy", "Mma"]
    mma = loop.body.ops[-1]
    assert isinstance(mma, Mma)
    assert (mma.a.name, mma.b.name, mma.c.name) == ("ra", "rb", "acc")
    assert mma.a.type.shape == (64, 32) and mma.c.type.shape == (64, 64)
    assert mma.c.type.dtype == "f32" or str(mma.c.type.dtype) == "f32"
    assert mma.loc.line == line_of(simple_gemm, "hl.mma(ra, rb, acc)")
    assert mma.loc.code == "hl.mma(ra, rb, acc)"
    assert loop.loc.line == line_of(simple_gemm, "for k in hl.range")
    assert loop.var.name == "k"
    ga = loop.body.ops[2]
    assert isinstance(ga, GlobalView) and ga.result.type.scope == Scope.GLOBAL
    assert ga.param.name == "a"
    assert tk.loc.line == line_of(simple_gemm, "def simple_gemm")
    assert all(isinstance(v.type.layout, LayoutVar) for v in (mma.a, mma.b, mma.c))


def test_trace_is_cached_per_constants() -> None:
    assert simple_gemm.trace() is simple_gemm.trace()
    assert simple_gemm.trace(BK=64) is not simple_gemm.trace()
    assert simple_gemm.trace(BK=64).consts == {"BM": 64, "BN": 64, "BK": 64}


def test_gemm_sm80_pipeline_structure() -> None:
    tk = gemm_sm80.trace()
    assert tk.launch.threads == 128
    assert len(tk.launch.grid) == 2
    sa, sb = [op.result for op in tk.body.ops if isinstance(op, Alloc) and op.result.scope == Scope.SHARED]
    assert sa.type.shape == (128, 32, 3) and sb.type.shape == (128, 32, 3)
    (loop,) = loops(tk.body)
    body = top(loop.body)
    assert body[:2] == ["AsyncWait", "Sync"]
    assert body.count("AsyncCommit") == 1 and body[-1] == "Mma"
    wait = loop.body.ops[0]
    assert isinstance(wait, AsyncWait) and wait.pending == 1
    # prologue: STAGES-1 = 2 groups of two global->shared copies, unrolled by the Python loop
    pro = tk.body.ops[: tk.body.ops.index(loop)]
    assert sum(isinstance(op, AsyncCommit) for op in pro) == 2
    g2s = [op for op in ops_of(tk.body, Copy) if op.src.scope == Scope.GLOBAL]
    assert all(op.dst.scope == Scope.SHARED and op.dst.root in (sa, sb) for op in g2s)
    assert len(g2s) == 6
    s2r = [op for op in ops_of(loop.body, Copy) if op.src.scope == Scope.SHARED]
    assert [op.dst.scope for op in s2r] == [Scope.REGISTER, Scope.REGISTER]
    assert all(isinstance(op.src.type.layout, LayoutVar) and op.src.type.layout.hints["view_of"] is
               op.src.root.type.layout for op in s2r)
    last = tk.body.ops[-1]
    assert isinstance(last, Copy) and last.src.scope == Scope.REGISTER and last.dst.scope == Scope.GLOBAL
    assert isinstance(tk.body.ops[-3], Cast)
    assert last.loc.line == line_of(gemm_sm80, "hl.copy(rc, hl.view(c")
    # source lines of the unrolled prologue point at the Python loop body
    pro_copies = [op for op in pro if isinstance(op, Copy)]
    assert {op.loc.line for op in pro_copies} == {
        line_of(gemm_sm80, "origin=(m0, s * BK)"), line_of(gemm_sm80, "origin=(n0, s * BK)")}
    slices = [op for op in pro if isinstance(op, Slice)]
    assert [op.index[2] for op in slices] == [0, 0, 1, 1]


def test_gemm_sm90_warp_specialization() -> None:
    tk = gemm_sm90.trace()
    assert tk.launch.threads == 384
    assert [(b.name, b.count) for b in tk.mbarriers] == [("full", 4), ("empty", 4)]
    (spec,) = [op for op in tk.body.ops if isinstance(op, If)]
    assert spec.warp_groups == (0,) and spec.else_body is not None
    assert spec.loc.line == line_of(gemm_sm90, "with hl.warp_group(0)")
    prod, cons = spec.then_body, spec.else_body
    assert isinstance(prod.ops[0], SetMaxNReg) and not prod.ops[0].increase and prod.ops[0].count == 40
    assert isinstance(cons.ops[0], SetMaxNReg) and cons.ops[0].increase and cons.ops[0].count == 232
    (ploop,) = loops(prod)
    tma = [op for op in ops_of(ploop.body, Copy)]
    assert len(tma) == 2 and all(op.mbarrier is tk.mbarriers[0] for op in tma)
    arrive = next(op for op in ploop.body.ops if isinstance(op, MbarrierArrive))
    assert arrive.tx_bytes == (128 * 64 + 256 * 64) * 2 and arrive.who == "one"
    (cloop,) = loops(cons)
    kinds = [type(op) for op in cloop.body.ops if not isinstance(op, Slice)]
    assert kinds == [MbarrierWait, WgmmaFence, Mma, WgmmaCommit, WgmmaWait, MbarrierArrive]
    mma = next(op for op in cloop.body.ops if isinstance(op, Mma))
    assert mma.a.scope == Scope.SHARED and mma.b.scope == Scope.SHARED and mma.c.scope == Scope.REGISTER
    assert mma.warps is not None and mma.warps.num_workers == 2
    assert mma.a.root.type.layout.hints == {"swizzle": "128B"}


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_structure(causal: bool) -> None:
    tk = flash_attention_fwd.trace(CAUSAL=causal)
    assert tk.launch.threads == 256 and len(tk.launch.grid) == 3
    # defaults BN=64, CHUNK=32, DCHUNK=64 (deliberate, issue 10 item 4): S per 32-key sub-block,
    # summed over two 64-column chunks of q (read from shared memory per chunk); loop split:
    # full key blocks unmasked, then the masked rest
    full, loop = loops(tk.body)
    full_fns = [op.fn for op in ops_of(full.body, Elementwise)]
    assert len(ops_of(full.body, Mma)) == 6 and "lt" not in full_fns and "le" not in full_fns
    assert full_fns.count("exp2_approx") == 3
    mmas = ops_of(loop.body, Mma)
    assert len(mmas) == 6
    qk, pv = mmas[0], mmas[4]
    assert qk.a.type.shape == (128, 64) and qk.b.type.shape == (32, 64) and qk.c.type.shape == (128, 32)
    assert all(m.c is qk.c for m in mmas[:2]) and mmas[2].c is mmas[3].c and mmas[2].c is not qk.c
    # P (cast to f16) is the A operand of P @ V; V^T comes from a transposed shared view
    assert pv.a.type.shape == (128, 32) and str(pv.a.type.dtype) == "f16"
    cast_p = next(op for op in ops_of(loop.body, Cast) if op.result is pv.a)
    made = next(op for op in ops_of(loop.body, Elementwise) if op.result is cast_p.src)
    assert made.fn == "exp2_approx"                      # p = exp2(s * scale - m) of hl.OnlineSoftmax
    assert pv.c.name == "acc" and pv.b.type.shape == (128, 32) and mmas[5].c is pv.c
    perm = next(op for op in ops_of(loop.body, Permute))
    assert perm.perm == (1, 0) and perm.src.scope == Scope.SHARED
    reduces = ops_of(loop.body, Reduce)
    assert [(r.fn, r.axis, r.result.type.shape) for r in reduces] == [
        ("max", 1, (128, 1)), ("sum", 1, (128, 1)), ("sum", 1, (128, 1))]   # one row max per key block
    fns = [op.fn for op in ops_of(loop.body, Elementwise)]
    assert fns.count("exp2_approx") == 3 and "select" in fns and "lt" in fns
    # loop-carried state is written in place
    inplace = {op.result.name for op in ops_of(loop.body, Elementwise) if op.fn == "mov"}
    assert len(inplace) == 2                             # the softmax state: row max m and row sum l
    assert ("le" in fns) == causal
    assert qk.loc.line == line_of(flash_attention_fwd, "hl.mma(rq, rk, s)")


def test_grid_coordinates_are_block_vars() -> None:
    tk = simple_gemm.trace()
    bx, by = tk.launch.block_index
    assert isinstance(bx, Var) and bx.name == "blockIdx.x" and bx.kind == "block"
    ga = ops_of(tk.body, GlobalView)[0]
    assert ga.origin[0] is not None and by in _vars(ga.origin[0])


def _vars(e: object) -> set:
    from hexlayout.ir.expr import free_vars

    return free_vars(e)
