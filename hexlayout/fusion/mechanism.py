"""The fusion pass over an already scheduled tile program.

An anchor kernel (a GEMM: loads of its operands from global memory into shared memory, an
MMA main loop, one store of its f32 accumulator cast to the output type) is traced alone;
its fusion points are

- the **operand loads**: ``copy(view(<operand param>, tile, origin) -> dst)``. A prologue
  replaces each such copy by: a view of every extra input at the same tile and origin ->
  registers -> cast to f32 -> the prologue's ops -> cast to the operand's type -> a copy
  into ``dst`` (the shared stage the anchor staged the operand in). The anchor's
  pipeline is unchanged: the stage is written synchronously before the barrier that
  publishes it. Synthesis then chooses the instructions and layouts of the new tiles;
- the **output store**: ``copy(cast(acc) -> view(<output param>, tile, origin))``. An
  epilogue replaces it by the epilogue's ops on the f32 accumulator tile ``acc`` and one
  store per output into a new output parameter. Extra inputs are loaded at the output
  tile's origin. A store staged through shared memory, ``copy(cast(acc) -> s)`` ...
  ``copy(s -> view(<output param>))`` (the GEMMs with ``stage_epilogue=True``, in column windows),
  is fused the same way at the first copy, the epilogue's math in registers: its first
  output of ``s``'s dtype over the whole window is copied into ``s`` and the second copy
  stores it from there; other outputs are stored directly. A mode of size 1 in an input
  (a bias row ``(1, N)``, a per-row scale
  ``(M, 1)``, a scalar tensor ``(1, 1)``) is a tile mode of extent 1 that broadcasts (a
  stride-0 layout of the broadcast value). A column slice (``slice(Y, -1, 0, N/2)`` /
  ``(N/2, N)``) of an anchor whose B operand the host gave in half-interleaved column
  order (tile columns ``[0, BN/2)`` from the first half, ``[BN/2, BN)`` from the second)
  is the corresponding half of the tile, stored at column ``n0 / 2``: the product tile
  is staged once in shared memory (in the output type, as eager rounds the product) and
  each half read back into registers (a block barrier between; so the staged, not the
  warp-specialized, anchor). A ``hexlayout::rope`` node (``fusion.rope``) rotates the q / k
  heads of the product tile, whose columns hold whole heads: its tables' rows are loaded
  once per tile (gathered by position ids, or row ``m mod T``) and broadcast over the heads.

Every new parameter is recorded in ``FusedProgram.sources`` (what the host passes for it).
Sizes stay symbolic: parameter shapes are expressions over the anchor's own size
variables, so one build serves every size.

``fuse(tk, plan)`` applies both to a deep copy of ``tk`` with the rewriter
(``hexlayout.ir.rewrite``) and returns the ``FusedProgram``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hexlayout.ir.expr import ExprLike
from hexlayout.ir.padding import PaddingError, annotate_padding
from hexlayout.ir.rewrite import Replacement, rewrite
from hexlayout.ir.tile import Cast, Copy, GlobalView, Op, TileKernel
from hexlayout.ir.types import Scope
from hexlayout.ir.walk import walk

from .aten import BITWISE, SLICES, VIEWS, emit_elementwise, hl_dtype, is_fusible
from .extend import KernelExtender, defining_ops
from .rope import ROPE, rotate
from .row_scale import RowScale, row_scale
from .spec import FusionUnsupported, Node

__all__ = ["InputSpec", "TilePlan", "FusedProgram", "fuse"]


@dataclass(frozen=True)
class InputSpec:
    """An extra input as the program sees it: ``kind`` ``"scalar"`` (a runtime number, an f32
    parameter) or ``"tensor"`` with ``dtype`` (a dtype name) and ``bcast``: per mode of
    the rank-2 frame, whether the input's extent there is 1 (broadcast). ``expand``: the
    program reads a broadcast input as a whole frame through stride-0 modes (a parameter of
    the frame's shape, strides 0 where ``bcast``; the host passes the input ``expand`` ed to
    the frame), so its register tile has the frame tile's shape and any layout synthesis
    gives the tile it is combined with: what a prologue's per-channel scale ``(N, 1)`` of an
    operand staged through registers needs (a ``(BN, 1)`` tile has no layout that matches
    every operand load's thread arrangement). ``group`` / ``period``: the input holds one value
    per group of ``group`` consecutive columns of the frame (a per-group dequantization
    scale or zero point: frame element ``(r, c)`` reads ``in[r, c // group]``, a parameter of
    ``C / group`` columns) or one per column position modulo ``period`` (``in[r, c % period]``,
    ``period`` columns: the shifts of packed sub-byte weights); rows broadcast where
    ``bcast[0]``. Such an input is read as the whole frame tile through a gather (index tiles
    ``r`` and ``c // group`` or ``c % period``)."""

    kind: str
    dtype: str = "f32"
    bcast: tuple[bool, bool] = (False, False)
    expand: bool = False
    group: int = 0
    period: int = 0


@dataclass(frozen=True)
class TilePlan:
    """What to fuse into a rank-2 GEMM-like anchor (no sizes: it is part of the build key).

    ``output_param``: the anchor's output parameter; ``operands``: (operand position, the
    anchor's parameter name), position 0 is A and 1 is B; ``prologues``: (operand position,
    nodes, output node); ``epilogue`` nodes and ``outputs`` (refs) with ``out_dtypes``
    (dtype names); ``inputs``: the extra inputs as the program sees them; ``halves``: the B
    operand comes half-interleaved (column slices are tile halves); ``row``: the anchor is a
    row reduction (``c[M, 1]`` of whole rows of operand 0): the epilogue runs in the frame of
    the operand's row load (``BM x N``), the anchor's ``BM x 1`` value broadcasts over it,
    extra inputs are placed against that frame and each output is stored in the frame of its
    value (``BM x N`` or ``BM x 1``); ``row_align``: the largest power of two (at most 16)
    dividing the row length ``N``, so the rows of an ``M x N`` tensor of ``b``-byte elements
    start ``min(16, row_align * b)``-byte aligned (what its parameter promises); ``heads``:
    per output ``(H, hd)`` when it is stored permuted into heads (``out[b, h, t, d] =
    Y[b * T + t, h * hd + d]``, a ``[B, H, T, hd]`` parameter whose ``B`` and ``T`` are new
    sizes) or None (empty: none is); ``row_reductions``: ``(aten op, "sum" | "mean")`` pairs, the
    reductions over the last dimension (``keepdim``) a prologue may hold because the anchor's
    tile of that operand holds whole rows (``mean_j x[m, j] = (sum_j x[m, j]) / K``, ``K`` the
    operand's row length; the anchor's planner names them and guarantees the rows fit, or
    sets ``row_scale``); ``row_scale``: the A prologue's reductions enter it as one row factor
    (``row_scale.row_scale``): the prologue runs without the factor, each A tile the kernel
    loads adds its row sums to per-row accumulators (the k-loop covers each row once), and the
    factor of the finished sums scales the product's rows before the epilogue (any ``K``)."""

    output_param: str
    operands: tuple[tuple[int, str], ...]
    prologues: tuple[tuple[int, tuple[Node, ...], int], ...]
    epilogue: tuple[Node, ...]
    outputs: tuple[tuple, ...]
    out_dtypes: tuple[str, ...]
    inputs: tuple[InputSpec, ...]
    halves: bool = False
    row: bool = False
    row_align: int = 16
    heads: tuple = ()
    row_reductions: tuple[tuple[str, str], ...] = ()
    row_scale: bool = False


@dataclass
class FusedProgram:
    """The fused tile program and, per parameter after the anchor's kept ones, what the host
    passes: ``("input", i, "tensor" | "scalar")`` (extra input ``i``) or ``("output", k)``.
    ``removed``: anchor parameters the fused program no longer has (the output, operands
    a prologue computes)."""

    kernel: TileKernel
    sources: list[tuple] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


#: keyword arguments the fused math honours (alpha of add / sub, gelu's approximate, a cast's
#: dtype) or that do not change values
_NEUTRAL_KWARGS = frozenset({"alpha", "approximate", "dtype", "memory_format", "layout", "device",
                             "pin_memory", "non_blocking", "copy"})
#: keyword arguments fused only when ``None`` (``div``'s rounding_mode)
_NONE_KWARGS = frozenset({"rounding_mode"})


@dataclass(frozen=True)
class _Frame:
    tile: tuple[int, int]
    origin: tuple[ExprLike, ExprLike]
    shape: tuple[ExprLike, ExprLike]


class _Evaluator:
    """Traces node lists into the kernel (inside ``KernelExtender.trace``)."""

    def __init__(self, ext: KernelExtender, plan: TilePlan, prog: FusedProgram) -> None:
        self.ext = ext
        self.plan = plan
        self.prog = prog
        self.params: dict[tuple, Any] = {}
        self.staged: Any = None                 # the product staged in shared memory (column halves)
        self.anchor_dtype: Any = None

    def input_param(self, i: int, frame: _Frame) -> Any:
        spec = self.plan.inputs[i]
        if spec.kind == "scalar":
            key = ("scalar", i)
            if key not in self.params:
                self.params[key] = self.ext.scalar_param(f"s{i}", hl_dtype("f32"))
                self.prog.sources.append(("input", i, "scalar"))
            return self.params[key]
        if spec.group or spec.period:  # columns per group / per position (read by a gather)
            shape = (1 if spec.bcast[0] else frame.shape[0],
                     frame.shape[1] // spec.group if spec.group else spec.period)
            stride = None
        elif spec.expand:              # the whole frame, stride 0 along the broadcast modes
            shape = tuple(frame.shape)
            stride = (0 if spec.bcast[0] else (1 if spec.bcast[1] else frame.shape[1]),
                      0 if spec.bcast[1] else 1)
        else:
            shape, stride = tuple(1 if b else s for b, s in zip(spec.bcast, frame.shape)), None
        key = ("tensor", i, tuple(str(s) for s in shape))
        if key not in self.params:
            dt = hl_dtype(spec.dtype)
            self.params[key] = self.ext.tensor_param(f"in{i}", dt, shape, stride,
                                                     align_bytes=self.align(dt, spec.bcast[1]))
            self.prog.sources.append(("input", i, "tensor"))
        return self.params[key]

    def align(self, dtype: Any, one_column: bool) -> int:
        """The byte alignment of rows of a new parameter (16; less for rows of a row
        reduction's length that is not a multiple of 16 bytes)."""
        if not self.plan.row or one_column:
            return 16
        return min(16, self.plan.row_align * dtype.bits // 8)

    def load(self, i: int, frame: _Frame, raw: bool = False) -> Any:
        """Extra input ``i``'s tile of ``frame`` in f32 (``raw``: in its own type)."""
        import hexlayout.lang as hl

        p = self.input_param(i, frame)
        spec = self.plan.inputs[i]
        if spec.kind == "scalar":
            return p
        if spec.group or spec.period:
            r = self.gather_columns(p, spec, frame)
            return r if raw else hl.cast(r, hl.f32)
        if spec.expand:
            tile, origin = tuple(frame.tile), tuple(frame.origin)
        else:
            tile = tuple(1 if b else t for b, t in zip(spec.bcast, frame.tile))
            origin = tuple(0 if b else o for b, o in zip(spec.bcast, frame.origin))
        r = hl.register(hl_dtype(spec.dtype), tile)
        hl.copy(hl.view(p, tile, origin), r)
        return r if raw else hl.cast(r, hl.f32)

    @staticmethod
    def gather_columns(p: Any, spec: InputSpec, frame: _Frame) -> Any:
        """The frame tile of a per-group / per-position input: ``in[r, c // group]`` or
        ``in[r, c % period]`` (``r`` 0 for a broadcast row) for every ``(r, c)`` of the tile,
        one gather (coordinates past the frame read 0, as the operand's padding)."""
        import hexlayout.lang as hl

        tile = tuple(frame.tile)
        cols = hl.iota(tile, 1) + frame.origin[1]
        idx = cols // spec.group if spec.group else cols % spec.period
        rows: Any = 0 if spec.bcast[0] else hl.iota(tile, 0) + frame.origin[0]
        r = hl.register(hl_dtype(spec.dtype), tile)
        hl.copy(p[rows, idx], r)
        return r

    def run(self, nodes: tuple[Node, ...], base: _Frame, anchor: Any, where: str,
            split: RowScale | None = None) -> list[tuple[Any, _Frame]]:
        """Each node's (tile or scalar, frame); ``anchor``: the anchor's f32 tile (epilogue);
        ``split``: the prologue's row factor is left out (its nodes are None, the product by
        it is its other argument)."""
        import hexlayout.lang as hl

        env: list[tuple[Any, _Frame]] = []
        for j, n in enumerate(nodes):
            if split is not None and j in split.row:
                env.append((None, base))
                continue
            if split is not None and j == split.scale:
                a = n.args[split.keep]
                env.append((env[a[1]][0], env[a[1]][1]) if a[0] == "node" else (self.load(a[1], base), base))
                continue
            fn = dict(self.plan.row_reductions).get(n.op)
            if fn is not None:
                env.append((self.row_reduce(n, fn, j, env, anchor, base, where), base))
                continue
            if n.op == ROPE:
                env.append(self.rope(n, j, env, anchor, base, where))
                continue
            if not is_fusible(n.op):
                raise FusionUnsupported(f"{where} node {j}: {n.op} is not an op fusion knows")
            frame = next((env[a[1]][1] for a in n.args if a[0] == "node"), base)
            if n.op in VIEWS:
                if anchor is None:
                    raise FusionUnsupported(f"{where} node {j}: {n.op} inside a prologue")
                env.append((None, frame))      # an output's trailing view: the host applies it
                continue
            kw = dict(n.kwargs)
            if n.op in SLICES:
                env.append(self.slice(n, j, env, anchor, base, where))
                continue
            args: list[Any] = []
            bitwise = n.op in BITWISE          # integer tiles in, an integer tile out
            for a in n.args:
                if a[0] == "anchor":
                    args.append(anchor)
                elif a[0] == "node":
                    if env[a[1]][0] is None:
                        raise FusionUnsupported(f"{where} node {j}: {n.op} reads the view node {a[1]} (views "
                                                "are fused only as the last ops of an epilogue output)")
                    v = env[a[1]][0]
                    if not bitwise and isinstance(v, hl.Tile) and v.dtype.kind in ("int", "uint"):
                        v = hl.cast(v, hl.f32)
                    args.append(v)
                elif a[0] == "input":
                    args.append(self.load(a[1], frame, raw=bitwise))
                else:
                    v = a[1]
                    number = isinstance(v, (int, float)) and not isinstance(v, bool)
                    args.append(float(v) if number and not bitwise else v)
            odd = {k: v for k, v in kw.items()
                   if k not in _NEUTRAL_KWARGS and not (k in _NONE_KWARGS and v is None)}
            if odd:
                raise FusionUnsupported(f"{where} node {j}: {n.op} with {odd} is not fused")
            try:
                env.append((emit_elementwise(n.op, args, kw), frame))
            except NotImplementedError as e:
                raise FusionUnsupported(f"{where} node {j}: {n.op}: {e}") from None
        return env

    def row_reduce(self, n: Node, fn: str, j: int, env: list, anchor: Any, base: _Frame, where: str) -> Any:
        """A reduction of the prologue's tile over its columns (``keepdim``): the tile holds
        whole rows of the operand (the planner keeps ``K <= BK``), so ``sum_j x[m, j]`` over the
        tile is the row's (padding past ``K`` counts as 0, ``hexlayout.ir.padding``) and a
        mean divides it by the operand's ``K`` (a runtime size): a ``BM x 1`` tile."""
        import hexlayout.lang as hl

        dims = n.args[1][1] if len(n.args) > 1 and n.args[1][0] == "const" else None
        keep = len(n.args) > 2 and n.args[2] == ("const", True)
        src = n.args[0]
        if anchor is not None or src[0] not in ("node", "input") or tuple(dims or ()) not in ((-1,), (1,)) \
                or not keep:
            raise FusionUnsupported(f"{where} node {j}: {n.op} is fused only in a prologue, over the last "
                                    "dimension, with keepdim")
        x = env[src[1]][0] if src[0] == "node" else self.load(src[1], base)
        s = hl.reduce(x, "sum", 1)
        if fn == "mean":
            s = s / hl.cast(hl.iota(tuple(s.shape), 1) + base.shape[1], hl.f32)
        return s

    def rope(self, n: Node, j: int, env: list, anchor: Any, base: _Frame, where: str) -> tuple[Any, _Frame]:
        """``hexlayout::rope`` of the product tile (``fusion.rope``): the tile holds whole heads
        (``BN`` a multiple of ``head_dim``), its rows' ``BM x head_dim`` tables are loaded
        once (rows gathered through the position ids when given) and broadcast over its
        heads; columns from ``rope_cols`` on (the v heads) keep the product. Table rows are
        gathered: by the position ids, or row ``m mod T`` of a table of ``T`` rows."""
        import hexlayout.lang as hl

        y_ref, cos_ref, sin_ref, pos_ref = n.args[:4]
        hd, rope_cols, inter = (int(a[1]) for a in n.args[4:7])
        bm, bn = base.tile
        if anchor is None or y_ref[0] not in ("anchor", "node") or cos_ref[0] != "input" or \
                sin_ref[0] != "input" or pos_ref[0] not in ("input", "const"):
            raise FusionUnsupported(f"{where} node {j}: rope is fused only in an epilogue, of the product, "
                                    "with its tables as inputs")
        if bn % hd:
            raise FusionUnsupported(f"{where} node {j}: rope needs whole heads in a column tile ({bn} "
                                    f"columns, heads of {hd})")
        y = anchor if y_ref[0] == "anchor" else env[y_ref[1]][0]
        dt = self.anchor_dtype
        y = hl.cast(hl.cast(y, dt), hl.f32)           # the product as eager holds it
        m0, n0 = base.origin
        rows = None
        if pos_ref[0] == "input":                     # a [max_pos, D] cache: rows by position id
            pf = _Frame((bm, 1), (m0, 0), (base.shape[0], 1))
            pp = self.input_param(pos_ref[1], pf)
            rows = hl.register(pp.dtype, (bm, 1))
            hl.copy(hl.view(pp, (bm, 1), (m0, 0)), rows)
        key = ("rope_rows", cos_ref[1])
        if key not in self.params:
            self.params[key] = self.ext.size_var("T")
        table_rows = self.params[key]
        if rows is None:                               # T rows, row m takes m mod T (T = M: per token)
            rows = (hl.iota((bm, 1), 0) + m0) % table_rows
        tf = _Frame((bm, hd), (None, 0), (table_rows, hd))
        params = [self.input_param(ref[1], tf) for ref in (cos_ref, sin_ref)]

        def table(which: int, d0: int, width: int) -> Any:
            p = params[which]
            r = hl.register(p.dtype, (bm, width))
            hl.copy(hl.view(p, (bm, width), (tf.origin[0], d0), rows=rows), r)
            return hl.cast(hl.cast(r, dt), hl.f32)       # rounded as the model casts its tables

        def keep(c0: int, width: int) -> Any:
            return (hl.iota((1, width), 1) + (n0 + c0)) < rope_cols

        return rotate(y, table, keep, hd, bool(inter), dt), base

    def slice(self, n: Node, j: int, env: list, anchor: Any, base: _Frame, where: str) -> tuple[Any, _Frame]:
        if not self.plan.halves or not n.args or n.args[0] != ("anchor",):
            raise FusionUnsupported(f"{where} node {j}: a slice is fused only as a column half of the "
                                    "anchor's output")
        import hexlayout.lang as hl

        half = int(n.args[2][1])             # the run-time planner normalized start to the half index
        bn = base.tile[1] // 2
        if self.staged is None:
            # register tiles have no column views: the product goes through shared memory once,
            # rounded to the anchor's output type (as eager rounds the product before the split)
            staged = hl.register(self.anchor_dtype, base.tile)
            hl.assign(staged, hl.cast(anchor, self.anchor_dtype))
            self.staged = hl.shared(self.anchor_dtype, base.tile)
            hl.copy(staged, self.staged)
            hl.syncthreads()
        r = hl.register(self.anchor_dtype, (base.tile[0], bn))
        hl.copy(self.staged[:, half * bn:(half + 1) * bn], r)
        t = hl.cast(r, hl.f32)
        frame = _Frame((base.tile[0], bn), (base.origin[0], base.origin[1] // 2),
                       (base.shape[0], base.shape[1] // 2))
        return t, frame


def fuse(tk: TileKernel, plan: TilePlan, name: str) -> FusedProgram:
    """The anchor ``tk`` with ``plan``'s prologues and epilogue fused (a new program)."""
    tk = copy.deepcopy(tk)
    tk.name = name
    f = _Fusion(tk, plan)
    for operand, nodes, out in plan.prologues:
        f.prologue(operand, nodes, out)
    f.epilogue()
    _drop_dead(tk)
    _drop_param(tk, plan.output_param, f.prog)
    try:            # the fused math changes what the padding of the anchor's loads holds
        annotate_padding(tk)
    except PaddingError as e:
        raise FusionUnsupported(f"{tk.name}: {e.detail}") from None
    return f.prog


class _Fusion:
    """One ``fuse``: the program being rewritten and what its rules share."""

    def __init__(self, tk: TileKernel, plan: TilePlan) -> None:
        self.tk = tk
        self.plan = plan
        self.prog = FusedProgram(tk)
        self.ext = KernelExtender(tk)
        self.ev = _Evaluator(self.ext, plan, self.prog)
        self.defs = defining_ops(tk)
        self.view_of = {op.result.id: op for op in walk(tk) if isinstance(op, GlobalView)}
        self.params = {p.name: p for p in tk.params}
        self.split: RowScale | None = None       # plan.row_scale: the A prologue's row factor
        self.row_sums: dict[int, Any] = {}       # its reductions' accumulators (node -> value)
        self.row_k: ExprLike = 0                 # A's row length
        self.factor: Any = None                  # the row factor (epilogue frame)
        self.row_frame: _Frame | None = None
        if plan.row:                                # the frame of the reduced operand's row load
            gv = next((v for v in self.view_of.values() if v.param.name == dict(plan.operands).get(0)), None)
            if gv is None:
                raise FusionUnsupported(f"{tk.name}: no load of the reduced operand")
            self.row_frame = _Frame(tuple(gv.result.type.shape), tuple(gv.origin), tuple(gv.param.shape))

    # --- prologues: operand loads -------------------------------------------------------------
    def prologue(self, operand: int, nodes: tuple, out: int) -> None:
        """Replace the loads of ``operand`` by the prologue ``nodes`` (value: node ``out``)."""
        import hexlayout.lang as hl

        tk, ev, ext = self.tk, self.ev, self.ext
        pname = dict(self.plan.operands).get(operand)
        if pname is None:
            raise FusionUnsupported(f"{tk.name}: operand {operand} has no load to fuse a prologue into")
        dtype = self.params[pname].dtype
        where = f"prologue of operand {operand}"
        split = self._row_split(pname, nodes, out) if self.plan.row_scale and operand == 0 else None

        def rule(visit: Any) -> Any:
            op = visit.op
            gv = self.view_of.get(op.src.id)
            if gv is None or gv.param.name != pname:
                return None
            if op.mbarrier is not None:
                raise FusionUnsupported(f"{tk.name}: the load of {pname} is an asynchronous bulk (TMA) copy; "
                                        "a computing prologue needs a kernel that stages operands "
                                        "through registers or cp.async (the sm_80 kernel)")
            frame = _Frame(tuple(gv.result.type.shape), tuple(gv.origin), tuple(gv.param.shape))

            def body() -> None:
                env = ev.run(nodes, frame, None, where, split)
                val = env[out][0]
                if split is not None:
                    self._add_row_sums(nodes, env, frame)
                if op.dst.scope == Scope.REGISTER:  # an operand loaded into registers (a row)
                    hl.assign(ext.tile(op.dst), hl.cast(val, dtype))
                else:
                    hl.copy(hl.cast(val, dtype), ext.tile(op.dst))

            ops, _ = ext.trace(body)
            return ops

        if rewrite(tk, rule, kinds=(Copy,)) == 0:
            raise FusionUnsupported(f"{tk.name}: no load of {pname} found to fuse a prologue into")
        _drop_param(tk, pname, self.prog)
        if pname not in self.prog.removed:
            raise FusionUnsupported(f"{tk.name}: {pname} is still read after fusing its prologue")

    # --- a row factor of the A prologue (plan.row_scale) ----------------------------------------
    def _row_split(self, pname: str, nodes: tuple, out: int) -> RowScale:
        """The split of the A prologue ``nodes`` and its row sums' accumulators (f32 zeros of
        A's tile, at the start of the kernel)."""
        import hexlayout.lang as hl

        def arg(a: tuple) -> Any:
            if a[0] == "node":
                return a[1]
            if a[0] == "input":
                spec = self.plan.inputs[a[1]]
                return "s" if spec.kind == "scalar" or all(spec.bcast) else "t"
            return "s" if a[0] == "const" else "t"

        args = [[arg(a) for a in nd.args if isinstance(a, tuple) and a] for nd in nodes]
        split = row_scale([nd.op for nd in nodes], args, out, frozenset(dict(self.plan.row_reductions)))
        if split is None:
            raise FusionUnsupported(f"{self.tk.name}: the A prologue's row reductions are not one row factor "
                                    "of its value (row_scale)")
        gv = next((v for v in self.view_of.values() if v.param.name == pname), None)
        if gv is None:
            raise FusionUnsupported(f"{self.tk.name}: no load of {pname} to sum rows of")
        tile = tuple(gv.result.type.shape)
        self.row_k = gv.param.shape[1]
        ops, tiles = self.ext.trace(lambda: [hl.zeros(tile, hl.f32) for _ in split.reductions])
        self.tk.body.ops[:0] = ops
        self.row_sums = {j: t.value for j, t in zip(split.reductions, tiles)}
        self.split = split
        return split

    def _add_row_sums(self, nodes: tuple, env: list, frame: _Frame) -> None:
        """Add the summands of the A tile of ``frame`` to the accumulators, element by element
        (inside a trace; the rows are reduced once, after the k-loop)."""
        import hexlayout.lang as hl

        for j, acc in self.row_sums.items():
            src = nodes[j].args[0]
            x = env[src[1]][0] if src[0] == "node" else self.ev.load(src[1], frame)
            t = self.ext.tile(acc)
            hl.assign(t, t + hl.cast(x, hl.f32))

    def _row_factor(self, rows: int) -> Any:
        """The row factor ``g`` of the finished sums as a ``rows x 1`` f32 tile that broadcasts
        over the product's tile (computed once, at the first store: the accumulators' rows are
        reduced and go through shared memory, since the load's and the product's row layouts
        differ)."""
        import hexlayout.lang as hl

        if self.factor is not None:
            return self.factor
        split, nodes = self.split, next(nd for op, nd, _ in self.plan.prologues if op == 0)
        fns = dict(self.plan.row_reductions)
        env: dict[int, Any] = {}
        for j in sorted(split.row):
            n = nodes[j]
            if j in self.row_sums:
                sh = hl.shared(hl.f32, (rows, 1))
                hl.copy(hl.reduce(self.ext.tile(self.row_sums[j]), "sum", 1), sh)
                hl.syncthreads()
                r = hl.register(hl.f32, (rows, 1))
                hl.copy(sh, r)
                if fns[n.op] == "mean":
                    r = r / hl.cast(hl.iota((rows, 1), 1) + self.row_k, hl.f32)
                env[j] = r
                continue
            args: list[Any] = []
            for a in n.args:
                if a[0] == "node":
                    args.append(env[a[1]])
                elif a[0] == "input":
                    args.append(self.ev.load(a[1], _Frame((1, 1), (0, 0), (1, 1))))
                else:
                    v = a[1]
                    args.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
            try:
                env[j] = emit_elementwise(n.op, args, dict(n.kwargs))
            except NotImplementedError as e:
                raise FusionUnsupported(f"{self.tk.name}: row factor node {j}: {n.op}: {e}") from None
        self.factor = env[split.factor]
        return self.factor

    # --- epilogue: the output store -----------------------------------------------------------
    def _staging(self) -> dict[int, Copy]:
        """A store staged through shared memory, ``copy(cast(acc), s)`` ... ``copy(s,
        view(out))``: id(the copy into ``s``) -> the store from ``s``. The epilogue (math in
        registers) replaces the first copy and stages its first output of the staging tile's
        dtype and frame in ``s``; the second copy stores that output (or goes)."""
        staging: dict[int, Copy] = {}
        pending: dict[int, Copy] = {}
        for op in walk(self.tk):
            if not isinstance(op, Copy):
                continue
            gv = self.view_of.get(op.dst.id)
            if gv is not None and gv.param.name == self.plan.output_param and op.src.id in pending:
                staging[id(pending.pop(op.src.id))] = op
            elif op.dst.scope == Scope.SHARED and isinstance(self.defs.get(op.src.id), Cast):
                pending[op.dst.id] = op
        return staging

    def epilogue(self) -> None:
        """Replace the store of the output by the epilogue and its outputs' stores."""
        import hexlayout.lang as hl

        tk, ev, ext, plan = self.tk, self.ev, self.ext, self.plan
        out_name = plan.output_param
        store_views = {op.dst.id for op in walk(tk) if isinstance(op, Copy) and op.dst.id in self.view_of
                       and self.view_of[op.dst.id].param.name == out_name}
        staging = self._staging()
        staged_stores = {id(st) for st in staging.values()}
        self.staged_out: dict[int, tuple[Any, _Frame]] = {}     # id(store from s) -> (param key, frame)

        def store_rule(visit: Any) -> Any:
            op = visit.op
            if isinstance(op, GlobalView):        # the output's old view goes with its store
                return [] if op.result.id in store_views else None
            if id(op) in staged_stores:           # the staged tile's store: of the output staged
                if id(op) not in self.staged_out:
                    return []

                def store() -> None:
                    key, fr = self.staged_out[id(op)]
                    hl.copy(ext.tile(op.src), hl.view(ev.params[key], fr.tile, fr.origin))

                return ext.trace(store)[0]
            stage = op.dst if id(op) in staging else None
            gv = self.view_of.get(staging[id(op)].dst.id if stage is not None else op.dst.id)
            if gv is None or gv.param.name != out_name:
                return None
            src_def = self.defs.get(op.src.id)
            acc = src_def.src if isinstance(src_def, Cast) else op.src
            frame = _Frame(tuple(gv.result.type.shape), tuple(gv.origin), tuple(gv.param.shape))
            if plan.halves and frame.tile[1] % 2:
                raise FusionUnsupported(f"{tk.name}: column halves need an even tile width, not "
                                        f"{frame.tile[1]}")
            ev.anchor_dtype = gv.param.dtype
            ev.staged = None
            store_from = staging[id(op)] if stage is not None else None
            ops, _ = ext.trace(lambda: self._store(acc, frame, stage, store_from))
            # an output not staged leaves the staging tile as it was (no longer written)
            return ops if stage is None else Replacement(ops, {stage: stage})

        if rewrite(tk, store_rule, kinds=(Copy, GlobalView)) == 0:
            raise FusionUnsupported(f"{tk.name}: no store of {out_name} found to fuse the epilogue into")

    def _store(self, acc: Any, frame: _Frame, stage: Any, store_from: Copy | None) -> None:
        """The epilogue on the accumulator ``acc`` (a tile of ``frame``) and one store per
        output (the first that fits the staging tile ``stage``, if any, through it)."""
        import hexlayout.lang as hl

        ev, ext, plan, prog, row_frame = self.ev, self.ext, self.plan, self.prog, self.row_frame
        y = ext.tile(acc)
        if self.split is not None:
            y = y * self._row_factor(frame.tile[0])
        env = ev.run(plan.epilogue, row_frame if row_frame is not None else frame, y, "epilogue")
        for k, ref in enumerate(plan.outputs):
            val, fr = (y, frame) if ref[0] == "anchor" else env[ref[1]]
            if row_frame is not None:        # a row's value or the reduced column's
                fr = frame if tuple(val.shape)[-1] == 1 else row_frame
            key = ("out", k)
            if key not in ev.params:
                odt = hl_dtype(plan.out_dtypes[k])
                if plan.heads and plan.heads[k] is not None:
                    nh, hd = plan.heads[k]
                    shape = (ext.size_var(f"B{k}"), nh, ext.size_var(f"T{k}"), hd)
                    ev.params[key] = ext.tensor_param(f"out{k}", odt, shape)
                else:
                    ev.params[key] = ext.tensor_param(f"out{k}", odt, fr.shape,
                                                      align_bytes=ev.align(odt, fr.tile[-1] == 1))
                prog.sources.append(("output", k))
            dtype = hl_dtype(plan.out_dtypes[k])
            if plan.heads and plan.heads[k] is not None:
                _store_heads(ext, ev.params[key], val, fr, dtype, plan.heads[k], self.tk.name)
                continue
            if (store_from is not None and id(store_from) not in self.staged_out and fr is frame
                    and tuple(val.shape) == frame.tile and dtype == stage.type.dtype):
                hl.copy(hl.cast(val, dtype), ext.tile(stage))
                self.staged_out[id(store_from)] = (key, fr)
            else:
                hl.copy(hl.cast(val, dtype), hl.view(ev.params[key], fr.tile, fr.origin))


def _store_heads(ext: KernelExtender, out: Any, val: Any, fr: _Frame, dtype: Any, heads: tuple[int, int],
                 name: str) -> None:
    """Store the ``BM x BN`` tile ``val`` of ``Y`` (origin ``(m0, n0)``) into ``out[B, H, T, hd]``
    at ``out[m // T, n // hd, m % T, n % hd]``: through shared memory (in ``dtype``), then in
    column pieces of ``w = min(BN, hd)`` (inside one head), each a gathered store of ``BM``
    rows of ``w`` contiguous elements (rows past ``M`` / heads past ``H`` are not written)."""
    import hexlayout.lang as hl

    bm, bn = fr.tile
    hd = heads[1]
    w = min(bn, hd)
    if bn % w or hd % w:
        raise FusionUnsupported(f"{name}: a column tile of {bn} and heads of {hd} (one must divide the "
                                "other)")
    stage = hl.shared(dtype, (bm, bn))
    hl.copy(hl.cast(val, dtype), stage)
    hl.syncthreads()
    t = out.shape[2]
    for c in range(bn // w):
        col = fr.origin[1] + c * w
        piece = hl.register(dtype, (bm, w))
        hl.copy(stage[:, c * w:(c + 1) * w], piece)
        rows = hl.iota(bm, 0) + fr.origin[0]      # per piece: short-lived index tiles
        d0 = col % hd
        hl.copy(piece, out[rows // t, col // hd, rows % t, d0:d0 + w])


def _drop_param(tk: TileKernel, name: str, prog: FusedProgram) -> None:
    """Remove parameter ``name`` and the views of it nothing uses any more."""
    used = {v.id for op in walk(tk) if not isinstance(op, GlobalView) for v in op.inputs() + op.outputs()}

    def rule(visit: Any) -> Any:
        op = visit.op
        if op.param.name == name and op.result.id not in used:
            return []
        return None

    rewrite(tk, rule, kinds=(GlobalView,))
    if any(isinstance(o, GlobalView) and o.param.name == name for o in walk(tk)):
        return
    tk.params[:] = [p for p in tk.params if p.name != name]
    prog.removed.append(name)


def _drop_dead(tk: TileKernel) -> None:
    """Remove casts whose results nothing reads (the anchor's cast before its old store)."""
    while True:
        read = {v.id for op in walk(tk) for v in op.inputs()}

        def rule(visit: Any, read: set[int] = read) -> Any:
            op: Op = visit.op
            return [] if op.result.id not in read else None

        if rewrite(tk, rule, kinds=(Cast,)) == 0:
            return
