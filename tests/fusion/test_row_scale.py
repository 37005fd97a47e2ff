"""``row_scale``: which prologues take their row reductions as one row factor of their value
(then a GEMM scales its product's rows instead of loading whole rows), on op lists as the
partition and the mechanism describe them (node indices, ``"s"`` scalars, ``"t"`` tensors)."""

from __future__ import annotations

from hexlayout.fusion.row_scale import row_scale

MEAN = "aten.mean.dim"
RED = frozenset({MEAN, "aten.sum.dim_IntList"})
CAST, POW, ADD, RSQRT, MUL, SUB, DIV = ("aten._to_copy.default", "aten.pow.Tensor_Scalar", "aten.add.Tensor",
                                        "aten.rsqrt.default", "aten.mul.Tensor", "aten.sub.Tensor",
                                        "aten.div.Tensor")

#: HF Llama: xf = x.float(); w * (xf * rsqrt(mean(xf^2) + eps)).to(dt)
LLAMA = ([CAST, POW, MEAN, ADD, RSQRT, MUL, CAST, MUL],
         [["t"], [0, "s"], [1, "s", "s"], [2, "s"], [3], [0, 4], [5], ["t", 6]])


def test_llama_rmsnorm_is_one_row_factor() -> None:
    ops, args = LLAMA
    s = row_scale(ops, args, 7, RED)
    assert s is not None
    assert s.reductions == (2,) and s.row == frozenset({2, 3, 4})
    assert (s.scale, s.factor, s.keep) == (5, 4, 0)


def test_gemma_rmsnorm_and_a_division_by_the_rms() -> None:
    # Gemma: (xf * rsqrt(...)) * (1 + w.float()), cast at the end
    ops = [CAST, POW, MEAN, ADD, RSQRT, MUL, CAST, ADD, MUL, CAST]
    args = [["t"], [0, "s"], [1, "s", "s"], [2, "s"], [3], [0, 4], ["t"], [6, "s"], [5, 7], [8]]
    s = row_scale(ops, args, 9, RED)
    assert s is not None and (s.scale, s.factor) == (5, 4)
    # x / sqrt(sum(x^2)): a division by the row value is not a product by it
    ops = [POW, "aten.sum.dim_IntList", "aten.sqrt.default", DIV]
    args = [["t", "s"], [0, "s", "s"], [1], ["t", 2]]
    assert row_scale(ops, args, 3, RED) is None


def test_subtracted_or_twice_used_row_values_are_not_a_factor() -> None:
    # LayerNorm: (x - mean(x)) * rsqrt(var + eps)
    ops = [MEAN, SUB, MUL, MEAN, ADD, RSQRT, MUL]
    args = [["t", "s", "s"], ["t", 0], [1, 1], [2, "s", "s"], [3, "s"], [4], [1, 5]]
    assert row_scale(ops, args, 6, RED) is None
    # the factor applied, then a tensor added: not linear in the factor
    ops, args = list(LLAMA[0]) + [ADD], [list(a) for a in LLAMA[1]] + [[7, "t"]]
    assert row_scale(ops, args, 8, RED) is None
    # two products by row values
    ops, args = list(LLAMA[0]) + [MUL], [list(a) for a in LLAMA[1]] + [[7, 4]]
    assert row_scale(ops, args, 8, RED) is None
    # the row value added to a tensor: no factor
    ops = [MEAN, ADD, MUL]
    args = [["t", "s", "s"], [0, "t"], ["t", 1]]
    assert row_scale(ops, args, 2, RED) is None
    # ... multiplied by one: a factor (t2 * (mean * t) = mean * (t2 * t))
    s = row_scale([MEAN, MUL, MUL], args, 2, RED)
    assert s is not None and (s.scale, s.factor, s.keep) == (1, 0, 1)


def test_no_reduction_or_an_unused_one() -> None:
    assert row_scale([CAST, MUL], [["t"], [0, "t"]], 1, RED) is None
    # the reduction does not reach the value
    assert row_scale([MEAN, CAST], [["t", "s", "s"], ["t"]], 1, RED) is None
