"""Where the 8-bit register elements of a straight-line stretch of code come from.

The lowered program is elementwise: a packed ``u4`` tile is loaded as bytes ``X`` and unpacked
by ``shr`` / ``bitand`` / ``cvt`` / ``bitcast`` (a register copy) into one byte per value.
The code generator follows these instructions while it prints them and records, for each
``u8`` register element ``A[i]``, a source ``(X, j, part)`` when its value is known to be

- ``"byte"``: ``X[j]`` (a copy of a loaded byte),
- ``"lo"``:   ``X[j] & 15``,
- ``"hi"``:   ``X[j] >> 4``,

``X`` a ``u8`` register array not written since. The printers read it to convert whole
32-bit words of ``X`` at once (``hexlayout.codegen.alu``: the magic conversions to f16 /
bf16 pairs). Any instruction that may write an array forgets what was known about it and
what was derived from it; a loop or a branch forgets everything (its body runs again, or
not at all). A source is only a fact about values: the printed code computes the same
elements either way.
"""

from __future__ import annotations

from typing import Any

from hexlayout.ir.expr import as_expr, free_vars, to_c
from hexlayout.ir.lowered import Alu, Instr, RegArray, RegRef

__all__ = ["ByteSources", "arrays_in", "const_start"]

Source = tuple[RegArray, int, str]


def const_start(ref: RegRef) -> int | None:
    """The slice's first element when it is a constant, else None."""
    start = as_expr(ref.start)
    if free_vars(start):
        return None
    return int(to_c(start).strip("()"))


def arrays_in(obj: Any, out: list[RegArray], depth: int = 0) -> None:
    if isinstance(obj, RegRef):
        out.append(obj.array)
    elif isinstance(obj, RegArray):
        out.append(obj)
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for o in obj:
            arrays_in(o, out, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for o in obj.values():
            arrays_in(o, out, depth + 1)


def _int(s: Any) -> int | None:
    if isinstance(s, (RegRef, float)) or not hasattr(s, "__int__"):
        return None
    try:
        return int(s)
    except (TypeError, ValueError):
        return None


class ByteSources:
    """The known sources of ``u8`` register elements at the current point of printing."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, int], Source] = {}

    def source(self, array: RegArray, i: int) -> Source:
        """The source of ``array[i]``: a recorded one, else (for ``u8``) the element itself."""
        return self._known.get((id(array), i), (array, i, "byte"))

    def forget_all(self) -> None:
        self._known.clear()

    def _forget(self, arrays: list[RegArray]) -> None:
        ids = {id(a) for a in arrays}
        self._known = {k: v for k, v in self._known.items() if k[0] not in ids and id(v[0]) not in ids}

    def _forget_range(self, array: RegArray, lo: int, hi: int) -> None:
        a = id(array)
        self._known = {k: v for k, v in self._known.items()
                       if not (k[0] == a and lo <= k[1] < hi) and not (id(v[0]) == a and lo <= v[1] < hi)}

    def observe(self, ins: Instr) -> None:
        """Update the sources after ``ins`` (printed at the current point)."""
        if not isinstance(ins, Alu) or ins.pred is not None:
            written: list[RegArray] = []
            arrays_in(list(vars(ins).values()), written)
            self._forget(written)
            return
        dst = ins.dst
        new = self._derive(ins)
        d0 = const_start(dst)
        if d0 is None:
            self._forget([dst.array])
            return
        self._forget_range(dst.array, d0, d0 + dst.count)
        if new:
            for i, s in enumerate(new):
                if s is not None and not (s[0] is dst.array and d0 <= s[1] < d0 + dst.count):
                    self._known[(id(dst.array), d0 + i)] = s

    def _derive(self, ins: Alu) -> list[Source | None] | None:
        dst, fn = ins.dst, ins.op.name
        if dst.array.dtype.name != "u8" or const_start(dst) is None or not ins.srcs:
            return None
        src = ins.srcs[0]
        if not isinstance(src, RegRef) or src.array.dtype.name != "u8" or src.count != dst.count:
            return None
        s0 = const_start(src)
        if s0 is None:
            return None
        srcs = [self.source(src.array, s0 + i) for i in range(dst.count)]
        if fn in ("cvt", "mov", "bitcast") and len(ins.srcs) == 1:
            return list(srcs)
        k = _int(ins.srcs[1]) if len(ins.srcs) == 2 else None
        if k is None:
            return None
        if fn == "shr":
            return [s if k == 0 else (s[0], s[1], "hi") if k == 4 and s[2] == "byte" else None
                    for s in srcs]
        if fn == "bitand":
            return [s if k & 0xFF == 0xFF or (k & 15 == 15 and s[2] != "byte")
                    else (s[0], s[1], "lo") if k & 0xFF == 15 and s[2] == "byte" else None
                    for s in srcs]
        return None
