"""Tile operations: ``copy``, ``mma``, ``cast``, ``fill`` / ``full`` / ``zeros``, ``reduce``,
``rearrange``, ``iota``, ``assign``.

- ``hl.copy(src, dst, instruction=None, mask=None, mbarrier=None)``: ``dst = src`` for
  tiles of equal shape and element type, between scopes global->register,
  global->shared, shared->register, register->shared, register->global, shared->global.
  ``instruction`` names a copy atom (``hexlayout.arch``) to force, else synthesis picks.
  ``mask``: an ``Expr`` (copy all or nothing) or a predicate tile of the copy's shape.
  ``mbarrier=bars[i]`` (global->shared only): an asynchronous bulk (TMA) copy that
  completes as transaction bytes on that barrier.
- ``hl.mma(a, b, c, atom=None, warps=None)``: ``c += a @ b^T`` with ``a`` (M,K), ``b``
  (N,K) register or shared tiles and ``c`` (M,N) a register accumulator (f32, f16 or
  s32). ``atom`` forces an mma atom, ``warps`` the task mapping of the atom's thread
  groups (warps / warp groups) over the (M/atom_m, N/atom_n) atom tiles.
- ``hl.cast(x, dtype)``: a new register tile of ``dtype`` (round to nearest even).
- ``hl.fill(x, v)``; ``hl.full(shape, v, dtype)``, ``hl.zeros(shape, dtype)``: new
  register tiles (``Alloc`` + ``Fill``).
- ``hl.reduce(x, "sum" | "max" | "min", axis)``: keeps ``axis`` with extent 1, so the
  result broadcasts against ``x``. ``hl.sum``, ``hl.max_reduce``, ``hl.min_reduce``.
- ``hl.rearrange(x, layout=hl.auto)``: the same values in a register tile of another
  layout (synthesis routes it through shuffles or shared memory).
- ``hl.iota(shape, axis)``: a register s32 tile whose element at ``c`` is ``c[axis]``.
- ``hl.assign(dst, src)`` (also ``dst[...] = src``): write ``src`` (broadcast) into ``dst``.
"""

from __future__ import annotations

from typing import Any

from hexlayout.arch import get_atom
from hexlayout.arch.copy_atom import CopyAtom
from hexlayout.arch.dtypes import DType
from hexlayout.arch.mma_atom import MmaAtom
from hexlayout.ir.expr import Expr
from hexlayout.ir.mapping import TaskMapping
from hexlayout.ir.mapping import spatial as _spatial
from hexlayout.ir.tile import Alloc, Cast, Copy, Fill, Iota, Mma, Rearrange, Reduce
from hexlayout.ir.types import LayoutVar, Scope, TileType

from .checks import SCOPE_NAMES, as_tile, begin, require_scope, static_int, static_shape
from .dtypes import canonical, f32, i32
from .layouts import auto, resolve_layout
from .math import elementwise
from .sync import BarrierRef, as_barrier
from .tensor import Tile, describe, shape_str

__all__ = ["copy", "mma", "cast", "fill", "full", "zeros", "reduce", "sum_", "max_reduce", "min_reduce",
           "rearrange", "iota", "assign"]

G, S, R = Scope.GLOBAL, Scope.SHARED, Scope.REGISTER
_COPY_PAIRS = {(G, R), (G, S), (S, R), (R, S), (R, G), (S, G)}
_SPACE = {G: "gmem", S: "smem", R: "rmem"}


