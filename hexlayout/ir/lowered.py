"""The lowered program: per-thread loops of concrete instructions.

Synthesis fixes every layout and instruction; lowering then turns each tile op into
instructions whose operands are per-thread addresses and register slices computed
from those layouts. The emulator executes exactly this form and the CUDA printer
prints exactly this form, so a kernel proven in the emulator is the kernel printed.

Conventions
- Every instruction is executed by every thread of the block for which its ``pred``
  (an ``Expr`` over the thread index, block index and loop variables; ``None`` = all)
  is non-zero. Warp-level instructions (``Ldmatrix``, ``Stmatrix``, ``MmaSync``) need
  their whole warp active, warp-group ones (``Wgmma``) their whole warp group.
- ``RegRef(array, start, count)``: ``count`` consecutive elements of a per-thread
  register array; ``start`` may depend on loop variables but not on the thread.
- ``GlobalRef(param, offset)``: element ``offset`` (an Expr, usually thread-dependent)
  of a global tensor argument. ``SharedRef(buffer, offset)``: element ``offset`` of a
  shared buffer (in the buffer's element type). Vector accesses move ``bits`` starting
  there and must be aligned to their width.
- Register fragments of mma / ldmatrix are element arrays; the register ``j`` of a
  PTX fragment is elements ``[j*32/bits, (j+1)*32/bits)`` of the ``RegRef``.
- ``SmemDesc`` is the wgmma shared-memory matrix descriptor (fields as in PTX: start
  address, leading / stride byte offsets, swizzle mode); the emulator decodes it as the
  hardware does, so a wrong descriptor shows up as wrong results.
- ``TmaDesc`` describes a tensor map (``cuTensorMapEncodeTiled`` parameters): global
  tensor, box shape, element strides, swizzle mode; built on the host at launch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .expr import ExprLike, Var, as_expr, to_c
from .functions import AluFunction, alu_function
from .tile import GlobalParam, ScalarParam, SourceLoc
from .types import DType

__all__ = [
    "RegArray", "RegRef", "SmemBuffer", "SharedRef", "GlobalRef", "SmemDesc", "TmaDesc", "MbarRef",
    "Instr", "LdGlobal", "StGlobal", "LdShared", "StShared", "CpAsync", "CpAsyncCommit", "CpAsyncWait",
    "Ldmatrix", "Stmatrix", "MmaSync", "Wgmma", "WgmmaFence", "WgmmaCommit", "WgmmaWait", "TmaLoad",
    "TmaStore", "TmaStoreCommit", "TmaStoreWait", "MbarInit", "MbarArrive", "MbarWait", "BarSync",
    "WarpSync", "FenceProxyAsync", "Alu", "Shfl", "SHFL_MODES", "SetMaxNReg", "ClusterBarrier", "Comment",
    "ForLoop", "IfThen", "ElectIf", "elect_if", "merge_elected", "LoweredKernel", "walk_instrs",
]


@dataclass(eq=False)
class RegArray:
    name: str
    dtype: DType
    count: int


@dataclass(eq=False)
class RegRef:
    array: RegArray
    start: ExprLike
    count: int


@dataclass(eq=False)
class SmemBuffer:
    """``nbytes`` bytes of dynamic shared memory at byte ``offset``, viewed as ``dtype``."""

    name: str
    dtype: DType
    nbytes: int
    offset: int = 0
    align: int = 128


@dataclass(eq=False)
class SharedRef:
    buffer: SmemBuffer
    offset: ExprLike


@dataclass(eq=False)
class GlobalRef:
    param: GlobalParam
    offset: ExprLike


@dataclass(eq=False)
class SmemDesc:
    """wgmma matrix descriptor for an operand tile starting at element ``offset`` of ``buffer``.

    ``swizzle``: 0 none (interleave), 1 = 128 B, 2 = 64 B, 3 = 32 B (PTX layout_type).
    ``lbo`` / ``sbo``: leading / stride dimension byte offsets. ``major``: "K" or "MN".
    """

    buffer: SmemBuffer
    offset: ExprLike
    swizzle: int
    lbo: int
    sbo: int
    major: str = "K"


@dataclass(eq=False)
class TmaDesc:
    name: str
    param: GlobalParam
    box: tuple[int, ...]           # box extent per global mode, innermost (stride-1) first
    dims: tuple[int, ...]          # which global modes, innermost first
    swizzle_bytes: int = 0         # 0, 32, 64, 128
    oob_fill_zero: bool = True


@dataclass(eq=False)
class MbarRef:
    name: str
    index: ExprLike = 0
    count: int = 1                 # number of barriers in the array this refers into


@dataclass(eq=False)
class Instr:
    pred: ExprLike | None = field(default=None, kw_only=True)
    loc: SourceLoc | None = field(default=None, kw_only=True)
    origin: str = field(default="", kw_only=True)   # the tile op this came from, for messages

    @property
    def opname(self) -> str:
        return type(self).__name__


@dataclass(eq=False)
class LdGlobal(Instr):
    dst: RegRef
    src: GlobalRef
    bits: int
    zero_fill: bool = True          # predicated-off threads write zeros to dst


@dataclass(eq=False)
class StGlobal(Instr):
    dst: GlobalRef
    src: RegRef
    bits: int


@dataclass(eq=False)
class LdShared(Instr):
    dst: RegRef
    src: SharedRef
    bits: int


@dataclass(eq=False)
class StShared(Instr):
    dst: SharedRef
    src: RegRef
    bits: int


@dataclass(eq=False)
class CpAsync(Instr):
    """cp.async of ``nbytes`` (4, 8, 16); predicated-off threads zero-fill (src-size 0)."""

    dst: SharedRef
    src: GlobalRef
    nbytes: int
    cache: str = "cg"


@dataclass(eq=False)
class CpAsyncCommit(Instr):
    pass


@dataclass(eq=False)
class CpAsyncWait(Instr):
    pending: int


@dataclass(eq=False)
class Ldmatrix(Instr):
    """ldmatrix.sync.aligned.m8n8.x{num}[.trans].b16: this lane's 16-byte row at ``src``."""

    dst: RegRef
    src: SharedRef
    num: int
    trans: bool = False


