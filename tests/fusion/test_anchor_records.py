"""Fusion anchors as records (issue 21): ``hexlayout.fusion`` holds the generic mechanism and
no op's schema; the op packages register ``AnchorRecord`` s, and the record table is what the
partitioner and ``run_fused`` look anchors up in."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FUSION = ROOT / "hexlayout" / "fusion"

#: What only an op package may know: the aten names of the anchors it registers, hexlayout's
#: GEMM op and its schema's argument names and activation table, attention's mask keywords,
#: the row reductions' row limit and the softmax they fuse.
FORBIDDEN = (
    "aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.linear.default",
    "hexlayout.gemm", "scaled_dot_product", "aten.mean.dim", "aten.sum.dim_IntList",
    "aten.amax.default", "aten._softmax", "attn_mask", "attn_bias", "gelu_tanh", "b_layout",
    '"residual"', '"activation"', '"bias"', "MAX_ROW", "ROW_REDUCTIONS", "ATTENTION_ANCHORS",
)


def test_fusion_names_no_op() -> None:
    bad = [f"{f.relative_to(ROOT)}: {word}" for f in sorted(FUSION.glob("*.py"))
           for word in FORBIDDEN if word in f.read_text()]
    assert not bad, "op-specific names in hexlayout/fusion:\n" + "\n".join(bad)


def _long_functions(path: pathlib.Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text())
    return [f"{path.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > limit]


def test_no_fusion_function_over_100_lines() -> None:
    files = [*sorted(FUSION.glob("*.py")), ROOT / "ops" / "gemm" / "fusion_plan.py",
             ROOT / "ops" / "gemm" / "fusion.py", ROOT / "ops" / "row_reduce" / "fusion.py",
             ROOT / "ops" / "attention" / "sdpa_fusion.py"]
    long = [x for f in files for x in _long_functions(f, 100)]
    assert not long, "functions over 100 lines:\n" + "\n".join(long)


def test_the_op_packages_register_the_anchors() -> None:
    pytest.importorskip("torch")
    import hexlayout.ops  # noqa: F401 - registers the anchor records

    from hexlayout.fusion import ANCHORS
    from hexlayout.fusion.anchors import anchor_records, record_of_op

    names = {r.name for r in anchor_records()}
    assert {"matmul", "hexlayout.gemm", "row reduction", "attention"} <= names
    assert record_of_op("hexlayout.gemm.default").name == "hexlayout.gemm"
    assert record_of_op("aten.addmm.default").name == "matmul"
    assert record_of_op("aten.mean.dim").rows
    assert record_of_op("aten.scaled_dot_product_attention.default").tuple_output
    assert {"aten.mm.default", "aten.linear.default", "aten.mean.dim"} <= set(ANCHORS)


def _graph():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return torch.cumsum(x * 2.0, 1).relu()

    return make_fx(f, tracing_mode="fake")(torch.randn(4, 8))


def _toy_record(calls: list):
    """``aten.cumsum`` as an anchor: its operand ``x`` takes a prologue, ``dim`` is a constant
    keyword of the spec; ``run`` runs the spec's reference (the table, not a kernel, is what
    is tested)."""
    from hexlayout.fusion import reference
    from hexlayout.fusion.anchors import AnchorRecord

    def to_spec(g, s) -> None:
        s.order = [0]
        s.kwargs = (("dim", g.const(g.anchor.args[1], g.anchor)[1]),)

    def run(spec, anchor_args, extra_inputs):
        calls.append(spec)
        return reference(spec, anchor_args, extra_inputs), None

    return AnchorRecord("toy cumsum", frozenset({"aten.cumsum.default"}), run=run,
                        operands=lambda g, n: n.args[:1], to_spec=to_spec)


def test_a_registered_record_makes_an_op_an_anchor() -> None:
    """Before: ``cumsum`` is a reduction left to torch. A record registered for it (no change
    to fusion) makes it an anchor: its producer fuses as a prologue, its consumer as an
    epilogue, and ``run_fused`` runs the spec through the record."""
    torch = pytest.importorskip("torch")
    from hexlayout.fusion import run_fused
    from hexlayout.fusion.anchors import register_anchor, unregister_anchor
    from hexlayout.fusion.partition import partition

    before = partition(_graph())
    assert not before.groups
    assert any("cumsum" in str(n.target) and "a reduction" in why for n, why in before.fallbacks)

    calls: list = []
    register_anchor(_toy_record(calls))
    try:
        part = partition(_graph())
        assert len(part.groups) == 1 and not part.fallbacks
        g = part.groups[0]
        assert g.ops == ("aten.cumsum.default", ["aten.mul.Tensor"], ["aten.relu.default"])
        spec = g.spec
        assert spec.anchor == "aten.cumsum.default" and spec.anchor_kwargs == (("dim", 1),)
        assert spec.prologue_ops() == ["aten.mul.Tensor"] and spec.epilogue_ops() == ["aten.relu.default"]
        x = torch.randn(4, 8)
        (out,) = run_fused(spec, [None], [x])
        assert calls == [spec]
        torch.testing.assert_close(out, torch.cumsum(x * 2.0, 1).relu())
    finally:
        unregister_anchor("toy cumsum")
    assert not partition(_graph()).groups


def test_a_spec_no_record_runs_is_unsupported() -> None:
    torch = pytest.importorskip("torch")
    from hexlayout.fusion import FusedSpec, FusionUnsupported, run_fused

    with pytest.raises(FusionUnsupported, match="aten.cumsum.default is not an anchor"):
        run_fused(FusedSpec("aten.cumsum.default"), [torch.randn(2, 2)], [])
