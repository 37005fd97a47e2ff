"""CuTe ``Layout``: a function from coordinates of ``shape`` to integers, ``c -> <c, stride>``.

A ``Layout`` is a pair (shape, stride) of congruent IntTuples. Evaluated at a 1-D
index ``i`` it splits ``i`` colexicographically by ``shape`` (column-major) and takes
the inner product with ``stride``; evaluated at a hierarchical coordinate it takes the
inner product directly. Coordinates may be ints, integer numpy arrays (vectorized) or
symbolic integer expressions; they are not bounds-checked (C++ semantics: a 1-D index
past ``size(L)`` extends the last mode). ``None`` in a coordinate is CuTe's ``_``:
``L(None, 2)`` on ``(4,8):(1,4)`` is the rank-1 tuple layout ``(4):(1)`` (the offset
``L(0, 2)`` is dropped, as in CuTe; ``slice_and_offset`` returns both).
``Layout(shape)`` gives extent-1 modes stride 0, as C++'s ``make_layout`` does.

Deviation from C++: bad operands (non-Layouts, non-positive extents, non-congruent
strides, wrong coordinate ranks, out-of-range mode indices) raise ValueError naming the
operation.

The functions here are the CuTe C++ operations on a single layout: ``make_layout``,
``size``, ``cosize``, ``rank``, ``depth``, ``flatten``, ``coalesce`` (by-mode with a
profile), ``filter_zeros``, ``filter``, ``append``, ``prepend``, ``select``, ``group``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from hexlayout.memo import memoized

from .inttuple import (
    IntTuple,
    all_positive,
    as_inttuple,
    compact_col_major,
    compact_row_major,
    congruent,
    crd2idx,
    fmt,
    is_coord_leaf,
    is_tuple,
    product,
)
from .inttuple import depth as tuple_depth
from .inttuple import flatten as tuple_flatten

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Layout",
    "make_layout",
    "make_ordered_layout",
    "make_identity_layout",
    "size",
    "cosize",
    "rank",
    "depth",
    "shape",
    "stride",
    "flatten",
    "coalesce",
    "coalesce_x",
    "filter_zeros",
    "filter",
    "append",
    "prepend",
    "select",
    "group",
    "slice_and_offset",
    "is_layout",
    "require_layout",
    "ModeIndexError",
]


class ModeIndexError(ValueError, IndexError):
    """A mode index out of range (a ValueError, and an IndexError for Python idioms)."""


def require_layout(x: Any, op: str) -> None:
    """Raise ValueError naming ``op`` unless ``x`` is a Layout."""
    if not isinstance(x, Layout):
        raise ValueError(f"{op}: {x!r} is not a Layout")


def _trusted(shape: IntTuple, stride: IntTuple) -> Layout:
    """``Layout(shape, stride)`` without the checks, for the algebra's own results: ``shape``
    and ``stride`` already ints / tuples, congruent, extents positive."""
    out = object.__new__(Layout)
    out._shape, out._stride, out._hash = shape, stride, None
    return out


class Layout:
    """``shape:stride`` as in CuTe; ``Layout(shape)`` has compact column-major strides
    (extent-1 modes get stride 0, as CuTe's ``make_layout`` does for static shapes)."""

    __slots__ = ("_shape", "_stride", "_hash")

    def __init__(self, shape: IntTuple, stride: IntTuple | None = None) -> None:
        shape = as_inttuple(shape, "Layout shape")
        if not all_positive(shape):
            s = next(v for v in (tuple_flatten(shape) if is_tuple(shape) else (shape,)) if v <= 0)
            raise ValueError(f"Layout: shape {fmt(shape)} has a non-positive extent {s}")
        if stride is None:
            stride = compact_col_major(shape)
        else:
            stride = as_inttuple(stride, "Layout stride")
            if not congruent(shape, stride):
                raise ValueError(f"Layout: stride {fmt(stride)} is not congruent with shape {fmt(shape)}")
        self._shape = shape
        self._stride = stride
        self._hash = None

    # --- structure -----------------------------------------------------------------
    @property
    def shape(self) -> IntTuple:
        return self._shape

    @property
    def stride(self) -> IntTuple:
        return self._stride

    def size(self) -> int:
        return product(self._shape)

    def cosize(self) -> int:
        """``L(size(L) - 1) + 1`` evaluated at the last coordinate of every mode (CuTe)."""
        return cosize(self)

    @property
    def rank(self) -> int:
        return len(self._shape) if is_tuple(self._shape) else 1

    @property
    def depth(self) -> int:
        return tuple_depth(self._shape)

    def __len__(self) -> int:
        return self.rank

    def __getitem__(self, i: int | tuple[int, ...]) -> Layout:
        """Mode ``i`` (``layout<i>`` in CuTe); a tuple index descends: ``L[1, 0]``."""
        if isinstance(i, tuple):
            out = self
            for j in i:
                out = out[j]
            return out
        if not isinstance(i, int):
            raise ValueError(f"Layout {self}: mode index {i!r} is not an int")
        if is_tuple(self._shape):
            if not -len(self._shape) <= i < len(self._shape):
                raise ModeIndexError(f"Layout {self}: mode {i} out of range for rank {len(self._shape)}")
            return _trusted(self._shape[i], self._stride[i])
        if i in (0, -1):
            return self
        raise ModeIndexError(f"Layout {self}: mode {i} out of range for a rank-1 layout")

    def __iter__(self) -> Iterator[Layout]:
        for i in range(self.rank):
            yield self[i]

    # --- evaluation ----------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        """``L(i)``, ``L(c0, c1, ...)``, ``L((c0, c1))``; with ``None`` inside, a slice."""
        if len(args) == 0:
            return self
        crd = args[0] if len(args) == 1 else tuple(args)
        if _has_none(crd):
            return slice_and_offset(crd, self)[0]
        if is_tuple(crd):
            if not is_tuple(self._shape):
                if len(crd) == 1:
                    crd = crd[0]
                else:
                    raise ValueError(
                        f"Layout {self}: coordinate {fmt(crd)} has rank {len(crd)}, layout rank 1"
                    )
            elif len(crd) != len(self._shape):
                raise ValueError(
                    f"Layout {self}: coordinate {fmt(crd)} has rank {len(crd)}, layout rank {self.rank}"
                )
        elif not is_coord_leaf(crd):
            raise ValueError(f"Layout {self}: {crd!r} is not a coordinate")
        return crd2idx(crd, self._shape, self._stride)

    def indices(self) -> np.ndarray:
        """``[L(0), L(1), ..., L(size-1)]`` as an int64 array (vectorized)."""
        return _indices(self._shape, self._stride).copy()

    # --- comparison / printing -------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self._shape == other._shape and self._stride == other._stride

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self._shape, self._stride))
        return self._hash

    def __str__(self) -> str:
        return f"{fmt(self._shape)}:{fmt(self._stride)}"

    def __repr__(self) -> str:
        return f"Layout({self._shape!r}, {self._stride!r})"


