"""``Emitter``: the state of printing one kernel (names, bound variables, storage, output lines).

Instruction printers (``memory``, ``matrix``, ``mma``, ``tma``, ``sync``, ``alu``) receive
the ``Emitter`` and return C++ statements; ``kernel`` walks the body and places them.
Integer expressions print through ``hexlayout.ir.expr.to_c``; variables whose C name
differs from their IR name (``threadIdx.x`` is printed as the ``int`` ``tid``, loop
variables that collide with other names) are substituted first.
"""

from __future__ import annotations

from hexlayout.ir.expr import (
    BinOp,
    Const,
    Expr,
    ExprLike,
    RegRead,
    Select,
    UnOp,
    Var,
    as_expr,
    bounds,
    free_vars,
    reg_reads,
    replace_leaves,
    substitute,
    to_c,
)
from hexlayout.ir.lowered import (
    GlobalRef,
    Instr,
    LoweredKernel,
    MbarRef,
    RegArray,
    RegRef,
    SharedRef,
    SmemBuffer,
    TmaDesc,
)
from hexlayout.ir.passes.algebra import linear_terms, sum_terms
from hexlayout.ir.tile import GlobalParam

from .byte_sources import ByteSources
from .errors import CodegenError
from .fold_zero import Fold
from .names import NameTable

__all__ = ["Emitter", "MBAR_ALIGN"]

MBAR_ALIGN = 8