def copy(src: Tile, dst: Tile, instruction: str | None = None, mask: Any = None,
         mbarrier: BarrierRef | Any = None) -> None:
    """``dst = src`` (see the module docstring)."""
    ctx, loc = begin("copy")
    s = as_tile(ctx, "copy", loc, src, "src")
    d = as_tile(ctx, "copy", loc, dst, "dst")
    pair = f"src {describe(s.value)} and dst {describe(d.value)}"
    if (s.scope, d.scope) not in _COPY_PAIRS:
        hint = " (use hl.rearrange to change a register layout)" if s.scope == d.scope == R else ""
        raise ctx.error("copy", loc, f"cannot copy {SCOPE_NAMES[s.scope]} -> {SCOPE_NAMES[d.scope]}: {pair}; "
                        "allowed: global->register/shared, shared->register/global, register->shared/global"
                        + hint)
    if s.shape != d.shape:
        raise ctx.error("copy", loc, f"shapes differ: {pair}")
    if s.dtype != d.dtype:
        raise ctx.error("copy", loc, f"element types differ: {pair}; convert with hl.cast first")
    if instruction is not None:
        try:
            atom = get_atom(instruction)
        except ValueError as e:
            raise ctx.error("copy", loc, f"instruction: {e}") from None
        if not isinstance(atom, CopyAtom):
            raise ctx.error("copy", loc, f"instruction {instruction!r} is not a copy atom")
        spaces = (_SPACE[s.scope], _SPACE[d.scope])
        if atom.kind != "universal" and (atom.src_space, atom.dst_space) != spaces:
            raise ctx.error("copy", loc, f"instruction {instruction} copies {atom.src_space} -> "
                            f"{atom.dst_space}, "
                            f"but {pair}")
    m: Any = None
    if mask is not None:
        if isinstance(mask, Tile):
            mt = as_tile(ctx, "copy", loc, mask, "mask")
            if mt.dtype.name != "pred" or mt.shape != s.shape or mt.scope != R:
                raise ctx.error("copy", loc, f"mask {describe(mt.value)} must be a register predicate "
                                "tile of "
                                f"shape {shape_str(s.shape)}")
            m = mt.value
        elif isinstance(mask, (bool, int, Expr)):
            m = mask
        else:
            raise ctx.error("copy", loc, f"mask {mask!r} must be an expression or a predicate tile")
    bar, bidx = None, 0
    if mbarrier is not None:
        ref = as_barrier(ctx, "copy", loc, mbarrier)
        if (s.scope, d.scope) != (G, S):
            raise ctx.error("copy", loc, f"mbarrier= is for global->shared bulk (TMA) copies, not {pair}")
        bar, bidx = ref.bar, ref.index
    ctx.emit(Copy(s.value, d.value, instruction, m, bar, bidx, loc=loc))


_ACC = {"f32", "f16", "s32"}


