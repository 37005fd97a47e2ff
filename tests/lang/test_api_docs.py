"""The kernel language is documented where it is defined, and its examples stay true.

Every public name of ``hexlayout.lang`` (``__all__``) and every public method and property
of the proxies a kernel sees (``Tile``, ``GlobalTensor``, ``Barriers``) and of ``Kernel``,
``Tensor``, ``Dim``, ``hl.auto`` carries a docstring in one style: a one-line summary, the
semantics, ``Args:`` (when it takes arguments), ``Returns:``, ``Raises:`` and an
``Example:``. Each example runs: a ``>>>`` example with doctest, a ``::`` block (a kernel
definition traced inside the block) with ``exec``.
"""

from __future__ import annotations

import doctest
import inspect
import itertools
import linecache
import re
import textwrap
from typing import Any

import pytest

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang.sync import Barriers

# Re-exported from lower layers and documented there (hexlayout.layout, hexlayout.ir.mapping).
REEXPORTS = {"Layout", "Swizzle", "ComposedLayout", "composition", "make_layout_tv", "TaskMapping"}
# Functions that cannot raise (pure helpers): no Raises section needed.
NO_RAISES = {"dims"}
# Classes whose public members are documented one by one.
MEMBER_CLASSES = [hl.Tile, hl.GlobalTensor, hl.Kernel, hl.Tensor, hl.Dim, Barriers, type(hl.auto)]
# Tile operators documented as members (the rest are listed in the Tile class docstring).
DUNDERS = {"__getitem__", "__setitem__", "__call__"}

SECTION = re.compile(r"^(\s*)(Args|Returns|Raises|Example|Examples|Attributes):\s*$", re.M)


def _api() -> list[tuple[str, Any]]:
    out = []
    for name in hl.__all__:
        obj = getattr(hl, name)
        if name in REEXPORTS or isinstance(obj, DType):
            continue
        out.append((f"hl.{name}", obj))
    for cls in MEMBER_CLASSES:
        for name, attr in vars(cls).items():
            if name.startswith("_") and name not in DUNDERS:
                continue
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if callable(attr) or isinstance(attr, property):
                out.append((f"{cls.__name__}.{name}", attr))
    return out


API = _api()


def _sections(doc: str) -> dict[str, str]:
    """``{"Args": text, ...}``; ``""`` holds the text before the first section."""
    doc = inspect.cleandoc(doc)
    parts: dict[str, str] = {}
    marks = list(SECTION.finditer(doc))
    parts[""] = doc[:marks[0].start()] if marks else doc
    for m, nxt in itertools.zip_longest(marks, marks[1:]):
        key = "Example" if m.group(2) == "Examples" else m.group(2)
        parts[key] = doc[m.end():nxt.start() if nxt is not None else len(doc)]
    return parts


def _params(obj: Any) -> list[str]:
    fn = obj.fget if isinstance(obj, property) else obj
    if inspect.isclass(fn):
        fn = fn.__init__
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters if p not in ("self", "cls")]


def test_enumeration_covers_the_language() -> None:
    names = {n for n, _ in API}
    assert {"hl.kernel", "hl.copy", "hl.mma", "hl.view", "hl.range", "hl.shared", "hl.register", "hl.zeros",
            "hl.reduce", "hl.grid", "hl.mbarrier", "hl.wgmma_wait", "hl.warp_group", "hl.auto", "Tile.T",
            "Tile.shape", "Tile.__getitem__", "Kernel.trace"} <= names
    assert REEXPORTS <= set(hl.__all__)


@pytest.mark.parametrize("name,obj", API, ids=[n for n, _ in API])
def test_documented(name: str, obj: Any) -> None:
    doc = (obj.fget if isinstance(obj, property) else obj).__doc__  # an instance (hl.auto): its class's
    assert doc and doc.strip(), f"{name} has no docstring"
    assert "see the module docstring" not in doc.lower(), f"{name}: document it here, not by reference"
    parts = _sections(doc)
    summary = parts[""].strip().splitlines()[0]
    assert summary.strip(), f"{name}: no one-line summary"
    if isinstance(obj, property):
        return  # a property: summary and semantics (the tests below run the examples of those that have one)
    if inspect.isclass(obj):
        assert len(parts[""].strip().splitlines()) > 1, f"{name}: no semantics"
        assert "Example" in parts or not name.startswith("hl."), f"{name}: no Example"
        return
    if _params(obj):
        assert "Args" in parts, f"{name}: no Args section"
        for p in _params(obj):
            assert re.search(rf"^\s*\**{p}\b", parts["Args"], re.M), f"{name}: argument {p} not documented"
    assert "Returns" in parts, f"{name}: no Returns section"
    bare = name.split(".")[-1]
    if name.startswith("hl.") and bare not in NO_RAISES:
        assert "Raises" in parts, f"{name}: no Raises section"
    assert "Example" in parts, f"{name}: no Example"


EXAMPLES = [(n, o) for n, o in API
            if "Example" in _sections((o.fget if isinstance(o, property) else o).__doc__ or "")]
_counter = itertools.count()


def _run_block(name: str, code: str) -> None:
    """Execute a ``::`` example block, with its lines visible to the tracer's source capture."""
    fname = f"<example {name} {next(_counter)}>"
    linecache.cache[fname] = (len(code), None, code.splitlines(keepends=True), fname)
    try:
        exec(compile(code, fname, "exec"), {"hl": hl, "__name__": "example"})  # noqa: S102 - our own docs
    finally:
        linecache.cache.pop(fname, None)


@pytest.mark.parametrize("name,obj", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_example_runs(name: str, obj: Any) -> None:
    doc = (obj.fget if isinstance(obj, property) else obj).__doc__
    ex = _sections(doc)["Example"]
    member = name.split(".")[-1]
    if not member.startswith("__") and not inspect.isclass(obj):  # a class's example shows its instances
        needle = name if name.startswith("hl.") else f".{member}"
        assert re.search(rf"{re.escape(needle)}\b", ex), f"{name}: the example does not use {needle}"
    if ">>>" in ex:
        test = doctest.DocTestParser().get_doctest(textwrap.dedent(ex), {"hl": hl}, name, None, 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test)
        assert runner.failures == 0, f"{name}: its doctest fails (see the output above)"
        assert runner.tries > 0
        return
    lines = ex.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.rstrip().endswith("::")]
    assert starts, f"{name}: the example has neither >>> lines nor a :: block"
    block = textwrap.dedent("\n".join(lines[starts[0] + 1:])).strip("\n") + "\n"
    assert ".trace(" in block or "hl.kernel" not in block, f"{name}: the example's kernel is never traced"
    _run_block(name, block)
