"""The prologue ``fused_moe`` takes on ``hidden_states``: the activation scaled per row and
per column,

    x'[t, k] = x[t, k] * prod_i r_i[t] * prod_j c_j[k]        (casts and leading reshapes aside)

``r_i[t] = post_i(red_k pre_i(x[t, k]))`` a row scale (``red`` a sum or mean over the row,
``pre_i`` elementwise math of ``x`` and numbers, ``post_i`` elementwise math of the reduced
value and numbers) and ``c_j`` a column scale (elementwise math of per-column inputs ``[H]`` /
``[1, H]`` and numbers): an RMSNorm ``x * rsqrt(mean(x * x, -1) + eps) * w`` as HF writes it
(``w * (x.float() * rsqrt(...)).to(dtype)``, Gemma's ``1 + w``), a cast, a scale by a number.
Both GEMMs of the experts are linear in the activation, so

    act(x' W_gate^T) * (x' W_up^T) = act(r * (x (c . W_gate)^T)) * (r * (x (c . W_up)^T))

(``r = prod_i r_i``): the column scale is folded into the gate-up weights once (a derived
parameter, ``w13 * c`` rounded to the weights' type) and the gate-up kernel accumulates
``pre_i(x)`` over the row it already reads, applying ``r`` to both accumulators before the
activation (``kernels_sm80.moe_gate_up_kernel(..., scales)``): no launch of its own. The
intermediate roundings of the written form (``x'`` in the activations' type) are not
repeated: the products are f32 until the activation, as the GEMM prologues'.

A prologue of another form (``x - mean``: LayerNorm's centering; math of ``x`` that is not a
product of scales) is refused with ``FusionUnsupported`` naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexlayout.fusion.aten import CASTS, ELEMENTWISE, dtype_name
from hexlayout.fusion.reference import eval_nodes
from hexlayout.fusion.spec import FusionUnsupported, Node, Prologue

from .derived import cached_derived

__all__ = ["RowScale", "MoePrologue", "moe_prologue", "ROW_SCALE_REDUCTIONS", "scaled_w13"]

#: the row reductions a row scale holds (over the last dimension, ``keepdim``)
ROW_SCALE_REDUCTIONS = {"aten.mean.dim": "mean", "aten.sum.dim_IntList": "sum"}


@dataclass(frozen=True)
class RowScale:
    """``r[t] = post(fn_k pre(x[t, k]))``: ``pre`` nodes read ``("input", 0)`` (``x`` in f32),
    ``post`` nodes read ``("input", 0)`` (the reduced ``[T, 1]`` value); ``fn`` ``"sum"`` /
    ``"mean"``."""

    pre: tuple[Node, ...]
    pre_out: int
    fn: str
    post: tuple[Node, ...]
    post_out: int


@dataclass(frozen=True)
class MoePrologue:
    """The prologue of ``hidden_states``: extra input ``x`` (``[..., H]`` of the activations'
    type), the row scales, and the column scale's factors (``columns``: ``(reference into the
    prologue's own ``nodes``, divides)`` pairs, each a per-column value or a number) that the
    host evaluates."""

    x: int
    scales: tuple[RowScale, ...]
    nodes: tuple[Node, ...]
    columns: tuple[tuple, ...]
    column_inputs: tuple[int, ...] = ()      # the extra inputs the column scale reads


_MULS = ("aten.mul.Tensor", "aten.mul.Scalar")
_DIVS = ("aten.div.Tensor", "aten.div.Scalar")


def _sub(nodes: tuple[Node, ...], out: int, leaf: dict) -> tuple[tuple[Node, ...], int]:
    """The nodes ``out`` depends on, renumbered, with the references in ``leaf`` (a node index or
    an ``("input", i)``) replaced by ``("input", 0)``."""
    keep: list[int] = []
    seen: set = set()

    def visit(j: int) -> None:
        if j in seen or j in leaf:
            return
        seen.add(j)
        for a in nodes[j].args:
            if isinstance(a, tuple) and a and a[0] == "node":
                visit(a[1])
        keep.append(j)

    visit(out)
    new = {j: i for i, j in enumerate(sorted(keep))}

    def ref(a: Any) -> Any:
        if isinstance(a, tuple) and a and a[0] == "node":
            return ("input", 0) if a[1] in leaf else ("node", new[a[1]])
        if isinstance(a, tuple) and a and a[0] == "input":
            if a in leaf:
                return ("input", 0)
            raise FusionUnsupported(f"reads extra input {a[1]} where only the activation or the reduced "
                                    "value is known")
        return a

    out_nodes = tuple(Node(nodes[j].op, tuple(ref(a) for a in nodes[j].args), nodes[j].kwargs)
                      for j in sorted(keep))
    if out in leaf:                        # the leaf itself: an identity
        return (Node("aten.mul.Tensor", (("input", 0), ("const", 1.0))),), 0
    return out_nodes, new[out]


def moe_prologue(p: Prologue, extra: list, tokens: int, hidden: int, where: str) -> MoePrologue:
    """``p`` (the prologue of ``hidden_states``; ``extra`` the spec's extra inputs; ``tokens``
    x ``hidden`` the activation's rows) as row and column scales of one activation input (see
    the module docstring): the activation is the input of rank >= 2 holding ``tokens`` rows of
    ``hidden`` (one token's ``[1, H]`` too), a column input holds ``hidden`` values otherwise;
    ``FusionUnsupported`` naming the node when it is not of that form."""
    nodes = p.nodes
    c = _Classes(extra, tokens, hidden, where)
    c.classify(nodes)
    if c.kind.get(p.output) != "x" or c.x_input is None:
        raise FusionUnsupported(f"{where}: the prologue of hidden_states is not a scale of one activation "
                                "input per row and column")
    rows: list[tuple] = []                   # row-scale factors
    cols: list[tuple] = []                   # column-scale factors
    inverse: set[tuple] = set()              # factors that divide
    ref: tuple = ("node", p.output)          # the chain from the output back to x: every factor on it
    while ref[0] == "node":
        xs, other, divides = c.factors[ref[1]]
        if other is not None:                  # a number or a one-element input: a column scale too
            (rows if c.of(other) == "row" else cols).append(other)
            if divides:
                inverse.add(other)
        ref = xs
    if ref != ("input", c.x_input):
        raise FusionUnsupported(f"{where}: the prologue's activation chain does not start at the input")
    scales = tuple(_row_scale(nodes, f, f in inverse, c.red, c.x_input, where) for f in rows)
    return MoePrologue(c.x_input, scales, nodes, tuple((f, f in inverse) for f in cols),
                       tuple(sorted(_column_reads(nodes, cols))))


class _Classes:
    """What each prologue node is (``kind``: ``"x"`` the activation scaled, ``"row"`` /
    ``"col"`` a row / column value, ``"num"`` a number, ``"math"`` other math of the
    activation), the activation input, each scaled node's ``(x operand, factor, divides)``
    and the reductions."""

    def __init__(self, extra: list, tokens: int, hidden: int, where: str) -> None:
        self.extra, self.tokens, self.hidden, self.where = extra, tokens, hidden, where
        self.kind: dict[int, str] = {}
        self.x_input: int | None = None
        self.factors: dict[int, tuple] = {}
        self.red: dict[int, int] = {}

    def of(self, a: Any) -> str:
        """The kind of argument ``a`` (a reference); the activation input is found here."""
        import torch

        if a[0] == "node":
            return self.kind[a[1]]
        if a[0] == "const":
            return "num"
        t = self.extra[a[1]]
        if not isinstance(t, torch.Tensor) or t.numel() == 1:
            return "num"
        if t.shape[-1] == self.hidden and t.dim() >= 2 and t.numel() == self.tokens * self.hidden:
            if self.x_input not in (None, a[1]):
                raise FusionUnsupported(f"{self.where}: the prologue of hidden_states reads two activations "
                                        f"(inputs {self.x_input} and {a[1]})")
            self.x_input = a[1]
            return "x"
        if t.shape[-1] == self.hidden and t.numel() == self.hidden:
            return "col"
        raise FusionUnsupported(f"{self.where}: the prologue of hidden_states reads extra input {a[1]} of "
                                f"shape {tuple(t.shape)} (neither the activation, a column [H] nor a number)")

    def classify(self, nodes: tuple[Node, ...]) -> None:
        """Each node's kind, in order."""
        where, kind = self.where, self.kind
        for j, n in enumerate(nodes):
            refs = [a for a in n.args if isinstance(a, tuple) and a and a[0] in ("node", "input", "const")]
            kinds = [self.of(a) for a in refs]
            tensors = [(a, k) for a, k in zip(refs, kinds) if k != "num"]
            if n.op in ROW_SCALE_REDUCTIONS:
                if kinds[0] not in ("x", "math"):
                    raise FusionUnsupported(f"{where}: prologue node {j} ({n.op}) reduces a value that is "
                                            "not math of the activation alone")
                self.red[j] = j
                kind[j] = "row"
                continue
            if n.op not in ELEMENTWISE and n.op not in CASTS:
                raise FusionUnsupported(f"{where}: prologue node {j}: {n.op} (fused_moe's prologue is "
                                        "elementwise math and row reductions)")
            ks = {k for _, k in tensors}
            if not ks:
                kind[j] = "num"
            elif ks <= {"col", "num"}:
                kind[j] = "col"
            elif ks <= {"row", "num"}:
                kind[j] = "row"
            elif n.op in CASTS and ks == {"x"}:
                kind[j] = "x"
                self.factors[j] = (refs[0], None, False)
            elif n.op in _MULS + _DIVS and len(tensors) <= 2 and \
                    sum(k == "x" for _, k in tensors) == 1 and (n.op in _MULS or kinds[0] == "x"):
                xs = next(a for a, k in tensors if k == "x")
                other = next((a for a, k in zip(refs, kinds) if a is not xs), None)
                if other is not None and self.of(other) == "math":
                    kind[j] = "math"
                    continue
                kind[j] = "x"
                self.factors[j] = (xs, other, n.op in _DIVS)
            elif "x" in ks or "math" in ks:
                if ks & {"row", "col"}:
                    raise FusionUnsupported(f"{where}: prologue node {j} ({n.op}) combines the activation "
                                            "with a row or column value other than by a product "
                                            "(fused_moe's prologue scales rows and columns)")
                kind[j] = "math"
            else:
                raise FusionUnsupported(f"{where}: prologue node {j} ({n.op}) mixes row and column values")


def _row_scale(nodes: tuple[Node, ...], f: tuple, inverse: bool, red: dict, x_input: int,
               where: str) -> RowScale:
    """The row scale of factor ``f`` (a node computed from one reduction of the activation's
    row): ``pre`` (the reduced math of x), the reduction, ``post`` (math of the reduced value;
    its reciprocal when the factor divides)."""
    if f[0] != "node":
        raise FusionUnsupported(f"{where}: a row scale that is not computed from the activation")
    reds = _reductions(nodes, f[1], red)
    if len(reds) != 1:
        raise FusionUnsupported(f"{where}: a row scale of {len(reds)} reductions (fused_moe's row scale "
                                "is a function of one reduction of the row)")
    (r,) = reds
    n = nodes[r]
    dims = n.args[1][1] if len(n.args) > 1 else None
    if tuple(dims or ()) not in ((-1,), (1,)) or n.args[2:3] != (("const", True),):
        raise FusionUnsupported(f"{where}: prologue node {r} ({n.op}) is not over the last dimension "
                                "with keepdim")
    if n.args[0][0] == "node":
        pre, pre_out = _sub(nodes, n.args[0][1], {("input", x_input): True})
    else:
        pre, pre_out = (Node("aten.mul.Tensor", (("input", 0), ("const", 1.0))),), 0
    post, post_out = _sub(nodes, f[1], {r: True})
    if inverse:
        post = post + (Node("aten.reciprocal.default", (("node", post_out),)),)
        post_out = len(post) - 1
    return RowScale(pre, pre_out, ROW_SCALE_REDUCTIONS[n.op], post, post_out)


def _column_reads(nodes: tuple[Node, ...], cols: list[tuple]) -> set[int]:
    """The extra inputs the column factors ``cols`` read."""
    reads: set[int] = set()
    for f in cols:
        work = [f]
        while work:
            a = work.pop()
            if a[0] == "input":
                reads.add(a[1])
            elif a[0] == "node":
                work.extend(b for b in nodes[a[1]].args
                            if isinstance(b, tuple) and b and b[0] in ("node", "input"))
    return reads


def _reductions(nodes: tuple[Node, ...], j: int, red: dict) -> set[int]:
    """The reductions node ``j`` depends on."""
    out: set[int] = set()
    work, seen = [j], set()
    while work:
        k = work.pop()
        if k in seen:
            continue
        seen.add(k)
        if k in red:
            out.add(k)
            continue
        work.extend(a[1] for a in nodes[k].args if isinstance(a, tuple) and a and a[0] == "node")
    return out


def column_scale(pro: MoePrologue, extra: list, hidden: int) -> Any:
    """The product of the column scales as one f32 ``[H]`` tensor (None: there is none)."""
    import torch

    if not pro.columns:
        return None
    vals = eval_nodes(pro.nodes, None, list(extra)) if any(f[0] == "node" for f, _ in pro.columns) else []
    c = None
    for f, divides in pro.columns:
        v = f[1] if f[0] == "const" else extra[f[1]] if f[0] == "input" else vals[f[1]]
        v = torch.as_tensor(v).to(torch.float32).reshape(-1).expand(hidden)
        v = 1.0 / v if divides else v
        c = v if c is None else c * v
    return c


def scaled_w13(w13: Any, pro: MoePrologue, extra: list, hidden: int) -> Any:
    """``w13 * c`` (the column scale over ``H``, rounded to ``w13``'s type), once per weight and
    column inputs (recomputed after an in-place update of either); ``w13`` itself without a
    column scale."""
    import torch

    if not pro.columns:
        return w13
    sources = tuple(extra[i] for i in pro.column_inputs if isinstance(extra[i], torch.Tensor))
    key = ("w13 column scale", pro.nodes, pro.columns, dtype_name(w13.dtype))

    def make() -> Any:
        c = column_scale(pro, extra, hidden)
        return (w13.float() * c.to(w13.device)).to(w13.dtype).contiguous()

    return cached_derived((w13, *sources), key, make)
