"""How ``hl.cast`` converts: the cheapest ALU function that is exact for the operand's values.

A ``Cast`` of an integer tile to f16 or bf16 lowers to a magic-number conversion
(``hexlayout.ir.functions.convert``: an integer add and one floating subtraction instead of
an ``I2F``) when every value the operand can hold lies in that function's exact range;
every other ``Cast`` lowers to ``cvt``, but an ``e2m1`` one (FP4 codes held in bytes), which
lowers to its bit trick (``FROM_E2M1``). ``CONVERSIONS`` lists the candidates, best first.

The operand's values are bounded by ``value_range``, an interval analysis over the tile
program: a tile has the range of its element type (``u8``: ``[0, 255]``, ``s4``: ``[-8,
7]``, ...) unless one ``Elementwise`` op alone writes it, in which case that op's function
bounds it from its operands' ranges (integer constants are their own range):

- ``a & b`` with an operand known ``>= 0``: ``[0, min of the non-negative operands' highs]``;
- ``a >> k`` (constant ``0 <= k < 64``): ``[lo >> k, hi >> k]``;
- ``a + b``, ``a - b``, ``max``, ``min``: interval arithmetic;
- a ``Reshape``, a ``Join`` (the union of its sources' ranges), a ``Permute`` or an
  integer -> integer ``Cast``: its source's values; a view holds its tile's values;

and a result outside its type's range (it might wrap) falls back to the type's range.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexlayout.arch.dtypes import DType

from ..functions import ALU_FUNCTIONS, AluFunction, alu_function
from ..functions.convert import EXACT_RANGE, FROM_E2M1
from ..regroup import Join, Reshape
from ..tile import Cast, Elementwise, Op, Permute, Slice, SubTile, TileKernel, Value
from ..walk import walk

__all__ = ["CONVERSIONS", "conversion", "type_range", "value_range", "writers"]

#: destination type -> the magic conversions to it, best first (``cvt`` is the fallback)
CONVERSIONS: dict[str, tuple[str, ...]] = {"f16": ("i2f16_magic",),
                                            "bf16": ("i2bf16_magic_narrow", "i2bf16_magic")}

_SUB_BYTE = {"u4": (0, 15), "s4": (-8, 7)}


def type_range(dt: DType) -> tuple[int, int] | None:
    """``[lo, hi]`` of the integer type ``dt`` (None for other types)."""
    if dt.name in _SUB_BYTE:
        return _SUB_BYTE[dt.name]
    if dt.kind not in ("int", "uint"):
        return None
    info = np.iinfo(dt.numpy())
    return int(info.min), int(info.max)


def writers(tk: TileKernel) -> dict[int, list[Op]]:
    """Root value id -> the ops that write it or a view of it (``outputs()``)."""
    out: dict[int, list[Op]] = {}
    for op in walk(tk):
        for v in op.outputs():
            out.setdefault(v.root.id, []).append(op)
    return out


def _arg_range(a: Any, ws: dict[int, list[Op]], depth: int) -> tuple[int, int] | None:
    if isinstance(a, Value):
        return value_range(a, ws, depth)
    if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
        return int(a), int(a)
    return None


def _function_range(fn: AluFunction, args: tuple[Any, ...], ws: dict[int, list[Op]],
                    depth: int) -> tuple[int, int] | None:
    rs = [_arg_range(a, ws, depth) for a in args]
    if fn == "bitand":
        highs = [r[1] for r in rs if r is not None and r[0] >= 0]
        return (0, min(highs)) if highs else None
    if any(r is None for r in rs):
        return None
    if fn == "shr" and 0 <= rs[1][0] and rs[1][0] == rs[1][1] < 64:
        k = rs[1][0]
        return rs[0][0] >> k, rs[0][1] >> k
    if fn == "add":
        return rs[0][0] + rs[1][0], rs[0][1] + rs[1][1]
    if fn == "sub":
        return rs[0][0] - rs[1][1], rs[0][1] - rs[1][0]
    if fn in ("max", "min"):
        pick = max if fn == "max" else min
        return pick(rs[0][0], rs[1][0]), pick(rs[0][1], rs[1][1])
    return None


def _moved_range(op: Op, ws: dict[int, list[Op]], depth: int) -> tuple[int, int] | None:
    """The range of what a regrouping op (``Reshape``, ``Join``, a ``Permute`` copy) or an
    integer -> integer ``Cast`` writes: its sources' values, moved (a cast's are checked
    against the destination type by the caller: one that may wrap falls back)."""
    int_cast = isinstance(op, Cast) and type_range(op.src.type.dtype) is not None
    if isinstance(op, (Reshape, Permute)) or int_cast:
        return value_range(op.src, ws, depth)
    if isinstance(op, Join):
        rs = [value_range(s, ws, depth) for s in op.srcs]
        if any(r is None for r in rs):
            return None
        return min(r[0] for r in rs), max(r[1] for r in rs)
    return None


def value_range(v: Value, ws: dict[int, list[Op]], depth: int = 0) -> tuple[int, int] | None:
    """``[lo, hi]`` bounding every value the integer tile ``v`` can hold (see the module
    docstring); ``None`` for non-integer tiles. ``ws`` is ``writers(kernel)``. A view
    (slice, permutation) holds values of the tile it views."""
    own = type_range(v.type.dtype)
    if own is None or depth > 32:
        return own
    root = v.root
    ops = [op for op in ws.get(root.id, []) if not _defines_view(op)]
    if len(ops) != 1 or ops[0].outputs() != [root]:
        return own
    op = ops[0]
    if isinstance(op, Elementwise):
        r = _function_range(op.fn, op.args, ws, depth + 1)
    else:
        r = _moved_range(op, ws, depth + 1)
    if r is None or r[0] < own[0] or r[1] > own[1]:
        return own                                   # unknown, or it may wrap
    return r


def _defines_view(op: Op) -> bool:
    """``op`` only names a view of its source's elements (writes none)."""
    return isinstance(op, (Slice, SubTile, Permute)) and op.result.base is not None


def conversion(tk: TileKernel, op: Cast) -> AluFunction:
    """The ALU function ``op`` (a ``Cast`` of ``tk``) lowers to: the first of
    ``CONVERSIONS[destination]`` whose exact range holds the operand's ``value_range``,
    else ``cvt``; an ``e2m1`` operand (codes) its bit trick ``FROM_E2M1[destination]``."""
    dst = op.result.type.dtype
    if op.src.type.dtype.name == "e2m1":
        return alu_function(FROM_E2M1[dst.name])     # hl.cast admits f16 / bf16 only
    cands = CONVERSIONS.get(dst.name, ())
    if cands and type_range(op.src.type.dtype) is not None:
        r = value_range(op.src, writers(tk))    # (not cached: passes may rewrite tk in place)
        for name in cands:
            lo, hi = EXACT_RANGE[name]
            if r is not None and lo <= r[0] and r[1] < hi and name in ALU_FUNCTIONS:
                return alu_function(name)
    return alu_function("cvt")
