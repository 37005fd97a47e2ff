"""The tile-level program: what ``hexlayout.lang`` builds from a kernel definition.

A ``TileKernel`` holds parameters, a launch configuration and a body of ``Op``s. Tile
values (``Value``) carry a ``TileType`` whose layout may still be a ``LayoutVar``;
scalar quantities (block indices, loop variables, sizes) are ``Expr``. Every op keeps
the ``SourceLoc`` of the kernel line that created it, so diagnostics and generated code
can point back to it.

Ops and their meaning (all block-wide unless stated):

- ``GlobalView``: a ``tile_shape`` window of a global tensor at element ``origin``;
  ``layout`` maps tile coordinates to element offsets from the origin; ``extent``
  gives, per mode, how many rows/columns from the origin are in bounds (ragged edges).
  With ``gather`` set, mode 0 is indexed through a row-index tensor.
- ``Alloc``: a shared or register tile (layout given or ``LayoutVar``).
- ``Slice``: a view of a tile with some modes fixed at (possibly runtime) indices.
- ``SubTile``: a view of a ``shape`` window of a tile at element ``offset`` (per mode).
- ``Permute``: a view of a tile with its modes reordered (``perm[i]`` = source mode of
  result mode ``i``; ``x.T`` of a rank-2 tile is ``perm=(1, 0)``).
- ``Iota``: a register tile whose element at coordinate ``c`` is ``c[axis]`` (i32).
- ``Copy(src, dst)``: move a tile between scopes (instruction chosen by synthesis or
  given), optionally masked, or completing on an mbarrier (bulk/TMA copies).
- ``Mma(a, b, c)``: ``c += a @ b^T`` over (M,K) x (N,K) -> (M,N) tiles (``accumulate`` False or a
  run-time zero: ``c = a @ b^T``); with ``scale_a`` / ``scale_b`` (shared UE8M0 exponents per row
  and 32 K elements, or for ``packed`` e2m1 operands UE8M0 / UE4M3 factors per 32 or 16) the
  operands are block-scaled first.
- ``Cast``, ``Elementwise``, ``Fill``, ``Reduce``, ``Scan``, ``Rearrange``: register-tile math.
- ``Sync`` (block barrier), ``AsyncCommit`` / ``AsyncWait`` (cp.async groups),
  ``MbarrierInit`` / ``MbarrierArrive`` / ``MbarrierWait`` (transaction barriers),
  ``WgmmaFence`` / ``WgmmaCommit`` / ``WgmmaWait``, ``FenceProxyAsync``, ``SetMaxNReg``,
  ``ClusterSync`` (barrier of every thread of the block's cluster). ``Copy.multicast`` (a
  TMA load written into every CTA of a cluster mask) and ``MbarrierArrive.cta`` (an arrive on
  the same barrier of another CTA of the cluster) are the cluster forms of those ops.
- ``For`` (runtime or unrolled loop), ``If`` (runtime condition; a condition on the
  warp-group index expresses warp specialization, and ``If.warp_groups`` then lists the
  warp groups that run ``then_body``).

Every op declares the tile values it reads and writes: ``op.inputs()`` and
``op.outputs()`` (an accumulator such as ``Mma.c`` is both), ``op.values()`` all of them,
and ``op.blocks()`` its nested blocks (``For.body``; ``If.then_body`` and ``else_body``).
Subclasses name the fields in ``INPUTS``, ``OUTPUTS`` and ``BLOCKS``. Barrier ops act on
``Mbarrier`` objects, not tile values. ``hexlayout.ir.walk`` visits every op,
``hexlayout.ir.rewrite`` replaces ops, ``hexlayout.ir.structural`` compares programs.

Register tiles are buffers: an op's ``result`` is usually a fresh ``Value``, but it may
be an existing one (``Elementwise`` with ``out=``, in-place ``+=``), as ``Mma`` (``c``)
and ``Fill`` (``dst``) write into existing tiles. Loop-carried state is such a buffer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .expr import Expr, ExprLike, Var
from .functions import AluFunction, alu_function
from .source import SourceLoc
from .types import DType, LayoutLike, Scope, TileType

__all__ = [
    "SourceLoc", "Value", "Op", "Block", "GlobalParam", "ScalarParam", "GlobalView", "Alloc", "Slice",
    "Copy", "Mma", "Cast", "Elementwise", "Fill", "Reduce", "Scan", "Rearrange", "Sync", "AsyncCommit",
    "AsyncWait", "Mbarrier", "MbarrierInit", "MbarrierArrive", "MbarrierWait", "WgmmaFence",
    "WgmmaCommit", "WgmmaWait", "FenceProxyAsync", "SetMaxNReg", "ClusterSync", "For", "If", "TileKernel",
    "LaunchConfig",
    "SubTile", "Permute", "Iota",
]

_value_ids = itertools.count()
_op_ids = itertools.count()

#: ``str(TileKernel)``: the text form, set by ``hexlayout.ir.printer`` (which ``hexlayout.ir``
#: imports) to its ``format_kernel``; the printer sits above this module.
TEXT_FORM: list[Callable[[Any], str]] = [object.__repr__]


@dataclass(eq=False)
class Value:
    """A tile value (or a view of one). ``base`` is the buffer a view aliases (self if none)."""

    name: str
    type: TileType
    loc: SourceLoc | None = None
    base: Value | None = None
    id: int = field(default_factory=lambda: next(_value_ids))

    @property
    def root(self) -> Value:
        return self if self.base is None else self.base.root

    @property
    def scope(self) -> Scope:
        return self.type.scope

    def __str__(self) -> str:
        return f"%{self.name}"

    __repr__ = __str__


@dataclass(eq=False)
class Op:
    """A tile op. Each subclass declares which of its fields hold the tile values it reads
    (``INPUTS``), the tile values it writes or defines (``OUTPUTS``; a field may be in both,
    as ``Mma.c``, an accumulator read and written) and its nested blocks (``BLOCKS``). A
    declared field holds a ``Value``, ``None``, a ``Block`` or a tuple mixing values with
    scalars (``Elementwise.args``); every other field is a plain attribute (expressions,
    constants, instruction names). Passes read values through ``inputs()`` / ``outputs()``
    and never through field names."""

    INPUTS: ClassVar[tuple[str, ...]] = ()
    OUTPUTS: ClassVar[tuple[str, ...]] = ()
    BLOCKS: ClassVar[tuple[str, ...]] = ()

    loc: SourceLoc | None = field(default=None, kw_only=True)
    # a stable identity, given at construction (trace time): copies of the op (deepcopy, the
    # persisted build's plain-data round trip, ``dataclasses.replace``) keep it, so an
    # ``Assignment`` keyed by it resolves the ops of any copy of the program it was made for
    uid: int = field(default_factory=lambda: next(_op_ids), kw_only=True, repr=False, compare=False)

    @property
    def name(self) -> str:
        return type(self).__name__

    def inputs(self) -> list[Value]:
        """The tile values this op reads, in field order (no repeats)."""
        return _values_in(self, self.INPUTS)

    def outputs(self) -> list[Value]:
        """The tile values this op writes or defines, in field order (no repeats)."""
        return _values_in(self, self.OUTPUTS)

    def values(self) -> list[Value]:
        """Every tile value the op mentions (outputs and inputs), in field declaration order."""
        return _values_in(self, _value_fields(type(self)))

    def blocks(self) -> list[Block]:
        """The nested blocks (a loop body, the branches of an ``If``), in field order."""
        out = []
        for name in self.BLOCKS:
            b = getattr(self, name)
            if b is not None:
                out.append(b)
        return out

    def replace_values(self, mapping: dict[int, Value]) -> None:
        """Mention ``mapping[v.id]`` wherever this op reads or writes a value ``v`` whose id
        is in ``mapping`` (the fields named in ``INPUTS`` and ``OUTPUTS``)."""
        for name in dict.fromkeys(self.INPUTS + self.OUTPUTS):
            x = getattr(self, name)
            if isinstance(x, Value) and x.id in mapping:
                setattr(self, name, mapping[x.id])
            elif isinstance(x, tuple) and any(isinstance(v, Value) and v.id in mapping for v in x):
                setattr(self, name, tuple(mapping.get(v.id, v) if isinstance(v, Value) else v for v in x))

    def operands(self) -> list[Value]:
        """Deprecated spelling of ``values()`` (every tile value the op mentions, the
        results included)."""
        return self.values()

    def results(self) -> list[Value]:
        """Deprecated: the ``result`` field, if the op has one (a value it defines);
        ``outputs()`` also lists the existing buffers an op writes (``Mma.c``, ``Copy.dst``)."""
        r = getattr(self, "result", None)
        return [r] if isinstance(r, Value) else []


_VALUE_FIELDS: dict[type, tuple[str, ...]] = {}


def _value_fields(cls: type[Op]) -> tuple[str, ...]:
    """The fields of ``cls`` named in ``INPUTS`` or ``OUTPUTS``, in declaration order."""
    names = _VALUE_FIELDS.get(cls)
    if names is None:
        names = tuple(f.name for f in fields(cls) if f.name in cls.INPUTS or f.name in cls.OUTPUTS)
        _VALUE_FIELDS[cls] = names
    return names


def _values_in(op: Op, names: Any) -> list[Value]:
    out: list[Value] = []
    for name in names:
        x = getattr(op, name)
        for v in (x if isinstance(x, tuple) else (x,)):
            if isinstance(v, Value) and all(v is not w for w in out):
                out.append(v)
    return out


@dataclass(eq=False)
class Block:
    ops: list[Op] = field(default_factory=list)

    def append(self, op: Op) -> Op:
        self.ops.append(op)
        return op

    def walk(self) -> Iterator[Op]:
        """Every op of this block and of the blocks nested in it, in pre-order (an op before
        the ops of its nested blocks)."""
        stack: list[Iterator[Op]] = [iter(self.ops)]
        while stack:
            op = next(stack[-1], None)
            if op is None:
                stack.pop()
                continue
            yield op
            if op.BLOCKS:
                for b in reversed(op.blocks()):
                    stack.append(iter(b.ops))


@dataclass(eq=False)
class GlobalParam:
    """A global tensor argument: element type, symbolic or static shape and strides (elements).

    ``align_bytes``: the data pointer, every row and every view origin are that many bytes
    aligned (vectors no wider). ``divisibility``: launch facts about the size variables that
    move this tensor's view origins, ``(name, d)``: the size is a multiple of ``d`` elements
    and no more is assumed; a size not listed counts as aligned (``hexlayout.ir.divisibility``
    specializes a program on the facts of a launch). ``offline``: declared ``hl.offline`` (the element
    bits; 0: not), its tiles stored in the order synthesis chooses (``hexlayout.ir.offline``)."""

    name: str
    dtype: DType
    shape: tuple[ExprLike, ...]
    stride: tuple[ExprLike, ...]
    align_bytes: int = 16
    divisibility: tuple[tuple[str, int], ...] = ()
    offline: int = 0   # hl.offline: the element bits (4: packed two per byte); 0: not offline


@dataclass(eq=False)
class ScalarParam:
    name: str
    dtype: DType
    var: Var


@dataclass(eq=False)
class GlobalView(Op):
    """A window of global tensor ``param`` (see the module docstring). Gathered views
    (``hexlayout.ir.gather``): ``indices`` are integer index tiles and ``index_map`` says,
    per tensor mode, how its coordinate is formed from the tile coordinate and them."""

    INPUTS = ("gather", "indices")
    OUTPUTS = ("result",)

    result: Value
    param: GlobalParam
    origin: tuple[ExprLike, ...]
    extent: tuple[ExprLike, ...]
    gather: Value | None = None
    indices: tuple[Value, ...] = ()
    index_map: Any = None


@dataclass(eq=False)
class _Unary(Op):
    """An op that reads one tile, ``src``, and defines ``result`` from it (a view of it, or
    register-tile math); subclasses add their own fields after these two."""

    INPUTS = ("src",)
    OUTPUTS = ("result",)

    result: Value
    src: Value


@dataclass(eq=False)
class Alloc(Op):
    OUTPUTS = ("result",)

    result: Value


@dataclass(eq=False)
class Slice(_Unary):
    index: tuple[ExprLike | None, ...]


@dataclass(eq=False)
class SubTile(_Unary):
    """``result`` = the ``result.type.shape`` window of ``src`` at element ``offset``."""

    offset: tuple[ExprLike, ...]


@dataclass(eq=False)
class Permute(_Unary):
    """``result`` = ``src`` with modes reordered: result mode ``i`` is source mode ``perm[i]``."""

    perm: tuple[int, ...]


@dataclass(eq=False)
class Iota(Op):
    """``result[c] = c[axis]`` for every coordinate ``c`` of a register tile."""

    OUTPUTS = ("result",)

    result: Value
    axis: int


@dataclass(eq=False)
class Copy(Op):
    """``dst = src``. ``mask``: an Expr (all or nothing) or a predicate tile of ``src``'s shape.
    ``mbarrier`` (a ``Mbarrier``) with ``mbarrier_index``: the async copy completes on it.
    ``multicast`` (a TMA copy in a cluster): bit ``r`` set writes the tile into CTA ``r``'s
    ``dst`` too, completing on its barrier at the same index. ``pair_barrier`` (2-CTA
    clusters): the bytes complete on the barrier of the pair's even CTA."""

    INPUTS = ("src", "mask", "mbarrier")
    OUTPUTS = ("dst",)

    src: Value
    dst: Value
    instruction: str | None = None
    mask: ExprLike | Value | None = None
    mbarrier: Mbarrier | Value | None = None
    mbarrier_index: ExprLike = 0
    multicast: ExprLike | None = None
    # a global -> register load: the value its out-of-bounds (and masked-off) elements read
    # (Triton's ``other=``); None: 0, and the padding analysis tracks them
    other: float | None = None
    pair_barrier: bool = False


