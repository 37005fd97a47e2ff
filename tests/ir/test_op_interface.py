"""Every tile op declares its inputs, outputs and nested blocks, and has every pass rule.

The registry test enumerates ``Op``'s subclasses, so an op added without a printing rule,
a layout relation for synthesis or a lowering fails here. The interface is checked on the
example kernels: every tile value an op holds in any field is one of its inputs or outputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import hexlayout.ir.tile as tile
from hexlayout.ir.lower.kernel import LOWERING
from hexlayout.ir.printer import PRINTING
from hexlayout.ir.registry import OpRegistry, op_classes
from hexlayout.ir.tile import Block, Copy, Elementwise, Fill, For, If, Mma, Op, TileKernel, Value
from hexlayout.ir.walk import walk
from hexlayout.synth.graph import RELATIONS

ALL = op_classes()


def _examples() -> list[TileKernel]:
    from hexlayout.lang.examples.explicit import gemm_sm80_explicit, gemm_sm90_ws_explicit
    from hexlayout.lang.examples.flash_attention import flash_attention_fwd
    from hexlayout.lang.examples.gemm_sm80 import gemm_sm80
    from hexlayout.lang.examples.gemm_sm90 import gemm_sm90
    from tests.e2e.test_softmax_explicit import causal_softmax
    from tests.lang.kernels import simple_gemm

    return [gemm_sm80.trace(), gemm_sm90.trace(), flash_attention_fwd.trace(CAUSAL=True),
            gemm_sm80_explicit().trace(), gemm_sm90_ws_explicit().trace(), causal_softmax.trace(),
            simple_gemm.trace()]


EXAMPLES = _examples()


def test_the_enumeration_finds_every_op_class_of_the_ir() -> None:
    declared = {getattr(tile, n) for n in tile.__all__}
    ops = {c for c in declared if isinstance(c, type) and issubclass(c, Op) and c is not Op}
    assert ops <= set(ALL)
    assert {tile.Copy, tile.Mma, tile.For, tile.If, tile.SetMaxNReg, tile.MbarrierWait} <= set(ALL)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_op_has_every_rule(cls: type[Op]) -> None:
    assert PRINTING.rule(cls) is not None, f"{cls.__name__} has no printing rule"
    assert RELATIONS.rule(cls) is not None, f"{cls.__name__} has no layout relation"
    assert LOWERING.rule(cls) is not None, f"{cls.__name__} has no lowering"


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_field_that_can_hold_a_value_or_block_is_declared(cls: type[Op]) -> None:
    names = {f.name for f in dataclasses.fields(cls)}
    declared = set(cls.INPUTS) | set(cls.OUTPUTS) | set(cls.BLOCKS)
    assert declared <= names, f"{cls.__name__} declares fields it does not have: {declared - names}"
    for f in dataclasses.fields(cls):
        ann = str(f.type)
        if "Value" in ann or ("Any" in ann and "tuple" in ann):
            assert f.name in cls.INPUTS or f.name in cls.OUTPUTS, f"{cls.__name__}.{f.name}"
        if "Block" in ann:
            assert f.name in cls.BLOCKS, f"{cls.__name__}.{f.name}"


def _held(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [y for v in x for y in _held(v)]
    return [x]


@pytest.mark.parametrize("tk", EXAMPLES, ids=lambda tk: tk.name)
def test_inputs_and_outputs_cover_every_value_an_op_holds(tk: TileKernel) -> None:
    for op in walk(tk):
        held = [x for f in dataclasses.fields(op) for x in _held(getattr(op, f.name))]
        values = [x for x in held if isinstance(x, Value)]
        blocks = [x for x in held if isinstance(x, Block)]
        io = op.inputs() + op.outputs()
        for v in values:
            assert any(v is w for w in io), f"{op.name} holds %{v.name} outside inputs/outputs"
        assert [id(b) for b in blocks] == [id(b) for b in op.blocks()]
        assert {id(v) for v in op.values()} == {id(v) for v in io}


def test_roles_of_reads_and_writes() -> None:
    seen: set[type] = set()
    for tk in EXAMPLES:
        for op in walk(tk):
            if isinstance(op, Mma):   # c += a @ b^T reads the accumulator and writes it
                assert op.inputs() == [op.a, op.b, op.c] and op.outputs() == [op.c]
            elif isinstance(op, Copy):
                assert op.outputs() == [op.dst] and op.inputs()[0] is op.src
                assert all(v is not op.dst for v in op.inputs())
            elif isinstance(op, Fill):    # overwrites, reads nothing
                assert op.inputs() == [] and op.outputs() == [op.dst]
            elif isinstance(op, Elementwise):
                assert op.inputs() == [a for a in op.args if isinstance(a, Value)]
                assert op.outputs() == [op.result]
            elif isinstance(op, (For, If)):
                assert op.inputs() == [] and op.outputs() == []
            else:
                continue
            seen.add(type(op))
    assert seen == {Mma, Copy, Fill, Elementwise, For, If}


def test_legacy_operands_and_results_still_answer() -> None:
    for op in walk(EXAMPLES[0]):
        assert {id(v) for v in op.operands()} == {id(v) for v in op.values()}
        r = getattr(op, "result", None)
        assert op.results() == ([r] if isinstance(r, Value) else [])


def test_registry_resolves_subclasses_reports_missing_and_refuses_duplicates() -> None:
    reg: OpRegistry = OpRegistry("test")

    class Base:
        pass

    class Derived(Base):
        pass

    class Other:
        pass

    @reg.register(Base)
    def _base(x: Any) -> str:
        return "base"

    assert reg.rule(Derived) is _base and Derived in reg
    assert reg.missing([Base, Derived, Other]) == [Other]
    with pytest.raises(ValueError, match="Base already has a rule"):
        reg.register(Base)(lambda x: x)
    assert set(PRINTING.missing([Other])) == {Other} and RELATIONS.missing([Other]) == [Other]
