"""A ``cuobjdump -sass`` listing parsed: its instructions and their control flow (branch
targets, loop spans, the main loop), what ``hexlayout.runtime.stats`` and
``hexlayout.runtime.tmem_epilogue`` count on."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Instruction", "Loop", "MMA_OPCODES", "parse_sass", "branch_target", "unconditional", "loops",
           "find_main_loop", "successors", "HEX"]

#: Opcodes (before the first ``.``) of tensor-core instructions: warp MMA (sm_80), warp-group MMA
#: (sm_90a) and the single-thread tcgen05 MMA of sm_100a (``UTCHMMA`` f16/bf16, ``UTCQMMA`` f8f6f4,
#: ``UTCIMMA`` i8, ``UTCOMMA`` f4 block-scaled), whose operands are descriptors and TMEM.
MMA_OPCODES = frozenset({"HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA", "QMMA", "DMMA", "BMMA", "BGMMA", "OMMA",
                         "UTCHMMA", "UTCQMMA", "UTCIMMA", "UTCOMMA", "UTCMMA"})

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(?P<name>\S+)")
_TARGET = re.compile(r"^\s*(?:code for|\.target)\s+(?P<arch>sm_\w+)")
_LINE = re.compile(r"^\s*/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<pred>@!?U?P(?:T|\d)\s+)?"
                   r"(?P<op>[A-Z][A-Za-z0-9_.]*)(?P<args>[^;]*);")
HEX = re.compile(r"0x[0-9a-f]+")


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: byte address, guard predicate (``""``, ``"@P0"``, ``"@!PT"``...),
    full opcode with modifiers and the operand text."""

    addr: int
    pred: str
    op: str
    args: str

    @property
    def base(self) -> str:
        return self.op.split(".", 1)[0]

    @property
    def never(self) -> bool:
        """Guarded by ``@!PT``: never executed."""
        return self.pred in ("@!PT", "@!UPT")

    @property
    def operands(self) -> list[str]:
        return [a.strip() for a in self.args.split(",")] if self.args.strip() else []

    @property
    def is_mma(self) -> bool:
        return self.base in MMA_OPCODES


def parse_sass(sass: str) -> dict[str, tuple[str, list[Instruction]]]:
    """``{function name: (arch, instructions)}`` of a ``cuobjdump -sass`` listing, in order."""
    out: dict[str, tuple[str, list[Instruction]]] = {}
    arch, current = "", None
    for line in sass.splitlines():
        if (m := _TARGET.match(line)):
            arch = m.group("arch")
            continue
        if (m := _FUNCTION.match(line)):
            current = m.group("name")
            out[current] = (arch, [])
            continue
        if current is None:
            continue
        if (m := _LINE.match(line)):
            out[current][1].append(Instruction(int(m.group("addr"), 16), (m.group("pred") or "").strip(),
                                               m.group("op"), m.group("args").strip()))
    return out


# --- control flow -------------------------------------------------------------------------------

def branch_target(ins: Instruction) -> int | None:
    if ins.base not in ("BRA", "JMP") or ins.never:
        return None
    hexes = HEX.findall(ins.args)
    return int(hexes[-1], 16) if hexes else None


def unconditional(ins: Instruction) -> bool:
    """No guard and no predicate operand (``BRA.U !UP0, 0x...`` is conditional)."""
    return ins.pred in ("", "@PT", "@UPT") and len(ins.operands) <= 1


def successors(code: list[Instruction]) -> list[list[int]]:
    """Successor instruction indices of each instruction."""
    index = {ins.addr: i for i, ins in enumerate(code)}
    succ: list[list[int]] = []
    for i, ins in enumerate(code):
        nxt = [i + 1] if i + 1 < len(code) else []
        t = branch_target(ins)
        if t is not None:
            tgt = [index[t]] if t in index else []
            succ.append(tgt if unconditional(ins) else nxt + [x for x in tgt if x not in nxt])
        elif ins.base in ("EXIT", "RET", "BPT", "KILL") and not ins.never and ins.pred in ("", "@PT"):
            succ.append([])
        else:
            succ.append(nxt)
    return succ


@dataclass(frozen=True)
class Loop:
    """A backward-branch span: instructions ``code[first..last]`` (inclusive); ``mma`` counts
    the MMA of its cycle (the instructions on a path from the target back to the branch)."""

    first: int
    last: int
    start: int          # address of the branch target
    end: int            # address of the backward branch
    mma: int


def _cycle(succ: list[list[int]], first: int, last: int) -> set[int]:
    """Instructions of ``[first, last]`` on a path from ``first`` to ``last`` inside the span
    (empty when ``last`` cannot be reached from ``first`` without leaving it)."""
    fwd = {first}
    todo = [first]
    while todo:
        v = todo.pop()
        for w in succ[v]:
            if first <= w <= last and w not in fwd:
                fwd.add(w)
                todo.append(w)
    if last not in fwd:
        return set()
    preds: dict[int, list[int]] = {}
    for v in fwd:
        for w in succ[v]:
            if w in fwd:
                preds.setdefault(w, []).append(v)
    back = {last}
    todo = [last]
    while todo:
        v = todo.pop()
        for u in preds.get(v, ()):
            if u not in back:
                back.add(u)
                todo.append(u)
    return fwd & back


def loops(code: list[Instruction]) -> list[Loop]:
    """Every loop span, one per branch target: a backward branch whose span holds a cycle
    from the target back to it. A jump back from an out-of-line block (the retry path of an
    mbarrier wait placed after the loop) closes no cycle inside its span, or one without the
    loop's MMA, and is no main-loop candidate."""
    succ = successors(code)
    index = {ins.addr: i for i, ins in enumerate(code)}
    spans: dict[int, tuple[int, set[int]]] = {}
    for i, ins in enumerate(code):
        t = branch_target(ins)
        if t is None or t > ins.addr or t not in index:
            continue
        j = index[t]
        cyc = _cycle(succ, j, i)
        if cyc and (j not in spans or i > spans[j][0]):
            spans[j] = (i, cyc)
    return [Loop(j, i, code[j].addr, code[i].addr, sum(code[v].is_mma for v in cyc))
            for j, (i, cyc) in sorted(spans.items())]


def find_main_loop(code: list[Instruction], spans: list[Loop] | None = None) -> Loop | None:
    """Among the innermost loop spans holding MMA (no other such span inside them), the one
    whose cycle holds the most MMA; the shortest among equals; ``None`` when no loop holds
    an MMA. (An outer loop around two warp groups' k-loops is not the main loop; nor is a
    span closed by ``BRA.U.ANY``: ptxas's loop issuing a uniform-datapath instruction such as
    ``UTCHMMA`` once per active lane, ``ELECT`` ... ``BRA.U.ANY``, which no source loop is.)"""
    spans = loops(code) if spans is None else spans         # ``spans``: ``loops(code)``, if known
    cands = [lp for lp in spans if lp.mma and not code[lp.last].op.startswith("BRA.U.ANY")]
    inner = [lp for lp in cands
             if not any(o is not lp and lp.first <= o.first and o.last <= lp.last for o in cands)]
    if not inner:
        return None
    return max(inner, key=lambda lp: (lp.mma, -(lp.last - lp.first)))
