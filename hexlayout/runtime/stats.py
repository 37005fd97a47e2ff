"""Static code quality of a compiled kernel, read from its cubin's SASS and ptxas' report.

``kernel_stats(cubin, ...)`` returns a :class:`KernelStats`: registers (and the highest
register each ``setmaxnreg`` region uses), spills, shared memory, the main loop's size and
instruction mix, MMA per iteration, non-MMA instructions per k-tile, the epilogue's store
widths, TMA / ldmatrix / stmatrix / cp.async use, ptxas' warnings and, for a ``tcgen05``
kernel, its epilogue (``tmem_epilogue``: instructions per accumulator value). No GPU is needed.

Definitions (per warp instruction stream, i.e. counted in the SASS of the function):

- **main loop**: the innermost backward-branch span ``[target, branch]`` (addresses) that
  holds the most MMA instructions (HMMA, HGMMA, IMMA, ...). A span is a loop when the
  control flow goes from the target back to the branch without leaving the span; its MMA
  are counted on that cycle, so the jump back from an out-of-line block (the retry path of
  an mbarrier wait placed after the loop) is no candidate. Among the innermost spans that
  hold MMA (no MMA-holding span nested in them) the one with the most MMA wins, the
  shortest among equals; the span's instructions are then counted. ptxas's per-lane issue
  loops of a single-thread instruction (``ELECT`` ... ``BRA.U.ANY`` around a ``UTCHMMA``)
  are not source loops and are no candidates.
- **padding**: instructions predicated ``@!PT`` (never executed; ptxas' alignment fill).
- **non-MMA** = instructions in the loop − MMA − padding.
- **k-tiles per iteration** = MMA in the SASS loop ÷ ``mma_per_ktile``, the MMA
  instructions one iteration of the *source* k-loop issues per warp. For a hexlayout kernel
  it is counted in the lowered program (:func:`mma_per_source_iteration`): more than 1 when
  ptxas unrolled the loop. For a block tile ``BM x BN x BK`` it is
  ``BM·BN·BK / (m·n·k · issuers)`` (:func:`mma_per_ktile_for_tile`) with ``m x n x k`` the
  instruction's shape and ``issuers`` the warps (mma.sync) or warp groups (wgmma) that
  split the tile.
  Given only the block tile's ``BK`` it is read from the loop's SASS
  (:func:`mma_per_ktile_from_bk`): accumulation chains × ``BK / k``.
- **non-MMA per k-tile** = non-MMA ÷ k-tiles per iteration; **non-MMA per MMA** = non-MMA
  ÷ MMA in the loop (the attention metric: it needs no tile).
- **overlapped** (warp-group MMA loops): the non-MMA instructions of the loop (the waits
  aside) issued while a wgmma group is in flight, i.e. after an ``HGMMA`` / ``IGMMA`` /
  ``QGMMA`` and before the ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` that waits for every group (a
  ``DEPBAR`` with a depth above 0 leaves the latest groups in flight), following the loop
  around its back edge: the work the tensor cores run beside. 0 when each group is waited
  for at once.
- **highest register**: the largest ``R`` index any instruction touches, counting every
  register of a wide operand (a 128-bit load's 4, an HMMA accumulator's 4, an HGMMA
  64xN f32 accumulator's N/2, a ``.64`` pair's 2, an ``LDTM`` / ``STTM``'s
  ``tmem_load_values``). Per ``setmaxnreg`` region: over the instructions reachable from
  each ``USETMAXREG`` up to the next one.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from hexlayout.errors import HexlayoutError

from .resources import ResourceUsage, parse_ptxas, parse_res_usage
from .sass_listing import (
    HEX,
    MMA_OPCODES,
    Instruction,
    Loop,
    find_main_loop,
    loops,
    parse_sass,
    successors,
)
from .tmem_epilogue import Epilogue, tmem_epilogue, tmem_load_values

__all__ = ["StatsError", "build_stats", "Instruction", "Loop", "MainLoop", "KernelStats", "parse_sass",
           "loops", "find_main_loop", "kernel_stats", "register_extents", "highest_register",
           "setmaxnreg_regions", "ptxas_warnings", "mma_per_source_iteration", "mma_per_ktile_for_tile",
           "mma_per_ktile_from_bk", "wgmma_overlap",
           "MMA_OPCODES", "SERIALIZATION_CODES"]

#: ptxas codes of the "wgmma pipeline serialized" performance messages.
SERIALIZATION_CODES = ("C7515", "C7510", "C7508", "C7509", "C7511", "C7512", "C7513", "C7514", "C7516")

_REG = re.compile(r"(?<![A-Za-z_])R(?P<idx>\d+)(?P<wide>\.64)?(?![0-9A-Za-z_])")
_SHAPE = re.compile(r"^(?P<m>\d+)x(?P<n>\d+)x(?P<k>\d+)$")
_TYPE_BITS = {"F64": 64, "F32": 32, "S32": 32, "TF32": 32, "F16": 16, "BF16": 16, "S8": 8, "U8": 8,
              "E4M3": 8, "E5M2": 8, "S4": 4, "U4": 4}
_LOADS = frozenset({"LDG", "LDS", "LD", "LDL", "LDC", "LDSM"})
_STORES = frozenset({"STG", "STS", "ST", "STL", "STSM"})
_DOUBLE = frozenset({"DADD", "DMUL", "DFMA", "DMNMX", "DSETP"})
_CATEGORIES = (
    ("mma", MMA_OPCODES),
    ("shared", {"LDS", "STS", "LDSM", "STSM", "ATOMS"}),
    ("global", {"LDG", "STG", "LD", "ST", "LDGSTS", "LDGDEPBAR", "RED", "ATOMG", "ATOM", "UTMALDG",
                "UTMASTG", "UTMAPF", "UBLKCP", "UTMACMDFLUSH", "UTMAREDG"}),
    ("local", {"LDL", "STL"}),
    ("sync", {"BAR", "DEPBAR", "SYNCS", "WARPGROUP", "WARPSYNC", "MEMBAR", "FENCE", "ARRIVES", "ERRBAR",
              "CCTL", "BSSY", "BSYNC", "NANOSLEEP"}),
    ("control", {"BRA", "JMP", "EXIT", "RET", "CALL", "BREAK", "BRX", "JMX", "NOP"}),
    ("float", {"FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "MUFU", "HADD2", "HMUL2", "HFMA2",
               "HMNMX2", "F2F", "F2FP", "F2I", "I2F", "FCHK", "FRND", "FSWZADD"}),
    ("uniform", {"UMOV", "UIADD3", "ULEA", "USHF", "ULOP3", "UISETP", "UIMAD", "ULDC", "USEL", "R2UR",
                 "S2UR", "UPRMT", "USETMAXREG", "UFLO", "UPOPC", "VOTEU", "UBMSK", "UIABS", "ULEPC",
                 "USGXT", "UBREV", "UCLEA", "PLOP3"}),
)


class StatsError(HexlayoutError, ValueError):
    """A kernel cannot be analyzed: no cubin, or the SASS does not hold the named kernel."""


# --- registers ----------------------------------------------------------------------------------

def _vector_regs(mods: list[str]) -> int:
    if "128" in mods:
        return 4
    if "64" in mods:
        return 2
    return 1


def _matrix_regs(mods: list[str]) -> int:
    """Registers per thread of an ldmatrix / stmatrix (``.M88.4`` -> 4, ``.M88.2`` -> 2)."""
    return 4 if "4" in mods else 2 if "2" in mods else 1


def _mma_widths(op: str) -> tuple[int, int, int] | None:
    """(D/C, A, B) registers per thread of an HMMA/IMMA-style warp MMA, or (D/C, A, 0) of an HGMMA."""
    parts = op.split(".")
    base, mods = parts[0], parts[1:]
    types = [_TYPE_BITS[t] for t in mods if t in _TYPE_BITS]
    if base in ("HGMMA", "IGMMA", "QGMMA", "BGMMA") and mods and (s := _SHAPE.match(mods[0])):
        m, n, k = (int(s.group(x)) for x in "mnk")
        acc = types[0] if types else 32
        inp = types[1] if len(types) > 1 else 16 if base == "HGMMA" else 8
        return m * n * acc // (128 * 32), m * k * inp // (128 * 32), 0
    shape = _mma_shape(op)
    if shape is None:
        return None
    m, n, k = shape
    if base == "IMMA":
        acc, inp = 32, types[0] if types else 8
    else:   # HMMA.16816.F32.BF16: f32 accumulator, bf16 inputs; HMMA.16816.F32: f16 inputs
        acc = types[0] if types else 16
        inp = types[1] if len(types) > 1 else 16
    return (max(1, m * n * acc // 1024), max(1, m * k * inp // 1024), max(1, n * k * inp // 1024))


def register_extents(ins: Instruction) -> list[tuple[int, int]]:
    """``(first register, count)`` of every general register the instruction touches."""
    parts = ins.op.split(".")
    base, mods = parts[0], parts[1:]
    ops = ins.operands
    mma = _mma_widths(ins.op) if base in MMA_OPCODES else None
    out: list[tuple[int, int]] = []
    for i, text in enumerate(ops):
        for m in _REG.finditer(text):
            idx = int(m.group("idx"))
            width = 2 if m.group("wide") else 1
            if "[" in text:
                pass               # an address: 32-bit, or 64-bit with its .64 suffix
            elif base == "LDTM" and i == 0 or base == "STTM" and i == len(ops) - 1:
                width = tmem_load_values(ins.op)
            elif base in _LOADS and i == 0:
                width = _matrix_regs(mods) if base == "LDSM" else _vector_regs(mods)
            elif base in _STORES and i == len(ops) - 1:
                width = _matrix_regs(mods) if base == "STSM" else _vector_regs(mods)
            elif mma is not None:
                if base.endswith("GMMA"):
                    width = mma[1] if i == 1 else mma[0]
                else:
                    width = (mma[0], mma[1], mma[2], mma[0])[min(i, 3)]
            elif base == "IMAD" and "WIDE" in mods and i in (0, 3):
                width = 2
            elif base in _DOUBLE or (base == "CS2R" and i == 0 and "32" not in mods):
                width = 2
            out.append((idx, width))
    return out


def highest_register(code: list[Instruction]) -> int:
    """The largest ``R`` index touched (``-1`` when none)."""
    return max((r + w - 1 for ins in code for r, w in register_extents(ins)), default=-1)


def setmaxnreg_regions(code: list[Instruction]) -> list[dict[str, Any]]:
    """For each ``USETMAXREG``: its register limit and the highest register among the
    instructions reachable from it without passing another ``USETMAXREG`` (the warp
    group's code under that limit)."""
    succ = successors(code)
    out = []
    for i, ins in enumerate(code):
        if ins.base != "USETMAXREG":
            continue
        hexes = HEX.findall(ins.args)
        seen = {i}
        todo = [i]
        while todo:
            v = todo.pop()
            for w in succ[v]:
                if w not in seen and code[w].base != "USETMAXREG":   # the next region starts there
                    seen.add(w)
                    todo.append(w)
        reach = [code[v] for v in sorted(seen)]
        out.append({"address": ins.addr, "op": ins.op, "limit": int(hexes[-1], 16) if hexes else None,
                    "kind": "dealloc" if "DEALLOC" in ins.op else "alloc",
                    "highest_register": highest_register(reach), "instructions": len(reach)})
    return out


# --- logs ---------------------------------------------------------------------------------------

_CODE = re.compile(r"\((C\d{4})\)")
_FUNC_NAME = re.compile(r"function '([^']+)'")


def ptxas_warnings(log: str, name: str | None = None) -> list[str]:
    """ptxas' warnings and coded performance messages (``(C7515) ...``) of ``name``'s compile."""
    out = []
    for line in log.splitlines():
        low = line.lower()
        if "warning" not in low and not _CODE.search(line):
            continue
        if name is not None and (f := _FUNC_NAME.search(line)) and f.group(1) != name:
            continue
        text = line.strip()
        if text not in out:
            out.append(text)
    return out


# --- mma per k-tile -----------------------------------------------------------------------------

def mma_per_ktile_for_tile(bm: int, bn: int, bk: int, mma_shape: tuple[int, int, int], issuers: int) -> float:
    """MMA instructions per warp stream for one ``bm x bn x bk`` k-tile: the tile's
    ``bm·bn·bk`` multiply-adds over the instruction's ``m·n·k``, split among ``issuers``
    warps (mma.sync) or warp groups (wgmma)."""
    m, n, k = mma_shape
    return bm * bn * bk / (m * n * k * issuers)


def mma_per_ktile_from_bk(loop_code: list[Instruction], bk: int) -> float | None:
    """MMA per ``bk``-deep k-tile for the loop ``loop_code``, read from its SASS: each
    accumulation chain is one of the warp's output tiles and takes ``bk / k`` MMA per k-tile
    (``k``: the instruction's depth). A chain starts at an MMA whose accumulator input (last
    register operand) no earlier MMA of the loop wrote; ptxas may rename the accumulator
    along a chain. ``None`` without MMA."""
    mma = [i for i in loop_code if i.is_mma and not i.never]
    if not mma:
        return None
    written: set[str] = set()
    chains = 0
    for ins in mma:
        regs = [o for o in ins.operands if _REG.fullmatch(o)]
        if len(regs) < 2 or regs[-1] not in written:
            chains += 1
        if regs:
            written.add(regs[0])
    shape = _mma_shape(mma[0].op)
    return chains * bk / shape[2] if shape else None


def _mma_shape(op: str) -> tuple[int, int, int] | None:
    """``(m, n, k)`` of an MMA opcode: ``HMMA.16816...`` -> (16, 8, 16), ``HGMMA.64x128x16...``
    -> (64, 128, 16)."""
    mods = op.split(".")[1:]
    if not mods:
        return None
    if (s := _SHAPE.match(mods[0])):
        return int(s.group("m")), int(s.group("n")), int(s.group("k"))
    if mods[0].isdigit() and len(mods[0]) >= 4:
        return int(mods[0][:2]), int(mods[0][2]), int(mods[0][3:])
    return None


def _const(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def mma_per_source_iteration(lowered: Any) -> int | None:
    """MMA instructions per thread in one iteration of the lowered program's loop that issues
    the most of them (its innermost such run-time loop); loops with constant bounds count as
    unrolled, ``if`` bodies by their larger branch (a tcgen05.mma counts for the thread that
    issues it). ``None`` when no loop issues an MMA."""
    from hexlayout.ir.lowered import ForLoop, IfThen, MmaSync, Wgmma
    from hexlayout.ir.lowered_tcgen05 import Tcgen05Mma

    best: list[int] = []

    def count(body: list[Any]) -> tuple[int, bool]:
        """MMA per execution of ``body``, without the run-time loops nested in it, and whether
        such a loop issues MMA (then ``body``'s loop is not innermost: a tile loop around a k-loop
        whose first k-tile is peeled)."""
        n, nested = 0, False
        for ins in body:
            if isinstance(ins, (MmaSync, Wgmma, Tcgen05Mma)):
                n += 1
            elif isinstance(ins, ForLoop):
                lo, hi = _const(ins.start), _const(ins.stop)
                inner, deeper = count(ins.body)
                if lo is not None and hi is not None:
                    n += inner * max(0, -(-(hi - lo) // ins.step))
                    nested |= deeper
                elif inner or deeper:
                    nested = True
                    if inner and not deeper:
                        best.append(inner)
            elif isinstance(ins, IfThen):
                (t, dt), (e, de) = count(ins.then_body), count(ins.else_body)
                n, nested = n + max(t, e), nested or dt or de
        return n, nested

    count(lowered.body)
    return max(best) if best else None


# --- the report ---------------------------------------------------------------------------------

def _category(base: str) -> str:
    for name, ops in _CATEGORIES:
        if base in ops:
            return name
    return "integer"


def _store_width(ins: Instruction) -> int:
    mods = ins.op.split(".")[1:]
    for bits in ("128", "64", "U16", "S16", "U8", "S8"):
        if bits in mods:
            return {"U16": 16, "S16": 16, "U8": 8, "S8": 8}.get(bits) or int(bits)
    return 32


_TRACKED = ("LDGSTS", "LDSM", "STSM", "UTMALDG", "UTMASTG", "UTMAPF", "UBLKCP", "LDS", "STS", "LDG", "STG",
            "HMMA", "HGMMA", "UTCHMMA", "UTCQMMA", "LDTM", "STTM", "UTCBAR", "LDL", "STL", "BAR", "SYNCS",
            "USETMAXREG")


@dataclass
class MainLoop:
    """The main loop (see the module docstring)."""

    start: int
    end: int
    instructions: int
    mma: int
    mma_opcode: str
    padding: int
    non_mma: int
    constant_reads: int
    mix: dict[str, int]
    categories: dict[str, int]
    mma_per_ktile: float | None
    k_tiles: float | None
    non_mma_per_ktile: float | None
    non_mma_per_mma: float
    overlapped: int = 0


@dataclass
class KernelStats:
    """Static quality numbers of one compiled kernel (see the module docstring)."""

    kernel: str
    arch: str
    registers: int | None
    highest_register: int
    setmaxnreg: list[dict[str, Any]]
    spill_stores: int | None
    spill_loads: int | None
    stack_frame: int | None
    local_memory_instructions: int
    shared_static: int | None
    shared_dynamic: int | None
    instructions: int
    mma: int
    main_loop: MainLoop | None
    counts: dict[str, int]
    epilogue_stores: dict[str, int]
    warnings: list[str]
    serialization: list[str] = field(default_factory=list)
    epilogue: Epilogue | None = None

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads or self.local_memory_instructions)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["spills"] = self.spills
        return d

    def summary(self) -> str:
        """A few lines of text: the numbers above, for ``hexlayout compile --stats``."""
        regs = f"{self.registers}" if self.registers is not None else "?"
        lines = [f"{self.kernel} ({self.arch}): {regs} registers (highest R{self.highest_register}), "
                 + (f"spills {self.spill_stores} B stored / {self.spill_loads} B loaded"
                    if self.spill_stores or self.spill_loads else "no spills")
                 + f", {self.local_memory_instructions} local-memory instructions, shared "
                 f"{self.shared_static or 0} B static + {self.shared_dynamic or 0} B dynamic, "
                 f"{self.instructions} instructions, {self.mma} MMA"]
        for r in self.setmaxnreg:
            hi = f"R{r['highest_register']}" if r["highest_register"] >= 0 else "none"
            lines.append(f"  setmaxnreg {r['kind']} {r['limit']}: highest register {hi} "
                         f"({r['instructions']} reachable instructions)")
        lp = self.main_loop
        if lp is None:
            lines.append("  main loop: none (no loop holds an MMA)")
        else:
            per_k = (f"{lp.non_mma_per_ktile:.1f} non-MMA per k-tile ({lp.k_tiles:g} k-tiles per iteration)"
                     if lp.non_mma_per_ktile is not None else "k-tiles unknown")
            lines.append(f"  main loop [0x{lp.start:x}, 0x{lp.end:x}]: {lp.instructions} instructions, "
                         f"{lp.mma} {lp.mma_opcode}, {lp.padding} @!PT padding, {lp.non_mma} non-MMA; "
                         f"{per_k}; {lp.non_mma_per_mma:.2f} non-MMA per MMA; "
                         f"{lp.constant_reads} constant-bank reads"
                         + (f"; {lp.overlapped} beside an in-flight wgmma group" if lp.overlapped else ""))
            lines.append("  loop mix: " + ", ".join(f"{k} {v}" for k, v in lp.categories.items()))
            lines.append("  loop opcodes: " + ", ".join(f"{k} {v}" for k, v in list(lp.mix.items())[:16]))
        lines.append("  memory: " + (", ".join(f"{k} {v}" for k, v in self.counts.items() if v) or "-"))
        lines.append("  epilogue stores: " + (", ".join(f"{k} {v}" for k, v in self.epilogue_stores.items())
                                              or "-"))
        if (ep := self.epilogue) is not None:
            once = " (one iteration)" if ep.looped else ""
            lines.append(f"  epilogue [0x{ep.start:x}, 0x{ep.end:x}]{once}: "
                         f"{ep.instructions} instructions for {ep.values} accumulator values per thread "
                         f"({ep.per_value:.2f} per value)")
        lines.append("  ptxas: " + ("; ".join(self.warnings) if self.warnings else "no warnings"))
        return "\n".join(lines)


def _pick(functions: dict[str, tuple[str, list[Instruction]]], name: str | None) -> tuple[str, str,
                                                                                          list[Instruction]]:
    if not functions:
        raise StatsError("the SASS listing holds no function")
    if name is not None:
        if name not in functions:
            raise StatsError(f"kernel {name!r} is not in the cubin (it has {', '.join(functions)})")
        return (name, *functions[name])
    # the function with the most MMA (the kernel of interest when a cubin holds several)
    best = max(functions, key=lambda f: sum(i.is_mma for i in functions[f][1]))
    return (best, *functions[best])


_WGMMA = frozenset({"HGMMA", "IGMMA", "QGMMA", "BGMMA"})


def wgmma_overlap(body: list[Instruction]) -> int:
    """The non-MMA instructions of loop ``body`` issued while a wgmma group is in flight (see the
    module docstring: **overlapped**), following the loop around its back edge."""
    def pass_(flight: bool, count: bool) -> tuple[bool, int]:
        n = 0
        for ins in body:
            if ins.never:
                continue
            if ins.base in _WGMMA:
                flight = True
            elif ins.op.startswith("WARPGROUP.DEPBAR"):
                depth = ins.args.split(",")[-1].strip().rstrip(";")
                flight = flight and int(depth, 0) > 0
            elif flight and count and not ins.is_mma:
                n += 1
        return flight, n

    at_back_edge, _ = pass_(False, False)
    return pass_(at_back_edge, True)[1]


def kernel_stats(cubin: bytes | None = None, *, sass: str | None = None, log: str = "",
                 name: str | None = None, resources: ResourceUsage | None = None,
                 mma_per_ktile: float | None = None, bk: int | None = None,
                 shared_dynamic: int | None = None) -> KernelStats:
    """The static report of kernel ``name`` (default: the function with the most MMA).

    ``sass`` is the ``cuobjdump -sass`` listing (disassembled from ``cubin`` when absent);
    ``log`` ptxas' ``-v`` output (registers, spills, warnings); ``resources`` overrides what
    the log says (else ``cuobjdump -res-usage`` of the cubin gives registers and shared
    memory, without spill bytes). ``mma_per_ktile``: see the module docstring; without it,
    ``bk`` (the block tile's k depth) gives it from the loop's SASS
    (:func:`mma_per_ktile_from_bk`).
    """
    from .sass import disassemble, res_usage

    if sass is None:
        if cubin is None:
            raise StatsError("kernel_stats needs a cubin or its SASS listing")
        sass = disassemble(cubin)
    kname, arch, code = _pick(parse_sass(sass), name)
    res = resources or (parse_ptxas(log, kname) if log else None)
    from_log = res is not None
    if res is None and cubin is not None:
        res = parse_res_usage(res_usage(cubin), kname)
    spans = loops(code)
    lp = find_main_loop(code, spans)
    main = None
    if lp is not None:
        body = code[lp.first:lp.last + 1]
        padding = sum(i.never for i in body)
        non_mma = len(body) - lp.mma - padding
        mix = Counter(i.base for i in body if not i.never)
        cats = Counter(_category(i.base) for i in body if not i.never)
        mma_ops = Counter(i.op for i in body if i.is_mma)
        if mma_per_ktile is None and bk:
            mma_per_ktile = mma_per_ktile_from_bk(body, bk)
        k_tiles = lp.mma / mma_per_ktile if mma_per_ktile else None
        main = MainLoop(lp.start, lp.end, len(body), lp.mma, mma_ops.most_common(1)[0][0], padding, non_mma,
                        sum("c[0x" in i.args for i in body if not i.never), dict(mix.most_common()),
                        dict(cats.most_common()), mma_per_ktile, k_tiles,
                        non_mma / k_tiles if k_tiles else None, non_mma / lp.mma, wgmma_overlap(body))
    in_loop = set(range(lp.first, lp.last + 1)) if lp is not None else set()
    stores: Counter[str] = Counter()
    for j, ins in enumerate(code):
        if j in in_loop or ins.never:
            continue
        if ins.base in ("STG", "ST"):
            stores[f"{ins.base}.{_store_width(ins)}"] += 1
        elif ins.base in ("STSM", "UTMASTG", "UBLKCP", "UTMAREDG"):
            stores[ins.base] += 1
    counts = Counter(i.base for i in code if not i.never)
    warnings = ptxas_warnings(log, kname)
    serial = sorted({c for w in warnings for c in _CODE.findall(w) if c in SERIALIZATION_CODES})
    return KernelStats(
        kernel=kname, arch=arch, registers=res.registers if res else None,
        highest_register=highest_register(code), setmaxnreg=setmaxnreg_regions(code),
        spill_stores=res.spill_stores if from_log and res else None,
        spill_loads=res.spill_loads if from_log and res else None,
        stack_frame=res.stack_frame if res else None,
        local_memory_instructions=counts["LDL"] + counts["STL"],
        shared_static=res.shared_static if res else None, shared_dynamic=shared_dynamic,
        instructions=len(code), mma=sum(i.is_mma for i in code), main_loop=main,
        counts={k: counts[k] for k in _TRACKED}, epilogue_stores=dict(sorted(stores.items())),
        warnings=warnings, serialization=serial, epilogue=tmem_epilogue(code, lp, spans))


_BUILD_STATS: dict[str, KernelStats] = {}


def build_stats(build: Any) -> KernelStats:
    """The report of a ``runtime.build`` result (memoized per compiled cubin): the SASS of its
    cubin, ptxas' log of its compile, k-tiles from its lowered program."""
    compiled = build.compiled
    if compiled is None:
        name = getattr(build.generated, "name", "?")
        raise StatsError(f"kernel {name}: no cubin to analyze (it was built with compile=False)")
    key = compiled.key
    if key not in _BUILD_STATS:
        try:
            _BUILD_STATS[key] = kernel_stats(
                compiled.cubin, sass=compiled.sass(), log=compiled.log, name=compiled.name,
                resources=compiled.resources, mma_per_ktile=mma_per_source_iteration(build.lowered),
                shared_dynamic=build.generated.smem_bytes)
        except StatsError as e:
            raise StatsError(f"kernel {compiled.name}: {e}") from None
    return _BUILD_STATS[key]
