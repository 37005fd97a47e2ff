"""IntTuple: an ``int`` or a (possibly nested) ``tuple`` of IntTuples, as in CuTe.

Shapes, strides and coordinates are IntTuples. Every function here follows the
CuTe C++ definition of the same name (``cute/int_tuple.hpp``, ``cute/stride.hpp``):

- ``product(t)``: the product of all leaves (1 for the empty tuple).
- ``prefix_product(s)``: the colexicographic (column-major) compact strides of ``s``.
- ``crd2idx(c, s, d)``: ``sum_i c_i * d_i`` after a 1-D coordinate has been split
  colexicographically by ``s`` (the last mode takes whatever is left, so indices
  past ``size(s)`` extend the last mode, exactly as in CuTe).
- ``idx2crd(i, s)``: the colexicographic inverse of ``crd2idx(., s, prefix_product(s))``.
- ``shape_div(a, b)``: ``a / b`` where one divides the other (1 when ``b`` is a
  multiple of ``a``), applied through nested tuples by folding the divisor.

All arithmetic also works elementwise on numpy integer arrays used as coordinates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import reduce
from typing import Any

IntTuple = int | tuple["IntTuple", ...]

__all__ = [
    "IntTuple",
    "is_int",
    "is_tuple",
    "as_inttuple",
    "all_positive",
    "product",
    "product_each",
    "rank",
    "depth",
    "flatten",
    "unflatten",
    "prefix_product",
    "suffix_product",
    "compact_col_major",
    "compact_row_major",
    "inner_product",
    "elem_scale",
    "shape_div",
    "ceil_div",
    "shape_min",
    "congruent",
    "compatible",
    "crd2idx",
    "idx2crd",
    "crd2crd",
    "is_coord_leaf",
    "repeat_like",
    "tuple_max",
    "signum",
    "fmt",
]


def is_int(x: Any) -> bool:
    """True for Python ints and numpy integer scalars/arrays (but not bools)."""
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and dtype.kind in "iu"


def is_tuple(x: Any) -> bool:
    return isinstance(x, tuple)


def as_inttuple(x: Any, what: str = "IntTuple") -> IntTuple:
    """Normalize lists to tuples and numpy integers to ints; reject anything else."""
    if type(x) is int:
        return x
    if isinstance(x, (list, tuple)):
        return tuple([as_inttuple(e, what) for e in x])
    if isinstance(x, bool) or not is_int(x):
        raise ValueError(f"{what}: {x!r} is not an int or a tuple of ints")
    return int(x)


def product(t: IntTuple) -> int:
    if is_tuple(t):
        return reduce(lambda a, b: a * b, (product(e) for e in t), 1)
    return t


def product_each(t: IntTuple) -> IntTuple:
    """The product of each top-level mode: ``((2,3),4) -> (6,4)``."""
    if is_tuple(t):
        return tuple(product(e) for e in t)
    return t


def rank(t: IntTuple) -> int:
    return len(t) if is_tuple(t) else 1


def depth(t: IntTuple) -> int:
    if is_tuple(t):
        return 1 + max((depth(e) for e in t), default=0)
    return 0


def flatten(t: IntTuple) -> IntTuple:
    """All leaves of ``t`` as a flat tuple (an int stays an int)."""
    if not is_tuple(t):
        return t
    out: list[int] = []

    def rec(x: IntTuple) -> None:
        if is_tuple(x):
            for e in x:
                rec(e)
        else:
            out.append(x)

    rec(t)
    return tuple(out)


def unflatten(flat: Iterable[int], profile: IntTuple) -> IntTuple:
    """Regroup the leaves ``flat`` with the nesting of ``profile``."""
    it = iter(flat)

    def rec(p: IntTuple) -> IntTuple:
        if is_tuple(p):
            return tuple(rec(e) for e in p)
        return next(it)

    return rec(profile)


def repeat_like(t: IntTuple, value: Any) -> Any:
    if is_tuple(t):
        return tuple(repeat_like(e, value) for e in t)
    return value


def _strides(s: IntTuple, init: int, reverse: bool, unit_zero: bool) -> IntTuple:
    """Compact strides of shape ``s`` from ``init``: column-major (modes in order) or row-major
    (``reverse``: the last mode fastest); ``unit_zero``: extent-1 modes get stride 0."""
    if is_tuple(s):
        out = []
        cur = init
        for e in (reversed(s) if reverse else s):
            out.append(_strides(e, cur, reverse, unit_zero))
            cur = cur * product(e)
        return tuple(reversed(out)) if reverse else tuple(out)
    return 0 if unit_zero and s == 1 else init


def prefix_product(s: IntTuple, init: int = 1) -> IntTuple:
    """Compact column-major strides: ``(4,(2,3)) -> (1,(4,8))``."""
    return _strides(s, init, False, False)


def compact_col_major(s: IntTuple, init: int = 1) -> IntTuple:
    """CuTe's ``compact_major<LayoutLeft>``: ``prefix_product`` except that extent-1 modes
    get stride 0 (``(1,4,(1,3)) -> (0,1,(0,4))``), as C++ does for static shapes."""
    return _strides(s, init, False, True)


def compact_row_major(s: IntTuple, init: int = 1) -> IntTuple:
    """CuTe's ``compact_major<LayoutRight>``: ``suffix_product`` with 0 for extent-1 modes."""
    return _strides(s, init, True, True)