def mma(a: Tile, b: Tile, c: Tile, atom: str | None = None, warps: TaskMapping | tuple[int, ...] | None = None
        ) -> None:
    """``c += a @ b^T`` (see the module docstring)."""
    ctx, loc = begin("mma")
    ta = as_tile(ctx, "mma", loc, a, "a")
    tb = as_tile(ctx, "mma", loc, b, "b")
    tc = as_tile(ctx, "mma", loc, c, "c")
    require_scope(ctx, "mma", loc, ta, "a", (R, S))
    require_scope(ctx, "mma", loc, tb, "b", (R, S))
    require_scope(ctx, "mma", loc, tc, "c (the accumulator)", (R,))
    for role, t in (("a", ta), ("b", tb), ("c", tc)):
        if t.ndim != 2:
            raise ctx.error("mma", loc, f"{role} {describe(t.value)} must be a matrix (2 modes)")
    (am, ak), (bn, bk), (cm, cn) = ta.shape, tb.shape, tc.shape
    da, db, dc = describe(ta.value), describe(tb.value), describe(tc.value)
    if ak != bk:
        raise ctx.error("mma", loc, f"a {da} but b {db}; K differs ({ak} vs {bk}); b must be (N,K)")
    if am != cm:
        raise ctx.error("mma", loc, f"a {da} but c {dc}; M differs ({am} vs {cm})")
    if bn != cn:
        raise ctx.error("mma", loc, f"b {db} but c {dc}; N differs ({bn} vs {cn})")
    fp8 = {"e4m3", "e5m2"}
    if ta.dtype != tb.dtype and not (ta.dtype.name in fp8 and tb.dtype.name in fp8):
        raise ctx.error("mma", loc, f"a {da} and b {db} have different element types")
    if tc.dtype.name not in _ACC:
        raise ctx.error("mma", loc, f"the accumulator c {dc} must be f32, f16 or s32")
    if (tc.dtype.name == "s32") != (ta.dtype.kind in ("int", "uint")):
        raise ctx.error("mma", loc, f"a {da} cannot accumulate into c {dc}")
    if atom is not None:
        try:
            at = get_atom(atom)
        except ValueError as e:
            raise ctx.error("mma", loc, f"atom: {e}") from None
        if not isinstance(at, MmaAtom):
            raise ctx.error("mma", loc, f"atom {atom!r} is not an mma atom")
        for role, t, want in (("a", ta, at.a_dtype), ("b", tb, at.b_dtype), ("c", tc, at.c_dtype)):
            if t.dtype.name != want.name and not (want.name == "tf32" and t.dtype.name == "f32"):
                raise ctx.error("mma", loc, f"atom {atom} takes {role} as {want}, but {role} is "
                                f"{describe(t.value)}")
        for what, n, d in (("M", am, at.m), ("N", bn, at.n), ("K", ak, at.k)):
            if n % d:
                raise ctx.error("mma", loc, f"atom {atom} is {at.m}x{at.n}x{at.k}: {what}={n} is not a "
                                "multiple "
                                f"of {d}")
        for role, t, src in (("a", ta, at.a_source), ("b", tb, at.b_source)):
            want_scope = S if src == "smem" else R
            if t.scope != want_scope:
                raise ctx.error("mma", loc, f"atom {atom} reads {role} from {SCOPE_NAMES[want_scope]} "
                                "memory, "
                                f"but {role} is {describe(t.value)}")
    wm: TaskMapping | None = None
    if warps is not None:
        if isinstance(warps, tuple) and all(static_int(w) is not None for w in warps):
            wm = _spatial(*warps)
        elif isinstance(warps, TaskMapping):
            wm = warps
        else:
            raise ctx.error("mma", loc, f"warps={warps!r} must be a task mapping (hl.spatial(...)) or a "
                            "tuple")
        if wm.num_workers * 32 > ctx.threads:
            raise ctx.error("mma", loc, f"warps={wm} needs {wm.num_workers} warps, the block has "
                            f"{ctx.threads // 32}")
    ctx.emit(Mma(ta.value, tb.value, tc.value, atom, wm, loc=loc))


def cast(x: Tile, dtype: DType) -> Tile:
    """A register tile holding ``x`` converted to ``dtype``."""
    ctx, loc = begin("cast")
    t = as_tile(ctx, "cast", loc, x, "x")
    require_scope(ctx, "cast", loc, t, "x", (R,))
    try:
        dt = canonical(dtype)
    except (ValueError, KeyError, AttributeError):
        raise ctx.error("cast", loc, f"{dtype!r} is not an element type") from None
    v = ctx.new_value(TileType(dt, t.shape, R, LayoutVar()), loc, (t.value,))
    ctx.emit(Cast(v, t.value, loc=loc))
    return Tile(v, ctx)


