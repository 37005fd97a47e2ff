"""Lowering of ``Scan``: inclusive scans along one axis of a register tile.

The layout is analysed first (``scan_plan``). Element ``(t, v)`` sits at position
``pos(t, v) = p(v) + sum_{b in B} bit_b(t) * s_b`` along the axis: ``p(v)`` is the offset of
value ``v`` inside its thread (the same in every thread) and each thread bit ``b`` of ``B``
adds a fixed stride ``s_b`` (the other thread bits select rows, or replicate). Written as a
mixed-radix number, a position has *digits* sorted by stride: each thread bit is a digit of
radix 2, and the value offsets between two thread strides form a value digit (radix
``m``, e.g. the 4 values of a thread's 16-byte vector, or an outer repeat).

The scan then merges the digits from the smallest stride up (a divide-and-conquer,
Sklansky-style scan). Before digit ``d`` is merged each element holds the scan of its
*segment*, the positions that agree with it on ``d`` and every digit above; merging ``d``:

- a value digit whose lower digits are all in the thread: the thread's own values in order,
  ``acc[j] = acc[j-1] (+) acc[j]`` (the sequential part);
- a value digit above thread digits: the totals of the sub-segments (the element with the
  lower digits at their last position, held by the thread whose merged bits are all set)
  are fetched, prefixed in order in registers, and each element takes in its predecessors';
- lane bits ``b0, b0+1, ...`` that are the lowest digits (each thread holds one position of
  the row there): Kogge-Stone, round ``r`` combining with the element ``2^r`` lanes before
  (``shfl.sync.up``); where a thread holds several positions this would need one more
  round for the exclusive prefix, so the per-bit merge below (as many rounds) is used;
- a thread bit ``b``: the threads with ``bit_b = 1`` (the later half) take in the total of
  the earlier half, fetched from thread ``(t & ~(M | 2^b)) | M`` (``M``: the thread bits merged
  so far) - a warp shuffle (``shfl.sync.idx``) when ``M | 2^b`` lies within the lanes, else a
  shared-memory exchange (every thread stores, a barrier, every thread loads, a barrier);
- consecutive warp bits at once: the thread holding each warp segment's last element stores
  it, a barrier, each thread combines the totals of the warp segments before its own in
  order, a barrier (two barriers however many warps).

A layout without such digits (a thread mode of 12 rows along the axis) goes through shared
memory instead: stored row-major, each thread scans whole rows one position after the other,
loaded back.

``reverse`` mirrors every digit (the last position of a segment is the smallest, the later
half of a thread bit is ``bit_b = 0``). ``(+)`` is ``fn`` for add / mul / max / min; for
``linear`` an element is the pair ``(A, B)`` (``h = A h_prev + B``) and ``(A1, B1) then (A2, B2) =
(A2 A1, A2 B1 + B2)`` (one ``fma``, one ``mul``). ``init`` enters last as the element before
the first. With ``valid`` (a ragged view's in-bounds extent along the axis) the elements at
positions ``>= valid`` start as the identity (0, 1, -inf, +inf, (1, 0)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexlayout.layout import Layout

from ..expr import as_expr
from ..lowered import Alu, Instr, LdShared, RegArray, RegRef, SharedRef, Shfl, StShared
from ..tile import Scan
from .math import reduce_identity, value_map
from .views import RegisterTile, tile_coords

__all__ = ["ScanPlan", "scan_plan", "lower_scan", "scan_identity"]


def scan_identity(fn: str, dtype: Any) -> tuple[float | int, ...]:
    """The identity of scan ``fn`` in ``dtype`` (a pair ``(A, B) = (1, 0)`` for ``linear``)."""
    if fn == "linear":
        return (1, 0)
    if fn == "mul":
        return (1,)
    return (reduce_identity({"add": "sum"}.get(fn, fn), dtype),)


@dataclass
class ScanPlan:
    """The digits of the scanned axis over a register layout (see the module docstring).

    ``digits``: ``("thread", bit, stride)`` or ``("value", radix, stride)``, by stride;
    ``value_of[g][j]``: the value index of row group ``g`` (the thread's values of one row)
    whose value digits are the tuple ``j`` (one entry per value digit, in digit order);
    ``digit_of[v]``: ``(g, j)`` of value ``v``."""

    digits: list[tuple[str, int, int]]
    value_of: list[dict[tuple[int, ...], int]]
    digit_of: dict[int, tuple[int, tuple[int, ...]]]


def _thread_bits(pos: np.ndarray, row: np.ndarray) -> dict[int, int] | str:
    """``{bit: stride}`` of the thread bits that move an element along the axis."""
    nt = pos.shape[0]
    bits: dict[int, int] = {}
    for b in range(max(nt - 1, 0).bit_length()):
        t0 = np.array([t for t in range(nt) if not t >> b & 1 and t | 1 << b < nt])
        if not len(t0):
            continue
        d = pos[t0 | 1 << b] - pos[t0]
        if not d.any():
            continue
        if (d != d.flat[0]).any() or d.flat[0] <= 0 or (row[t0 | 1 << b] != row[t0]).any():
            return f"thread bit {b} moves elements along the axis by different amounts or across rows"
        bits[b] = int(d.flat[0])
    return bits


def _digits(bits: dict[int, int], offsets: list[int], n: int) -> list[tuple[str, int, int]] | str:
    """The mixed-radix digits of positions ``0..n-1`` (thread bits of radix 2, value digits between)."""
    by_stride = {s: b for b, s in bits.items()}
    digits: list[tuple[str, int, int]] = []
    covered = 1
    while covered < n:
        if covered in by_stride:
            digits.append(("thread", by_stride[covered], covered))
            covered *= 2
            continue
        nxt = min([s for s in by_stride if s > covered] + [n])
        if nxt % covered:
            return f"the positions along the axis are not a mixed-radix number (stride {nxt} after {covered})"
        digits.append(("value", nxt // covered, covered))
        covered = nxt
    nvals = 1
    for kind, r, _ in digits:
        nvals *= r if kind == "value" else 1
    if covered != n or len(offsets) != nvals or not all(_split(p, digits)[1] for p in offsets):
        return "the thread's values along the axis do not complete the positions the threads leave"
    return digits


def _split(p: int, digits: list[tuple[str, int, int]]) -> tuple[tuple[int, ...], bool]:
    """The value digits of offset ``p``, and whether its thread digits are all 0."""
    js, ok = [], True
    for kind, r, s in digits:
        d = p // s % (r if kind == "value" else 2)
        if kind == "value":
            js.append(d)
        elif d:
            ok = False
    return tuple(js), ok


def scan_plan(tile: RegisterTile, axis: int) -> ScanPlan | str:
    """The digits of ``axis`` over ``tile``'s TV layout, or the reason the layout has none."""
    table = tile.index_table()
    coords = tile_coords(table, tile.shape)
    pos = coords[axis]
    row = np.zeros_like(pos)
    scale = 1
    for k, s in enumerate(tile.shape):
        if k != axis:
            row = row + coords[k] * scale
            scale *= s
    bits = _thread_bits(pos, row)
    if isinstance(bits, str):
        return bits
    t = np.arange(pos.shape[0])
    tpart = sum(((t >> b) & 1) * s for b, s in bits.items()) if bits else np.zeros_like(t)
    off = pos - np.asarray(tpart)[:, None]
    if (off != off[:1]).any():
        return "the value offsets along the axis differ between threads"
    groups: dict[int, int] = {}
    value_of: list[dict[tuple[int, ...], int]] = []
    digit_of: dict[int, tuple[int, tuple[int, ...]]] = {}
    same_row = row[:, :, None] == row[:, None, :]
    if (same_row != same_row[:1]).any():
        return "the values of one row differ between threads"
    offsets_of: dict[int, list[int]] = {}
    for v in range(pos.shape[1]):
        g = groups.setdefault(int(row[0, v]), len(groups))
        offsets_of.setdefault(g, []).append(int(off[0, v]))
    digits = _digits(bits, offsets_of[0], tile.shape[axis])
    if isinstance(digits, str):
        return digits
    for v in range(pos.shape[1]):
        g = groups[int(row[0, v])]
        js, ok = _split(int(off[0, v]), digits)
        if g == len(value_of):
            value_of.append({})
        if not ok or js in value_of[g]:
            return "the thread's values along the axis overlap the positions of other threads"
        value_of[g][js] = v
        digit_of[v] = (g, js)
    if any(len(vs) != len(value_of[0]) for vs in value_of):
        return "the rows of a thread hold different positions along the axis"
    return ScanPlan(digits, value_of, digit_of)


class _Scan:
    """The instructions of one scan, built digit by digit (``lower_scan``)."""

    def __init__(self, fn: str, dst: RegisterTile, plan: ScanPlan, reverse: bool, tid: Any,
                 scratch: Callable[[str, int], RegArray], exchange: Any) -> None:
        self.fn, self.plan, self.reverse, self.t = fn, plan, reverse, as_expr(tid)
        self.dst, self.nv, self.threads = dst, dst.values, dst.threads
        self.linear = fn == "linear"
        # the running elements, in the result's registers: (x,), or (A, B) for linear (h = A h_prev + B)
        self.acc = (scratch("a", self.nv), dst.array) if self.linear else (dst.array,)
        self.tmp = tuple(scratch(f"t{i}", self.nv) for i in range(len(self.acc)))
        self.exchange = exchange
        self.scratch_of = lambda name: scratch(name, self.nv)
        self.xchg: Any = None
        self.out: list[Instr] = []

    def combine(self, earlier: tuple[RegRef, ...], later: tuple[RegRef, ...], pred: Any = None) -> None:
        """``later = earlier then later``."""
        if self.linear:
            (ea, eb), (la, lb) = earlier, later
            self.out.append(Alu("fma", lb, (la, eb, lb), pred=pred))
            self.out.append(Alu("mul", la, (la, ea), pred=pred))
        else:
            self.out.append(Alu(self.fn, later[0], (earlier[0], later[0]), pred=pred))

    def position(self, v: int) -> Any:
        """The position of value ``v`` along the axis: its value digits' offset plus
        ``sum_b ((t >> b) & 1) * s_b`` over the axis's thread bits."""
        js = iter(self.plan.digit_of[v][1])
        pos: Any = 0
        d, digits = 0, self.plan.digits
        while d < len(digits):
            kind, r, stride = digits[d]
            if kind == "value":
                pos, d = pos + next(js) * stride, d + 1
                continue
            k = _run(digits[d:], r)         # consecutive bits with doubling strides: one field
            pos, d = pos + ((self.t >> r) & ((1 << k) - 1)) * stride, d + k
        return as_expr(pos)

    def refs(self, arrays: tuple[RegArray, ...], v: int) -> tuple[RegRef, ...]:
        return tuple(RegRef(a, v, 1) for a in arrays)

    def last(self, v: int, merged: int) -> int:
        """The value of ``v``'s row whose first ``merged`` value digits are at the last position."""
        g, js = self.plan.digit_of[v]
        radix = [r for kind, r, _ in self.plan.digits if kind == "value"]
        j = tuple((0 if self.reverse else radix[k] - 1) if k < merged else x for k, x in enumerate(js))
        return self.plan.value_of[g][j]

    def fetch(self, values: list[int], src: Any, mask: int) -> None:
        """``tmp[i] = acc[values[i]]`` of thread ``src`` (which differs from this one in ``mask``'s bits)."""
        if mask < 32:
            for i, v in enumerate(values):
                for a, tm in zip(self.acc, self.tmp):
                    self.out.append(Shfl(RegRef(tm, i, 1), RegRef(a, v, 1), "idx", src & 31))
            return
        bits, nt, nval = self.dst.dtype.bits, self.threads, len(values)
        if self.xchg is None or self.xchg[2] < nval:     # one buffer for every exchange of this size
            self.xchg = (*self.exchange(len(self.acc) * nval * nt * bits // 8), nval)
        buf, barrier, _ = self.xchg
        for k, a in enumerate(self.acc):
            for i, v in enumerate(values):
                at = SharedRef(buf, (k * nval + i) * nt + self.t)
                self.out.append(StShared(at, RegRef(a, v, 1), bits))
        self.out.append(barrier())
        for k, tm in enumerate(self.tmp):
            for i in range(nval):
                at = SharedRef(buf, (k * nval + i) * nt + src)
                self.out.append(LdShared(RegRef(tm, i, 1), at, bits))
        self.out.append(barrier())

    def kogge_stone(self, b0: int, k: int) -> None:
        """Merge lane bits ``b0 .. b0+k-1``, the lowest digits (each thread holds one position of
        the row across them), by Kogge-Stone: round ``r`` reads the element ``2^r`` positions
        before (``shfl.up``; ``shfl.down`` reversed) and combines where there is one."""
        j = (self.t >> b0) & ((1 << k) - 1)
        for r in range(k):
            d = 1 << r
            for a, tm in zip(self.acc, self.tmp):
                mode = "down" if self.reverse else "up"
                self.out.append(Shfl(RegRef(tm, 0, self.nv), RegRef(a, 0, self.nv), mode, d << b0))
            later = j <= (1 << k) - 1 - d if self.reverse else j >= d
            for v in range(self.nv):
                self.combine(self.refs(self.tmp, v), self.refs(self.acc, v), later)

    def warp_digits(self, b0: int, k: int, mask: int, merged: int) -> None:
        """Merge the thread bits ``b0 .. b0+k-1`` (warps) at once through shared memory: the
        thread holding each warp segment's last element stores it, a barrier, every thread
        combines the totals of the segments before its own (in order), a barrier."""
        t, nw, run_mask = self.t, 1 << k, ((1 << k) - 1) << b0
        lasts = sorted({self.last(v, merged) for v in range(self.nv)})
        nval, nt, bits = len(lasts), self.threads, self.dst.dtype.bits
        if self.xchg is None or self.xchg[2] < nval:
            self.xchg = (*self.exchange(len(self.acc) * nval * nt * bits // 8), nval)
        buf, barrier, _ = self.xchg
        writer = (t & mask).eq(0 if self.reverse else mask)
        for a_, arr in enumerate(self.acc):
            for i, v in enumerate(lasts):
                at = SharedRef(buf, (a_ * nval + i) * nt + t)
                self.out.append(StShared(at, RegRef(arr, v, 1), bits, pred=writer if mask else None))
        self.out.append(barrier())
        prefix = tuple(self.scratch_of(f"p{a_}") for a_ in range(len(self.acc)))
        for arr, e in zip(prefix, scan_identity(self.fn, self.dst.dtype)):
            self.out.append(Alu("mov", RegRef(arr, 0, nval), (e,)))
        j = (t >> b0) & (nw - 1)
        order = list(range(nw - 1, -1, -1)) if self.reverse else list(range(nw))
        base = (t & ~(mask | run_mask)) | (0 if self.reverse else mask)
        for w in order[:-1]:
            src = base | (w << b0)
            for a_, tm in enumerate(self.tmp):
                for i in range(nval):
                    at = SharedRef(buf, (a_ * nval + i) * nt + src)
                    self.out.append(LdShared(RegRef(tm, i, 1), at, bits))
            before = j < w if self.reverse else j > w
            for i in range(nval):
                self.combine(self.refs(prefix, i), self.refs(self.tmp, i))
                for p_, tm in zip(prefix, self.tmp):
                    self.out.append(Alu("mov", RegRef(p_, i, 1), (RegRef(tm, i, 1),), pred=before))
        self.out.append(barrier())
        for v in range(self.nv):
            self.combine(self.refs(prefix, lasts.index(self.last(v, merged))), self.refs(self.acc, v))

    def gather_carry(self, carry: RegisterTile, mask: int) -> str | None:
        """``carry`` = the result at each row's last position (``mask``: every thread bit of
        the axis; the element sits in the thread with them all set, or all clear reversed)."""
        m = value_map(self.dst, carry)
        if isinstance(m, str):
            return f"carry: {m}"
        nvd = sum(kind == "value" for kind, _, _ in self.plan.digits)
        lasts = [self.last(int(np.argmax(m == w)), nvd) for w in range(carry.values)]
        if mask:
            self.fetch(lasts, (self.t & ~mask) if self.reverse else (self.t | mask), mask)
        for w, v in enumerate(lasts):
            src = RegRef(self.tmp[-1], w, 1) if mask else RegRef(self.acc[-1], v, 1)
            self.out.append(Alu("mov", RegRef(carry.array, w, 1), (src,)))
        return None

    def thread_digit(self, b: int, mask: int, merged: int) -> None:
        """Merge thread bit ``b`` (``mask``: the thread bits merged before, ``merged``: the value digits)."""
        t = self.t
        if self.reverse:
            src, later = (t & ~mask) | (1 << b), ((t >> b) & 1).eq(0)
        else:
            src, later = (t & ~(mask | 1 << b)) | mask, ((t >> b) & 1).eq(1)
        lasts = sorted({self.last(v, merged) for v in range(self.nv)})
        self.fetch(lasts, src, mask | 1 << b)
        for v in range(self.nv):
            total = self.refs(self.tmp, lasts.index(self.last(v, merged)))
            self.combine(total, self.refs(self.acc, v), later)

    def value_digit(self, k: int, radix: int, mask: int) -> None:
        """Merge value digit ``k`` (of ``radix``) after the thread bits ``mask`` and value digits ``< k``."""
        order = list(range(radix - 1, -1, -1)) if self.reverse else list(range(radix))
        g_of = self.plan.digit_of

        def at(v: int, j: int) -> int:
            g, js = g_of[v]
            return self.plan.value_of[g][js[:k] + (j,) + js[k + 1:]]

        if not mask:        # the sub-segments' totals are this thread's own: in order
            for prev, j in zip(order, order[1:]):
                for v in range(self.nv):
                    if g_of[v][1][k] == j:
                        self.combine(self.refs(self.acc, self.last(at(v, prev), k)), self.refs(self.acc, v))
            return
        src = (self.t & ~mask) if self.reverse else (self.t | mask)
        lasts = sorted({self.last(v, k) for v in range(self.nv) if g_of[v][1][k] != order[-1]})
        self.fetch(lasts, src, mask)

        def before(v: int, prev: int) -> int:
            """The fetched total of ``v``'s sub-segment ``prev``."""
            return lasts.index(self.last(at(v, prev), k))

        for prev, j in zip(order, order[1:]):          # running totals of the fetched sub-segments
            for i, v in enumerate(lasts):
                if g_of[v][1][k] == j:
                    self.combine(self.refs(self.tmp, before(v, prev)), self.refs(self.tmp, i))
        for prev, j in zip(order, order[1:]):
            for v in range(self.nv):
                if g_of[v][1][k] == j:
                    self.combine(self.refs(self.tmp, before(v, prev)), self.refs(self.acc, v))


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for e in reversed(shape):
        strides.append(acc)
        acc *= e
    return tuple(reversed(strides))


def _offset(crd: list[Any], strides: tuple[int, ...], axis: int) -> Any:
    """The offset of the row with coordinates ``crd`` (every mode but ``axis``) at position 0."""
    return sum((as_expr(x) * st for x, st in zip(crd, [st for k, st in enumerate(strides) if k != axis])),
               as_expr(0))


def _sequential(s: _Scan, srcs: list[RegisterTile], init: RegisterTile | None, axis: int,
                valid: Any, carry: RegisterTile | None) -> list[Instr] | str:
    """Any layout: the tiles go through shared memory (row-major), thread ``t`` scans rows
    ``t, t + threads, ...`` one position after the other, the result (and the carry, each
    row's last element) comes back."""
    from .copy import lower_reg_mem
    from .views import SharedTileView

    dst, t = s.dst, s.t
    shape, n, bits = dst.shape, dst.shape[axis], dst.dtype.bits
    strides = _row_major(shape)
    rows = int(np.prod([e for k, e in enumerate(shape) if k != axis]))
    tiles = list(srcs) + ([init] if init is not None else []) + ([carry] if carry is not None else [])
    views = []
    for reg in tiles:
        buf, barrier = s.exchange(int(np.prod(reg.shape)) * bits // 8)
        views.append(SharedTileView(buf, dst.dtype, reg.shape, Layout(reg.shape, _row_major(reg.shape))))
        if reg is carry:
            break
        st = lower_reg_mem(reg, views[-1], False, t, bits)
        if isinstance(st, str):
            return f"a scan through shared memory: {st}"
        s.out += st.instrs
    s.out.append(barrier())
    run, x = s.refs(s.acc, 0), s.refs(s.tmp, 0)
    other = [e for k, e in enumerate(shape) if k != axis]
    row_shape = tuple(1 if k == axis else e for k, e in enumerate(shape))
    order = range(n - 1, -1, -1) if s.reverse else range(n)
    for c in range(-(-rows // s.threads)):
        r = t + c * s.threads
        live = r < rows
        crd = tile_coords(r, tuple(other)) if other else []
        base = _offset(crd, strides, axis)
        row_at = as_expr(_offset(crd, _row_major(row_shape), axis))     # in init's and carry's buffers
        if init is not None:
            s.out.append(LdShared(run[-1], SharedRef(views[len(srcs)].buffer, row_at), bits, pred=live))
            if s.linear:
                s.out.append(Alu("mov", run[0], (1,), pred=live))
        for q, i in enumerate(order):
            at = as_expr(base) + i * strides[axis]
            for k, xr in enumerate(x):
                s.out.append(LdShared(xr, SharedRef(views[k].buffer, at), bits, pred=live))
                if valid is not None:
                    ident = scan_identity(s.fn, dst.dtype)[k]
                    s.out.append(Alu("select", xr, (as_expr(valid) > i, xr, ident)))
            if q or init is not None:
                s.combine(run, x, live)
            for rr, xr in zip(run, x):
                s.out.append(Alu("mov", rr, (xr,), pred=live))
            s.out.append(StShared(SharedRef(views[len(srcs) - 1].buffer, at), run[-1], bits, pred=live))
        if carry is not None:
            s.out.append(StShared(SharedRef(views[-1].buffer, row_at), run[-1], bits, pred=live))
    s.out.append(barrier())
    for reg, view in ((dst, views[len(srcs) - 1]), (carry, views[-1])):
        if reg is not None:
            ld = lower_reg_mem(reg, view, True, t, bits)
            if isinstance(ld, str):
                return f"a scan through shared memory: {ld}"
            s.out += ld.instrs
    return s.out + [barrier()]


def _run(digits: list[tuple[str, int, int]], b0: int, below: int = 32) -> int:
    """How many of ``digits`` are the consecutive thread bits ``b0, b0+1, ...`` (below ``below``)."""
    n = 0
    while n < len(digits) and digits[n][0] == "thread" and digits[n][1] == b0 + n < below:
        n += 1
    return n


def _lowest_lane_run(digits: list[tuple[str, int, int]]) -> int:
    """How many of the lowest digits are consecutive lane bits ``b0, b0+1, ...`` (Kogge-Stone's case)."""
    return _run(digits, digits[0][1], 5) if digits and digits[0][0] == "thread" else 0


def lower_scan(fn: str, dst: RegisterTile, srcs: list[RegisterTile], axis: int, reverse: bool,
               init: RegisterTile | None, tid: Any, scratch: Callable[[str, int], RegArray],
               exchange: Any = None, valid: Any = None,
               carry: RegisterTile | None = None) -> list[Instr] | str:
    """``dst = scan_fn(srcs, axis)`` (see the module docstring), and ``carry`` = its last element
    per row when given; ``scratch(name, count)`` gives a register array of ``dst``'s type,
    ``exchange(nbytes) -> (SmemBuffer, barrier_factory)`` a shared buffer (needed when the axis
    spans warps, or the layout has no digits). A reason string when it cannot be lowered."""
    if fn not in Scan.FUNCTIONS:
        return f"unknown scan {fn!r}; known: {', '.join(Scan.FUNCTIONS)}"
    if any(s.shape != dst.shape or s.threads != dst.threads or s.values != dst.values for s in srcs):
        return "the scan's sources and result differ in shape or thread count"
    if any(not np.array_equal(s.index_table(), dst.index_table()) for s in srcs):
        return "the scan's sources and result have different layouts"
    plan = scan_plan(dst, axis)
    if isinstance(plan, str):       # any layout: row by row through shared memory
        if exchange is None:
            return f"the layout {dst.tv} has no scan along axis {axis} in registers ({plan}) and no scratch"
        return _sequential(_Scan(fn, dst, ScanPlan([], [], {}), reverse, tid, scratch, exchange), srcs, init,
                           axis, valid, carry)
    s = _Scan(fn, dst, plan, reverse, tid, scratch, exchange)
    ident = scan_identity(fn, dst.dtype)
    for a, src, e in zip(s.acc, srcs, ident):
        if valid is None:
            s.out.append(Alu("mov", RegRef(a, 0, dst.values), (RegRef(src.array, 0, dst.values),)))
            continue
        for v in range(dst.values):
            inside = s.position(v) < as_expr(valid)
            s.out.append(Alu("select", RegRef(a, v, 1), (inside, RegRef(src.array, v, 1), e)))
    mask, merged = 0, 0
    run = _lowest_lane_run(plan.digits)
    if run > 1:
        b0 = plan.digits[0][1]
        s.kogge_stone(b0, run)
        mask = ((1 << run) - 1) << b0
    d = run if run > 1 else 0
    while d < len(plan.digits):
        kind, r, _ = plan.digits[d]
        if kind == "value":
            s.value_digit(merged, r, mask)
            merged += 1
        elif r < 5:
            s.thread_digit(r, mask, merged)
            mask |= 1 << r
        else:
            if exchange is None:
                return "the scan spans several warps and no shared scratch was provided"
            k = _run(plan.digits[d:], r)
            s.warp_digits(r, k, mask, merged)
            mask |= ((1 << k) - 1) << r
            d += k
            continue
        d += 1
    if init is not None:
        m = value_map(dst, init)
        if isinstance(m, str):
            return f"init: {m}"
        for v in range(dst.values):
            i = RegRef(init.array, int(m[v]), 1)
            b = RegRef(dst.array, v, 1)
            s.out.append(Alu("fma", b, (RegRef(s.acc[0], v, 1), i, b)) if s.linear else Alu(fn, b, (i, b)))
    err = s.gather_carry(carry, mask) if carry is not None else None
    return err if err is not None else s.out