@dataclass(eq=False)
class Mma(Op):
    INPUTS = ("a", "b", "c", "scale_a", "scale_b")
    OUTPUTS = ("c",)

    a: Value
    b: Value
    c: Value
    atom: str | None = None
    warps: Any = None  # a TaskMapping over warps, or None for auto
    k_inner: bool = True  # A/B register value order of the TiledMma (see TiledMma.k_inner)
    # True: c += a @ b^T; False: c = a @ b^T (c not read); an integer Expr: either, chosen at
    # run time (nonzero: accumulate), uniform over the threads of each mma (wgmma's scale-d)
    accumulate: Any = True
    # block scales (shared u8 UE8M0 exponents, [M, K/32] and [N, K/32]), both or neither:
    # c (+)= sum_kb (a[:, kb] * 2^(scale_a[:, kb] - 127)) @ (b[:, kb] * 2^(scale_b[:, kb] - 127))^T
    scale_a: Value | None = None
    scale_b: Value | None = None
    # "e2m1": a and b are u8 tiles of packed FP4 pairs (element 2j in the low nibble of byte j), K =
    # twice their columns; the block scales then hold one factor per 32 (u8: UE8M0) or 16 (ue4m3 or
    # u8) K elements
    packed: str | None = None


@dataclass(eq=False)
class Cast(_Unary):
    """``result`` = ``src`` converted to ``result``'s element type."""


