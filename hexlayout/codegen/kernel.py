"""``generate``: a ``LoweredKernel`` printed as one CUDA C++ translation unit.

Layout of the output (deterministic: the same kernel prints the same text):

1. a header comment: kernel, architecture, launch shape, shared-memory map (buffers, then
   mbarriers, 8-byte aligned after them), register arrays;
2. ``#include`` of the fp16 / bf16 / fp8 headers the kernel's types need, then the device
   helpers it uses (``helpers``);
3. ``extern "C" __global__ void __launch_bounds__(threads) name(...)`` with one pointer per
   ``GlobalParam`` (``const`` unless the kernel writes it), one scalar per ``ScalarParam``,
   one ``int`` per symbolic size or stride of a tensor that is not a scalar parameter, and one
   ``const __grid_constant__ CUtensorMap`` per ``TmaDesc`` - in that order (``KernelArg``);
4. the prologue: ``extern __shared__ __align__(1024) unsigned char smem[]``, its 32-bit
   shared-window address ``smem_base``, ``tid`` / ``bid_x``... as ``int``, one local array per
   ``RegArray`` (constant-indexed after unrolling, so kept in registers);
5. the body, with a comment per group of instructions from one source line and tile op.

Loops whose body indexes register arrays with the loop variable are fully unrolled
(``#pragma unroll``); other loops follow ``ForLoop.unroll`` (``False``: ``#pragma unroll 1``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hexlayout.ir.expr import Var, as_expr, free_vars, to_c
from hexlayout.ir.lowered import (
    Comment,
    ElectIf,
    ForLoop,
    IfThen,
    Instr,
    LoweredKernel,
    MbarArrive,
    MbarInit,
    MbarRef,
    MbarWait,
    RegArray,
    RegRef,
    SetMaxNReg,
    TmaLoad,
    Wgmma,
    walk_instrs,
)
from hexlayout.ir.tile import GlobalParam, ScalarParam

from . import alu, atomics, matrix, memory, mma, sync, tcgen05, tma
from .ctypes_map import c_type, is_fp8
from .emitter import MBAR_ALIGN, Emitter
from .errors import CodegenError
from .fold_zero import array_uses, plan_folds
from .helpers import helper_source
from .overlap import plan_overlap
from .tcgen05 import ISSUED

__all__ = ["generate", "generate_cuda", "GeneratedKernel", "KernelArg"]

Printer = Callable[[Emitter, Any], list[str]]
PRINTERS: dict[type, Printer] = {}
for _m in (memory, matrix, mma, tma, sync, alu, atomics, tcgen05):
    PRINTERS.update(_m.PRINTERS)  # type: ignore[attr-defined]
SELF_PREDICATED = set(memory.SELF_PREDICATED)

_INDENT = "  "


@dataclass(frozen=True)
class KernelArg:
    """One kernel parameter, in order: ``kind`` is "tensor" (a pointer; ``obj`` the
    ``GlobalParam``), "scalar" (``ScalarParam``), "size" (the size ``Var``) or "tensor_map"
    (the ``TmaDesc``; a 128-byte ``CUtensorMap`` passed by value)."""

    kind: str
    name: str
    c_type: str
    obj: Any


@dataclass(frozen=True)
class GeneratedKernel:
    """CUDA C++ source of a lowered kernel and what a launcher needs to call it."""

    name: str                  # the extern "C" symbol
    source: str
    arch: str
    threads: int
    smem_bytes: int            # dynamic shared memory to request: buffers + mbarriers
    args: tuple[KernelArg, ...]
    grid: tuple[Any, ...]
    cluster: tuple[int, ...] | None


def _reg_refs(ins: Instr) -> list[RegRef]:
    return [v for v in vars(ins).values() if isinstance(v, RegRef)] + [
        s for s in getattr(ins, "srcs", ()) if isinstance(s, RegRef)]


def _uses_var_in_registers(body: list[Instr], var: Var) -> bool:
    return any(var in free_vars(r.start) for ins in walk_instrs(body) for r in _reg_refs(ins))


def _site(ins: Instr) -> tuple[str, int, str, str] | None:
    if ins.loc is None and not ins.origin:
        return None
    if ins.loc is None:
        return ("", 0, ins.origin, "")
    return (ins.loc.filename, ins.loc.line, ins.origin, ins.loc.text)


def _site_comment(site: tuple[str, int, str, str]) -> str:
    file, line, origin, code = site
    where = f"{file}:{line}" if file else ""
    parts = [p for p in (where, f"[{origin}]" if origin else "", code) if p]
    return "// " + "  ".join(parts)


class _Printer:
    def __init__(self, kernel: LoweredKernel) -> None:
        self.k = kernel
        self.em = Emitter(kernel)
        self.lines: list[str] = []
        self.depth = 1
        self.last_site: tuple[str, int, str, str] | None = None
        self.uses = array_uses(kernel.body)

    # --- output ---------------------------------------------------------------------------
    def out(self, line: str) -> None:
        self.lines.append(_INDENT * self.depth + line if line else "")

    def out_all(self, lines: list[str]) -> None:
        for s in lines:
            self.out(s)

    # --- declarations -----------------------------------------------------------------------
    def signature(self) -> tuple[list[KernelArg], list[str]]:
        em, k = self.em, self.k
        written = {id(p) for p in k.written_params()}
        # scalars are bound first so that a size named like a scalar is that scalar
        for p in k.params:
            if isinstance(p, ScalarParam):
                em.bind(p.var, p.name)
        args: list[KernelArg] = []
        decls: list[str] = []
        for p in k.params:
            if isinstance(p, ScalarParam):
                name = em.expr(p.var)
                ct = c_type(p.dtype)
                args.append(KernelArg("scalar", name, ct, p))
                decls.append(f"const {ct} {name}")
            elif isinstance(p, GlobalParam):
                name = em.names.take(p.name)
                em.add_name(p, name)
                ct = c_type(p.dtype) if p.dtype.bits % 8 == 0 else "unsigned char"
                const = "" if id(p) in written else "const "
                args.append(KernelArg("tensor", name, f"{const}{ct}*", p))
                decls.append(f"{const}{ct}* __restrict__ {name}")
            else:
                raise CodegenError(k.name, f"parameter {p!r} is neither a GlobalParam nor a ScalarParam")
        sizes: list[Var] = []
        for p in k.params:
            if isinstance(p, GlobalParam):
                for e in tuple(p.shape) + tuple(p.stride):
                    for v in sorted(free_vars(e), key=lambda v: v.name):
                        if not em.is_bound(v) and all(v is not s for s in sizes):
                            sizes.append(v)
        for v in sizes:
            name = em.bind(v)
            args.append(KernelArg("size", name, "int", v))
            decls.append(f"const int {name}")
        for d in k.tma:
            name = em.names.take(d.name)
            em.add_name(d, name)
            em.helpers.add("tensor_map")
            args.append(KernelArg("tensor_map", name, "CUtensorMap", d))
            decls.append(f"const __grid_constant__ CUtensorMap {name}")
        return args, decls

    def mbarriers(self) -> list[tuple[str, int, int]]:
        """(name, offset, count) of every mbarrier array, placed after the shared buffers."""
        refs: list[MbarRef] = list(self.k.mbarriers)
        for ins in walk_instrs(self.k.body):
            bar = getattr(ins, "bar", None)
            if isinstance(ins, (MbarInit, MbarArrive, MbarWait, TmaLoad)) and isinstance(bar, MbarRef):
                refs.append(bar)
        counts: dict[str, int] = {}
        for r in refs:
            counts[r.name] = max(counts.get(r.name, 0), int(r.count))
        top = -(-self.k.smem_bytes // MBAR_ALIGN) * MBAR_ALIGN
        out = []
        for name, count in counts.items():
            out.append((name, top, count))
            self.em.mbar_offsets[name] = (top, count)
            top += MBAR_ALIGN * count
        return out

    def registers(self) -> list[str]:
        decls = []
        for arr in self.k.registers:
            name = self.em.names.take(arr.name)
            self.em.add_name(arr, name)
            try:
                ct = c_type(arr.dtype)
            except ValueError as e:
                raise CodegenError(self.k.name, f"register array {arr.name}: {e}") from None
            if arr.count < 1:
                raise CodegenError(self.k.name, f"register array {arr.name} has {arr.count} elements")
            decls.append(f"__align__(16) {ct} {name}[{arr.count}];")
        return decls

    # --- body -------------------------------------------------------------------------------
    def site(self, ins: Instr) -> None:
        s = _site(ins)
        if s is not None and s != self.last_site:
            self.out(_site_comment(s))
            self.last_site = s

    def body(self, body: list[Instr]) -> None:
        self.em.add_folds(plan_folds(body, self.uses))
        self.em.overlap.update(plan_overlap(body, self.uses, self.em.wgmma_arrays))
        for ins in body:
            self.em.instr = ins
            if isinstance(ins, Comment):
                for t in ins.text.splitlines() or [""]:
                    self.out(f"// {t}".rstrip())
                continue
            self.site(ins)
            pred = None if ins.pred is None else self.em.expr(ins.pred)
            if isinstance(ins, (ForLoop, IfThen)):
                self.em.bytes.forget_all()          # a body runs again, or not at all
                if pred is not None:
                    self.out(f"if ({pred}) {{")
                    self.depth += 1
                self.control(ins)
                self.em.bytes.forget_all()
                if pred is not None:
                    self.depth -= 1
                    self.out("}")
                continue
            printer = PRINTERS.get(type(ins))
            if printer is None:
                raise self.em.error(f"no CUDA printer for {type(ins).__name__}")
            lines = printer(self.em, ins)
            self.em.bytes.observe(ins)
            if pred is None or type(ins) in SELF_PREDICATED:
                self.out_all(lines)
            elif len(lines) == 1:
                self.out(f"if ({pred}) {lines[0]}")
            else:
                self.out(f"if ({pred}) {{")
                self.depth += 1
                self.out_all(lines)
                self.depth -= 1
                self.out("}")

    def control(self, ins: ForLoop | IfThen) -> None:
        em = self.em
        if isinstance(ins, ElectIf):     # the warp, tested warp-uniform, and its elected lane
            em.helpers.add("elect_one")
            em.elected_used = True
            also = "" if isinstance(ins.also, int) and ins.also == 1 else f" && ({em.expr(ins.also)})"
            if ins.else_body:
                raise em.error("an elected branch has no else branch")
            warp_id = em.expr(as_expr(em.kernel.thread_index) // 32, warp_uniform=True)
            warp = f"{warp_id} == {ins.thread // 32}"
            if all(type(i) in ISSUED and i.pred is None for i in ins.then_body):
                # only single-thread tcgen05 instructions: each guarded by the condition (no
                # branch to reconverge from; ptxas issues each once, from a uniform predicate)
                em.issue_guard = f"{warp}{also} && {em.elected_name}"
                try:
                    self.body(ins.then_body)
                finally:
                    em.issue_guard = None
                return
            # (the lane test nested: ptxas keeps its one-lane knowledge when `also` joins other
            # tests of the same values, which a single && chain lost on the pair's issue branch)
            self.out(f"if ({warp}{also}) {{")
            self.depth += 1
            self.out(f"if ({em.elected_name}) {{")
            self.nested(ins.then_body)
            self.out("}")
            self.depth -= 1
            self.out("}")
            return
        if isinstance(ins, IfThen):
            self.out(f"if ({em.expr(ins.cond)}) {{")
            self.nested(ins.then_body)
            if ins.else_body:
                self.out("} else {")
                self.nested(ins.else_body)
            self.out("}")
            return
        if ins.step == 0:
            raise em.error(f"loop over {ins.var.name} has step 0")
        start, stop = em.expr(ins.start), em.expr(ins.stop)
        name = em.bind(ins.var)
        const_bounds = not free_vars(as_expr(ins.start)) and not free_vars(as_expr(ins.stop))
        if _uses_var_in_registers(ins.body, ins.var):
            if not const_bounds:
                self.out(f"// register arrays are indexed by {name} but its bounds are not constant: "
                         "they will live in local memory")
            self.out("#pragma unroll")
        elif ins.unroll is True:
            self.out("#pragma unroll")
        elif ins.unroll is False:
            self.out("#pragma unroll 1")
        else:
            self.out(f"#pragma unroll {int(ins.unroll)}")
        cmp = "<" if ins.step > 0 else ">"
        step = "++" + name if ins.step == 1 else f"{name} += {ins.step}" if ins.step > 0 \
            else f"{name} -= {-ins.step}"
        self.out(f"for (int {name} = {start}; {name} {cmp} {stop}; {step}) {{")
        self.nested(ins.body)
        self.out("}")
        em.unbind(ins.var)

    def nested(self, body: list[Instr]) -> None:
        self.depth += 1
        self.body(body)
        self.depth -= 1

    # --- whole kernel -------------------------------------------------------------------------
    def run(self) -> GeneratedKernel:
        k, em = self.k, self.em
        if k.threads % 32 or not 0 < k.threads <= 1024:
            raise CodegenError(k.name, f"{k.threads} threads: a multiple of 32 up to 1024 is needed")
        if k.arch not in ("sm_80", "sm_89", "sm_90a", "sm_90", "sm_100a"):
            raise CodegenError(k.name, f"architecture {k.arch!r} is not sm_80, sm_89, sm_90a or sm_100a")
        kname = em.names.take(k.name)
        args, decls = self.signature()
        tid = em.bind(k.thread_index, "tid" if not k.thread_index.name.isidentifier() else None)
        prologue = [
            "extern __shared__ __align__(1024) unsigned char smem[];",
            "const unsigned smem_base = static_cast<unsigned>(__cvta_generic_to_shared(smem));",
            f"const int {tid} = static_cast<int>(threadIdx.x);",
        ]
        if len(k.block_index) > 3:
            raise CodegenError(k.name, f"{len(k.block_index)} block indices (at most 3)")
        for axis, bv in zip("xyz", k.block_index):
            want = f"bid_{axis}" if not bv.name.isidentifier() else bv.name
            prologue.append(f"const int {em.bind(bv, want)} = static_cast<int>(blockIdx.{axis});")
        regs = self.registers()
        bars = self.mbarriers()
        em.wgmma_arrays.extend(a for a in _wgmma_arrays(k.body))
        self.body(k.body)
        em.instr = None
        if em.warp_used:
            prologue.append(f"const int {em.warp_var.name} = __shfl_sync(0xffffffffu, {tid} >> 5, 0);")
        if em.elected_used:       # (the prologue: every warp converged, the elected lane is lane 0)
            prologue.append(f"const bool {em.elected_name} = hl_elect_one();")
        smem_total = max(k.smem_bytes, max((off + MBAR_ALIGN * n for _, off, n in bars), default=0))
        head = self.header(kname, bars, smem_total)
        attrs = f"__launch_bounds__({k.threads}, {mb})" if (mb := self.min_blocks()) \
            else f"__launch_bounds__({k.threads})"
        if k.cluster:
            dims = tuple(k.cluster) + (1,) * (3 - len(k.cluster))
            attrs = f"__cluster_dims__({', '.join(str(int(d)) for d in dims)}) " + attrs
        sig = [f'extern "C" __global__ void {attrs} {kname}(']
        sig += [f"    {d}{',' if i < len(decls) - 1 else ') {'}" for i, d in enumerate(decls)]
        if not decls:
            sig = [f'extern "C" __global__ void {attrs} {kname}() {{']
        helpers = helper_source(em.helpers)
        text = head + [""] + self.includes() + [""]
        text += ["#pragma nv_diag_suppress 177  // declared but never referenced",
                 "#pragma nv_diag_suppress 550  // set but never used", ""]
        if helpers:
            text += helpers.split("\n") + [""]
        text += sig + [_INDENT + s for s in prologue + regs] + self.lines + ["}", ""]
        return GeneratedKernel(kname, "\n".join(text), k.arch, k.threads, smem_total, tuple(args),
                               tuple(k.grid), tuple(k.cluster) if k.cluster else None)

    def includes(self) -> list[str]:
        k = self.k
        dts = [a.dtype for a in k.registers] + [b.dtype for b in k.smem]
        dts += [p.dtype for p in k.params]
        names = {d.name for d in dts}
        out = ["#include <cuda_fp16.h>"]
        if "bf16" in names:
            out.append("#include <cuda_bf16.h>")
        if any(is_fp8(d) for d in dts):
            out.append("#include <cuda_fp8.h>")
        return out

    def min_blocks(self) -> int | None:
        """``__launch_bounds__``'s minBlocksPerMultiprocessor: the kernel's own, else 1 where
        ``setmaxnreg`` needs the register count at entry (ptxas derives it from minBlocks),
        else none (the compiler's choice)."""
        k = self.k
        if k.min_blocks is not None:
            return k.min_blocks
        return 1 if any(isinstance(i, SetMaxNReg) for i in walk_instrs(k.body)) else None

    def header(self, kname: str, bars: list[tuple[str, int, int]], smem_total: int) -> list[str]:
        k = self.k
        src = f" ({k.loc.format()})" if k.loc is not None else ""
        grid = ", ".join(to_c(g) for g in k.grid)
        lines = [f"// hexlayout kernel `{k.name}`{src} for {k.arch}: generated by hexlayout.codegen.",
                 f"// launch: grid ({grid}), {k.threads} threads, {smem_total} bytes of dynamic shared memory"
                 + (f", cluster {tuple(k.cluster)}" if k.cluster else "")]
        if k.smem or bars:
            lines.append("// shared memory (byte ranges):")
            for b in k.smem:
                lay = getattr(b, "layout", None)
                lines.append(f"//   {b.name:<16} {b.dtype.name:<5} [{b.offset}, {b.offset + b.nbytes})"
                             f" align {b.align}" + (f"  layout {lay}" if lay is not None else ""))
            for name, off, n in bars:
                lines.append(f"//   {name + f'[{n}]':<16} mbar  [{off}, {off + MBAR_ALIGN * n})")
        if k.registers:
            lines.append("// registers (per thread):")
            for a in k.registers:
                lay = getattr(a, "layout", None)
                tv = f"  TV layout {lay}" if lay is not None else ""
                lines.append(f"//   {a.name:<16} {a.dtype.name}[{a.count}]{tv}")
        return lines


def _wgmma_arrays(body: list[Instr]) -> list[RegArray]:
    out: list[RegArray] = []
    for ins in walk_instrs(body):
        if isinstance(ins, Wgmma):
            for r in (ins.d, ins.a):
                if isinstance(r, RegRef) and all(r.array is not a for a in out):
                    out.append(r.array)
    return out


def generate(kernel: LoweredKernel) -> GeneratedKernel:
    """Print ``kernel`` as CUDA C++; raises ``CodegenError`` naming the offending instruction."""
    return _Printer(kernel).run()


def generate_cuda(kernel: LoweredKernel) -> str:
    """The CUDA C++ source of ``kernel`` (see ``generate`` for the launch metadata)."""
    return generate(kernel).source