@dataclass(eq=False)
class Stmatrix(Instr):
    dst: SharedRef
    src: RegRef
    num: int
    trans: bool = False


@dataclass(eq=False)
class MmaSync(Instr):
    atom: str
    d: RegRef
    a: RegRef
    b: RegRef
    c: RegRef


@dataclass(eq=False)
class Wgmma(Instr):
    atom: str
    d: RegRef
    a: RegRef | SmemDesc
    b: SmemDesc
    scale_d: ExprLike = 1           # 0: D = A*B, 1: D = A*B + D


@dataclass(eq=False)
class WgmmaFence(Instr):
    pass


@dataclass(eq=False)
class WgmmaCommit(Instr):
    pass


@dataclass(eq=False)
class WgmmaWait(Instr):
    pending: int


@dataclass(eq=False)
class TmaLoad(Instr):
    dst: SharedRef
    desc: TmaDesc
    coords: tuple[ExprLike, ...]    # element coordinates of the box origin, innermost first
    bar: MbarRef
    multicast: ExprLike | None = None   # cluster CTA mask: the box lands in each CTA's dst / bar
    pair_bar: bool = False              # (.cta_group::2) the bytes complete on the pair's even CTA's bar


@dataclass(eq=False)
class TmaStore(Instr):
    desc: TmaDesc
    coords: tuple[ExprLike, ...]
    src: SharedRef


@dataclass(eq=False)
class TmaStoreCommit(Instr):
    pass


@dataclass(eq=False)
class TmaStoreWait(Instr):
    pending: int


@dataclass(eq=False)
class MbarInit(Instr):
    bar: MbarRef
    arrivals: int


@dataclass(eq=False)
class MbarArrive(Instr):
    """mbarrier.arrive (with ``tx_bytes`` > 0: arrive.expect_tx); with ``cta``, on the barrier
    of the cluster's CTA of that rank (``mapa`` + ``mbarrier.arrive.shared::cluster``), with the
    release semantics of ``scope``: ``"cta"`` (the default ``.release.cta``) or ``"cluster"``
    (``.release.cluster``: the arriving threads' earlier accesses - their fenced tcgen05.ld of a
    pair's TMEM - are ordered before whatever the peer CTA's waiting threads do next)."""

    bar: MbarRef
    tx_bytes: int = 0
    cta: ExprLike | None = None
    scope: str = "cta"