@dataclass(eq=False)
class Elementwise(Op):
    """``result = fn(*args)`` elementwise with numpy broadcasting; ``fn`` is an ALU function
    (``hexlayout.ir.functions``, which defines its typing, semantics, printing and cost; a
    name is looked up there), an arg a tile value or a scalar."""

    INPUTS = ("args",)
    OUTPUTS = ("result",)

    result: Value
    fn: AluFunction
    args: tuple[Any, ...]

    def __post_init__(self) -> None:
        self.fn = alu_function(self.fn)


@dataclass(eq=False)
class Fill(Op):
    OUTPUTS = ("dst",)

    dst: Value
    value: float


@dataclass(eq=False)
class Reduce(_Unary):
    """``result = fn_i src[..., i, ...]`` along ``axis``. ``valid`` (set by the padding
    analysis, ``hexlayout.ir.padding``): only the elements with coordinate ``< valid`` along
    ``axis`` take part (the rest are the padding of a ragged view: they count as the
    reduction's identity); ``None``: all of them. ``overwrite``: those elements of ``src``
    are set to the identity in place (padding is nobody's data; no copy of the tile)."""

    fn: str
    axis: int
    valid: ExprLike | None = None
    overwrite: bool = False


@dataclass(eq=False)
class Scan(Op):
    """``result`` = the inclusive scan of ``srcs`` along ``axis``.

    ``fn`` ``"add"`` / ``"mul"`` / ``"max"`` / ``"min"`` (one source ``x``):
    ``result[..., i, ...] = x[..., 0, ...] fn ... fn x[..., i, ...]``; ``"linear"`` (sources
    ``(a, b)``): ``result[..., i, ...] = h_i`` with ``h_i = a_i * h_{i-1} + b_i``. ``reverse``:
    ``i`` runs from the end (``h_i = a_i * h_{i+1} + b_i``). ``init`` (a tile of the result's
    shape with ``axis`` of extent 1, or ``None``): the element before the first (``h_{-1}``;
    ``None``: the identity, ``h_{-1} = 0``). ``carry`` (or ``None``): a tile of ``init``'s shape
    given the scan's last element (``result[..., n-1, ...]``, reversed ``result[..., 0, ...]``),
    the ``init`` of a next chunk. ``valid`` (set by the padding analysis): only the elements
    with coordinate ``< valid`` along ``axis`` take part, the others count as the identity
    (``None``: all of them)."""

    INPUTS = ("srcs", "init")
    OUTPUTS = ("result", "carry")
    #: the scan functions (each associative)
    FUNCTIONS: ClassVar[tuple[str, ...]] = ("add", "mul", "max", "min", "linear")

    result: Value
    srcs: tuple[Value, ...]
    fn: str
    axis: int
    reverse: bool = False
    init: Value | None = None
    valid: ExprLike | None = None
    carry: Value | None = None