class Emitter:
    """Names and storage of one kernel, and helpers shared by the instruction printers."""

    def __init__(self, kernel: LoweredKernel) -> None:
        self.kernel = kernel
        self.arch = kernel.arch
        self.names = NameTable()
        self.helpers: set[str] = set()
        self.instr: Instr | None = None           # the instruction being printed (for errors)
        self._bound: dict[Var, str] = {}
        self._rename: dict[Var, Var] = {}
        self._retired: dict[Var, str] = {}
        self._c_names: dict[int, str] = {}        # id(GlobalParam / RegArray / TmaDesc) -> C name
        self._smem: dict[int, SmemBuffer] = {id(b): b for b in kernel.smem}
        self.mbar_offsets: dict[str, tuple[int, int]] = {}   # name -> (byte offset, count)
        self.wgmma_arrays: list[RegArray] = []    # register arrays wgmma reads or writes asynchronously
        #: what the ``u8`` register elements hold at the point being printed (the kernel printer
        #: updates it after each instruction; ``hexlayout.codegen.byte_sources``)
        self.bytes = ByteSources()
        #: constant zero points folded into magic conversions (``hexlayout.codegen.fold_zero``):
        #: id(conversion) -> its fold; the ids of the ``sub`` instructions folded away
        self.folds: dict[int, Fold] = {}
        self.folded: set[int] = set()
        #: id(WgmmaWait) -> register arrays tied before it (``hexlayout.codegen.overlap``)
        self.overlap: dict[int, list[RegArray]] = {}
        #: the warp index ``threadIdx.x / 32`` as a value the compiler knows is the same in every
        #: lane (read from lane 0 by ``__shfl_sync``): in ``expr(e, warp_uniform=True)``,
        #: ``tid / (32 j)`` prints as ``warp_id / j``, so warp-uniform values (a warp group's
        #: descriptor offsets) go to uniform registers; declared by the kernel printer when used
        self.warp_var = Var(self.names.take("warp_id"), 0, max(1, kernel.threads // 32), "warp")
        self.warp_used = False
        #: whether this thread is its warp's elected lane (``elect.sync`` once in the kernel's
        #: prologue, where every warp runs converged: lane 0): single-thread branches test it
        #: (``ElectIf``), and the compiler knows one lane of the warp runs them
        self.elected_name = self.names.take("elected")
        self.elected_used = False
        #: while an elected branch of single-thread tcgen05 instructions is printed as predicates:
        #: its C condition (``codegen.tcgen05._issue`` guards each instruction with it)
        self.issue_guard: str | None = None
        self._bound[self.warp_var] = self.warp_var.name

    def add_folds(self, folds: dict[int, Fold]) -> None:
        """Record the folds planned for a body about to be printed."""
        self.folds.update(folds)
        self.folded.update(id(s) for f in folds.values() for s in f.subs)

    # --- errors ---------------------------------------------------------------------------
    def error(self, message: str) -> CodegenError:
        return CodegenError(self.kernel.name, message, self.instr)

    # --- variables and expressions -----------------------------------------------------------
    def bind(self, var: Var, want: str | None = None) -> str:
        """Give ``var`` a C name (once); expressions over it print with that name."""
        if var in self._bound:
            return self._bound[var]
        name = self._retired.pop(var, None) or self.names.take(want or var.name)
        self._bound[var] = name
        if name != var.name:
            self._rename[var] = Var(name, var.lo, var.hi, var.kind)
        return name

    def unbind(self, var: Var) -> None:
        """End the scope of ``var`` (a loop variable); binding it again reuses its name."""
        name = self._bound.pop(var, None)
        if name is not None:
            self._retired[var] = name

    def is_bound(self, var: Var) -> bool:
        return var in self._bound

    def expr(self, e: ExprLike, warp_uniform: bool = False) -> str:
        """C source of an integer expression over bound variables; ``warp_uniform``: with
        ``tid / (32 j)`` read as the warp-uniform ``warp_id / j`` (see ``warp_var``)."""
        if not isinstance(e, Expr):
            return str(int(e)) if int(e) >= 0 else f"({int(e)})"
        fv = free_vars(e)
        unbound = sorted(v.name for v in fv if v not in self._bound)
        if unbound:
            raise self.error(f"the expression {to_c(e)} uses {', '.join(unbound)}, which is not a kernel "
                             "parameter, size, thread or block index, or an enclosing loop variable")
        out = self._warp_uniform(e) if warp_uniform and self.kernel.thread_index in fv else e
        ren = {v: self._rename[v] for v in fv if v in self._rename}
        out = substitute(out, ren) if ren else out
        if reg_reads(out):        # per-thread register values (e.g. gathered row indices), with
            # the bounds of their type (a signed load may be negative: `e >= 0` must not fold to 1)
            out = replace_leaves(out, lambda x: Var(f"{self.reg_name(x.array)}[{x.index}]", *bounds(x))
                                 if isinstance(x, RegRead) else x)
        return to_c(out)

    def _warp_uniform(self, e: Expr) -> Expr:
        """``e`` with every ``tid // (32 j)`` written ``warp_id // j`` (equal values)."""
        if isinstance(e, BinOp):
            if e.op == "//" and e.a is self.kernel.thread_index and isinstance(e.b, Const) \
                    and e.b.value > 0 and e.b.value % 32 == 0:
                self.warp_used = True
                j = e.b.value // 32
                return as_expr(self.warp_var) // j if j > 1 else as_expr(self.warp_var)
            a, b = self._warp_uniform(e.a), self._warp_uniform(e.b)
            return e if a is e.a and b is e.b else BinOp(e.op, a, b)
        if isinstance(e, UnOp):
            a = self._warp_uniform(e.a)
            return e if a is e.a else UnOp(e.op, a)
        if isinstance(e, Select):
            c, a, b = self._warp_uniform(e.cond), self._warp_uniform(e.a), self._warp_uniform(e.b)
            return e if c is e.cond and a is e.a and b is e.b else Select(c, a, b)
        return e

    # --- storage ----------------------------------------------------------------------------
    def add_name(self, obj: GlobalParam | RegArray | TmaDesc, name: str) -> None:
        """``name`` is the C name of the parameter, register array or TMA descriptor ``obj``."""
        self._c_names[id(obj)] = name

    def _c_name(self, obj: GlobalParam | RegArray | TmaDesc, missing: str) -> str:
        try:
            return self._c_names[id(obj)]
        except KeyError:
            raise self.error(missing) from None

    def param_name(self, p: GlobalParam) -> str:
        return self._c_name(p, f"global tensor {p.name!r} is not a parameter of the kernel")

    def reg_name(self, arr: RegArray) -> str:
        return self._c_name(arr, f"register array {arr.name!r} is not in LoweredKernel.registers")

    def tma_name(self, desc: TmaDesc) -> str:
        return self._c_name(desc, f"TMA descriptor {desc.name!r} is not in LoweredKernel.tma")

    def reg_index(self, ref: RegRef, i: ExprLike | str = 0) -> str:
        """``name[start + i]``; ``i`` may be the C name of an element loop variable."""
        name = self.reg_name(ref.array)
        if isinstance(i, str):
            s = self.expr(ref.start)
            return f"{name}[{i}]" if s == "0" else f"{name}[{s} + {i}]"
        return f"{name}[{self.expr(as_expr(ref.start) + i)}]"

    def check_reg_range(self, ref: RegRef) -> None:
        start = as_expr(ref.start)
        if not free_vars(start):
            s = int(to_c(start).strip("()"))
            if s < 0 or s + ref.count > ref.array.count:
                raise self.error(f"register slice {ref.array.name}[{s}:{s + ref.count}] is outside the "
                                 f"{ref.array.count}-element array")

    def reg_u32(self, ref: RegRef, j: int) -> str:
        """Fragment register ``j`` of ``ref`` as an ``unsigned`` lvalue."""
        bits = ref.array.dtype.bits
        per = 32 // bits if bits < 32 else 1
        self.helpers.add("u32")
        return f"hl_u32({self.reg_index(ref, j * per)})"

    def buffer(self, buf: SmemBuffer) -> SmemBuffer:
        if id(buf) not in self._smem:
            raise self.error(f"shared buffer {buf.name!r} is not in LoweredKernel.smem")
        return buf

    def smem_byte_offset(self, ref: SharedRef) -> Expr:
        """Byte offset of ``ref`` from the start of dynamic shared memory."""
        buf = self.buffer(ref.buffer)
        bits = buf.dtype.bits
        if bits % 8:
            return (as_expr(ref.offset) * bits) // 8 + buf.offset
        # element offset x bytes per element, distributed over the offset's terms (an
        # invariant part, immediate offsets and a stage offset stay separate additions)
        return sum_terms([t * (bits // 8) for t in linear_terms(ref.offset)] + [as_expr(buf.offset)])

    def smem_addr(self, ref: SharedRef) -> str:
        """The 32-bit shared-window address of ``ref`` (for PTX ``.shared`` operands)."""
        off = self.expr(self.smem_byte_offset(ref))
        return "smem_base" if off == "0" else f"smem_base + {off}"

    def smem_ptr(self, ref: SharedRef) -> str:
        """A generic ``unsigned char*`` to ``ref``."""
        off = self.expr(self.smem_byte_offset(ref))
        return "smem" if off == "0" else f"smem + {off}"

    def gmem_ptr(self, ref: GlobalRef) -> str:
        name = self.param_name(ref.param)
        bits = ref.param.dtype.bits
        if bits % 8:
            off = self.expr((as_expr(ref.offset) * bits) // 8)
            return f"reinterpret_cast<const unsigned char*>({name}) + {off}"
        off = self.expr(ref.offset)
        return name if off == "0" else f"{name} + {off}"

    def mbar_addr(self, bar: MbarRef) -> str:
        try:
            base, count = self.mbar_offsets[bar.name]
        except KeyError:
            raise self.error(f"mbarrier {bar.name!r} is not allocated") from None
        idx = as_expr(bar.index)
        if not free_vars(idx) and not reg_reads(idx):
            i = int(self.expr(idx).strip("()"))
            if not 0 <= i < count:
                raise self.error(f"mbarrier {bar.name}[{i}] is outside its {count} barriers")
        return f"smem_base + {self.expr(idx * MBAR_ALIGN + base)}"


def wait_group(em: Emitter, instruction: str, pending: int, qualifier: str = "") -> list[str]:
    """``<instruction><qualifier> <pending>;``: wait until at most ``pending`` of the groups
    this thread committed are incomplete (a negative count is refused)."""
    if pending < 0:
        raise em.error(f"{instruction} {pending}: the count is negative")
    return asm(f"{instruction}{qualifier} {int(pending)};", [], [])


def asm(template: str, outputs: list[str], inputs: list[str], memory: bool = True,
        volatile: bool = True) -> list[str]:
    """An ``asm`` statement: ``template`` is PTX with ``%n`` operands (one instruction per line)."""
    body = "".join(f"{line}\\n" for line in template.split("\n"))
    head = f'asm volatile("{body}"' if volatile else f'asm("{body}"'
    clob = '"memory"' if memory else ""
    if not outputs and not inputs:
        return [head + (f" ::: {clob});" if clob else ");")]
    tail = f" : {clob}" if clob else ""
    outs = f" : {', '.join(outputs)} :" if outputs else " ::"
    one = f"{head}{outs} {', '.join(inputs)}{tail});"
    if len(one) <= 110:
        return [one]
    lines = [head]
    lines += _wrap(": ", outputs) if outputs else []
    lines += _wrap(": " if outputs else ":: ", inputs)
    if clob:
        lines.append(f"    : {clob}")
    lines[-1] += ");"
    return lines


def _wrap(lead: str, ops: list[str], width: int = 100) -> list[str]:
    """Operand list lines, indented under an asm statement."""
    out: list[str] = []
    cur = "    " + lead
    fresh = True
    for i, op in enumerate(ops):
        piece = op + ("," if i < len(ops) - 1 else "")
        if len(cur) + len(piece) > width and not fresh:
            out.append(cur.rstrip())
            cur = "      "
        cur += piece + " "
        fresh = False
    out.append(cur.rstrip())
    return out


def operand_list(start: int, count: int) -> str:
    """``{%start, ..., %start+count-1}``."""
    return "{" + ", ".join(f"%{start + i}" for i in range(count)) + "}"
