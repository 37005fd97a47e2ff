"""Indirect addressing: scalars loaded from global memory and gathers through index tiles.

``a[i, j]`` (a global tensor indexed by integers / ``Expr`` only) loads one element: the
result is an integer ``Expr`` (the value, in registers, the same in every thread) usable as a
loop bound (``hl.range(n)``), a view origin, a condition (``hl.if_(n > 0)``) or an index.
``hl.load(a, (i, j), count=4)`` loads ``count`` consecutive elements of the last mode with
one vector load and returns a tuple of ``Expr``. Out-of-range coordinates read 0.

``a[...]`` with integer *index tiles* among the indices is a gathered global view, with
numpy's advanced-indexing semantics: the index tiles (register tiles computed with
``hl.iota`` and integer math, or global views of an index tensor) are broadcast together
to a shape ``B``; integers and ``Expr`` fix their mode; ``:`` and ``a:b`` (static width)
keep a mode. The result's modes are ``B`` followed by the kept modes in order, ``B`` taking
the place of the indexed modes when those are adjacent (numpy's rule), so

    k_cache[page, slot % BS, kvh, :]        # page, slot: (BN,) index tiles -> a (BN, D) view

is the ``(BN, D)`` tile whose row ``r`` is ``k_cache[page[r], slot[r] % BS, kvh, :]``.
An element whose coordinates fall outside the tensor (a negative or too large index, or an
index whose own load was out of range) reads as 0 and is never written, so ``hl.where(valid,
idx, -1)`` masks rows. A gathered view is copied like any global tile (``cp.async`` or vector
loads into shared memory / registers, stores or ``hl.atomic_add`` out of registers, never
TMA); it can be sliced, windowed and permuted. Without index tiles, ``a[s, :, 2:6]`` is the
plain view ``hl.view`` would give with the fixed modes dropped.
"""

from __future__ import annotations

from typing import Any

from hexlayout.ir.expr import BinOp, Const, Expr, ExprLike, as_expr, emin
from hexlayout.ir.gather import IndexMap, ModeIndex, ScalarLoad
from hexlayout.ir.lowered import RegArray
from hexlayout.ir.tile import GlobalView, Value
from hexlayout.ir.types import Scope, TileType

from .checks import as_index, begin, static_int
from .context import TraceContext
from .tensor import GlobalTensor, Tile, describe, method

__all__ = ["load", "index_global"]


def load(a: GlobalTensor, index: Any, count: int = 1) -> Any:
    """Load ``count`` consecutive elements of global tensor ``a`` starting at ``index``.

    ``y[i] = a[index[0], ..., index[-1] + i]`` for ``i < count``, loaded by every thread
    from the same address (one ``ld.global`` of ``count * bits`` bits), so the values are
    thread-uniform. Coordinates past the end of a mode read 0. The values are integer
    ``Expr``: a loop bound, a view origin, a condition or an index.

    Args:
        a (GlobalTensor): an integer global tensor argument.
        index (tuple[int | Expr, ...] | int | Expr): one coordinate per mode of ``a``.
        count (int): consecutive elements along the last mode (1, 2, 4; the load is
            ``count * bits`` bits wide and its address must be aligned to that width).

    Returns:
        Expr | tuple[Expr, ...]: the value (``count == 1``) or the ``count`` values.

    Raises:
        KernelError: ``a`` is not a global tensor or not of an integer type; ``index`` has
            the wrong length or a non-integer entry; the load is not 8 to 128 bits wide.

    Example:
        The sequence length of this block's sequence, as a loop bound::

            @hl.kernel(threads=128)
            def lengths(seq_lens: hl.i32["B"], out: hl.f32["B", "N"]):
                s = hl.grid(hl.spatial(seq_lens.shape[0]))
                n = seq_lens[s]                 # the same as hl.load(seq_lens, (s,))
                for j in hl.range(hl.cdiv(n, 64)):
                    pass

            lengths.trace()
    """
    ctx, loc = begin("load")
    return _load(ctx, loc, a, index, count)