@memoized(maxsize=512)
def _indices(shape: IntTuple, stride: IntTuple) -> np.ndarray:
    """``Layout(shape, stride).indices()``, read-only (memoized: a synthesis compares the same
    TV layouts as maps many times; ``indices`` hands out copies)."""
    import numpy as np

    out = np.asarray(crd2idx(np.arange(product(shape), dtype=np.int64), shape, stride),
                     dtype=np.int64).reshape(-1)
    out.setflags(write=False)
    return out


def is_layout(x: Any) -> bool:
    return isinstance(x, Layout)


def _has_none(c: Any) -> bool:
    if c is None:
        return True
    if is_tuple(c):
        return any(_has_none(e) for e in c)
    return False


def _as_layout(x: Any, op: str) -> Layout:
    if isinstance(x, Layout):
        return x
    try:
        return Layout(x)
    except ValueError as e:
        raise ValueError(f"{op}: {x!r} is not a Layout or a shape") from e


def make_layout(*args: Any, stride: IntTuple | None = None) -> Layout:
    """``make_layout(shape, stride=None)`` or ``make_layout(L0, L1, ...)`` (modes concatenated)."""
    if args and all(isinstance(a, Layout) for a in args):
        if stride is not None:
            raise ValueError("make_layout: a stride cannot be given with Layout arguments")
        if len(args) == 1:
            return args[0]
        return Layout(tuple(a.shape for a in args), tuple(a.stride for a in args))
    if len(args) == 2 and stride is None:
        return Layout(args[0], args[1])
    if len(args) != 1:
        raise ValueError(f"make_layout: expected (shape[, stride]) or Layouts, got {args!r}")
    return Layout(args[0], stride)


def make_ordered_layout(shape: IntTuple, order: IntTuple) -> Layout:
    """Compact layout whose modes are laid out in increasing ``order`` (CuTe's make_ordered_layout)."""
    fs = tuple_flatten(shape) if is_tuple(shape) else (shape,)
    fo = tuple_flatten(order) if is_tuple(order) else (order,)
    if len(fs) != len(fo):
        raise ValueError(f"make_ordered_layout: order {fmt(order)} does not match shape {fmt(shape)}")
    strides = [0] * len(fs)
    cur = 1
    for i in sorted(range(len(fs)), key=lambda k: (fo[k], k)):
        strides[i] = 0 if fs[i] == 1 else cur
        cur *= fs[i]
    from .inttuple import unflatten

    return Layout(shape, unflatten(strides, shape) if is_tuple(shape) else strides[0])