@dataclass(eq=False)
class Rearrange(_Unary):
    """``result`` = ``src`` under ``result``'s layout (the values move between threads)."""


@dataclass(eq=False)
class Sync(Op):
    pass


@dataclass(eq=False)
class AsyncCommit(Op):
    pass


@dataclass(eq=False)
class AsyncWait(Op):
    pending: int


@dataclass(eq=False)
class Mbarrier:
    """A shared-memory transaction barrier (an array of ``count`` barriers)."""

    name: str
    count: int = 1
    loc: SourceLoc | None = None


@dataclass(eq=False)
class MbarrierInit(Op):
    bar: Mbarrier
    index: ExprLike
    arrivals: int


@dataclass(eq=False)
class MbarrierArrive(Op):
    """Arrive on barrier ``index``. ``who``: "thread" (every executing thread arrives),
    "warp" / "warpgroup" (one elected thread per executing warp / warp group), "one" (one
    elected thread of the executing threads), "mma" (the tensor cores, when the tcgen05 mmas the
    executing threads issued so far completed: ``tcgen05.commit``). ``tx_bytes`` > 0:
    arrive.expect_tx. ``cta``
    (clusters): the arrival goes to the barrier at ``index`` of the CTA with that rank in the
    cluster instead of this CTA's."""

    bar: Mbarrier
    index: ExprLike
    tx_bytes: int = 0
    who: str = "thread"
    cta: ExprLike | None = None