def _load(ctx: TraceContext, loc: Any, a: Any, index: Any, count: int) -> Any:
    if not isinstance(a, GlobalTensor):
        raise ctx.error("load", loc, f"{a!r} is not a global tensor argument")
    if a.dtype.kind not in ("int", "uint"):
        raise ctx.error("load", loc, f"{a.name} holds {a.dtype} values; scalar loads read integer tensors "
                        "(indices, lengths, expert ids)")
    idx = index if isinstance(index, tuple) else (index,)
    if len(idx) != a.ndim:
        raise ctx.error("load", loc, f"{len(idx)} coordinates for the {a.ndim}-mode tensor {a.name}")
    coords = tuple(as_index(ctx, "load", loc, i, f"coordinate {m} of {a.name}") for m, i in enumerate(idx))
    n = static_int(count)
    bits = (n or 0) * a.dtype.bits
    if n is None or n < 1 or bits not in (8, 16, 32, 64, 128):
        raise ctx.error("load", loc, f"count={count!r}: a load of {a.dtype} elements moves 8 to 128 bits "
                        f"(count 1, 2, 4, ... up to {128 // a.dtype.bits})")
    for m, (c, s) in enumerate(zip(coords, a.shape)):
        cv, sv = static_int(c), static_int(s)
        if cv is not None and (cv < 0 or (sv is not None and cv + (n - 1 if m == a.ndim - 1 else 0) >= sv)):
            raise ctx.error("load", loc, f"coordinate {cv} is out of range for mode {m} of {a.name} "
                            f"(extent {sv})")
    arr = RegArray(ctx._unique(f"{a.name}_ld"), a.dtype, n)
    op = ScalarLoad(arr, a.param, coords, n, loc=loc)
    ctx.emit(op)
    vals = op.loaded()
    return vals[0] if n == 1 else tuple(vals)


def _broadcast(ctx: TraceContext, loc: Any, tiles: list[Tile], name: str) -> tuple[int, ...]:
    rank = max(t.ndim for t in tiles)
    out = [1] * rank
    for t in tiles:
        for i, s in enumerate(t.shape):
            k = rank - t.ndim + i
            if s != 1 and out[k] not in (1, s):
                shapes = ", ".join(describe(x.value) for x in tiles)
                raise ctx.error("gather", loc, f"the index tiles of {name} do not broadcast together "
                                f"({shapes})")
            if s != 1:
                out[k] = s
    return tuple(out)


def _width(start: ExprLike, stop: ExprLike) -> int | None:
    """``stop - start`` when it is static (``s:s+W`` with a runtime ``s`` included)."""
    w = static_int(as_expr(stop) - as_expr(start))
    if w is not None:
        return w
    e = as_expr(stop)
    if isinstance(e, BinOp) and e.op == "+" and isinstance(e.b, Const) and isinstance(e.a, Expr) \
            and isinstance(start, Expr) and e.a == start:
        return e.b.value
    # the same runtime terms, constants apart (``n0 + 64 : n0 + 128``, folded by the arithmetic)
    from hexlayout.ir.expr import to_c
    from hexlayout.ir.passes.algebra import linear_terms

    def parts(x: ExprLike) -> tuple[list[str], int]:
        terms = linear_terms(as_expr(x))
        return sorted(to_c(t) for t in terms if not isinstance(t, Const)), \
            sum(t.value for t in terms if isinstance(t, Const))

    (a, ca), (b, cb) = parts(start), parts(stop)
    return cb - ca if a == b else None