def make_identity_layout(shp: IntTuple) -> Layout:
    return Layout(shp)


def make_row_major(shp: IntTuple) -> Layout:
    """Compact row-major layout of ``shp`` (CuTe's ``make_layout(shp, LayoutRight{})``)."""
    return Layout(shp, compact_row_major(shp))


def size(x: Any, *modes: int) -> int:
    """``size(L)`` / ``size(shape)``; ``size(L, i, j)`` is the size of mode ``L[i][j]``."""
    if isinstance(x, Layout) or hasattr(x, "layout_b"):
        lay = x
        for m in modes:
            lay = lay[m]
        return lay.size()
    t = as_inttuple(x, "size")
    for m in modes:
        t = t[m]
    return product(t)


def cosize(x: Layout) -> int:
    """``L(shape - 1) + 1``: one past the image of the last coordinate (CuTe's cosize)."""
    if hasattr(x, "cosize") and not isinstance(x, Layout):
        return x.cosize()
    require_layout(x, "cosize")

    def last(s: IntTuple, d: IntTuple) -> int:
        if is_tuple(s):
            return sum(last(a, b) for a, b in zip(s, d))
        return (s - 1) * d

    return last(x.shape, x.stride) + 1


def rank(x: Any, *modes: int) -> int:
    t = x.shape if isinstance(x, Layout) else x
    for m in modes:
        t = t[m]
    return len(t) if is_tuple(t) else 1


def depth(x: Any) -> int:
    return tuple_depth(x.shape if isinstance(x, Layout) else x)


def shape(x: Any) -> IntTuple:
    return x.shape if hasattr(x, "shape") else x


def stride(x: Layout) -> IntTuple:
    return x.stride


def flatten(x: Any) -> Any:
    if isinstance(x, Layout):
        return Layout(tuple_flatten(x.shape), tuple_flatten(x.stride))
    return tuple_flatten(x)


def _bw_coalesce(old_shape: Sequence[int], old_stride: Sequence[int], new_shape: Any,
                 new_stride: Any) -> Layout:
    """Fold flat modes right to left into (new_shape, new_stride) (CuTe's detail::bw_coalesce)."""
    ns = [new_shape]
    nd = [new_stride]
    for s, d in zip(reversed(old_shape), reversed(old_stride)):
        if s == 1:
            continue
        if ns[0] == 1:
            ns[0], nd[0] = s, d
        elif s * d == nd[0]:
            ns[0], nd[0] = s * ns[0], d
        else:
            ns.insert(0, s)
            nd.insert(0, d)
    if len(ns) == 1:
        if ns[0] == 1:
            return _trusted(1, 0)
        return _trusted(ns[0], nd[0])
    return _trusted(tuple(ns), tuple(nd))


def _flat(x: Layout) -> tuple[tuple[int, ...], tuple[int, ...]]:
    fs = tuple_flatten(x.shape) if is_tuple(x.shape) else (x.shape,)
    fd = tuple_flatten(x.stride) if is_tuple(x.stride) else (x.stride,)
    return fs, fd


def coalesce(x: Layout, profile: IntTuple | None = None) -> Layout:
    """Merge modes ``s0:d0, s1:d1`` with ``d1 == s0*d0`` and drop size-1 modes.

    Preserves ``L(i)`` for ``0 <= i < size(L)``; the result has depth <= 1. With a
    ``profile`` (a tuple), coalesces each mode separately, keeping the rank.
    """
    require_layout(x, "coalesce")
    if profile is not None and is_tuple(profile):
        if len(profile) > x.rank:
            raise ValueError(f"coalesce: profile {fmt(profile)} has more modes than {x}")
        modes = [coalesce(x[i], profile[i]) for i in range(len(profile))]
        modes += [x[i] for i in range(len(profile), x.rank)]
        return make_layout(*modes) if len(modes) > 1 else Layout((modes[0].shape,), (modes[0].stride,))
    fs, fd = _flat(x)
    return _bw_coalesce(fs[:-1], fd[:-1], fs[-1], fd[-1])


def coalesce_x(x: Layout) -> Layout:
    """Coalesce that also preserves ``L(i)`` for ``i >= size(L)`` (CuTe's detail::coalesce_x)."""
    fs, fd = _flat(x)
    last = 2 if fs[-1] == 1 else fs[-1]
    return _bw_coalesce(fs[:-1], fd[:-1], last, fd[-1])


def filter_zeros(x: Layout, profile: IntTuple | None = None) -> Layout:
    """Replace every stride-0 mode by a size-1 mode (``profile`` zeros select the modes instead)."""
    require_layout(x, "filter_zeros")
    key = x.stride if profile is None else profile

    def rec(k: IntTuple, s: IntTuple) -> IntTuple:
        if is_tuple(k):
            return tuple(rec(a, b) for a, b in zip(k, s))
        return 1 if k == 0 else s

    return Layout(rec(key, x.shape), x.stride)


