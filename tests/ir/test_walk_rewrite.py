"""The generic walker and rewriter of the tile IR.

The rewriter is checked end to end: a rewritten softmax kernel (every elementwise result
computed into a fresh tile first) still lowers and, emulated, matches numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.emulator import run
from hexlayout.ir.printer import format_kernel
from hexlayout.ir.rewrite import Replacement, RewriteError, rewrite
from hexlayout.ir.tile import Block, Cast, Copy, Elementwise, For, If, Mma, Op, TileKernel, Value
from hexlayout.ir.walk import walk, walk_with_context
from hexlayout.synth.solve import synthesize
from tests.e2e.test_softmax_explicit import causal_softmax
from tests.lang.kernels import simple_gemm


def _preorder(b: Block) -> list[Op]:
    """Reference pre-order, written out by hand."""
    out: list[Op] = []
    for op in b.ops:
        out.append(op)
        if isinstance(op, For):
            out += _preorder(op.body)
        elif isinstance(op, If):
            out += _preorder(op.then_body)
            if op.else_body is not None:
                out += _preorder(op.else_body)
    return out


def _ws_gemm() -> TileKernel:
    from hexlayout.lang.examples.gemm_sm90 import gemm_sm90

    return gemm_sm90.trace()


@pytest.mark.parametrize("make", [simple_gemm.trace, _ws_gemm, causal_softmax.trace],
                         ids=["loop", "warp_specialized", "straight"])
def test_walk_is_preorder_with_nested_blocks(make: object) -> None:
    tk = make()  # type: ignore[operator]
    ref = _preorder(tk.body)
    assert [id(o) for o in walk(tk)] == [id(o) for o in ref]
    assert [id(o) for o in tk.body.walk()] == [id(o) for o in ref]
    assert [id(v.op) for v in walk_with_context(tk)] == [id(o) for o in ref]


def test_walk_context_gives_enclosing_loops_and_branches() -> None:
    tk = _ws_gemm()
    for v in walk_with_context(tk):
        assert v.block.ops[v.index] is v.op
        # the parents are exactly the ops whose nested blocks contain this op
        enclosing = [p for p in walk(tk) if p.blocks() and any(v.op is q for q in walk(p) if q is not p)]
        assert [id(p) for p in v.parents] == [id(p) for p in enclosing]
        assert v.loops == tuple(p for p in enclosing if isinstance(p, For))
        assert v.loop_depth == len(v.loops)
    assert any(v.loop_depth == 1 and any(isinstance(p, If) for p in v.parents) for v in walk_with_context(tk))


def test_walk_of_a_single_op_includes_its_body() -> None:
    tk = _trace(simple_gemm)
    loop = next(op for op in walk(tk) if isinstance(op, For))
    assert [id(o) for o in walk(loop)] == [id(o) for o in [loop] + _preorder(loop.body)]


def _trace(kernel, **consts) -> TileKernel:  # type: ignore[no-untyped-def]
    """A new trace (rewrites modify the program: never share the kernel's cached one)."""
    kernel._cache.clear()
    return kernel.trace(**consts)


def _fresh(v: Value, name: str) -> Value:
    return Value(name, v.type.with_layout(v.type.layout), v.loc)


def _emulate_softmax(tk: TileKernel) -> np.ndarray:
    prog = synthesize(tk, "sm_80").lowered
    rng = np.random.default_rng(11)
    x = (3 * rng.standard_normal((128, 64))).astype(np.float32)
    y = np.full_like(x, np.nan)
    run(prog.kernel, {"x": x, "y": y})
    xs = np.where(np.arange(64)[None, :] <= np.arange(128)[:, None], x.astype(np.float64), -np.inf)
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    return y


def test_rewrite_keeping_the_result_value_still_computes_the_same() -> None:
    """``y = f(args)`` -> ``t = f(args); y = cast(t)``: the new ops write ``y`` itself."""
    tk = _trace(causal_softmax, CAUSAL=True, SPLIT=False)
    n_elem = sum(isinstance(op, Elementwise) for op in walk(tk))

    def split(v):  # type: ignore[no-untyped-def]
        op = v.op
        t = _fresh(op.result, op.result.name + "_t")
        return [Elementwise(t, op.fn, op.args, loc=op.loc), Cast(op.result, t, loc=op.loc)]

    assert rewrite(tk, split, kinds=(Elementwise,)) == n_elem > 0
    assert sum(isinstance(op, Cast) for op in walk(tk)) == n_elem
    assert "_t" in format_kernel(tk)
    _emulate_softmax(tk)


def test_rewrite_with_a_value_map_redirects_every_later_use() -> None:
    """``y = f(args)`` -> ``y2 = f(args)`` with ``y -> y2``: later ops read ``y2``."""
    tk = _trace(causal_softmax, CAUSAL=True, SPLIT=False)
    old: dict[int, Value] = {}

    def rename(v):  # type: ignore[no-untyped-def]
        op = v.op
        new = _fresh(op.result, op.result.name + "_r")
        old[op.result.id] = op.result
        return Replacement([Elementwise(new, op.fn, op.args, loc=op.loc)], {op.result: new})

    assert rewrite(tk, rename, kinds=(Elementwise,)) > 0
    for op in walk(tk):
        assert all(v.id not in old for v in op.values()), f"{op.name} still mentions a replaced value"
    last = [op for op in walk(tk) if isinstance(op, Copy)][-1]
    assert last.src.name.endswith("_r")
    _emulate_softmax(tk)


def test_rewrite_refuses_to_drop_a_value_that_is_still_used() -> None:
    tk = _trace(simple_gemm)
    with pytest.raises(RewriteError, match=r"rewriting Cast .*%\w+, which Copy .* still uses"):
        rewrite(tk, lambda v: [], kinds=(Cast,))
    assert format_kernel(tk) == format_kernel(_trace(simple_gemm))   # left unchanged


def test_rewrite_may_delete_dead_ops_and_leaves_others_untouched() -> None:
    tk = _trace(simple_gemm)
    before = format_kernel(tk)
    assert rewrite(tk, lambda v: None) == 0
    assert format_kernel(tk) == before
    mmas = [op for op in walk(tk) if isinstance(op, Mma)]
    # an mma writes only the accumulator, which other ops also use: deleting it is refused
    with pytest.raises(RewriteError):
        rewrite(tk, lambda v: [], kinds=(Mma,))
    tk = _trace(simple_gemm)
    # a fresh cast whose result nobody reads can go
    loop = next(op for op in walk(tk) if isinstance(op, For))
    acc = mmas[0].c
    dead = Cast(Value("dead", acc.type.with_layout(acc.type.layout)), acc)
    loop.body.ops.append(dead)
    assert rewrite(tk, lambda v: [] if v.op is dead else None, kinds=(Cast,)) == 1
    assert all(op is not dead for op in walk(tk)) and format_kernel(tk) == before
