"""Where the 8-bit register elements of a straight-line stretch of code come from.

The lowered program is elementwise: a packed ``u4`` tile is loaded as bytes ``X`` and unpacked
by ``shr`` / ``bitand`` / ``cvt`` / ``bitcast`` (a register copy) into one byte per value.
The code generator follows these instructions while it prints them and records, for each
``u8`` register element ``A[i]``, a source ``(X, j, part)`` when its value is known to be

- ``"byte"``: ``X[j]`` (a copy of a loaded byte),
- ``"lo"``:   ``X[j] & 15``,
- ``"hi"``:   ``X[j] >> 4``,

``X`` a ``u8`` register array not written since; and for a byte made of two nibbles of other
bytes (``nibble_pair_<sa><sb>``: an ``hl.offline`` tile stored in an in-word nibble order, given
its logical bytes back, ``hexlayout.ir.lower.offline``), the pair of the nibbles' sources, so
that its ``& 15`` is the first and its ``>> 4`` the second. The printers read it to convert whole
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


class _Facts:
    """Facts keyed by register element ``(id(array), i)``, indexed by the array written and by
    the arrays their sources read (``sources(value)``), so that forgetting an array or a range
    of it visits only the facts that name it."""

    def __init__(self, sources: Any) -> None:
        self.sources = sources
        self.facts: dict[tuple[int, int], Any] = {}
        self.by_dst: dict[int, set[tuple[int, int]]] = {}
        self.by_src: dict[int, set[tuple[int, int]]] = {}

    def get(self, key: tuple[int, int]) -> Any:
        return self.facts.get(key)

    def set(self, key: tuple[int, int], value: Any) -> None:
        if key in self.facts:
            self.pop(key)
        self.facts[key] = value
        self.by_dst.setdefault(key[0], set()).add(key)
        for src in self.sources(value):
            self.by_src.setdefault(id(src[0]), set()).add(key)

    def pop(self, key: tuple[int, int]) -> None:
        value = self.facts.pop(key)
        self.by_dst[key[0]].discard(key)
        for src in self.sources(value):
            self.by_src[id(src[0])].discard(key)

    def clear(self) -> None:
        self.facts.clear()
        self.by_dst.clear()
        self.by_src.clear()

    def forget(self, a: int, keep: Any) -> None:
        """Drop the facts about elements of array ``a`` and those whose sources read ``a``,
        except where ``keep(key, value)``."""
        for key in [*self.by_dst.get(a, ()), *self.by_src.get(a, ())]:
            value = self.facts.get(key)
            if value is not None and not keep(key, value):
                self.pop(key)


class ByteSources:
    """The known sources of ``u8`` register elements at the current point of printing."""

    def __init__(self) -> None:
        self._known = _Facts(lambda v: (v,))
        self._pairs = _Facts(lambda v: (v[0], v[1]))   # a byte of two nibbles

    def source(self, array: RegArray, i: int) -> Source:
        """The source of ``array[i]``: a recorded one, else (for ``u8``) the element itself."""
        return self._known.facts.get((id(array), i), (array, i, "byte"))

    def forget_all(self) -> None:
        self._known.clear()
        self._pairs.clear()

    def _forget(self, arrays: list[RegArray]) -> None:
        """Forget the elements of ``arrays`` and what was derived from them (a pair: from its
        first nibble's array)."""
        ids = {id(a) for a in arrays}
        for a in ids:
            self._known.forget(a, lambda k, v: k[0] not in ids and id(v[0]) not in ids)
            self._pairs.forget(a, lambda k, v: k[0] not in ids and id(v[0][0]) not in ids)

    def _forget_range(self, array: RegArray, lo: int, hi: int) -> None:
        a = id(array)

        def hit(s: Source) -> bool:
            return id(s[0]) == a and lo <= s[1] < hi

        def mine(k: tuple[int, int]) -> bool:
            return k[0] == a and lo <= k[1] < hi

        self._known.forget(a, lambda k, v: not mine(k) and not hit(v))
        self._pairs.forget(a, lambda k, v: not mine(k) and not hit(v[0]) and not hit(v[1]))

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
        pairs = self._nibble_pairs(ins)
        if pairs:
            for i, p in enumerate(pairs):
                self._pairs.set((id(dst.array), d0 + i), p)
            return
        if new:
            for i, s in enumerate(new):
                if s is not None and not (s[0] is dst.array and d0 <= s[1] < d0 + dst.count):
                    self._known.set((id(dst.array), d0 + i), s)

    def _nibble_pairs(self, ins: Alu) -> list[tuple[Source, Source]] | None:
        """The nibble sources of each element ``ins`` writes when it is a ``nibble_pair_<sa><sb>``
        of two loaded bytes, or a copy of such bytes (``mov`` / ``cvt`` / ``bitcast``, ``>> 0``,
        ``& 0xff``); else None."""
        fn = ins.op
        if ins.dst.array.dtype.name != "u8" or not ins.srcs:
            return None
        src = ins.srcs[0]
        k = _int(ins.srcs[1]) if len(ins.srcs) == 2 else None
        name = str(fn)
        copy = (name in ("cvt", "mov", "bitcast") and len(ins.srcs) == 1) or (name == "shr" and k == 0) \
            or (name == "bitand" and k is not None and k & 0xFF == 0xFF)
        if copy:   # a copy of bytes of two nibbles each: the same pairs
            s0 = const_start(src) if isinstance(src, RegRef) and src.count == ins.dst.count else None
            if s0 is None or src.array.dtype.name != "u8":
                return None
            got = [self._pairs.get((id(src.array), s0 + i)) for i in range(ins.dst.count)]
            return got if all(got) else None
        if not str(fn).startswith("nibble_pair_") or len(ins.srcs) != 2:
            return None
        a, b = ins.srcs
        if not (isinstance(a, RegRef) and isinstance(b, RegRef)) or a.array is not b.array \
                or a.array is ins.dst.array or a.array.dtype.name != "u8":
            return None
        sa, sb = const_start(a), const_start(b)
        if sa is None or sb is None:
            return None
        part = {0: "lo", 4: "hi"}
        out = []
        for i in range(ins.dst.count):
            x, y = self.source(a.array, sa + i), self.source(b.array, sb + i)
            if x[2] != "byte" or y[2] != "byte":
                return None
            out.append(((x[0], x[1], part[fn.sa]), (y[0], y[1], part[fn.sb])))
        return out

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
        pairs = [self._pairs.get((id(src.array), s0 + i)) for i in range(dst.count)]
        if fn in ("cvt", "mov", "bitcast") and len(ins.srcs) == 1:
            if any(pairs):   # (a copy of a byte of two nibbles: not followed further)
                return None
            return list(srcs)
        k = _int(ins.srcs[1]) if len(ins.srcs) == 2 else None
        if k is None:
            return None
        if any(pairs):   # a byte of two nibbles: & 15 gives the first, >> 4 the second
            if fn == "bitand" and k & 0xFF == 15:
                return [p[0] if p else None for p in pairs]
            if fn == "shr" and k == 4:
                return [p[1] if p else None for p in pairs]
            return None
        if fn == "shr":
            return [s if k == 0 else (s[0], s[1], "hi") if k == 4 and s[2] == "byte" else None
                    for s in srcs]
        if fn == "bitand":
            return [s if k & 0xFF == 0xFF or (k & 15 == 15 and s[2] != "byte")
                    else (s[0], s[1], "lo") if k & 0xFF == 15 and s[2] == "byte" else None
                    for s in srcs]
        return None