def filter(x: Layout, profile: IntTuple | None = None) -> Layout:  # noqa: A001 - CuTe's name
    """Remove stride-0 and size-1 modes, then coalesce (``1:0`` if nothing remains)."""
    require_layout(x, "filter")
    if profile is not None and is_tuple(profile):
        modes = [filter(x[i], profile[i]) for i in range(len(profile))]
        modes += [x[i] for i in range(len(profile), x.rank)]
        return make_layout(*modes) if len(modes) > 1 else Layout((modes[0].shape,), (modes[0].stride,))
    return coalesce(filter_zeros(x))


def _pad(x: Layout, y: Layout | None, n: int | None, front: bool, name: str) -> Layout:
    """``x`` with mode ``y`` (default ``1:0``) added at the back (at the ``front``), once, or
    with ``n`` as often as it takes to reach rank ``n``."""
    y = Layout(1, 0) if y is None else y
    require_layout(x, name)
    require_layout(y, name)
    modes = list(x) if is_tuple(x.shape) else [x]
    at = 0 if front else len(modes)
    pad = 1 if n is None else max(0, n - len(modes))
    modes[at:at] = [y] * pad
    if n is not None and len(modes) == 1:
        return x
    return Layout(tuple(m.shape for m in modes), tuple(m.stride for m in modes))


def append(x: Layout, y: Layout | None = None, n: int | None = None) -> Layout:
    """Append mode ``y`` (default ``1:0``); with ``n``, pad with ``y`` up to rank ``n``."""
    return _pad(x, y, n, False, "append")


def prepend(x: Layout, y: Layout | None = None, n: int | None = None) -> Layout:
    """Prepend mode ``y`` (default ``1:0``); with ``n``, pad with ``y`` up to rank ``n``."""
    return _pad(x, y, n, True, "prepend")


def select(x: Layout, *modes: int) -> Layout:
    """The layout made of the listed modes, in that order."""
    require_layout(x, "select")
    for i in modes:
        if not isinstance(i, int) or not -x.rank <= i < x.rank:
            raise ValueError(f"select({x}, {modes}): mode {i!r} out of range for rank {x.rank}")
    return Layout(tuple(x[i].shape for i in modes), tuple(x[i].stride for i in modes))


def group(x: Layout, begin: int, end: int) -> Layout:
    """Group modes ``[begin, end)`` into one mode."""
    require_layout(x, "group")
    if not 0 <= begin < end <= x.rank:
        raise ValueError(f"group({x}, {begin}, {end}): need 0 <= begin < end <= rank {x.rank}")
    ms = list(x)
    inner = ms[begin:end]
    grouped = Layout(tuple(m.shape for m in inner), tuple(m.stride for m in inner))
    out = ms[:begin] + [grouped] + ms[end:]
    return Layout(tuple(m.shape for m in out), tuple(m.stride for m in out))


def slice_and_offset(crd: Any, x: Layout) -> tuple[Layout, Any]:
    """CuTe's ``slice_and_offset``: keep the modes where ``crd`` is ``None`` (``_``), and the
    offset ``<crd, stride>`` of the fixed modes (``None`` counts as 0).

    As in CuTe's ``slice``, the kept modes of a tuple coordinate are concatenated into one
    flat tuple of modes: ``L(None, (2, None))`` on ``(4,(3,5))`` keeps ``(4,5)``, and
    ``L(None, 2)`` on ``(4,8):(1,4)`` is the rank-1 tuple layout ``(4):(1)``. A bare
    ``None`` keeps the whole layout.
    """
    if crd is None:
        return x, 0

    def rec(c: Any, s: IntTuple, d: IntTuple) -> tuple[list[tuple[IntTuple, IntTuple]], Any]:
        if c is None:
            return [(s, d)], 0
        if is_tuple(c):
            if not is_tuple(s) or len(c) != len(s):
                raise ValueError(f"slice: coordinate {fmt(c)} does not match shape {fmt(s)} of {x}")
            kept: list[tuple[IntTuple, IntTuple]] = []
            off: Any = 0
            for ci, si, di in zip(c, s, d):
                k, o = rec(ci, si, di)
                kept += k
                off = off + o
            return kept, off
        return [], crd2idx(c, s, d)

    if is_tuple(crd) and not is_tuple(x.shape):
        if len(crd) != 1:
            raise ValueError(f"slice: coordinate {fmt(crd)} has rank {len(crd)}, layout {x} rank 1")
        kept, off = rec(crd[0], x.shape, x.stride)
    else:
        kept, off = rec(crd, x.shape, x.stride)
    return Layout(tuple(k[0] for k in kept), tuple(k[1] for k in kept)), off
