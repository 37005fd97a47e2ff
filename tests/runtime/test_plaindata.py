"""``plaindata``: hexlayout object graphs as JSON + blobs; shared and cyclic references kept;
decoding creates only hexlayout classes and builtin containers, never imports or calls
anything a document names outside hexlayout."""

from __future__ import annotations

import json
import math
import sys

import pytest

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import Var
from hexlayout.layout import Layout, Swizzle
from hexlayout.runtime import plaindata
from hexlayout.runtime.compile import CompiledKernel


def _roundtrip(obj):
    doc, blobs = plaindata.encode(obj)
    return plaindata.decode(doc, blobs)


def test_values_sharing_and_cycles_survive() -> None:
    v = Var("n", 0, 8, "scalar")
    lay = Layout((4, 8), (8, 1))
    shared = [1, 2]
    cyc: list = []
    cyc.append(cyc)
    obj = {"v": (v, v), "lay": lay, "sw": Swizzle(3, 3, 3), "l": [shared, shared], "c": cyc,
           7: {1.5, 2.5}, "f": frozenset({3}), "x": (float("nan"), float("inf"), -float("inf"), 2**80),
           "b": b"\x00\x01cubin", "dt": DType("f16", 16, "f16", "half")}
    out = _roundtrip(obj)
    assert out["v"][0] is out["v"][1] and out["v"][0] is not v          # Vars compare by identity
    assert (out["v"][0].name, out["v"][0].lo, out["v"][0].hi) == ("n", 0, 8)
    assert out["lay"] == lay and str(out["sw"]) == str(Swizzle(3, 3, 3))
    assert out["l"][0] is out["l"][1] and out["l"][0] == [1, 2]
    assert out["c"][0] is out["c"]
    assert out[7] == {1.5, 2.5} and out["f"] == frozenset({3})
    assert math.isnan(out["x"][0]) and out["x"][1:] == (float("inf"), -float("inf"), 2**80)
    assert out["b"] == b"\x00\x01cubin" and out["dt"] == obj["dt"]


def test_a_compiled_kernel_keeps_its_bytes_as_a_blob() -> None:
    ck = CompiledKernel("k", "sm_80", b"\x7fELF" + bytes(range(256)), "ptx", "log", "nvrtc 13.0", ("-O3",),
                        None, "key", 0.5)
    doc, blobs = plaindata.encode(ck)
    assert blobs == [ck.cubin] and b"ELF" not in doc
    assert plaindata.decode(doc, blobs) == ck


@pytest.mark.parametrize("obj", [print, lambda: 0, json.JSONDecoder(), object(), type("T", (), {})()])
def test_foreign_objects_are_not_encoded(obj) -> None:
    with pytest.raises(TypeError):
        plaindata.encode({"x": obj})


def _doc(classes, table, root) -> bytes:
    return json.dumps({"format": plaindata.FORMAT, "classes": classes, "table": table, "root": root}).encode()


@pytest.mark.parametrize("name", ["os:system", "builtins:eval", "antigravity:geohash", "subprocess:Popen",
                                  "hexlayout.runtime.build:build", "hexlayout.runtime.build:os",
                                  "hexlayoutx.evil:C", "hexlayout.ir.expr:<locals>.X", "hexlayout.__main__:X",
                                  "hexlayout.cli.__main__:X", "hexlayout.cli.demo_nonexistent:X"])
def test_documents_naming_anything_outside_hexlayout_classes_are_refused(name: str) -> None:
    before = set(sys.modules)
    with pytest.raises(ValueError):
        plaindata.decode(_doc([name], [["o", 0, [], []]], ["r", 0]), [])
    assert not {m for m in set(sys.modules) - before if not m.startswith("hexlayout")}


@pytest.mark.parametrize("doc", [
    b"not json", b"[]", _doc([], [], ["r", 3]), _doc([], [["x", []]], ["r", 0]), _doc([], [], ["b", 0]),
    _doc(["hexlayout.ir.expr:Var"], [["o", 0, [], [["nope", 1]]]], ["r", 0]),
    _doc(["hexlayout.arch.dtypes:DType"], [["o", 0, [[1, 2]], []]], ["r", 0]),
    _doc([], [["t", [["r", 0]]]], ["r", 0]),                                # a tuple containing itself
    json.dumps({"format": 99, "classes": [], "table": [], "root": 1}).encode(),
])
def test_malformed_documents_raise_value_error(doc: bytes) -> None:
    with pytest.raises(ValueError):
        plaindata.decode(doc, [])


def test_str_subclasses_keep_their_value_and_fields() -> None:
    from hexlayout.ir.functions.base import alu_function
    from hexlayout.ir.lower.rejection import Rejection

    rej = Rejection("16-byte aligned rows", instruction="cp.async.cg", operand="a")
    fn = alu_function("mov")
    out_rej, out_fn = _roundtrip((rej, fn))
    assert type(out_rej) is Rejection and out_rej == rej and out_rej.instruction == "cp.async.cg"
    assert out_rej.operand == "a" and out_rej.requirement == "16-byte aligned rows"
    assert type(out_fn) is type(fn) and out_fn == fn and out_fn.numpy(3) == 3
