"""The padding analysis: where the out-of-bounds elements of ragged views go.

A global view (``GlobalView``) of a ``tile`` at ``origin`` has, per mode ``k``, an in-bounds
``extent[k] = min(tile[k], shape[k] - origin[k])``; a copy from it reads each element
``c`` with ``c[k] >= extent[k]`` for some ``k`` as 0 (or as the copy's ``other``). Those
elements are *padding*: they hold no element of the tensor, and a reduction over them
would be wrong (a row sum that counts zeros past the row, a row max of negative numbers
that returns the padded 0). This analysis follows the padding through the program and

- sets ``Reduce.valid`` to the in-bounds extent along the reduced axis wherever padding
  reaches a reduction there, so that the lowering (``hexlayout.ir.lower.math``) counts
  the padding as the reduction's identity (0 for sum, -inf for max, +inf for min) on every
  architecture and in every backend (both read the one lowered program);
- refuses (``PaddingError``) the programs where padding reaches a reduction or an mma at
  positions it cannot know.

The state of a tile's contents (per buffer; views derive theirs) is ``None`` (no padding),
a ``Pad(extents, value)``: element ``c`` is padding iff ``c[k] >= extents[k]`` for some
mode ``k`` (``None``: no padding along ``k``), each padded element holding ``value`` when it
is known (a load's 0) - or ``Pad.lost``: padding at positions the analysis cannot know.

Transfer rules, per op:

- a copy moves its source's state into the destination; with ``other=`` the load's
  out-of-bounds elements hold ``other``, a value like any other (Triton's semantics): no
  padding. A view of a buffer (slice, sub-tile, permute) shifts or reorders the extents, so
  a shared tile written whole and read in parts keeps exact padding;
- elementwise ops, casts and broadcasts: an element is padding where any operand's is
  (the smaller extent per mode; a broadcast mode of extent 1 adds none); the padding's
  value is the function of the operands' padding values when every operand is padded
  alike (``exp`` of a 0 padding is 1), else unknown;
- ``a + b`` (or ``a - b``) of one shape where ``a`` has no padding and ``b``'s padding holds
  0: no padding (the sum is ``a`` there: an accumulator of a loop's tiles);
- ``hl.where(cond, a, b)``: as above, and it clears lost padding: the kernel masked
  explicitly (attention's key mask), so what the select leaves in the padding - and what
  math after it makes of that - is the kernel's (``Pad.masked``): reductions still skip the
  padding, but an mma takes it as it is;
- ``reduce`` along ``axis``: ``valid = extents[axis]`` (none when the padding already holds
  the identity: a sum of a load's zeros); the result is padded along the other modes. Unless
  an mma or a copy to shared memory reads the source's buffer or a value computed from it,
  the reduction overwrites its
  padding with the identity in place (``Reduce.overwrite``; the padding is nobody's data), so
  no second copy of the tile lives on and later math sees the identity (``exp(-inf - m) = 0``);
- ``scan`` along ``axis``: ``valid = extents[axis]`` (the smallest over its sources); the
  padding takes part as the scan's identity; the result is padded where a source is;
- ``mma``: the sum over K is right only when K's padding is 0, so padding of unknown or
  non-zero value along K is refused; the result is padded along M where ``a`` is and along
  N where ``b`` is (lost padding in an operand - a dequantized weight tile regrouped for
  wgmma - is not refused there: the product's padding is lost, and refused where reduced);
- a global -> shared copy into part of a buffer (a pipeline stage) is not tracked: its
  padding is 0, which an mma over K needs, and a kernel that reduces an mma's result over
  the keys of such a tile masks them itself (as the attention kernels do);
- a register tile's padding written into part of another buffer, a reshape that regroups
  a padded mode, a join along a padded axis, or padding that depends on a loop's iteration
  when it is carried into the next one or out of the loop: lost. Lost padding that reaches
  a reduction (without a mask in between) is refused;
- loops are analysed to a fixed point; the two branches of an ``if`` are joined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hexlayout.errors import HexlayoutError

from .expr import Const, Expr, ExprLike, as_expr, emin, free_vars, reg_reads
from .regroup import Join, Reshape
from .source import SourceLoc
from .tile import (
    Alloc,
    Block,
    Cast,
    Copy,
    Elementwise,
    Fill,
    For,
    GlobalView,
    If,
    Iota,
    Mma,
    Op,
    Permute,
    Rearrange,
    Reduce,
    Scan,
    Slice,
    SubTile,
    TileKernel,
    Value,
)
from .types import Scope

__all__ = ["Pad", "PaddingError", "annotate_padding", "IDENTITY"]

#: the value of a reduction's identity, per reduction (floats)
IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}

#: fixed-point iterations of a loop before the padding that still changes is declared lost
_MAX_ITERATIONS = 4


class PaddingError(HexlayoutError, ValueError):
    """Padding reaches a reduction or an mma where the analysis cannot make it harmless.

    Attributes:
        kernel (str): the kernel's name.
        op (str): the operation (``"reduce"``, ``"mma"``).
        loc (SourceLoc | None): its source line.
        detail (str): what is wrong and how to fix it.
    """

    def __init__(self, kernel: str, op: str, loc: SourceLoc | None, detail: str) -> None:
        self.kernel, self.op, self.loc, self.detail = kernel, op, loc, detail
        where = f" at {loc.format(code='backticks')}" if loc is not None else ""
        super().__init__(f"{kernel}: {op}{where}: {detail}")


@dataclass(frozen=True)
class Pad:
    """Padding in a tile: element ``c`` is padding iff ``c[k] >= extents[k]`` for some ``k``
    (``None``: none along ``k``); each holds ``value`` when known. ``lost``: padding at
    positions unknown (``why`` says where they were lost). ``masked``: an explicit select
    (``hl.where``) is on its path, so its value is the kernel's choice."""

    extents: tuple[ExprLike | None, ...] = ()
    value: float | None = None
    lost: bool = False
    why: str = ""
    masked: bool = False