@method("index_global")
def index_global(a: GlobalTensor, index: Any) -> Any:
    """``a[index]``: a scalar load, a plain view or a gathered view (see the module docstring)."""
    ctx, loc = begin("gather")
    idx = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in idx):
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (a.ndim - len(idx) + 1) + idx[k + 1:]
    if len(idx) > a.ndim:
        raise ctx.error("gather", loc, f"{len(idx)} indices for the {a.ndim}-mode tensor {a.name}")
    idx = idx + (slice(None),) * (a.ndim - len(idx))
    tiles = [i for i in idx if isinstance(i, Tile)]
    if not tiles and not any(isinstance(i, slice) for i in idx):
        return _load(ctx, loc, a, idx, 1)
    for t in tiles:
        if t._ctx is not ctx:
            raise ctx.error("gather", loc, f"index tile %{t.name} belongs to another kernel trace")
        if t.dtype.kind not in ("int", "uint"):
            raise ctx.error("gather", loc, f"index tile {describe(t.value)} of {a.name} must hold integers")
        if t.value.scope == Scope.SHARED:
            raise ctx.error("gather", loc, f"index tile {describe(t.value)} of {a.name} is a shared tile; "
                            "copy it into registers first")
    origin: list[ExprLike] = []
    kept: list[tuple[int, int]] = []          # (tensor mode, width) of the kept modes
    for m, i in enumerate(idx):
        if isinstance(i, slice):
            if i.step not in (None, 1):
                raise ctx.error("gather", loc, f"mode {m} of {a.name}: slice steps are not supported")
            start = 0 if i.start is None else as_index(ctx, "gather", loc, i.start, f"mode {m} start")
            stop = a.shape[m] if i.stop is None else as_index(ctx, "gather", loc, i.stop, f"mode {m} stop")
            width = _width(start, stop)
            if width is None or width <= 0:
                raise ctx.error("gather", loc, f"mode {m} of {a.name}: the slice {i.start}:{i.stop} must "
                                "have a static positive width (the tensor's extent is not static: give "
                                "start:start+W)")
            origin.append(start)
            kept.append((m, width))
        elif isinstance(i, Tile):
            origin.append(0)
        else:
            origin.append(as_index(ctx, "gather", loc, i, f"index of mode {m} of {a.name}"))
    if not tiles:
        from .memory import view

        shape = tuple(dict(kept).get(m, 1) for m in range(a.ndim))
        v = view(a, shape, tuple(origin))
        fixed = tuple(0 if not isinstance(i, slice) else slice(None) for i in idx)
        return v[fixed]
    bshape = _broadcast(ctx, loc, tiles, a.name)
    adv = [m for m, i in enumerate(idx) if not isinstance(i, slice)]
    adjacent = adv == list(range(adv[0], adv[-1] + 1))
    before = sum(1 for m, _ in kept if m < adv[0]) if adjacent else 0
    # result modes: kept modes before B, then B, then the other kept modes
    shape = tuple(w for _, w in kept[:before]) + bshape + tuple(w for _, w in kept[before:])
    b0 = before
    values: list[Value] = []
    modes: list[ModeIndex] = []
    extent: list[ExprLike] = [0] * len(shape)
    for k in range(len(bshape)):
        extent[b0 + k] = bshape[k]
    for j, (m, w) in enumerate(kept):
        k = j if j < before else j + len(bshape)
        ext = a.shape[m] - origin[m]
        sv = static_int(ext)
        extent[k] = min(sv, w) if sv is not None else emin(ext, w)
    for m, i in enumerate(idx):
        if isinstance(i, slice):
            j = [km for km, _ in kept].index(m)
            modes.append(ModeIndex(j if j < before else j + len(bshape)))
        elif isinstance(i, Tile):
            pos = next((p for p, v in enumerate(values) if v is i.value), None)
            if pos is None:
                pos = len(values)
                values.append(i.value)
            axes = tuple(b0 + len(bshape) - i.ndim + a_ for a_ in range(i.ndim))
            modes.append(ModeIndex(None, pos, axes))
        else:
            modes.append(ModeIndex(None))
    ty = TileType(a.dtype, shape, Scope.GLOBAL, None)
    v = ctx.new_value(ty, loc, tuple(values), default=f"{a.name}_rows")
    ctx.emit(GlobalView(v, a.param, tuple(origin), tuple(extent), None, tuple(values),
                        IndexMap(tuple(modes)), loc=loc))
    return Tile(v, ctx)
