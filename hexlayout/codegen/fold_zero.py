"""A compile-time zero point folded into the magic-number conversion.

The dequantization ``(q - z) * s`` with a constant ``z`` (GPTQ's ``2^(bits-1)``) lowers to a
magic conversion ``A = i2f16_magic(q)`` (``hexlayout.ir.functions.convert``: the bits ``M +
q`` as a float, minus the float ``b`` of the bits ``M``), then ``B = A - Z`` with ``Z`` a
register tile filled with the constant ``c``. Both subtractions are exact (``q`` and ``q -
c`` are integers the type holds), so ``B = float(M + q) - (b + c)``: one subtraction of the
folded constant ``b + c`` instead of two, bit for bit the same values.

``plan_folds`` finds the pattern in a straight-line body: a magic ``Alu`` whose destination
``A`` is read by nothing in the kernel but the ``sub`` instructions that follow it at once,
each ``B[d + i] = A[a + i] - Z[..]`` with every ``Z`` element a known constant (a ``mov`` of a
number earlier in the body, or a number), ``B`` one array at one offset from ``A``. The
printer then writes the conversion into ``B`` with the per-element constants and prints
nothing for the ``sub`` instructions (``hexlayout.codegen.alu``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hexlayout.ir.lowered import Alu, Instr, RegArray, RegRef, walk_instrs

from .byte_sources import arrays_in, const_start

__all__ = ["Fold", "MAGIC_LIMITS", "array_uses", "named_arrays", "plan_folds"]

#: magic conversion -> the constants ``c`` it may absorb: ``b + c`` exact, ``q - c`` exact
MAGIC_LIMITS = {"i2f16_magic": 256, "i2bf16_magic_narrow": 128, "i2bf16_magic": 256}


@dataclass(frozen=True)
class Fold:
    """Print the conversion into ``dst`` (``B``'s slice) minus ``zeros[i]`` for element ``i``;
    ``subs``: the ``sub`` instructions it replaces (printed as nothing)."""

    dst: RegRef
    zeros: tuple[float, ...]
    subs: tuple[Alu, ...]


def array_uses(body: list[Instr]) -> Counter[int]:
    """``id(array)`` -> how many instructions of ``body`` (nested bodies included) name it."""
    uses: Counter[int] = Counter()
    for ins in walk_instrs(body):
        for a in {id(x): x for x in named_arrays(ins)}.values():
            uses[id(a)] += 1
    return uses


def named_arrays(ins: Instr) -> list[RegArray]:
    """The register arrays ``ins`` names (its nested bodies excluded)."""
    out: list[RegArray] = []
    arrays_in([v for k, v in vars(ins).items() if k not in ("then_body", "else_body", "body")], out)
    return out


def _constant(consts: dict[tuple[int, int], float], s: object, i: int) -> float | None:
    if isinstance(s, bool):
        return None
    if isinstance(s, (int, float)):
        return float(s)
    if isinstance(s, RegRef):
        s0 = const_start(s)
        return None if s0 is None else consts.get((id(s.array), s0 + i))
    return None


def _track(consts: dict[tuple[int, int], float], ins: Instr) -> None:
    """Update the known constant register elements after ``ins`` (a loop or a branch: none)."""
    if hasattr(ins, "body") or hasattr(ins, "then_body"):
        consts.clear()
        return
    d0 = const_start(ins.dst) if isinstance(ins, Alu) and ins.pred is None else None
    if d0 is None:
        written = {id(a) for a in named_arrays(ins)}
        for k in [k for k in consts if k[0] in written]:
            del consts[k]
        return
    for i in range(ins.dst.count):
        consts.pop((id(ins.dst.array), d0 + i), None)
    src = ins.srcs[0] if len(ins.srcs) == 1 else None
    if str(ins.op) == "mov" and isinstance(src, (int, float)) and not isinstance(src, bool):
        for i in range(ins.dst.count):
            consts[(id(ins.dst.array), d0 + i)] = float(src)


def _fold_at(body: list[Instr], i: int, consts: dict[tuple[int, int], float],
             uses: Counter[int]) -> Fold | None:
    """The fold of the magic conversion ``body[i]``, or None."""
    cast = body[i]
    limit = MAGIC_LIMITS[str(cast.op)]
    a, a0, n = cast.dst.array, const_start(cast.dst), cast.dst.count
    if a0 is None or cast.pred is not None:
        return None
    src = cast.srcs[0]
    if str(cast.op) == "i2bf16_magic" and not (isinstance(src, RegRef) and src.array.dtype.name == "u8"):
        return None     # (bytes: v - z has at most 8 significant bits, exact in bf16)
    zeros: dict[int, float] = {}
    target: tuple[RegArray, int] | None = None
    subs: list[Alu] = []
    for ins in body[i + 1:]:
        if not (isinstance(ins, Alu) and str(ins.op) == "sub" and ins.pred is None
                and isinstance(ins.srcs[0], RegRef) and ins.srcs[0].array is a):
            break
        s0, d0 = const_start(ins.srcs[0]), const_start(ins.dst)
        b = ins.dst.array
        if s0 is None or d0 is None or b is a or b.dtype != a.dtype or \
                (target is not None and target != (b, d0 - s0)):
            return None
        if isinstance(ins.srcs[1], RegRef) and ins.srcs[1].array is b:
            return None
        target = (b, d0 - s0)
        for k in range(ins.dst.count):
            c = _constant(consts, ins.srcs[1], k)
            if c is None or c != int(c) or not 0 <= c < limit or (s0 + k) in zeros:
                return None
            zeros[s0 + k] = c
        subs.append(ins)
    if target is None or sorted(zeros) != list(range(a0, a0 + n)) or uses[id(a)] != 1 + len(subs):
        return None
    b, off = target
    return Fold(RegRef(b, a0 + off, n), tuple(zeros[a0 + k] for k in range(n)), tuple(subs))


def plan_folds(body: list[Instr], uses: Counter[int]) -> dict[int, Fold]:
    """``id(conversion)`` -> its ``Fold``, for the magic conversions of the straight-line
    ``body`` that a constant zero point can be folded into (see the module docstring);
    ``uses`` is ``array_uses`` of the whole kernel."""
    consts: dict[tuple[int, int], float] = {}
    folds: dict[int, Fold] = {}
    for i, ins in enumerate(body):
        if isinstance(ins, Alu) and str(ins.op) in MAGIC_LIMITS:
            f = _fold_at(body, i, consts, uses)
            if f is not None:
                folds[id(ins)] = f
        _track(consts, ins)
    return folds