@dataclass(eq=False)
class MbarWait(Instr):
    """Block until the barrier's phase with parity ``phase`` has completed (try_wait.parity loop)."""

    bar: MbarRef
    phase: ExprLike


@dataclass(eq=False)
class BarSync(Instr):
    barrier_id: int = 0
    threads: int | None = None      # None: the whole block


@dataclass(eq=False)
class WarpSync(Instr):
    """``bar.warp.sync 0xffffffff`` (``__syncwarp()``): every lane of the warp arrives before any
    goes on, and the lanes' earlier memory accesses are ordered before their later ones - so one
    lane's later release (an elected ``mbarrier.arrive``) covers the whole warp's work."""


@dataclass(eq=False)
class FenceProxyAsync(Instr):
    pass


@dataclass(eq=False)
class Alu(Instr):
    """``dst[i] = op(srcs[0][i], srcs[1][i], ...)`` for ``i < dst.count``.

    A source is a ``RegRef`` (same count as ``dst``), a Python number (an immediate),
    an ``Expr`` (an integer per thread, e.g. a coordinate; broadcast over ``i``) or a
    ``ScalarParam`` (a kernel scalar argument). Arithmetic happens in ``dst``'s element
    type (f32 for 16-bit float destinations, then rounded); ``cvt`` converts to ``dst``'s
    element type with round-to-nearest-even; comparisons (``lt``, ``le``, ``eq``...) give 0/1.
    ``op`` is an ``AluFunction`` (``hexlayout.ir.functions``; a name is looked up there):
    its definition gives the arity, the semantics, the printing and the cost.
    """

    op: AluFunction
    dst: RegRef
    srcs: tuple[RegRef | float | int | ExprLike | ScalarParam, ...]

    def __post_init__(self) -> None:
        self.op = alu_function(self.op)


#: the modes of ``Shfl`` (PTX ``shfl.sync.<mode>``)
SHFL_MODES = ("bfly", "idx", "up", "down")


@dataclass(eq=False)
class Shfl(Instr):
    """shfl.sync: ``mode`` "bfly" (lane ^ arg), "idx" (lane arg), "up" (lane - arg) or "down"
    (lane + arg; "up" / "down" outside the segment read the thread's own value) over segments
    of ``width`` lanes."""

    dst: RegRef
    src: RegRef
    mode: str
    arg: ExprLike
    width: int = 32


@dataclass(eq=False)
class ClusterBarrier(Instr):
    """``fence.mbarrier_init.release.cluster`` (unless ``init_fence`` is False: no mbarrier was
    initialized since the last one), then ``barrier.cluster.arrive.release`` and
    ``barrier.cluster.wait.acquire``: every thread of the cluster's CTAs arrives first."""

    init_fence: bool = True


@dataclass(eq=False)
class SetMaxNReg(Instr):
    count: int
    increase: bool


@dataclass(eq=False)
class Comment(Instr):
    text: str


@dataclass(eq=False)
class ForLoop(Instr):
    var: Var
    start: ExprLike
    stop: ExprLike
    step: int
    body: list[Instr]
    unroll: bool | int = False


@dataclass(eq=False)
class IfThen(Instr):
    cond: ExprLike
    then_body: list[Instr]
    else_body: list[Instr] = field(default_factory=list)


@dataclass(eq=False)
class ElectIf(IfThen):
    """A branch one thread of a converged warp takes: ``cond`` is ``tid == thread`` (and
    ``also``), ``thread`` the first thread of its warp (a multiple of 32). Its meaning is the
    ``IfThen``'s (the emulator runs ``cond``); the printer tests the warp-uniform warp index and
    the lane ``elect.sync`` elected in the kernel's prologue (every warp converged there: lane
    0), so the compiler knows one thread of one warp runs the body: no loop over the warp's
    active lanes around each single-thread instruction (a body of single-thread tcgen05
    instructions only is printed as that condition guarding each of them, no branch)."""

    thread: int = 0
    also: ExprLike = 1


