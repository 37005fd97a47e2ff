"""A prologue's row factor, moved past the anchor.

An A prologue ``P(x)`` that reduces rows of ``x`` (an RMSNorm of the activation) is exact in a
GEMM whose A tile holds whole rows. For longer rows it still fuses when the reductions reach
the operand only through one product by a row value:

    P(x)[m, k] = L(f(x)[m, k] * g(r_1[m], ..., r_p[m]))[m, k],   r_i[m] = sum_k h_i(x)[m, k]

with ``L`` row-linear (products by values that do not depend on the reductions, casts,
views, negation; ``L(v * c[m]) = c[m] * L(v)``). Then, for the product with ``B``,

    (P(x) @ B)[m, n] = g(r[m]) * (L(f(x)) @ B)[m, n]

so the kernel computes the prologue without the factor (``L(f(x))``, tile by tile), adds
``sum_k h_i(x)`` of each tile it loads to a per-row sum (the k-loop covers the row once), and
multiplies the accumulator's rows by ``g`` of the finished sums before its epilogue. RMSNorm
``w * (x * rsqrt(mean(x * x) + eps)).to(dt)`` is of this form (``f = x``, ``g = rsqrt(r / K +
eps)``, ``L = w * cast``); LayerNorm is not (``x - mean(x)`` subtracts a row value). The
rounding differs from eager's by one rounding of the unscaled operand (``x * w`` in ``dt``
where eager rounds ``x * g``): within the half-precision tolerance, not bit-exact.

``row_scale(ops, args, out, reductions)`` finds the split on a prologue written as a list of
ops whose arguments are node indices, ``"s"`` (a scalar: a constant, a one-element tensor)
or ``"t"`` (a tensor input); both the partition (fx nodes) and the mechanism (``Node`` lists)
describe their prologues this way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .aten import CASTS, VIEWS

__all__ = ["RowScale", "row_scale"]

Arg = int | str
_MUL, _DIV, _NEG = "aten.mul.Tensor", "aten.div.Tensor", "aten.neg.default"
#: ops of one tensor argument that commute with a product by a row value
_LINEAR_UNARY = frozenset(CASTS) | frozenset(VIEWS) | {_NEG, "aten.clone.default", "aten.alias.default"}


@dataclass(frozen=True)
class RowScale:
    """The split of a prologue (node indices): ``reductions`` (the row sums ``r_i``), ``row``
    (the nodes computed from the reductions and scalars alone, ``g``'s; the reductions among
    them), ``scale`` (the product ``f(x) * g``), ``factor`` (its row-value argument, a node
    of ``row``) and ``keep`` (the position of its other argument in the product's arguments)."""

    reductions: tuple[int, ...]
    row: frozenset[int]
    scale: int
    factor: int
    keep: int


def row_scale(ops: Sequence[str], args: Sequence[Sequence[Arg]], out: int,
              reductions: frozenset[str] | set[str]) -> RowScale | None:
    """The split of the prologue ``ops`` / ``args`` (value: node ``out``) whose row reductions
    (ops in ``reductions``) reach ``out`` only through one product by a row value followed by
    row-linear ops (see the module docstring), or None."""
    reds = tuple(j for j, op in enumerate(ops) if op in reductions)
    if not reds:
        return None
    row: set[int] = set(reds)
    after: set[int] = set()               # nodes that depend on a reduction, not row values
    for j in range(len(ops)):
        if j in row:
            continue
        nodes = [a for a in args[j] if isinstance(a, int)]
        if not any(a in row or a in after for a in nodes):
            continue
        if all(a == "s" or a in row for a in args[j]):
            row.add(j)
        else:
            after.add(j)
    if out not in after:
        return None
    scales = []
    for j in sorted(after):
        a = list(args[j])
        dep = [i for i, x in enumerate(a) if isinstance(x, int) and (x in row or x in after)]
        if ops[j] == _MUL and len(a) == 2 and len(dep) == 1 and a[dep[0]] in row:
            scales.append((j, a[dep[0]], 1 - dep[0]))
        elif ops[j] == _MUL and len(a) == 2 and len(dep) == 1:
            continue                      # L: a product by a value free of the reductions
        elif ops[j] == _DIV and len(a) == 2 and dep == [0] and a[0] in after:
            continue
        elif ops[j] in _LINEAR_UNARY and dep == [0] and a[0] in after:
            continue
        else:
            return None
    if len(scales) != 1:
        return None
    (scale, factor, keep), = scales
    if isinstance(args[scale][keep], int) and args[scale][keep] in after:
        return None
    return RowScale(reds, frozenset(row), scale, factor, keep)
