"""Structural identity of a tile program: ``structural_key``, ``structural_hash``, ``structurally_equal``.

Two ``TileKernel`` s have the same key exactly when they describe the same program: the
same kernel name, parameters (names, dtypes, shapes, strides, alignment), constants, launch
configuration (grid, threads, cluster, index variables), mbarriers, and the same ops in
the same loop / branch structure, each with the same fields: tile types (dtype, shape,
scope, layout, or the same pattern of layout variables with the same hints), value names,
view aliasing, expressions, instructions, atoms, warp arrangements, constants.

What does not count is object identity: ``Value.id``, ``LayoutVar.id`` and Python object
ids are replaced by the order in which the value, variable, parameter or barrier first
appears in the program. Two traces of one kernel with the same constants therefore have
equal keys, though every ``Value`` and ``LayoutVar`` in them is a new object.

Source locations: an op's location does count, as its file's base name, line number and
line of code, because the code generator writes exactly these into the CUDA source as
comments (``// gemm.py:42 hl.mma(...)``) and diagnostics of a cached build name them.
The directory of the file, the enclosing function name and the locations of values do
not count (they reach neither the generated code nor the printed tile program).

``structural_hash(tk)`` is the sha256 of the key's text (hex), stable across processes
(it depends on no ``id`` and no ``hash()`` randomization): the persisted build cache is
keyed on it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import numbers
from typing import Any

from hexlayout.layout import ComposedLayout, Layout

from .expr import Const, Expr, Var
from .tile import Block, GlobalParam, Mbarrier, Op, ScalarParam, TileKernel, Value
from .types import LayoutVar, TileType

__all__ = ["structural_key", "structural_hash", "structurally_equal"]


class _Encoder:
    """Encodes IR objects as nested tuples of strings and numbers-as-text, numbering
    identity-bearing objects (values, variables, layout variables, parameters, barriers)
    in order of first appearance."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], int] = {}
        self.counts: dict[str, int] = {}
        self.alive: list[Any] = []   # keeps numbered objects alive so their ids stay unique

    def _number(self, kind: str, obj: Any) -> tuple[int, bool]:
        key = (kind, id(obj))
        n = self.seen.get(key)
        if n is None:
            n = self.seen[key] = self.counts.get(kind, 0)
            self.counts[kind] = n + 1
            self.alive.append(obj)
            return n, True
        return n, False

    def enc(self, x: Any) -> Any:  # noqa: C901 - one case per kind of IR object
        if x is None or isinstance(x, str):
            return x
        if isinstance(x, bool):
            return ("bool", str(x))
        if isinstance(x, numbers.Integral):  # numpy integers too
            return ("int", str(int(x)))
        if isinstance(x, numbers.Real):
            return ("float", float(x).hex())
        if isinstance(x, enum.Enum):
            return (type(x).__name__, str(x.value))
        if isinstance(x, (tuple, list)):
            return ("seq",) + tuple(self.enc(v) for v in x)
        if isinstance(x, dict):
            items = sorted(x.items(), key=lambda kv: str(kv[0]))
            return ("dict",) + tuple((str(k), self.enc(v)) for k, v in items)
        if isinstance(x, Value):
            n, first = self._number("value", x)
            if not first:
                return ("value", n)
            base = None if x.base is None else self.enc(x.base)
            return ("value", n, x.name, self.enc(x.type), base)
        if isinstance(x, TileType):
            return ("type", x.dtype.name, self.enc(tuple(x.shape)), str(x.scope), self.enc(x.layout))
        if isinstance(x, LayoutVar):
            n, first = self._number("layoutvar", x)
            return ("layoutvar", n, x.name, self.enc(x.hints)) if first else ("layoutvar", n)
        if isinstance(x, Layout):
            return ("layout", repr(x))
        if isinstance(x, ComposedLayout):
            return ("composed", self.enc(x.layout_a), self.enc(x.offset), self.enc(x.layout_b))
        if isinstance(x, Var):
            n, first = self._number("var", x)
            return ("var", n, x.name, x.kind, self.enc(x.lo), self.enc(x.hi)) if first else ("var", n)
        if isinstance(x, Const):
            return ("const", str(x.value))
        if isinstance(x, Expr):
            slots = [s for c in type(x).__mro__ for s in getattr(c, "__slots__", ()) if not s.startswith("_")]
            return (type(x).__name__,) + tuple(self.enc(getattr(x, s)) for s in slots)
        if isinstance(x, (GlobalParam, ScalarParam, Mbarrier)):
            n, first = self._number(type(x).__name__, x)
            if not first:
                return (type(x).__name__, n)
            return (type(x).__name__, n) + self._fields(x)
        if isinstance(x, Block):
            return ("block",) + tuple(self.enc(op) for op in x.ops)
        if isinstance(x, Op):
            return (type(x).__name__, self.loc(x.loc)) + self._fields(x, skip=("loc", "uid"))
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return (type(x).__name__,) + self._fields(x)
        if hasattr(type(x), "__slots__"):
            return (type(x).__name__,) + tuple(self.enc(getattr(x, s)) for s in type(x).__slots__
                                               if not s.startswith("_"))
        return (type(x).__name__, repr(x))

    def _fields(self, x: Any, skip: tuple[str, ...] = ()) -> tuple[Any, ...]:
        out = []
        for f in dataclasses.fields(x):
            if f.name in skip:
                continue
            v = getattr(x, f.name)
            out.append((f.name, self.loc(v) if f.name == "loc" else self.enc(v)))
        return tuple(out)

    @staticmethod
    def loc(loc: Any) -> Any:
        if loc is None:
            return None
        return ("loc", loc.filename, str(loc.line), loc.text)


def structural_key(tk: TileKernel) -> tuple[Any, ...]:
    """A nested tuple that is equal for two kernels exactly when they are the same program
    (see the module docstring for what counts)."""
    e = _Encoder()
    return ("kernel", tk.name, e.loc(tk.loc),
            ("params",) + tuple(e.enc(p) for p in tk.params),
            ("consts", e.enc(dict(tk.consts))),
            ("launch", e.enc(tk.launch)),
            ("mbarriers",) + tuple(e.enc(b) for b in tk.mbarriers),
            e.enc(tk.body))


def structural_hash(tk: TileKernel) -> str:
    """sha256 (hex) of ``structural_key(tk)``'s text; stable across processes."""
    return hashlib.sha256(repr(structural_key(tk)).encode()).hexdigest()


def structurally_equal(a: TileKernel, b: TileKernel) -> bool:
    """Whether ``a`` and ``b`` are the same program (``structural_key(a) == structural_key(b)``)."""
    return structural_key(a) == structural_key(b)
