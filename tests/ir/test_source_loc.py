"""``SourceLoc.format``: the one spelling of a kernel-source location, in every layer's messages."""

from __future__ import annotations

import doctest

import pytest

import hexlayout.ir.source
import hexlayout.lang as hl
import hexlayout.lang.errors
from hexlayout.codegen.errors import CodegenError
from hexlayout.emulator.errors import describe_instr
from hexlayout.ir.lower.kernel import LoweringError
from hexlayout.ir.lowered import BarSync
from hexlayout.ir.printer import _loc as printer_loc
from hexlayout.ir.source import SourceLoc
from hexlayout.ir.tile import Sync
from hexlayout.synth.diagnose import describe_op

LOC = SourceLoc("/work/kernels/attn.py", 17, "attn", "    acc += hl.exp2(s - m)   ")
NO_CODE = SourceLoc("/work/kernels/attn.py", 17, "attn")


def test_styles() -> None:
    assert LOC.format() == "attn.py:17"
    assert LOC.format(code="backticks") == "attn.py:17 `acc += hl.exp2(s - m)`"
    assert LOC.format(code="parens") == "attn.py:17 (`acc += hl.exp2(s - m)`)"
    assert LOC.format(full_path=True, code="backticks") == "/work/kernels/attn.py:17 `acc += hl.exp2(s - m)`"
    assert str(LOC) == "/work/kernels/attn.py:17"
    assert LOC.filename == "attn.py" and LOC.text == "acc += hl.exp2(s - m)"


def test_unknown_code_is_left_out() -> None:
    for style in ("none", "backticks", "parens"):
        assert NO_CODE.format(code=style) == "attn.py:17"  # type: ignore[arg-type]
    assert SourceLoc("k.py", 3, "k", "   ").format(code="backticks") == "k.py:3"


def test_bad_style() -> None:
    with pytest.raises(ValueError, match="brackets"):
        LOC.format(code="brackets")  # type: ignore[arg-type]


def test_every_layer_uses_it() -> None:
    """The messages of the language, the lowering, the code generator, the emulator, the
    diagnostics and the IR printer spell the location as ``SourceLoc.format`` does."""
    assert str(hl.KernelError("attn", "exp2", LOC, "bad")) == \
        "attn: exp2 at attn.py:17 `acc += hl.exp2(s - m)`: bad"
    op = Sync(loc=LOC)
    assert str(LoweringError("attn", op, "bad")) == \
        "attn: sync at /work/kernels/attn.py:17 `acc += hl.exp2(s - m)`: bad"
    ins = BarSync(loc=LOC, origin="sync")
    assert str(CodegenError("attn", "bad", ins)) == \
        "attn: BarSync (from sync) at /work/kernels/attn.py:17 `acc += hl.exp2(s - m)`: bad"
    assert describe_instr(ins) == "BarSync [sync] at /work/kernels/attn.py:17 (`acc += hl.exp2(s - m)`)"
    assert describe_op(op) == "sync at attn.py:17 `acc += hl.exp2(s - m)`"
    assert printer_loc(LOC) == "  # attn.py:17"


@pytest.mark.parametrize("module", [hexlayout.ir.source, hexlayout.lang.errors])
def test_doctests(module) -> None:
    result = doctest.testmod(module, extraglobs={"hl": hl}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