def suffix_product(s: IntTuple, init: int = 1) -> IntTuple:
    """Compact row-major strides: ``(4,(2,3)) -> (6,(3,1))``."""
    return _strides(s, init, True, False)


def inner_product(a: IntTuple, b: IntTuple) -> Any:
    if is_tuple(a):
        if not is_tuple(b) or len(a) != len(b):
            raise ValueError(f"inner_product: {fmt(a)} and {fmt(b)} are not congruent")
        return sum((inner_product(x, y) for x, y in zip(a, b)), 0)
    if is_tuple(b):
        raise ValueError(f"inner_product: {fmt(a)} and {fmt(b)} are not congruent")
    return a * b


def elem_scale(a: IntTuple, b: IntTuple) -> IntTuple:
    if is_tuple(a):
        return tuple(elem_scale(x, y) for x, y in zip(a, b))
    return a * product(b)


def signum(x: int) -> int:
    return (x > 0) - (x < 0)


def shape_div(a: IntTuple, b: IntTuple) -> IntTuple:
    """CuTe's shape_div: ``a / b`` if ``b | a``, 1 if ``a | b``; tuples fold the divisor.

    Raises ValueError when neither divides the other (CuTe waives this check for
    dynamic values and returns a truncated quotient).
    """
    if is_tuple(a):
        if is_tuple(b):
            if len(a) != len(b):
                raise ValueError(f"shape_div: ranks of {fmt(a)} and {fmt(b)} differ")
            return tuple(shape_div(x, y) for x, y in zip(a, b))
        out = []
        rest = b
        for ai in a:
            out.append(shape_div(ai, rest))
            rest = shape_div(rest, ai)
        return tuple(out)
    if is_tuple(b):
        return shape_div(a, product(b))
    if b == 0:
        raise ValueError(f"shape_div: division of {a} by 0")
    if a % b == 0:
        return a // b
    if b % a == 0:
        return signum(a) * signum(b)
    raise ValueError(f"shape_div: neither of {a} and {b} divides the other")


