"""Lower a tile program whose layouts and instructions are all fixed to the per-thread program.

``lower_kernel(tile_kernel, arch)`` walks the ops in order and keeps, for every tile value,
where its elements live (``GlobalTileView``, ``SharedTileView`` or ``RegisterTile``).
Each op becomes instructions (see ``copy``, ``mma``, ``math``); control flow maps to
``ForLoop`` / ``IfThen``. Shared buffers are packed in order of allocation, each aligned
to its swizzle period (at least 128 bytes). Conditions on launch arguments that the
instructions rely on (alignment, divisibility) are collected as ``requirements``.

Every failure is a ``LoweringError`` naming the kernel, the op, its tensors and its
source line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexlayout.arch import atom_spec, get_arch, get_atom
from hexlayout.errors import HexlayoutError
from hexlayout.layout import ComposedLayout, Layout
from hexlayout.layout.tv_maps import same_function

from ..accumulator_handoff import handoff_regions
from ..assignment import EMPTY, Assignment
from ..expr import BinOp, ExprLike, Var, as_expr
from ..functions import ALU_FUNCTIONS
from ..lowered import (
    Alu,
    BarSync,
    ClusterBarrier,
    Comment,
    CpAsyncCommit,
    CpAsyncWait,
    FenceProxyAsync,
    ForLoop,
    IfThen,
    Instr,
    LdGlobal,
    LoweredKernel,
    MbarArrive,
    MbarInit,
    MbarRef,
    MbarWait,
    RegArray,
    SetMaxNReg,
    Shfl,
    SmemBuffer,
    TmaDesc,
    TmaLoad,
    WarpSync,
    WgmmaCommit,
    WgmmaFence,
    WgmmaWait,
)
from ..mapping import TaskMapping
from ..tile import (
    Alloc,
    AsyncCommit,
    AsyncWait,
    Block,
    Cast,
    ClusterSync,
    Copy,
    Elementwise,
    Fill,
    For,
    GlobalView,
    If,
    Iota,
    Mbarrier,
    MbarrierArrive,
    MbarrierInit,
    MbarrierWait,
    Mma,
    Op,
    Permute,
    Rearrange,
    Reduce,
    Scan,
    Slice,
    SubTile,
    Sync,
    TileKernel,
    Value,
)
from ..tile import (
    FenceProxyAsync as TileFenceProxyAsync,
)
from ..tile import (
    SetMaxNReg as TileSetMaxNReg,
)
from ..tile import (
    WgmmaCommit as TileWgmmaCommit,
)
from ..tile import (
    WgmmaFence as TileWgmmaFence,
)
from ..tile import (
    WgmmaWait as TileWgmmaWait,
)
from ..tiled_mma import TiledMma
from ..tiled_umma import TiledUmma
from ..types import Scope
from . import atomic, regroup  # noqa: F401 - their lowering rules register in LOWERING
from .conversions import conversion
from .copy import Requirement, lower_reg_mem
from .copy_rules import COPY_RULES, CopyChoice, CopyContext, legal_copies, lower_choice
from .indirect import lower_gathered_view
from .math import lower_elementwise, lower_fill, lower_iota, lower_reduce
from .mma import lower_mma
from .rejection import Rejection
from .rules import LOWERING
from .scan import lower_scan
from .umma import (
    TmemState,
    is_umma,
    lower_umma,
    same_region_ops,
    umma_arrive,
    umma_commit,
    umma_fence,
    umma_wait,
)
from .views import GlobalTileView, RegisterTile, SharedTileView

__all__ = ["LOWERING", "Lowering", "LoweringError", "lower_kernel", "LoweredProgram", "assigned_copy",
           "CopyChooser"]


class LoweringError(HexlayoutError, ValueError):
    """A tile op that cannot be lowered, with the kernel, op, tensors and source line."""

    def __init__(self, kernel: str, op: Op | None, message: str) -> None:
        self.reason = Rejection.of(message)     # the reason as a value (no kernel, op or line in it)
        where = ""
        if op is not None and op.loc is not None:
            where = f" at {op.loc.format(full_path=True, code='backticks')}"
        name = _op_name(op) if op is not None else "kernel"
        self.located = f"{name}{where}: {self.reason}"      # the message without the kernel's name
        super().__init__(f"{kernel}: {self.located}")
        self.kernel = kernel
        self.op = op
        self.loc = op.loc if op is not None else None


def _op_name(op: Op) -> str:
    return {"Copy": "copy", "Mma": "mma", "Elementwise": "elementwise", "Alloc": "alloc",
            "AtomicAdd": "atomic_add", "ScalarLoad": "load"}.get(
        type(op).__name__, type(op).__name__.lower())


@dataclass
class LoweredProgram:
    kernel: LoweredKernel
    requirements: list[Requirement] = field(default_factory=list)
    choices: list[tuple[Op, str]] = field(default_factory=list)   # (op, instruction chosen)
    offline: dict[str, Any] = field(default_factory=dict)         # hl.offline tensor -> OfflineLayout


# a copy's instruction, ``choose(lowering, op, context)``: the legal choice or why there is none
CopyChooser = Callable[[Any, Copy, CopyContext], "list[CopyChoice] | Rejection"]


class Lowering:
    """The lowering of one tile kernel under one assignment: the views of its tiles, its
    registers, shared buffers, tensor maps and mbarriers, and one rule per op class
    (``LOWERING``). A copy's instruction is the assignment's or the program's ``instruction=``
    (``assigned_copy``): the lowering chooses nothing (synthesis's legality rule for copies
    passes its own choice to ``lower_copy``, ``hexlayout.ir.lower.legality``)."""

    def __init__(self, tk: TileKernel, arch: str, assignment: Assignment | None = None) -> None:
        self.tk = tk
        self.assignment = assignment if assignment is not None else EMPTY
        self.arch = get_arch(arch)
        tid = tk.launch.thread_index
        self.tid: Var = tid if tid is not None else Var("threadIdx.x", 0, tk.launch.threads, "thread")
        self.threads = tk.launch.threads
        self.views: dict[int, Any] = {}
        self.smem: list[SmemBuffer] = []
        self.smem_top = 0
        self.regs: list[RegArray] = []
        self.reg_names: set[str] = set()
        self.reqs: list[Requirement] = []
        self.tma: list[TmaDesc] = []
        self.mbars: dict[int, MbarRef] = {}
        self.choices: list[tuple[Op, str]] = []
        self.offline: dict[str, Any] = {}                    # offline tensor -> its OfflineLayout
        self.copy_choices: dict[int, tuple[str, str]] = {}   # copy op uid -> (rule family, name)
        self.elect: list[ExprLike] = [as_expr(self.tid).eq(0)]
        self.group_threads: list[tuple[int, int]] = [(0, self.threads)]
        self.tmem: Any = None        # tensor memory of tcgen05 mmas (``umma.TmemState``), on first use
        self._handoff: dict[int, tuple[int, int]] | None = None

    @property
    def handoff(self) -> dict[int, tuple[int, int]]:
        """Per root id of a tcgen05 accumulator read by another warp role, the readers' threads
        (``ir.accumulator_handoff``; computed at the kernel's top level on first use)."""
        if self._handoff is None:
            self._handoff = {}
            if self.arch.name == "sm_100a":
                regions = handoff_regions(self.tk, self.op_regions())
                self._handoff = {op.c.root.id: regions[op.uid] for op in self.tk.body.walk()
                                 if isinstance(op, Mma) and op.uid in regions}
        return self._handoff

    def op_regions(self) -> dict[int, tuple[int, int]]:
        """The thread range ``[lo, hi)`` that runs each op of the kernel (by ``id(op)``)."""
        regions: dict[int, tuple[int, int]] = {}
        saved, self.group_threads = self.group_threads, [(0, self.threads)]

        def walk(b: Block) -> None:
            for op in b.ops:
                regions[id(op)] = self.group_threads[-1]
                if isinstance(op, For):
                    walk(op.body)
                elif isinstance(op, If):
                    for region, body in zip(self.branch_regions(op), (op.then_body, op.else_body)):
                        if body is None:
                            continue
                        if region is not None:
                            self.group_threads.append(region)
                        walk(body)
                        if region is not None:
                            self.group_threads.pop()

        try:
            walk(self.tk.body)
        finally:
            self.group_threads = saved
        return regions

    # --- the threads running the current region (warp specialization) -----------------
    @property
    def gthreads(self) -> int:
        lo, hi = self.group_threads[-1]
        return hi - lo

    @property
    def gtid(self) -> ExprLike:
        """The thread index relative to the first thread of the current region, ``tid - lo``,
        with the bounds it has there, ``[0, hi - lo)`` (the expression is built for the
        region's code only), so that its divisions and remainders print as C's, not as floor
        corrections of a maybe-negative operand, and fold where its range allows."""
        lo, hi = self.group_threads[-1]
        if lo == 0:
            return self.tid
        e = as_expr(self.tid) - lo
        if isinstance(e, BinOp):
            object.__setattr__(e, "_bounds", (0, hi - lo))
        return e

    # --- errors / naming -------------------------------------------------------------
    def fail(self, op: Op | None, msg: str | Rejection) -> LoweringError:
        return LoweringError(self.tk.name, op, msg)

    def _reg_name(self, base: str) -> str:
        name = base if base.isidentifier() else "r"
        k = 0
        while name in self.reg_names:
            k += 1
            name = f"{base}_{k}"
        self.reg_names.add(name)
        return name

    # --- storage ---------------------------------------------------------------------
    def view(self, v: Value, op: Op) -> Any:
        try:
            return self.views[v.id]
        except KeyError:
            root = v.root
            lay = self.layout(root)
            if v.scope == Scope.SHARED and not isinstance(lay, (Layout, ComposedLayout)):
                raise self.fail(op, f"shared tile %{root.name} has no layout ({lay}); give one or run "
                                "synthesis") from None
            raise self.fail(op, f"%{v.name} is used before it is defined") from None

    def layout(self, v: Value) -> Any:
        """The layout of ``v``: the assignment's, else the program's (none: ``v`` is refused
        where it is allocated)."""
        return self.assignment.layout_of(v)

    def alloc_shared(self, v: Value, op: Op) -> SharedTileView:
        lay = self.layout(v)
        if not isinstance(lay, (Layout, ComposedLayout)):
            raise self.fail(op, f"shared tile %{v.name} has no layout ({lay}); give one or run synthesis")
        eb = v.type.dtype.bits
        n = v.type.size
        probe = SharedTileView.of(SmemBuffer(v.name, v.type.dtype, 0), v.type.dtype, tuple(v.type.shape), lay)
        offs = probe.offsets(np.arange(n))
        if offs.min() < 0:
            raise self.fail(op, f"shared layout {lay} of %{v.name} maps an element to a negative offset")
        if len(np.unique(offs)) != n:
            raise self.fail(op, f"shared layout {lay} of %{v.name} maps two elements to one offset")
        nbytes = (int(offs.max()) + 1) * eb // 8
        period = probe.swizzle.period() * eb // 8 if probe.swizzle is not None else 0
        align = max(128, period)
        nbytes = -(-nbytes // align) * align
        start = -(-self.smem_top // align) * align
        buf = SmemBuffer(v.name, v.type.dtype, nbytes, start, align)
        self.smem.append(buf)
        self.smem_top = start + nbytes
        return SharedTileView.of(buf, v.type.dtype, tuple(v.type.shape), lay)

    def alloc_register(self, v: Value, op: Op) -> RegisterTile:
        lay = self.layout(v)
        if not isinstance(lay, Layout):
            raise self.fail(op, f"register tile %{v.name} has no TV layout ({lay}); "
                            "give one or run synthesis")
        region = self.handoff.get(v.root.id, self.group_threads[-1])   # a handed-off accumulator:
        threads = region[1] - region[0]                                  # its readers' registers
        if lay.size() % threads:
            raise self.fail(op, f"TV layout {lay} of %{v.name} does not spread over the "
                            f"{threads} threads that run it")
        values = lay.size() // threads
        idx = lay.indices()
        if idx.min() < 0 or idx.max() >= v.type.size:
            raise self.fail(op, f"TV layout {lay} of %{v.name} reaches outside its "
                            f"{v.type.size}-element tile")
        missing = v.type.size - len(np.unique(idx))
        if missing:
            raise self.fail(op, f"TV layout {lay} of %{v.name} leaves {missing} tile elements unheld")
        arr = RegArray(self._reg_name(v.name), v.type.dtype, values)
        self.regs.append(arr)
        tile = RegisterTile(arr, v.type.dtype, tuple(v.type.shape), lay, threads)
        tile.extra["range"] = region
        return tile

    def scratch(self, base: str, dtype: Any, count: int) -> RegArray:
        arr = RegArray(self._reg_name(base), dtype, count)
        self.regs.append(arr)
        return arr

    def register_of(self, v: Value, op: Op) -> RegisterTile:
        """The register tile ``v`` names; an op result not yet allocated is allocated now from
        its assigned layout."""
        if v.id not in self.views:
            self.views[v.id] = self.alloc_register(v, op)
        t = self.views[v.id]
        if not isinstance(t, RegisterTile):
            raise self.fail(op, f"%{v.name} is a {v.scope} tile, not a register tile")
        issuer = isinstance(op, Mma) and v is op.c and v.root.id in self.handoff    # its MMA role
        if t.extra.get("range") != self.group_threads[-1] and not issuer:
            lo, hi = t.extra.get("range", (0, 0))
            raise self.fail(op, f"register tile %{v.name} belongs to threads [{lo}, {hi}); this op runs on "
                            f"threads {list(self.group_threads[-1])}")
        return t

    # --- ops -------------------------------------------------------------------------
    def block(self, b: Block) -> list[Instr]:
        out: list[Instr] = []
        for i, op in enumerate(b.ops):
            try:
                if self.tmem is not None and self.tmem.pending:   # an accumulator in TMEM read here
                    out += self.tmem.loads_before(self, op)
                if self.arch.name == "sm_100a" and self.assignment.mma:  # registers a tcgen05 mma adds to
                    out += TmemState.of(self).stores_before(self, op) if _has_umma(self, op) else []
                    if is_umma(self, op):                       # a register A the MMA reads from TMEM
                        out += TmemState.of(self).a_stores_before(self, b.ops[i:])
                instrs = self.op(op)
            except LoweringError:
                raise
            except ValueError as e:
                raise self.fail(op, str(e)) from None
            for ins in instrs:
                if ins.loc is None:
                    ins.loc = op.loc
                if not ins.origin:
                    ins.origin = _op_name(op)
            out += instrs
        return out

    def op(self, op: Op) -> list[Instr]:
        """The instructions of ``op``: its lowering rule (``LOWERING``, by op class)."""
        rule = LOWERING.rule(type(op))
        if rule is None:
            raise self.fail(op, f"{type(op).__name__} cannot be lowered yet")
        return rule(self, op)

    @LOWERING.register(GlobalView)
    def op_GlobalView(self, op: GlobalView) -> list[Instr]:
        if op.index_map is not None or op.gather is not None:   # a gather (hexlayout.ir.gather)
            return lower_gathered_view(self, op)
        p = op.param
        shape = tuple(op.result.type.shape)
        rank = len(p.shape)
        if len(shape) != rank:
            raise self.fail(op, f"a {len(shape)}-mode window of the {rank}-mode tensor {p.name}")
        self.views[op.result.id] = GlobalTileView(p, p.dtype, shape, tuple(range(rank)), tuple(op.origin),
                                                  tuple(op.extent))
        return []

    @LOWERING.register(Alloc)
    def op_Alloc(self, op: Alloc) -> list[Instr]:
        v = op.result
        if v.scope == Scope.SHARED:
            self.views[v.id] = self.alloc_shared(v, op)
        elif v.scope == Scope.REGISTER and v.root.id not in self.handoff:   # (a handed-off one: at
            self.views[v.id] = self.alloc_register(v, op)                  # its first use)
        elif v.scope == Scope.REGISTER:
            pass
        else:
            raise self.fail(op, f"cannot allocate a {v.scope} tile")
        return []

    def _derived_view(self, op: Op, src: Value, make: Any) -> list[Instr]:
        base = self.view(src, op)
        if isinstance(base, RegisterTile):
            from .register_views import lower_register_window

            return lower_register_window(self, op, base)
        self.views[op.result.id] = make(base)
        return []

    @LOWERING.register(Slice)
    def op_Slice(self, op: Slice) -> list[Instr]:
        return self._derived_view(op, op.src, lambda b: b.slice(tuple(op.index)))

    @LOWERING.register(SubTile)
    def op_SubTile(self, op: SubTile) -> list[Instr]:
        def make(b: Any) -> Any:
            try:
                return b.subtile(tuple(op.result.type.shape), tuple(op.offset))
            except ValueError as e:      # a window the synthesized shared layout cannot express
                raise self.fail(op, f"window {tuple(op.result.type.shape)} of %{op.src.name}: {e}") from None
        return self._derived_view(op, op.src, make)

    @LOWERING.register(Permute)
    def op_Permute(self, op: Permute) -> list[Instr]:
        if op.src.scope == Scope.REGISTER:
            return self.register_permute(op)

        return self._derived_view(op, op.src, lambda b: b.permute(tuple(op.perm)))

    def register_permute(self, op: Permute) -> list[Instr]:
        """``x.T`` of a register tile: the same registers under ``P o tv`` (``register_views``)."""
        from .register_views import permuted_tile

        view = permuted_tile(self.register_of(op.src, op), tuple(op.perm))
        lay = self.layout(op.result)
        if isinstance(lay, Layout) and not same_function(lay, view.tv):
            raise self.fail(op, f"the view of %{op.src.name} with modes {tuple(op.perm)} has layout "
                            f"{view.tv}, not {lay}")
        self.views[op.result.id] = view
        return []

    # copies
    @LOWERING.register(Copy)
    def op_Copy(self, op: Copy) -> list[Instr]:
        return self.lower_copy(op, assigned_copy)

    def lower_copy(self, op: Copy, choose: CopyChooser) -> list[Instr]:
        """The instructions of ``op`` with the instruction ``choose(self, op, ctx)`` gives."""
        # a register source computed by an op a probe did not lower (an elementwise result
        # copied to shared memory) is allocated from its assigned layout
        src = (self.register_of(op.src, op) if op.src.scope == Scope.REGISTER and op.src.id not in self.views
               else self.view(op.src, op))
        dst = self.register_of(op.dst, op) if op.dst.scope == Scope.REGISTER else self.view(op.dst, op)
        if isinstance(op.mask, Value):
            return self.masked_copy(op, src, dst)
        if isinstance(src, RegisterTile) and isinstance(dst, RegisterTile):
            raise self.fail(op, f"register-to-register copy %{op.src.name} -> %{op.dst.name}: use rearrange")
        if isinstance(src, GlobalTileView) and src.param.offline and not isinstance(dst, RegisterTile):
            raise self.fail(op, f"offline tensor {src.param.name} can only be copied into a register tile "
                            f"(its storage order is that of the register tile's layout), not %{op.dst.name}")
        ctx = self.copy_context(op, src, dst)
        if not any(rule.instructions(ctx) for rule in COPY_RULES):
            raise self.fail(op, f"cannot copy a {op.src.scope} tile into a {op.dst.scope} tile")
        res = choose(self, op, ctx)
        if isinstance(res, Rejection):
            if res.alternatives:
                res = Rejection(f"no instruction can copy %{op.src.name} ({op.src.type}) into "
                                f"%{op.dst.name} ({op.dst.type})", alternatives=res.alternatives)
            raise self.fail(op, res)
        plan_ok = res[0].plan
        self.copy_choices[op.uid] = (res[0].rule, res[0].name)
        if plan_ok.desc is not None:
            desc = self.tma_desc(plan_ok.desc)
            for ins in plan_ok.instrs:
                ins.desc = desc
        self.regs += plan_ok.scratch
        self.reqs += plan_ok.requirements
        if plan_ok.offline is not None:
            self.record_offline(op, plan_ok.offline)
        self.choices.append((op, plan_ok.instruction))
        if op.mask is not None:
            _and_predicate(plan_ok.instrs, as_expr(op.mask))
        if op.multicast is not None:
            if not plan_ok.instruction.startswith("SM90_TMA_LOAD"):
                raise self.fail(op, f"multicast= needs a TMA load; this copy is {plan_ok.instruction}")
            for ins in plan_ok.instrs:
                if isinstance(ins, TmaLoad):
                    ins.multicast = op.multicast
        if op.pair_barrier:
            if not plan_ok.instruction.startswith("SM90_TMA_LOAD"):
                raise self.fail(op, f"pair_barrier= needs a TMA load; this copy is {plan_ok.instruction}")
            if self.arch.name != "sm_100a":
                raise self.fail(op, f"pair_barrier= (cp.async.bulk.tensor.cta_group::2) needs sm_100a; the "
                                f"kernel is lowered for {self.arch.name}")
            for ins in plan_ok.instrs:
                if isinstance(ins, TmaLoad):
                    ins.pair_bar = True
        loads: list[Instr] = []
        for view in (src, dst):
            gather = view.gather if isinstance(view, GlobalTileView) else None
            if gather is not None:
                if plan_ok.instruction.startswith("SM90_TMA"):
                    raise self.fail(op, "TMA cannot gather rows; copy gathered rows with cp.async")
                loads += gather.take_loads()
        return loads + _other_fill(plan_ok.instrs, op.other)

    def record_offline(self, op: Copy, lay: Any) -> None:
        """Note the layout an offline load defines; every copy of one offline tensor must define
        the same one (one storage order per tensor)."""
        old = self.offline.get(lay.param)
        if old is not None and old.key != lay.key:
            raise self.fail(op, f"offline tensor {lay.param}: this copy needs the storage order {lay.key} "
                            f"(tile {lay.tile}, register layout {lay.tv}) but an earlier copy chose "
                            f"{old.key} "
                            f"(tile {old.tile}, register layout {old.tv}); copy one tile shape into tiles "
                            "of one layout")
        self.offline[lay.param] = lay

    def masked_copy(self, op: Copy, src: Any, dst: Any) -> list[Instr]:
        """A copy masked by a predicate tile (``masked.py``): one predicated access per element."""
        from .masked import lower_masked_copy

        assert isinstance(op.mask, Value)
        plan = lower_masked_copy(src, dst, self.register_of(op.mask, op), self.gtid, op.src.type.dtype.bits,
                                 (op.src.name, op.dst.name, op.mask.name))
        if isinstance(plan, Rejection):
            raise self.fail(op, plan)
        self.reqs += plan.requirements
        self.choices.append((op, plan.instruction))
        return _other_fill(plan.instrs, op.other)

    def copy_context(self, op: Copy, src: Any, dst: Any) -> CopyContext:
        """What the copy rules see of ``op`` (views, threads, arch, the instruction asked for)."""
        bar = self.mbar_ref(op.mbarrier, op.mbarrier_index, op) if op.mbarrier is not None else None

        def scratch(dtype: Any, count: int) -> RegArray:
            return RegArray(self._reg_name(f"{op.src.root.name}_tmp"), dtype, count)

        return CopyContext(src, dst, self.gtid, self.gthreads, op.src.type.dtype.bits, self.arch,
                           op.instruction, bar, self.elect[-1], (op.src.name, op.dst.name), scratch,
                           self.region_barrier if op.mask is None else None)

    def tma_desc(self, desc: TmaDesc) -> TmaDesc:
        """One tensor map per (tensor, box, dims, swizzle): reuse an equal one."""
        for d in self.tma:
            if (d.param is desc.param and d.box == desc.box and d.dims == desc.dims
                    and d.swizzle_bytes == desc.swizzle_bytes):
                return d
        n = sum(d.param is desc.param for d in self.tma)
        desc.name = f"tma_{desc.param.name}" + (str(n) if n else "")
        self.tma.append(desc)
        return desc

    # mma
    @LOWERING.register(Mma)
    def op_Mma(self, op: Mma) -> list[Instr]:
        chosen = self.assignment.mma.get(op.uid)
        if isinstance(chosen, TiledUmma):
            a, b = (self.view(x, op) if x.scope == Scope.SHARED else self.register_of(x, op)
                    for x in (op.a, op.b))
            res = lower_umma(self, op, chosen, a, b, self.register_of(op.c, op))
            self.choices.append((op, str(chosen)))
            return res
        if chosen is not None:
            atom_name, warps, k_inner = atom_spec(chosen.atom), chosen.warps, chosen.k_inner
        else:
            atom_name, warps, k_inner = op.atom, op.warps, op.k_inner
        if atom_name is None or warps is None:
            raise self.fail(op, "the mma atom and warp arrangement are not chosen; give atom= and warps= or "
                            "run synthesis")
        atom = get_atom(atom_name)
        if atom.kind == "tcgen05":
            raise self.fail(op, f"{atom.name}: a tcgen05 mma is lowered from synthesis's choice (the "
                            "accumulator's TMEM layout and load); run synthesis for sm_100a, atom= left out")
        if atom.arch not in ("sm_80", "sm_89", "sm_90a") or self.arch.name not in atom.archs:
            raise self.fail(op, f"{atom.name} needs {atom.arch}; the kernel is lowered for {self.arch.name}")
        if not isinstance(warps, TaskMapping):
            raise self.fail(op, f"warps={warps!r} is not a task mapping")
        k = op.a.type.shape[1]
        if k % atom.k:
            raise self.fail(op, f"K = {k} is not a multiple of the atom's K = {atom.k}")
        tm = TiledMma(atom, warps, k // atom.k, k_inner)
        m, n, kk = tm.tile_mnk
        if (m, n, kk) != (op.c.type.shape[0], op.c.type.shape[1], k):
            raise self.fail(op, f"{tm} covers {m}x{n}x{kk}, the operands are "
                            f"{op.c.type.shape[0]}x{op.c.type.shape[1]}x{k}")
        if tm.threads != self.gthreads:
            raise self.fail(op, f"{tm} needs {tm.threads} threads; {self.gthreads} threads run it")
        a = self.view(op.a, op) if op.a.scope == Scope.SHARED else self.register_of(op.a, op)
        b = self.view(op.b, op) if op.b.scope == Scope.SHARED else self.register_of(op.b, op)
        c = self.register_of(op.c, op)
        res = lower_mma(tm, a, b, c, self.gtid, op.a.type.dtype.bits, op.accumulate)
        if isinstance(res, str):
            raise self.fail(op, Rejection.of(res).tried(str(tm)))
        self.choices.append((op, str(tm)))
        return res

    # register math
    def _operand(self, x: Any, op: Op) -> Any:
        if isinstance(x, Value):
            return self.register_of(x, op)
        return x

    @LOWERING.register(Elementwise)
    def op_Elementwise(self, op: Elementwise) -> list[Instr]:
        if op.fn not in ALU_FUNCTIONS:
            raise self.fail(op, f"unknown elementwise function {op.fn!r}")
        args = [self._operand(a, op) for a in op.args]
        dst = self.register_of(op.result, op)
        res = lower_elementwise(op.fn, dst, args)
        if isinstance(res, str):
            raise self.fail(op, res)
        return res

    @LOWERING.register(Cast)
    def op_Cast(self, op: Cast) -> list[Instr]:
        src = self.register_of(op.src, op)
        fn = conversion(self.tk, op)            # cvt, or a magic-number conversion exact for src's values
        res = lower_elementwise(fn, self.register_of(op.result, op), [src])
        if isinstance(res, str):
            raise self.fail(op, res)
        if fn != "cvt":
            self.choices.append((op, str(fn)))
        return res

    @LOWERING.register(Fill)
    def op_Fill(self, op: Fill) -> list[Instr]:
        return lower_fill(self.register_of(op.dst, op), op.value)

    @LOWERING.register(Iota)
    def op_Iota(self, op: Iota) -> list[Instr]:
        return lower_iota(self.register_of(op.result, op), op.axis, self.gtid)

    @LOWERING.register(Reduce)
    def op_Reduce(self, op: Reduce) -> list[Instr]:
        src = self.register_of(op.src, op)
        dst = self.register_of(op.result, op)
        tmp = self.scratch(f"{op.result.name}_shfl", dst.dtype, dst.values)
        res = lower_reduce(op.fn, dst, src, op.axis, tmp, self.gtid,
                           lambda nbytes: self.exchange_buffer(f"{op.result.name}_xchg", dst.dtype, nbytes),
                           valid=op.valid, overwrite=op.overwrite)
        if not isinstance(res, str) and any(isinstance(i, BarSync) for i in res):
            self.choices.append((op, "warp shuffles + shared memory across warps"))
        if isinstance(res, str):
            raise self.fail(op, res)
        return res

    @LOWERING.register(Scan)
    def op_Scan(self, op: Scan) -> list[Instr]:
        srcs = [self.register_of(v, op) for v in op.srcs]
        dst = self.register_of(op.result, op)
        init, carry = (self.register_of(v, op) if v is not None else None for v in (op.init, op.carry))
        res = lower_scan(op.fn, dst, srcs, op.axis, op.reverse, init, self.gtid,
                         lambda name, count: self.scratch(f"{op.result.name}_{name}", dst.dtype, count),
                         lambda nbytes: self.exchange_buffer(f"{op.result.name}_xchg", dst.dtype, nbytes),
                         valid=op.valid, carry=carry)
        if isinstance(res, str):
            raise self.fail(op, res)
        shfl, bar = (any(isinstance(i, c) for i in res) for c in (Shfl, BarSync))
        if bar:
            self.choices.append((op, "warp shuffles + shared memory across warps" if shfl
                                 else "rows in order through shared memory"))
        return res

    @LOWERING.register(Rearrange)
    def op_Rearrange(self, op: Rearrange) -> list[Instr]:
        """Redistribute a register tile through a shared scratch tile (row-major): every
        thread stores its values, a barrier, every thread loads the values its new layout
        holds, a barrier (so the scratch can be reused)."""
        src = self.register_of(op.src, op)
        dst = self.register_of(op.result, op)
        shape = tuple(op.src.type.shape)
        n = op.src.type.size
        eb = op.src.type.dtype.bits
        scratch, _ = self.exchange_buffer(f"{op.result.name}_xchg", op.src.type.dtype, n * eb // 8)
        strides, s = [], 1
        for e in reversed(shape):
            strides.append(s)
            s *= e
        view = SharedTileView(scratch, op.src.type.dtype, shape,
                              Layout(shape, tuple(reversed(strides))) if len(shape) > 1 else Layout(shape[0]))
        st = lower_reg_mem(src, view, False, self.gtid, eb)
        ld = lower_reg_mem(dst, view, True, self.gtid, eb)
        for name, plan in (("store", st), ("load", ld)):
            if isinstance(plan, str):
                raise self.fail(op, f"rearrange {name} through shared memory: {plan}")
        self.choices.append((op, f"{st.instruction} + {ld.instruction} through shared memory"))
        return st.instrs + [self.region_barrier()] + ld.instrs + [self.region_barrier()]

    def region_barrier(self) -> BarSync:
        """A barrier of the threads running the current region (a named one inside a warp-group
        branch, so the other warp groups are not waited for)."""
        lo, hi = self.group_threads[-1]
        if (lo, hi) == (0, self.threads):
            return BarSync()
        return BarSync(1 + lo // 128, hi - lo)

    def exchange_buffer(self, name: str, dtype: Any, nbytes: int) -> tuple[SmemBuffer, Any]:
        """A shared scratch buffer of ``nbytes`` (128-byte aligned) and a barrier factory."""
        buf = SmemBuffer(self._reg_name(name), dtype, -(-nbytes // 128) * 128)
        buf.offset = -(-self.smem_top // 128) * 128
        self.smem.append(buf)
        self.smem_top = buf.offset + buf.nbytes
        return buf, self.region_barrier

    # synchronization
    @LOWERING.register(Sync)
    def op_Sync(self, op: Sync) -> list[Instr]:
        """``syncthreads``: a barrier of the block, or of the warp groups running the current
        branch (a named barrier, so the other warp groups are not waited for)."""
        return [self.region_barrier()]

    def mbar_ref(self, bar: Any, index: ExprLike, op: Op) -> MbarRef:
        if not isinstance(bar, Mbarrier):
            raise self.fail(op, f"{bar!r} is not an mbarrier")
        return MbarRef(bar.name, index, bar.count)

    @LOWERING.register(MbarrierInit)
    def op_MbarrierInit(self, op: MbarrierInit) -> list[Instr]:
        return [MbarInit(self.mbar_ref(op.bar, op.index, op), op.arrivals, pred=self.elect[-1])]

    @LOWERING.register(MbarrierArrive)
    def op_MbarrierArrive(self, op: MbarrierArrive) -> list[Instr]:
        pred: ExprLike | None = None
        t = as_expr(self.tid)
        if op.who == "mma":
            if not any(isinstance(tu, TiledUmma) for tu in self.assignment.mma.values()):
                raise self.fail(op, "arrive(who='mma') is a tcgen05.commit: the kernel has no tcgen05 mma "
                                    f"(sm_100a); it is lowered for {self.arch.name}")
            return umma_arrive(self, self.mbar_ref(op.bar, op.index, op))
        sync: list[Instr] = []
        if op.who == "one":
            pred = self.elect[-1]
        elif op.who == "warp":      # lane 0 arrives for its warp, after a __syncwarp orders the lanes' work
            pred = (t % 32).eq(0)
            sync = [WarpSync()]
        elif op.who == "warpgroup":
            pred = (t % 128).eq(0)
        # an arrive on a peer CTA's barrier in a kernel of tcgen05 mmas may release TMEM reads to the
        # peer's MMA issuer (a pair's epilogue: the even CTA's MMAs write the odd CTA's TMEM): cluster scope
        tc = op.cta is not None and any(isinstance(tu, TiledUmma) for tu in self.assignment.mma.values())
        return sync + [MbarArrive(self.mbar_ref(op.bar, op.index, op), op.tx_bytes, op.cta, pred=pred,
                                  scope="cluster" if tc else "cta")]

    @LOWERING.register(MbarrierWait)
    def op_MbarrierWait(self, op: MbarrierWait) -> list[Instr]:
        return [MbarWait(self.mbar_ref(op.bar, op.index, op), op.phase)]

    @LOWERING.register(TileFenceProxyAsync)
    def op_FenceProxyAsync(self, op: TileFenceProxyAsync) -> list[Instr]:
        # no async proxy before sm_90: nothing to order
        return [FenceProxyAsync()] if self.arch.has_tma else []

    @LOWERING.register(ClusterSync)
    def op_ClusterSync(self, op: ClusterSync) -> list[Instr]:
        if not self.arch.has_clusters:
            raise self.fail(op, f"cluster barriers need sm_90; the kernel is lowered for {self.arch.name}")
        return [ClusterBarrier()]

    # control flow
    @LOWERING.register(For)
    def op_For(self, op: For) -> list[Instr]:
        if not any(is_umma(self, o) for o in op.body.walk()):
            return [ForLoop(op.var, op.start, op.stop, op.step, self.block(op.body), op.unroll)]
        tmem = TmemState.of(self)            # tcgen05 mmas in the loop: TMEM state around the back edge
        entry = tmem.enter_loop(self, op)
        body = self.block(op.body)
        body += tmem.leave_loop(self, op, entry)
        return [ForLoop(op.var, op.start, op.stop, op.step, body, op.unroll)]

    def warp_group_region(self, groups: tuple[int, ...] | None, op: Op) -> tuple[int, int] | None:
        """The threads ``[lo, hi)`` of the contiguous warp groups ``groups`` (None: no region)."""
        if not groups:
            return None
        groups = tuple(sorted(groups))
        if groups != tuple(range(groups[0], groups[-1] + 1)):
            raise self.fail(op, f"warp groups {groups} are not contiguous")
        return 128 * groups[0], 128 * (groups[-1] + 1)

    def _in_region(self, region: tuple[int, int] | None, body: Block) -> list[Instr]:
        if region is None:
            return self.block(body)
        lo, hi = region
        self.elect.append(as_expr(self.tid).eq(lo))
        self.group_threads.append(region)
        try:
            return self.block(body)
        finally:
            self.elect.pop()
            self.group_threads.pop()

    def branch_regions(self, op: If) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """The threads running the then and else branches of a warp-group ``If`` (the else
        branch: the other warp groups of the current region); None where the branch runs on
        the threads of the current region."""
        then_region = self.warp_group_region(op.warp_groups, op)
        else_region = None
        if op.warp_groups and op.else_body is not None:
            lo, hi = self.group_threads[-1]
            rest = tuple(g for g in range(lo // 128, hi // 128) if g not in op.warp_groups)
            else_region = self.warp_group_region(rest, op)
        return then_region, else_region

    @LOWERING.register(If)
    def op_If(self, op: If) -> list[Instr]:
        then_region, else_region = self.branch_regions(op)
        entry = self.tmem.flow if self.tmem is not None else (frozenset(), frozenset())
        then = self._in_region(then_region, op.then_body)
        if self.tmem is not None:            # each branch starts from the entry's commit/wait flow
            self.tmem.flow = entry
        other = self._in_region(else_region, op.else_body) if op.else_body is not None else []
        if self.tmem is not None:
            self.tmem.leave_if(self, op, entry)
        return [IfThen(op.cond, then, other)]

    # --- driver ----------------------------------------------------------------------
    def run(self) -> LoweredProgram:
        for b in self.tk.mbarriers:
            self.mbars[id(b)] = MbarRef(b.name, 0, b.count)
        body = [Comment(f"kernel {self.tk.name}")] + self.block(self.tk.body)
        if self.tmem is not None:            # tcgen05 mmas: the kernel allocates and frees tensor memory
            body = body[:1] + self.tmem.prologue(self) + body[1:] + self.tmem.epilogue(self)
        if self.smem_top > self.arch.smem_per_block_max:
            limit = self.arch.smem_per_block_max
            raise self.fail(_largest_shared_alloc(self.tk),
                            f"{self.smem_top} bytes of shared memory exceed the {limit} bytes a block may "
                            f"use on {self.arch.name} (the largest shared tile is named here)")
        launch = self.tk.launch
        lk = LoweredKernel(
            name=self.tk.name, params=list(self.tk.params), grid=tuple(launch.grid), threads=self.threads,
            thread_index=self.tid, block_index=tuple(launch.block_index), body=body, registers=self.regs,
            smem=self.smem, mbarriers=list(self.mbars.values()), tma=self.tma, cluster=launch.cluster,
            arch=self.arch.name, loc=self.tk.loc, min_blocks=launch.min_blocks,
        )
        return LoweredProgram(lk, _dedupe(self.reqs), self.choices, dict(self.offline))


def _has_umma(lw: Lowering, op: Op) -> bool:
    """Whether ``op`` is, or nests on the same threads, an mma lowered to tcgen05."""
    return any(is_umma(lw, o) for o in same_region_ops(op))


def _other_fill(instrs: list[Instr], other: float | None) -> list[Instr]:
    """A load with ``other=``: each predicated global load first sets its registers to
    ``other`` and leaves them when predicated off (no zero fill)."""
    if other is None:
        return instrs
    out: list[Instr] = []
    for ins in instrs:
        if isinstance(ins, LdGlobal) and ins.pred is not None:
            out.append(Alu("mov", ins.dst, (other,)))
            ins.zero_fill = False
        out.append(ins)
    return out


def _and_predicate(instrs: list[Instr], cond: Any) -> None:
    """Run ``instrs`` only where ``cond`` holds (a condition of the copy as a whole). A
    predicated-off zero-filling load writes zeros, as for out-of-bounds elements."""
    for ins in instrs:
        ins.pred = cond if ins.pred is None else as_expr(ins.pred).logical_and(cond)


def _dedupe(reqs: list[Requirement]) -> list[Requirement]:
    seen: dict[tuple[str, str, int], Requirement] = {}
    for r in reqs:
        key = (r.param, r.kind, r.mode)
        if key not in seen or r.value > seen[key].value:
            seen[key] = r
    return list(seen.values())


#: tile ops that lower to one instruction carrying the same fields, whatever the layouts (a
#: commit, a wait, a fence, a register budget): ``tile op class -> (instruction, fields)``
ONE_INSTRUCTION: dict[type, tuple[type, tuple[str, ...]]] = {
    AsyncCommit: (CpAsyncCommit, ()),
    AsyncWait: (CpAsyncWait, ("pending",)),
    TileWgmmaFence: (WgmmaFence, ()),
    TileWgmmaCommit: (WgmmaCommit, ()),
    TileWgmmaWait: (WgmmaWait, ("pending",)),
    TileSetMaxNReg: (SetMaxNReg, ("count", "increase")),
}


def _one_instruction(lw: Lowering, op: Op) -> list[Instr]:
    """The instruction ``ONE_INSTRUCTION`` gives ``op``, with ``op``'s fields; on sm_100a the
    wgmma fence / commit / wait of a kernel order its tcgen05 mmas instead (``umma``)."""
    if lw.arch.name == "sm_100a" and isinstance(op, (TileWgmmaFence, TileWgmmaCommit, TileWgmmaWait)):
        if isinstance(op, TileWgmmaFence):
            return umma_fence(lw)
        return umma_commit(lw) if isinstance(op, TileWgmmaCommit) else umma_wait(lw, int(op.pending))
    instr, fields = ONE_INSTRUCTION[type(op)]
    return [instr(*(getattr(op, f) for f in fields))]


LOWERING.register(*ONE_INSTRUCTION)(_one_instruction)


def assigned_copy(lw: Lowering, op: Copy, ctx: CopyContext) -> list[CopyChoice] | Rejection:
    """A copy's instruction as assigned (synthesis's choice), else as the program asks
    (``instruction=``); a copy with neither is refused: the lowering chooses no instruction."""
    given = lw.assignment.copies.get(op.uid)
    if given is not None:
        return lower_choice(ctx, *given)
    if ctx.want is not None:
        return legal_copies(ctx, limit=1)
    raise lw.fail(op, f"no instruction is assigned to the copy of %{op.src.name} into %{op.dst.name}: "
                  "run synthesis (hexlayout.synth.synthesize) or give the copy instruction=")


def lower_kernel(tk: TileKernel, arch: str = "sm_80", assignment: Assignment | None = None) -> LoweredProgram:
    """The per-thread program of ``tk`` for ``arch``: every layout, mma and copy instruction
    as ``assignment`` gives it (synthesis's choices), else as the program gives it. ``tk`` is
    not changed. On architectures with an async proxy (sm_90+) it gets a proxy fence wherever
    generic-proxy shared writes reach a wgmma or TMA store without one
    (``hexlayout.ir.passes.insert_proxy_fences``); its sequential loops go through
    ``hexlayout.ir.passes.optimize_loops`` (loop-invariant code motion, stage rotation), after
    adjacent single-thread branches of one issuer are merged (``lowered.merge_elected``): the
    emulator and the code generator both take this result."""
    from ..lowered import merge_elected
    from ..passes import insert_proxy_fences, optimize_loops

    lowering = Lowering(tk, arch, assignment)
    prog = lowering.run()
    if lowering.arch.has_tma:
        prog.kernel = insert_proxy_fences(prog.kernel)
    prog.kernel = dataclasses.replace(prog.kernel, body=merge_elected(prog.kernel.body))
    prog.kernel = optimize_loops(prog.kernel)
    return prog


def _largest_shared_alloc(tk: TileKernel) -> Op | None:
    """The allocation of the largest shared tile of ``tk`` (to locate a shared-memory overflow)."""
    best, size = None, -1
    for op in tk.body.walk():
        r = op.results()[0] if op.results() else None
        if type(op).__name__ != "Alloc" or r is None or r.type.scope != Scope.SHARED:
            continue
        n = r.type.dtype.bits
        for e in r.type.shape:
            n *= e
        if n > size:
            best, size = op, n
    return best