def elect_if(tid: ExprLike, thread: int, body: list[Instr], also: ExprLike = 1) -> ElectIf:
    """The ``ElectIf`` of ``thread`` (a warp's first thread) and ``also`` around ``body``."""
    if thread % 32:
        raise ValueError(f"elect_if: thread {thread} is not the first thread of a warp")
    cond = as_expr(tid).eq(thread)
    trivial = isinstance(also, int) and also == 1
    return ElectIf(cond if trivial else cond & as_expr(also), body, thread=thread, also=also)


def merge_elected(body: list[Instr]) -> list[Instr]:
    """``body`` (and its nested bodies) with each run of adjacent ``ElectIf`` of one thread and
    one ``also`` (no else, no predicate) made one branch: the same threads run the same
    instructions in the same order (``thread`` and ``also`` read nothing the bodies write)."""
    out: list[Instr] = []
    for ins in body:
        if isinstance(ins, ForLoop):
            ins.body = merge_elected(ins.body)
        elif isinstance(ins, IfThen):
            ins.then_body = merge_elected(ins.then_body)
            ins.else_body = merge_elected(ins.else_body)
        prev = out[-1] if out else None
        if (isinstance(ins, ElectIf) and isinstance(prev, ElectIf) and not ins.else_body
                and not prev.else_body and ins.pred is None and prev.pred is None
                and ins.thread == prev.thread and _same(ins.also, prev.also)):
            out[-1] = ElectIf(prev.cond, prev.then_body + ins.then_body, thread=prev.thread, also=prev.also,
                              loc=prev.loc, origin=prev.origin)
            continue
        out.append(ins)
    return out


def _same(a: ExprLike, b: ExprLike) -> bool:
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b) or \
        (not isinstance(a, int) and not isinstance(b, int) and to_c(as_expr(a)) == to_c(as_expr(b)))


def walk_instrs(body: list[Instr]) -> Iterator[Instr]:
    """Every instruction of ``body`` in program order, each loop's and branch's body (then,
    else) right after the loop or branch itself."""
    for ins in body:
        yield ins
        if isinstance(ins, ForLoop):
            yield from walk_instrs(ins.body)
        elif isinstance(ins, IfThen):
            yield from walk_instrs(ins.then_body)
            yield from walk_instrs(ins.else_body)


@dataclass(eq=False)
class LoweredKernel:
    name: str
    params: list[GlobalParam | ScalarParam]
    grid: tuple[ExprLike, ...]
    threads: int
    thread_index: Var
    block_index: tuple[Var, ...]
    body: list[Instr]
    registers: list[RegArray] = field(default_factory=list)
    smem: list[SmemBuffer] = field(default_factory=list)
    mbarriers: list[MbarRef] = field(default_factory=list)
    tma: list[TmaDesc] = field(default_factory=list)
    cluster: tuple[int, ...] | None = None
    arch: str = "sm_80"
    loc: SourceLoc | None = None
    min_blocks: int | None = None       # __launch_bounds__'s minBlocksPerMultiprocessor

    @property
    def smem_bytes(self) -> int:
        return max((b.offset + b.nbytes for b in self.smem), default=0)

    def written_params(self) -> list[GlobalParam]:
        """The global tensor parameters the kernel writes (``StGlobal`` and its ``RedGlobal``
        atomics, ``TmaStore``), in parameter order; the others are only read."""
        written: set[int] = set()
        stack: list[list[Instr]] = [self.body]
        while stack:
            for ins in stack.pop():
                if isinstance(ins, StGlobal):
                    written.add(id(ins.dst.param))
                elif isinstance(ins, TmaStore):
                    written.add(id(ins.desc.param))
                elif isinstance(ins, ForLoop):
                    stack.append(ins.body)
                elif isinstance(ins, IfThen):
                    stack += [ins.then_body, ins.else_body]
        return [p for p in self.params if isinstance(p, GlobalParam) and id(p) in written]