def _static(e: ExprLike | None) -> int | None:
    if isinstance(e, (int, np.integer)) and not isinstance(e, bool):
        return int(e)
    if isinstance(e, Const):
        return e.value
    return None


def _same(a: ExprLike | None, b: ExprLike | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    sa, sb = _static(a), _static(b)
    if sa is not None or sb is not None:
        return sa == sb
    return bool(as_expr(a) == as_expr(b))


def _same_value(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a == b or (a != a and b != b)


def _same_pad(a: Pad | None, b: Pad | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.lost or b.lost:
        return a.lost and b.lost
    return (len(a.extents) == len(b.extents) and all(_same(x, y) for x, y in zip(a.extents, b.extents))
            and _same_value(a.value, b.value) and a.masked == b.masked)


def _min(a: ExprLike | None, b: ExprLike | None) -> ExprLike | None:
    if a is None or b is None:
        return b if a is None else a
    if _same(a, b):
        return a
    sa, sb = _static(a), _static(b)
    if sa is not None and sb is not None:
        return min(sa, sb)
    return emin(a, b)


def _sub(a: ExprLike, b: ExprLike) -> ExprLike:
    sa, sb = _static(a), _static(b)
    if sa is not None and sb is not None:
        return sa - sb
    return as_expr(a) - b


def _make(extents: tuple[ExprLike | None, ...], shape: tuple[int, ...], value: float | None,
          masked: bool = False) -> Pad | None:
    """A ``Pad`` over a tile of ``shape``, or ``None`` when no extent cuts it."""
    ext = tuple(None if e is None or ((s := _static(e)) is not None and s >= n) else e
                for e, n in zip(extents, shape))
    if all(e is None for e in ext):
        return None
    return Pad(ext, value, masked=masked)


def _lost(why: str, value: float | None = None) -> Pad:
    return Pad((), value, True, why)


def _where(op: Op) -> str:
    return f"at {op.loc.format(code='backticks')}" if op.loc is not None else f"at {op.name}"


def _describe(p: Pad) -> str:
    if p.value is None:
        return "of unknown value"
    return f"holding {p.value!r}"


class _Analysis:
    def __init__(self, tk: TileKernel) -> None:
        self.tk = tk
        self.state: dict[int, Pad | None] = {}      # buffer (root value) id -> its contents' padding
        self.views: dict[int, Op] = {}              # a view's value id -> the op defining it
        self.globals: dict[int, Pad | None] = {}    # a global view's value id -> its padding
        self.kept = _kept(tk)

    # --- errors ----------------------------------------------------------------------------
    def fail(self, op: Op, detail: str) -> PaddingError:
        return PaddingError(self.tk.name, op.name.lower(), op.loc, detail)

    # --- reading and writing tiles ------------------------------------------------------------
    def read(self, v: Value) -> Pad | None:
        d = self.views.get(v.id)
        if d is not None:
            return self._through(d, self.read(d.src))   # type: ignore[attr-defined]
        if v.scope == Scope.GLOBAL:
            return self.globals.get(v.id)
        return self.state.get(v.root.id)

    def _through(self, op: Op, s: Pad | None) -> Pad | None:
        """The padding of the view ``op`` defines, from its source's ``s``."""
        if s is None or s.lost:
            return s
        shape = tuple(op.result.type.shape)          # type: ignore[attr-defined]
        if isinstance(op, Slice):
            kept = tuple(e for e, i in zip(s.extents, op.index) if i is None)
            return _make(kept, shape, s.value, s.masked)
        if isinstance(op, SubTile):
            return _make(tuple(None if e is None else _sub(e, o) for e, o in zip(s.extents, op.offset)),
                         shape, s.value, s.masked)
        if isinstance(op, Permute):
            return _make(tuple(s.extents[p] for p in op.perm), shape, s.value, s.masked)
        return _lost(f"the view {_where(op)}", s.value)

    def write(self, v: Value, s: Pad | None, op: Op, *, staged: bool = False) -> None:
        """``v`` (a buffer or a view of one) now holds padding ``s``. ``staged``: a global ->
        shared copy (not tracked into part of a buffer)."""
        if v.scope == Scope.GLOBAL:
            return
        root = v.root
        if v.id not in self.views:
            self.state[root.id] = s
            return
        if staged:
            self.state[root.id] = None
        elif s is not None or self.state.get(root.id) is not None:
            self.state[root.id] = _lost(f"the copy into a part of %{root.name} {_where(op)}",
                                        s.value if s is not None else None)

    # --- blocks --------------------------------------------------------------------------------
    def block(self, b: Block) -> None:
        for op in b.ops:
            self.op(op)

    def op(self, op: Op) -> None:  # noqa: C901 - one case per op
        if isinstance(op, GlobalView):
            shape = tuple(op.result.type.shape)
            # an hl.offline tensor is padded to whole tiles by the op (the launch checks): no padding
            self.globals[op.result.id] = None if op.param.offline else _make(tuple(op.extent), shape, 0.0)
        elif isinstance(op, (Slice, SubTile, Permute)):
            self.views[op.result.id] = op
        elif isinstance(op, Alloc):
            self.state[op.result.id] = None
        elif isinstance(op, (Fill,)):
            self.write(op.dst, None, op)
        elif isinstance(op, Iota):
            self.write(op.result, None, op)
        elif isinstance(op, Copy):
            s = None if op.other is not None else self.read(op.src)
            staged = (op.src.scope == Scope.GLOBAL and op.dst.scope == Scope.SHARED)
            self.write(op.dst, s, op, staged=staged)
        elif isinstance(op, Cast):
            s = self.read(op.src)
            if s is not None and s.value is not None and s.value not in (0.0, float("inf"), float("-inf")):
                s = Pad(s.extents, None, s.lost, s.why, s.masked)
            self.write(op.result, s, op)
        elif isinstance(op, Rearrange):
            self.write(op.result, self.read(op.src), op)
        elif isinstance(op, Elementwise):
            self.write(op.result, self.elementwise(op), op)
        elif isinstance(op, Reduce):
            self.reduce(op)
        elif isinstance(op, Scan):
            self.scan(op)
        elif isinstance(op, Mma):
            self.mma(op)
        elif isinstance(op, Reshape):
            self.write(op.result, self.reshape(op), op)
        elif isinstance(op, Join):
            self.write(op.result, self.join(op), op)
        elif isinstance(op, For):
            self.loop(op)
        elif isinstance(op, If):
            self.branch(op)
        else:
            ins = [self.read(v) for v in op.inputs()]
            out = None
            if any(s is not None for s in ins):
                out = _lost(f"the {op.name} {_where(op)}")
            for v in op.outputs():
                if v.scope != Scope.GLOBAL:
                    self.write(v, out, op)
            for b in op.blocks():
                self.block(b)

    def elementwise(self, op: Elementwise) -> Pad | None:
        shape = tuple(op.result.type.shape)
        rank = len(shape)
        tiles = [(a, self.read(a)) for a in op.args if isinstance(a, Value)]
        is_select = str(op.fn) == "select"
        if self._adds_zero_padding(op, tiles):
            return None
        lost = [s for _, s in tiles if s is not None and s.lost]
        if lost and not is_select:
            return _lost(lost[0].why)
        ext: list[ExprLike | None] = [None] * rank
        aligned: list[tuple[ExprLike | None, ...] | None] = []
        for a, s in tiles:
            if s is None or s.lost:
                aligned.append(None)
                continue
            ashape = tuple(a.type.shape)
            off = rank - len(ashape)
            row: list[ExprLike | None] = [None] * rank
            for j, e in enumerate(s.extents):
                if e is not None and not (ashape[j] == 1 and shape[off + j] != 1):
                    row[off + j] = e
                    ext[off + j] = _min(ext[off + j], e)
            aligned.append(tuple(row))
        value = self._value(op, tiles, aligned)
        masked = is_select or any(s is not None and s.masked for _, s in tiles)
        return _make(tuple(ext), shape, value, masked)

    @staticmethod
    def _adds_zero_padding(op: Elementwise, tiles: list[Any]) -> bool:
        """``a + b`` (or ``a - b``) of tiles of one shape where ``a`` has no padding and ``b``'s
        padding holds 0: the result is ``a`` at ``b``'s padded elements, real data (an
        accumulator that sums the tiles of a loop)."""
        if str(op.fn) not in ("add", "sub") or len(tiles) != 2 or len(op.args) != 2:
            return False
        (a, sa), (b, sb) = tiles
        if tuple(a.type.shape) != tuple(b.type.shape):
            return False
        zero = [s is not None and not s.lost and _same_value(s.value, 0.0) for s in (sa, sb)]
        return (sa is None and zero[1]) or (str(op.fn) == "add" and sb is None and zero[0])

    def _value(self, op: Elementwise, tiles: list[Any], aligned: list[Any]) -> float | None:
        """The padding's value when every tile operand is padded alike with a known value and
        the other operands are numbers (a select whose two choices agree: that value)."""
        if str(op.fn) == "select":
            choices = []
            for a in op.args[1:]:
                if isinstance(a, Value):
                    sa = self.read(a)
                    choices.append(None if sa is None or sa.lost else sa.value)
                elif isinstance(a, (int, float, np.integer, np.floating)) and not isinstance(a, bool):
                    choices.append(float(a))
                else:
                    choices.append(None)
            if choices[0] is not None and _same_value(choices[0], choices[1]):
                return choices[0]
        if not tiles or any(r is None for r in aligned):
            return None
        first = aligned[0]
        if any(not all(_same(x, y) for x, y in zip(first, r)) for r in aligned[1:]):
            return None
        vals: list[Any] = []
        it = iter(s for _, s in tiles)
        for a in op.args:
            if isinstance(a, Value):
                s = next(it)
                if s is None or s.value is None:
                    return None
                vals.append(np.float64(s.value))
            elif isinstance(a, (int, float, np.integer, np.floating)) and not isinstance(a, bool):
                vals.append(np.float64(a))
            else:
                return None
        try:
            with np.errstate(all="ignore"):
                out = float(np.asarray(op.fn.numpy(*vals), dtype=np.float64))
        except (TypeError, ValueError, ArithmeticError, AttributeError, NotImplementedError):
            return None
        return out

    def reshape(self, op: Reshape) -> Pad | None:
        """The modes before the first one the reshape changes keep their padding; padding along a
        mode of extent 1 is all or nothing, as a slice's (dropped); elsewhere it is lost."""
        s = self.read(op.src)
        if s is None or s.lost:
            return s
        src, dst = tuple(op.src.type.shape), tuple(op.result.type.shape)
        same = 0
        while same < min(len(src), len(dst)) and src[same] == dst[same]:
            same += 1
        if any(e is not None and src[k] != 1 for k, e in enumerate(s.extents) if k >= same):
            return _lost(f"the reshape {_where(op)}", s.value)
        return _make(tuple(s.extents[:same]) + (None,) * (len(dst) - same), dst, s.value, s.masked)

    def join(self, op: Join) -> Pad | None:
        """Padding along the joined axis is lost; along the others, where any source has it."""
        pads = [self.read(v) for v in op.srcs]
        if all(p is None for p in pads):
            return None
        values = {None if p is None else p.value for p in pads}
        value = values.pop() if len(values) == 1 else None
        if any(p is not None and (p.lost or p.extents[op.axis] is not None) for p in pads):
            return _lost(f"the join {_where(op)}", value)
        ext: list[ExprLike | None] = [None] * len(op.result.type.shape)
        for p in pads:
            if p is not None:
                ext = [_min(a, b) for a, b in zip(ext, p.extents)]
        known = value if all(p is not None for p in pads) else None
        masked = all(p is not None and p.masked for p in pads)
        return _make(tuple(ext), tuple(op.result.type.shape), known, masked)

    def scan(self, op: Scan) -> None:
        """``valid`` = the sources' in-bounds extent along the axis (their padding takes part as
        the identity); the result is padded where any source or ``init`` is, its value unknown."""
        pads = [self.read(v) for v in op.srcs + ((op.init,) if op.init is not None else ())]
        op.valid = None
        if all(p is None for p in pads):
            self.write(op.result, None, op)
            if op.carry is not None:
                self.write(op.carry, None, op)
            return
        lost = next((p for p in pads if p is not None and p.lost), None)
        if lost is not None:
            raise self.fail(op, f"the scan's sources hold the padding of a ragged view at positions the "
                                f"language cannot follow (lost through {lost.why}), and the {op.fn} scan "
                                f"along axis {op.axis} would take it in: load with hl.copy(view, tile, "
                                "other=<the identity>) or select the in-bounds elements with "
                                "hl.where(mask, x, identity)")
        ext: list[ExprLike | None] = [None] * len(op.result.type.shape)
        for i, p in enumerate(pads):
            if p is not None:      # init (the last) has extent 1 along the axis: it pads the others only
                ext = [a if i == len(op.srcs) and k == op.axis else _min(a, b)
                       for k, (a, b) in enumerate(zip(ext, p.extents))]
        op.valid = ext[op.axis]
        self.write(op.result, _make(tuple(ext), tuple(op.result.type.shape), None), op)
        if op.carry is not None:      # the last element of each row: padded where the rows are
            rows = tuple(None if k == op.axis else e for k, e in enumerate(ext))
            self.write(op.carry, _make(rows, tuple(op.carry.type.shape), None), op)

    def reduce(self, op: Reduce) -> None:
        s = self.read(op.src)
        op.valid, op.overwrite = None, False
        shape = tuple(op.result.type.shape)
        if s is None:
            self.write(op.result, None, op)
            return
        if s.lost:
            raise self.fail(op, f"%{op.src.name} holds the padding of a ragged view (its out-of-bounds "
                                f"elements) at positions the language cannot follow (lost through {s.why}), "
                                f"and the {op.fn} along axis {op.axis} would count it: load with "
                                "hl.copy(view, tile, other=<the identity>) or select the in-bounds elements "
                                "with hl.where(mask, x, identity) before the reduction")
        e = s.extents[op.axis]
        if e is not None and not _same_value(s.value, IDENTITY[op.fn]):
            op.valid = e
            # the padding is nobody's data: overwrite it in place with the identity (no copy of the
            # tile), unless an mma or a copy to shared memory reads what is computed from the buffer
            if op.src.id not in self.views and op.src.root.id not in self.kept:
                op.overwrite = True
                uniform = all(x is None for k, x in enumerate(s.extents) if k != op.axis)
                ident = IDENTITY[op.fn] if op.src.type.dtype.kind == "float" else None
                keep = uniform or _same_value(s.value, ident)
                self.write(op.src, Pad(s.extents, ident if keep else None, masked=s.masked), op)
        ext = tuple(None if k == op.axis else x for k, x in enumerate(s.extents))
        self.write(op.result, _make(ext, shape, None), op)

    def mma(self, op: Mma) -> None:
        pads = [self.read(op.a), self.read(op.b)]

        def nonzero_k(s: Pad | None) -> bool:
            return (s is not None and not s.lost and s.extents[1] is not None
                    and not _same_value(s.value, 0.0) and not s.masked)

        def zero_k(s: Pad | None, extent: Any) -> bool:
            """Zero padding along K from the same extent on: its products with the other
            operand's (finite) padding are 0."""
            return (s is not None and not s.lost and s.extents[1] is not None
                    and _same_value(s.value, 0.0) and str(s.extents[1]) == str(extent))

        for k, (name, v) in enumerate((("a", op.a), ("b", op.b))):
            s, other = pads[k], pads[1 - k]
            if nonzero_k(s) and not zero_k(other, s.extents[1]):
                how = "past its in-bounds extent along K"
                raise self.fail(op, f"operand {name} %{v.name} holds the padding of a ragged view ({how}) "
                                    f"{_describe(s)}, and the mma sums over K, where padding must be 0 (in "
                                    f"one operand at least): load it with hl.copy(view, tile, other=0.0) "
                                    "or select the in-bounds elements with hl.where(mask, x, 0.0) before "
                                    "the mma")
        sa, sb = pads
        if (sa is not None and sa.lost) or (sb is not None and sb.lost):
            res: Pad | None = _lost(f"the mma {_where(op)}")
        else:
            rows = sa.extents[0] if sa is not None else None
            cols = sb.extents[0] if sb is not None else None
            # a padded row of C is a padded row of A against B (0 when A's padding is 0, B finite);
            # a padded column likewise from B
            zero = ((rows is None or _same_value(sa.value, 0.0))
                    and (cols is None or _same_value(sb.value, 0.0)))
            res = _make((rows, cols), tuple(op.c.type.shape), 0.0 if zero else None)
        if op.accumulate is not False:
            res = _combine(res, self.read(op.c), tuple(op.c.type.shape))
        self.write(op.c, res, op)

    def loop(self, op: For) -> None:
        variant = {op.var} | {o.var for o in op.body.walk() if isinstance(o, For)}
        entry = dict(self.state)
        for it in range(_MAX_ITERATIONS + 1):
            self.state = dict(entry)
            self.block(op.body)
            merged = _join(entry, self.state, variant, _where(op), loop=True,
                           give_up=it == _MAX_ITERATIONS - 1)
            if all(_same_pad(merged.get(k), entry.get(k)) for k in set(merged) | set(entry)):
                break
            entry = merged
        self.state = merged

    def branch(self, op: If) -> None:
        entry = dict(self.state)
        self.block(op.then_body)
        then = self.state
        self.state = dict(entry)
        if op.else_body is not None:
            self.block(op.else_body)
        self.state = _join(then, self.state, set(), _where(op), loop=False, give_up=False)


def _kept(tk: TileKernel) -> set[int]:
    """The buffers whose padding's value matters: mma operands and sources of copies to shared
    memory, and every buffer their values are computed from (elementwise math, casts, regroups)."""
    ops = list(tk.body.walk())
    kept: set[int] = set()
    for op in ops:
        if isinstance(op, Mma):
            kept |= {op.a.root.id, op.b.root.id}
        elif isinstance(op, Copy) and op.dst.scope == Scope.SHARED:
            kept.add(op.src.root.id)
    flows = [op for op in ops if isinstance(op, (Elementwise, Cast, Rearrange, Reshape, Join, Copy))]
    changed = True
    while changed:
        changed = False
        for op in flows:
            if any(v.root.id in kept for v in op.outputs()):
                for v in op.inputs():
                    if v.scope != Scope.GLOBAL and v.root.id not in kept:
                        kept.add(v.root.id)
                        changed = True
    return kept


def _combine(a: Pad | None, b: Pad | None, shape: tuple[int, ...]) -> Pad | None:
    """Padding where either is (an accumulation of ``a`` into ``b``)."""
    if a is None or b is None:
        return b if a is None else a
    if a.lost or b.lost:
        return a if a.lost else b
    return _make(tuple(_min(x, y) for x, y in zip(a.extents, b.extents)), shape, None)


def _variant(p: Pad, variant: set[Any]) -> bool:
    return any(e is not None and isinstance(e, Expr) and (free_vars(e) & variant or reg_reads(e))
               for e in p.extents)


def _join(a: dict[int, Pad | None], b: dict[int, Pad | None], variant: set[Any], where: str, *, loop: bool,
          give_up: bool) -> dict[int, Pad | None]:
    """The state after a loop iteration (``a`` the state at its head, ``b`` at its end) or
    after an ``if`` (``a``, ``b`` its branches). In a loop a buffer padded at the end of an
    iteration keeps that padding at the next head (its steady state) unless it depends on
    the iteration; after a branch, padding on one side only is lost."""
    out: dict[int, Pad | None] = {}
    for k in set(a) | set(b):
        x, y = a.get(k), b.get(k)
        if y is not None and not y.lost and _variant(y, variant):
            y = _lost(f"the loop {where}, whose iterations pad it differently", y.value)
        if _same_pad(x, y):
            out[k] = x
        elif (x is not None and y is not None and not x.lost and not y.lost
              and _same_pad(Pad(x.extents), Pad(y.extents))):
            out[k] = Pad(x.extents, x.value if _same_value(x.value, y.value) else None,
                         masked=x.masked and y.masked)
        elif x is None or y is None:
            p = y if x is None else x
            out[k] = p if loop and not give_up else _lost(f"the branches {where}", p.value)
            if not loop and p.lost:
                out[k] = p
        elif x.lost or y.lost:
            out[k] = x if x.lost else y
        else:
            out[k] = _lost(f"the {'loop' if loop else 'branches'} {where}, whose paths pad it differently")
    return out


def annotate_padding(tk: TileKernel) -> TileKernel:
    """Set ``Reduce.valid`` of every reduction of ``tk`` (in place) from the padding of ragged
    views that reaches it (see the module docstring); ``tk``.

    Raises:
        PaddingError: padding reaches a reduction or an mma at positions or with values the
            analysis cannot make harmless; the message names the kernel, the op, its source
            line and the fix (``other=`` on the load, or an explicit ``hl.where`` mask).
    """
    for op in tk.body.walk():
        if isinstance(op, Reduce):
            op.valid, op.overwrite = None, False
        elif isinstance(op, Scan):
            op.valid = None
    _Analysis(tk).block(tk.body)
    return tk