@dataclass(eq=False)
class MbarrierWait(Op):
    bar: Mbarrier
    index: ExprLike
    phase: ExprLike


@dataclass(eq=False)
class WgmmaFence(Op):
    pass


@dataclass(eq=False)
class WgmmaCommit(Op):
    pass


@dataclass(eq=False)
class FenceProxyAsync(Op):
    """``fence.proxy.async.shared::cta``: order this thread's generic-proxy shared-memory writes
    (stores, cp.async) before later async-proxy reads (wgmma operands, TMA stores); sm_90+."""


@dataclass(eq=False)
class WgmmaWait(Op):
    pending: int


@dataclass(eq=False)
class SetMaxNReg(Op):
    count: int
    increase: bool


@dataclass(eq=False)
class ClusterSync(Op):
    """``barrier.cluster.arrive.release`` + ``wait.acquire`` after ``fence.mbarrier_init``:
    every thread of every CTA of the cluster arrives before any proceeds (sm_90)."""


@dataclass(eq=False)
class For(Op):
    BLOCKS = ("body",)

    var: Var
    start: ExprLike
    stop: ExprLike
    step: int
    body: Block
    unroll: bool | int = False


@dataclass(eq=False)
class If(Op):
    BLOCKS = ("then_body", "else_body")

    cond: Expr
    then_body: Block
    else_body: Block | None = None
    warp_groups: tuple[int, ...] | None = None  # set when cond selects warp groups


@dataclass(eq=False)
class LaunchConfig:
    """Grid (blocks per dimension, from the task mapping), threads per block, cluster shape,
    and the blocks per SM the registers must allow (``min_blocks``, None: the compiler's)."""

    grid: tuple[ExprLike, ...]
    threads: int
    cluster: tuple[int, ...] | None = None
    block_index: tuple[Var, ...] = ()
    thread_index: Var | None = None
    min_blocks: int | None = None


@dataclass(eq=False)
class TileKernel:
    name: str
    params: list[GlobalParam | ScalarParam]
    launch: LaunchConfig
    body: Block
    loc: SourceLoc | None = None
    consts: dict[str, Any] = field(default_factory=dict)
    mbarriers: list[Mbarrier] = field(default_factory=list)

    def __str__(self) -> str:
        """The program's text form (``hexlayout.ir.printer.format_kernel``)."""
        return TEXT_FORM[0](self)

    def values(self) -> list[Value]:
        """Every tile value of the program, in order of first mention."""
        seen: dict[int, Value] = {}
        for op in self.body.walk():
            for v in op.values():
                seen.setdefault(v.id, v)
        return list(seen.values())

    def layout_vars(self) -> list[tuple[Value, LayoutLike]]:
        return [(v, v.type.layout) for v in self.values() if not v.type.has_layout]