def _scalar(ctx: Any, op: str, loc: Any, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        try:
            return float(v)
        except (TypeError, ValueError):
            raise ctx.error(op, loc, f"fill value {v!r} must be a number") from None
    return float(v)


def fill(x: Tile, value: float) -> Tile:
    """Set every element of register or shared tile ``x`` to ``value``; returns ``x``."""
    ctx, loc = begin("fill")
    t = as_tile(ctx, "fill", loc, x, "x")
    require_scope(ctx, "fill", loc, t, "x", (R, S))
    ctx.emit(Fill(t.value, _scalar(ctx, "fill", loc, value), loc=loc))
    return t


def full(shape: tuple[int, ...] | int, value: float, dtype: DType = f32, layout: Any = auto, *,
         name: str | None = None) -> Tile:
    """A new register tile of ``shape`` filled with ``value``."""
    ctx, loc = begin("full")
    shp = static_shape(ctx, "full", loc, shape, "shape")
    try:
        dt = canonical(dtype)
    except (ValueError, KeyError, AttributeError):
        raise ctx.error("full", loc, f"{dtype!r} is not an element type") from None
    val = _scalar(ctx, "full", loc, value)
    v = ctx.new_value(TileType(dt, shp, R, None), loc, name=name)
    v.type.layout = resolve_layout(ctx, "full", loc, f"%{v.name}", R, shp, layout)
    if isinstance(v.type.layout, LayoutVar) and not v.type.layout.name:
        v.type.layout.name = v.name
    ctx.emit(Alloc(v, loc=loc))
    ctx.emit(Fill(v, val, loc=loc))
    return Tile(v, ctx)


def zeros(shape: tuple[int, ...] | int, dtype: DType = f32, layout: Any = auto, *,
          name: str | None = None) -> Tile:
    """``hl.full(shape, 0.0, dtype)``."""
    return full(shape, 0.0, dtype, layout, name=name)


_REDUCE = ("sum", "max", "min")


def reduce(x: Tile, fn: str, axis: int) -> Tile:
    """Reduce ``x`` along ``axis`` with ``fn``; the axis stays with extent 1."""
    ctx, loc = begin("reduce")
    t = as_tile(ctx, "reduce", loc, x, "x")
    require_scope(ctx, "reduce", loc, t, "x", (R,))
    if fn not in _REDUCE:
        raise ctx.error("reduce", loc, f"unknown reduction {fn!r}; use one of {', '.join(_REDUCE)}")
    ax = static_int(axis)
    if ax is None or not -t.ndim <= ax < t.ndim:
        raise ctx.error("reduce", loc, f"axis {axis!r} out of range for {describe(t.value)}")
    ax %= t.ndim
    shape = tuple(1 if i == ax else s for i, s in enumerate(t.shape))
    v = ctx.new_value(TileType(t.dtype, shape, R, LayoutVar()), loc, (t.value,))
    ctx.emit(Reduce(v, t.value, fn, ax, loc=loc))
    return Tile(v, ctx)


def sum_(x: Tile, axis: int) -> Tile:
    return reduce(x, "sum", axis)


def max_reduce(x: Tile, axis: int) -> Tile:
    return reduce(x, "max", axis)


def min_reduce(x: Tile, axis: int) -> Tile:
    return reduce(x, "min", axis)


def rearrange(x: Tile, layout: Any = auto) -> Tile:
    """``x``'s values in a new register tile with layout ``layout``."""
    ctx, loc = begin("rearrange")
    t = as_tile(ctx, "rearrange", loc, x, "x")
    require_scope(ctx, "rearrange", loc, t, "x", (R,))
    v = ctx.new_value(TileType(t.dtype, t.shape, R, None), loc, (t.value,))
    v.type.layout = resolve_layout(ctx, "rearrange", loc, f"%{v.name}", R, t.shape, layout)
    if isinstance(v.type.layout, LayoutVar) and not v.type.layout.name:
        v.type.layout.name = v.name
    ctx.emit(Rearrange(v, t.value, loc=loc))
    return Tile(v, ctx)


def iota(shape: tuple[int, ...] | int, axis: int, dtype: DType = i32, layout: Any = auto) -> Tile:
    """A register tile whose element at coordinate ``c`` is ``c[axis]``."""
    ctx, loc = begin("iota")
    shp = static_shape(ctx, "iota", loc, shape, "shape")
    ax = static_int(axis)
    if ax is None or not -len(shp) <= ax < len(shp):
        raise ctx.error("iota", loc, f"axis {axis!r} out of range for shape {shape_str(shp)}")
    dt = canonical(dtype)
    if dt.kind not in ("int", "uint"):
        raise ctx.error("iota", loc, f"iota needs an integer element type, not {dt}")
    v = ctx.new_value(TileType(dt, shp, R, None), loc)
    v.type.layout = resolve_layout(ctx, "iota", loc, f"%{v.name}", R, shp, layout)
    ctx.emit(Iota(v, ax % len(shp), loc=loc))
    return Tile(v, ctx)


def assign(dst: Tile, src: Any) -> Tile:
    """Write ``src`` (a tile or scalar, broadcast) into register tile ``dst``; returns ``dst``."""
    if not isinstance(src, Tile):
        return fill(dst, src)
    return elementwise("mov", (src,), out=dst, opname="assign")