def ceil_div(a: IntTuple, b: IntTuple) -> IntTuple:
    """Ceiling division; a tuple dividend folds an integral divisor through its modes."""
    if is_tuple(a):
        if is_tuple(b):
            if len(b) > len(a):
                raise ValueError(f"ceil_div: {fmt(b)} has more modes than {fmt(a)}")
            b = b + (1,) * (len(a) - len(b))
            return tuple(ceil_div(x, y) for x, y in zip(a, b))
        out = []
        rest = b
        for ai in a:
            out.append(ceil_div(ai, rest))
            rest = ceil_div(rest, product(ai))
        return tuple(out)
    if is_tuple(b):
        return ceil_div(a, product(b))
    return -(-a // b)


def shape_min(a: IntTuple, b: IntTuple) -> IntTuple:
    if is_tuple(a) or is_tuple(b):
        raise ValueError(f"shape_min: tuple arguments {fmt(a)}, {fmt(b)} are not supported")
    return min(a, b)


def tuple_max(t: IntTuple) -> int:
    if is_tuple(t):
        return max((tuple_max(e) for e in t), default=0)
    return t


def congruent(a: IntTuple, b: IntTuple) -> bool:
    """Same nesting profile."""
    ta, tb = isinstance(a, tuple), isinstance(b, tuple)
    if ta and tb:
        if len(a) != len(b):
            return False
        for x, y in zip(a, b):
            if not congruent(x, y):
                return False
        return True
    return not ta and not tb


def all_positive(t: IntTuple) -> bool:
    """Every leaf of ``t`` is positive."""
    if isinstance(t, tuple):
        for e in t:
            if not all_positive(e):
                return False
        return True
    return t > 0


def compatible(a: IntTuple, b: IntTuple) -> bool:
    """CuTe's ``compatible(a, b)``: every coordinate of shape ``a`` is a coordinate of ``b``.

    True when ``size(a) == size(b)`` and, recursively, ``a`` is an int or both are
    tuples of equal rank with compatible modes.
    """
    if is_tuple(a):
        return is_tuple(b) and len(a) == len(b) and all(compatible(x, y) for x, y in zip(a, b))
    return product(b) == a


def is_coord_leaf(x: Any) -> bool:
    """An integer coordinate: a Python/numpy int, an integer numpy array (vectorized
    evaluation) or a symbolic integer expression (any object with integer arithmetic,
    e.g. ``hexlayout.ir.expr.Expr``). Floats, strings, bools and None are not."""
    if isinstance(x, (bool, float, complex, str, bytes)) or x is None:
        return False
    if is_int(x):
        return True
    dtype = getattr(x, "dtype", None)
    if dtype is not None:
        return False  # a non-integer numpy scalar / array
    return hasattr(x, "__mul__") and hasattr(x, "__floordiv__") and hasattr(x, "__mod__")


def crd2idx(crd: Any, shape: IntTuple, stride: IntTuple | None = None) -> Any:
    """``<crd, stride>`` after splitting integral coordinates colexicographically by ``shape``.

    ``crd`` is an int / numpy integer array / symbolic integer, or a tuple congruent to
    (a coarsening of) ``shape``. An integral coordinate for a tuple mode is split as
    ``c_k = (c // (s_0...s_{k-1})) % s_k`` with the last mode taking whatever is left, so
    coordinates are not bounds-checked: ``L(size(L) + j)`` extends the last mode exactly as
    in CuTe. ``stride`` defaults to ``prefix_product(shape)`` (CuTe's ``crd2idx(c, s)``).
    """
    if stride is None:
        stride = prefix_product(shape)
    if is_tuple(crd):
        if not is_tuple(shape):
            raise ValueError(f"crd2idx: coordinate {fmt(crd)} has more modes than shape {fmt(shape)}")
        if len(crd) != len(shape):
            raise ValueError(f"crd2idx: coordinate {fmt(crd)} does not match the rank of shape {fmt(shape)}")
        return sum((crd2idx(c, s, d) for c, s, d in zip(crd, shape, stride)), 0)
    if not is_coord_leaf(crd):
        raise ValueError(f"crd2idx: {crd!r} is not an integer coordinate (shape {fmt(shape)})")
    if is_tuple(shape):
        if len(shape) == 0:
            return 0
        result = 0
        for s, d in zip(shape[:-1], stride[:-1]):
            n = product(s)
            result = result + crd2idx(crd % n, s, d)
            crd = crd // n
        return result + crd2idx(crd, shape[-1], stride[-1])
    return crd * stride


def idx2crd(idx: Any, shape: IntTuple, stride: IntTuple | None = None) -> Any:
    """Natural coordinate of ``idx`` in ``shape`` (colexicographic); an int for an int shape.

    Without ``stride`` this inverts ``crd2idx(., shape, prefix_product(shape))`` exactly as
    CuTe's ``idx2crd(i, s)``: mode ``k`` gets ``(i // (s_0...s_{k-1})) % s_k`` except the
    last mode, which takes whatever is left (so ``i >= size(shape)`` extends the last
    mode, mirroring ``crd2idx``). With ``stride`` given, every mode's coordinate is
    ``(idx // stride) % shape`` (CuTe's ``idx2crd(i, s, d)``; 0 for extent-1 modes).
    """
    if stride is not None:
        if is_tuple(idx):
            if not is_tuple(shape) or len(idx) != len(shape):
                raise ValueError(f"idx2crd: {fmt(idx)} does not match shape {fmt(shape)}")
            return tuple(idx2crd(i, s, d) for i, s, d in zip(idx, shape, stride))
        if is_tuple(shape):
            if not is_tuple(stride) or len(stride) != len(shape):
                raise ValueError(f"idx2crd: stride {fmt(stride)} does not match shape {fmt(shape)}")
            return tuple(idx2crd(idx, s, d) for s, d in zip(shape, stride))
        if shape == 1:
            return idx * 0
        return (idx // stride) % shape
    if is_tuple(idx):
        if not is_tuple(shape) or len(idx) != len(shape):
            raise ValueError(f"idx2crd: {fmt(idx)} does not match shape {fmt(shape)}")
        return tuple(idx2crd(i, s) for i, s in zip(idx, shape))
    if is_tuple(shape):
        out = []
        for k, s in enumerate(shape):
            if k == len(shape) - 1:
                out.append(idx2crd(idx, s))
            else:
                n = product(s)
                out.append(idx2crd(idx % n, s))
                idx = idx // n
        return tuple(out)
    return idx


def crd2crd(crd: Any, src_shape: IntTuple, dst_shape: IntTuple) -> Any:
    """Re-express a coordinate of ``src_shape`` as a coordinate of ``dst_shape`` (CuTe's
    argument order ``crd2crd(coord, src_shape, dst_shape)``), mode by mode where all three
    are tuples, else through the colexicographic index."""
    if is_tuple(crd) and is_tuple(src_shape) and is_tuple(dst_shape):
        if not len(crd) == len(src_shape) == len(dst_shape):
            raise ValueError(f"crd2crd: {fmt(crd)}, {fmt(src_shape)}, {fmt(dst_shape)} have mismatched ranks")
        return tuple(crd2crd(c, s, d) for c, s, d in zip(crd, src_shape, dst_shape))
    return idx2crd(crd2idx(crd, src_shape), dst_shape)


def transform_leaves(f: Callable[..., Any], *ts: IntTuple) -> Any:
    if is_tuple(ts[0]):
        return tuple(transform_leaves(f, *es) for es in zip(*ts))
    return f(*ts)


def fmt(t: Any) -> str:
    """CuTe notation without spaces: ``(4,(2,3))``; ``None`` prints as ``_``."""
    if t is None:
        return "_"
    if is_tuple(t):
        return "(" + ",".join(fmt(e) for e in t) + ")"
    if is_int(t) and getattr(t, "ndim", 0) == 0:
        return str(int(t))
    return str(t)
