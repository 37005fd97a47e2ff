"""Divisibility facts of a launch, and a tile program specialized on them.

Triton specializes a kernel on the 16-divisibility of its pointer and integer arguments;
hexlayout does the same with powers of two up to 16. A launch has, per tensor argument, the
largest power of two ``2^a <= 16`` dividing its data pointer (bytes), and per symbolic size or
stride ``v`` the largest ``2^b <= 16`` dividing ``v`` (elements): ``DivisibilityFacts``. A
program traced without facts assumes the most of them (16-byte pointers, sizes multiples of
16), which the launcher checks (``Requirement``).

``specialize(tk, facts)`` gives the program whose vector accesses need no more than the
facts: for each global tensor ``x`` with element size ``e`` bytes,

    align(x) = min(declared(x), ptr(x), e * div(stride_k) for each symbolic stride,
                   e * div(extent_u) for the symbolic extent of the unit-stride mode)

(``align_bytes``: vectors of at most ``align(x)`` bytes; a row at ``r * stride`` and a vector
wholly in or out of bounds need those), and ``divisibility``: the facts of the sizes that
move a view origin of ``x`` (``origin = (t, I + i)``: a vector at column ``I`` needs
``c * div(I)`` to be a multiple of its width), which the lowering reads in
``origin_alignment``. ``div`` of an expression: ``div(c) = 2^v2(c)``,
``div(a * b) = div(a) * div(b)``, ``div(a + b) = div(a - b) = min(div(a), div(b))``, capped at
16; any other operation counts 1. When the facts assume nothing weaker than the program
already does, ``specialize`` returns ``tk`` itself (so an aligned launch keeps its build);
otherwise a copy of it (``copy.deepcopy``: op uids, value ids and source lines kept), whose
structural key - and so whose build-cache key - includes the facts.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .expr import BinOp, Const, Expr, ExprLike, Var, free_vars
from .tile import GlobalParam, GlobalView, TileKernel
from .walk import walk

__all__ = ["CAP", "DivisibilityFacts", "pow2_divisor", "expr_divisibility", "specialization", "specialize"]

#: The largest divisibility recorded: 16 bytes for pointers, 16 elements for sizes (a 16-byte
#: vector holds at most 16 elements of 8 bits).
CAP = 16


def pow2_divisor(n: int, cap: int = CAP) -> int:
    """The largest power of two ``<= cap`` dividing ``n`` (``cap`` for 0)."""
    n = abs(int(n))
    if n == 0:
        return cap
    return min(cap, n & -n)


@dataclass(frozen=True)
class DivisibilityFacts:
    """What a launch guarantees: ``pointers`` (tensor name, bytes its data pointer is a
    multiple of) and ``sizes`` (size or stride variable name, elements it is a multiple of),
    powers of two up to ``CAP``. A name not listed is assumed ``CAP``-divisible."""

    pointers: tuple[tuple[str, int], ...] = ()
    sizes: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def of(pointers: Mapping[str, int], sizes: Mapping[str, int]) -> DivisibilityFacts:
        """Facts from raw values: data pointers (bytes) and sizes (elements)."""
        return DivisibilityFacts(tuple(sorted((k, pow2_divisor(v)) for k, v in pointers.items())),
                                 tuple(sorted((k, pow2_divisor(v)) for k, v in sizes.items())))

    def pointer(self, name: str) -> int:
        return dict(self.pointers).get(name, CAP)

    def size_map(self) -> dict[str, int]:
        return dict(self.sizes)

    def __str__(self) -> str:
        ptr = ", ".join(f"{k}: {v} B" for k, v in self.pointers)
        sz = ", ".join(f"{k}: {v}" for k, v in self.sizes)
        return f"pointers ({ptr}), sizes ({sz})"


def expr_divisibility(e: ExprLike, sizes: Mapping[str, int], cap: int = CAP) -> int:
    """The power of two (``<= cap``) that ``e`` is known to be a multiple of, given the
    divisibility of its variables by name (a variable not in ``sizes`` counts 1)."""
    if isinstance(e, bool):
        return 1
    if isinstance(e, int):
        return pow2_divisor(e, cap)
    if isinstance(e, Const):
        return pow2_divisor(int(e.value), cap)
    if isinstance(e, Var):
        return min(cap, sizes.get(e.name, 1))
    if isinstance(e, BinOp):
        if e.op in ("+", "-"):
            return min(expr_divisibility(e.a, sizes, cap), expr_divisibility(e.b, sizes, cap))
        if e.op == "*":
            return min(cap, expr_divisibility(e.a, sizes, cap) * expr_divisibility(e.b, sizes, cap))
    return 1


def _symbolic(e: ExprLike) -> bool:
    return isinstance(e, Expr) and not isinstance(e, Const)


def _unit(e: ExprLike) -> bool:
    return (isinstance(e, int) and e == 1) or (isinstance(e, Const) and e.value == 1)


def _origin_sizes(tk: TileKernel) -> dict[int, set[str]]:
    """Per tensor parameter (by id): the names of its own size variables in its views' origins."""
    out: dict[int, set[str]] = {}
    for op in walk(tk):
        if not isinstance(op, GlobalView) or op.gather is not None:
            continue
        p = op.param
        own: set[Var] = set()
        for e in (*p.shape, *p.stride):
            own |= free_vars(e) if isinstance(e, Expr) else set()
        used: set[Var] = set()
        for o in op.origin:
            used |= free_vars(o) if isinstance(o, Expr) else set()
        out.setdefault(id(p), set()).update(v.name for v in used & own)
    return out


Specialization = tuple[tuple[str, int, tuple[tuple[str, int], ...]], ...]


def specialization(tk: TileKernel, facts: DivisibilityFacts) -> Specialization:
    """What ``facts`` change in ``tk``: ``(tensor, align_bytes, divisibility)`` for each tensor
    whose alignment or origin sizes they weaken (empty: nothing). Cheap; a key for the
    specialized build."""
    sizes = facts.size_map()
    origins = _origin_sizes(tk)
    out = []
    for p in tk.params:
        if not isinstance(p, GlobalParam) or p.dtype.bits % 8:
            continue
        eb = p.dtype.bits // 8
        align = min(p.align_bytes, facts.pointer(p.name))
        for n, s in zip(p.shape, p.stride):
            if _symbolic(s):
                align = min(align, eb * expr_divisibility(s, sizes))
            if _unit(s) and _symbolic(n):
                align = min(align, eb * expr_divisibility(n, sizes))
        align = max(align, 1)
        weak = dict(p.divisibility)
        for name in origins.get(id(p), ()):
            d = min(sizes.get(name, 1), weak.get(name, CAP))
            if d < CAP:
                weak[name] = d
        divis = tuple(sorted(weak.items()))
        if align < p.align_bytes or divis != tuple(p.divisibility):
            out.append((p.name, align, divis))
    return tuple(out)


def specialize(tk: TileKernel, facts: DivisibilityFacts | Specialization) -> TileKernel:
    """``tk`` specialized on ``facts`` (see the module docstring): ``tk`` itself when they
    change nothing, else a copy whose tensors carry the weaker alignment and origin facts."""
    spec = specialization(tk, facts) if isinstance(facts, DivisibilityFacts) else facts
    if not spec:
        return tk
    out = copy.deepcopy(tk)
    by_name: dict[str, Any] = {p.name: p for p in out.params if isinstance(p, GlobalParam)}
    for name, align, divis in spec:
        p = by_name[name]
        p.align_bytes = align
        p.divisibility = divis
    return out
