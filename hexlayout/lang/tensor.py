"""Proxies the kernel function sees while it is traced.

- ``GlobalTensor``: a global tensor argument. ``a.shape`` / ``a.stride`` are ints or
  ``Expr`` (symbolic sizes are ``Var``s named as in the annotation); ``a.tile(tile,
  origin)`` is ``hl.view(a, tile, origin)``.
- ``Tile``: a tile value (global view, shared or register tile) wrapping an IR ``Value``.
  ``x.shape`` (ints), ``x.dtype``, ``x.scope``, ``x.layout``, ``x.nbytes``. Views:
  ``x[:, :, s]`` (modes fixed at indices, runtime indices allowed -> ``Slice``),
  ``x[0:64, :]`` / ``x.tile((64, 32), (m, k))`` (a window at element offsets ->
  ``SubTile``), ``x.T`` / ``x.permute(1, 0)`` (``Permute``). Operators on register tiles
  are elementwise ops with numpy broadcasting: ``+ - * /``, unary ``-``, ``abs``,
  comparisons ``< <= > >=`` and ``x.eq(y)`` / ``x.ne(y)`` (predicate tiles), ``& | ~``
  on predicate tiles. Augmented assignments (``acc *= alpha``) update the tile in place.
  A tile has no truth value: ``if x:`` raises ``KernelError``. Put the tile on the
  left of an operator whose other operand is an ``Expr`` (``cols + n0``, not ``n0 + cols``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import ExprLike
from hexlayout.ir.tile import GlobalParam, Value
from hexlayout.ir.types import LayoutLike, Scope

if TYPE_CHECKING:
    from .context import TraceContext

__all__ = ["GlobalTensor", "Tile", "describe", "shape_str"]


def shape_str(shape: tuple[Any, ...]) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


def describe(v: Value) -> str:
    """``%ra f16(128,32) register`` for messages."""
    return f"%{v.name} {v.type.dtype}{shape_str(v.type.shape)} {v.type.scope}"


class GlobalTensor:
    """A global tensor kernel argument (see the module docstring)."""

    def __init__(self, param: GlobalParam, ctx: TraceContext) -> None:
        self.param = param
        self._ctx = ctx

    @property
    def name(self) -> str:
        return self.param.name

    @property
    def dtype(self) -> DType:
        return self.param.dtype

    @property
    def shape(self) -> tuple[ExprLike, ...]:
        return tuple(self.param.shape)

    @property
    def stride(self) -> tuple[ExprLike, ...]:
        return tuple(self.param.stride)

    @property
    def ndim(self) -> int:
        return len(self.param.shape)

    def tile(self, tile: tuple[int, ...], origin: tuple[Any, ...] | None = None, *, rows: Tile | None = None,
             valid_rows: ExprLike | None = None, name: str | None = None) -> Tile:
        """``hl.view(self, tile, origin, rows=..., valid_rows=...)``."""
        from .memory import view

        return view(self, tile, origin, rows=rows, valid_rows=valid_rows, name=name)

    def __bool__(self) -> bool:
        from .context import current

        ctx = current("bool")
        raise ctx.error("bool", ctx.loc(), f"the global tensor {self.name} has no Python truth value")

    def __repr__(self) -> str:
        shp = ", ".join(map(str, self.param.shape))
        return f"GlobalTensor({self.name}: {self.dtype}[{shp}])"


class Tile:
    """A tile value (see the module docstring). ``value`` is the IR ``Value``."""

    __slots__ = ("value", "_ctx")
    __array_priority__ = 1000  # numpy scalars on the left defer to our reflected operators

    def __init__(self, value: Value, ctx: TraceContext) -> None:
        self.value = value
        self._ctx = ctx

    # --- type ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.value.name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.type.shape)

    @property
    def dtype(self) -> DType:
        return self.value.type.dtype

    @property
    def scope(self) -> Scope:
        return self.value.type.scope

    @property
    def layout(self) -> LayoutLike:
        return self.value.type.layout

    @property
    def ndim(self) -> int:
        return len(self.value.type.shape)

    @property
    def size(self) -> int:
        return self.value.type.size

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tile (e.g. the ``tx_bytes`` a TMA copy of it transfers)."""
        return self.value.type.size * self.dtype.bits // 8

    # --- views --------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> Tile:
        from .views import getitem

        return getitem(self, index)

    def __setitem__(self, index: Any, src: Any) -> None:
        from .ops import assign
        from .views import getitem

        dst = self if index is Ellipsis else getitem(self, index)
        assign(dst, src)

    def tile(self, shape: tuple[int, ...], origin: tuple[ExprLike, ...] | None = None, *,
             name: str | None = None) -> Tile:
        """The ``shape`` window at element offsets ``origin`` (a view, ``SubTile``)."""
        from .views import subtile

        return subtile(self, shape, origin, name=name)

    def permute(self, *perm: int) -> Tile:
        from .views import permute

        return permute(self, perm[0] if len(perm) == 1 and isinstance(perm[0], tuple) else perm)

    @property
    def T(self) -> Tile:  # noqa: N802 - numpy's name
        from .views import permute

        return permute(self, tuple(reversed(range(self.ndim))))

    def to(self, dtype: DType) -> Tile:
        from .ops import cast

        return cast(self, dtype)

    # --- arithmetic ---------------------------------------------------------------------
    def _ew(self, fn: str, *args: Any, out: Tile | None = None) -> Tile:
        from .math import elementwise

        return elementwise(fn, args, out=out)

    def __add__(self, o: Any) -> Tile:
        return self._ew("add", self, o)

    def __radd__(self, o: Any) -> Tile:
        return self._ew("add", o, self)

    def __sub__(self, o: Any) -> Tile:
        return self._ew("sub", self, o)

    def __rsub__(self, o: Any) -> Tile:
        return self._ew("sub", o, self)

    def __mul__(self, o: Any) -> Tile:
        return self._ew("mul", self, o)

    def __rmul__(self, o: Any) -> Tile:
        return self._ew("mul", o, self)

    def __truediv__(self, o: Any) -> Tile:
        return self._ew("div", self, o)

    def __rtruediv__(self, o: Any) -> Tile:
        return self._ew("div", o, self)

    def __neg__(self) -> Tile:
        return self._ew("neg", self)

    def __abs__(self) -> Tile:
        return self._ew("abs", self)

    def __iadd__(self, o: Any) -> Tile:
        return self._ew("add", self, o, out=self)

    def __isub__(self, o: Any) -> Tile:
        return self._ew("sub", self, o, out=self)

    def __imul__(self, o: Any) -> Tile:
        return self._ew("mul", self, o, out=self)

    def __itruediv__(self, o: Any) -> Tile:
        return self._ew("div", self, o, out=self)

    def __lt__(self, o: Any) -> Tile:
        return self._ew("lt", self, o)

    def __le__(self, o: Any) -> Tile:
        return self._ew("le", self, o)

    def __gt__(self, o: Any) -> Tile:
        return self._ew("gt", self, o)

    def __ge__(self, o: Any) -> Tile:
        return self._ew("ge", self, o)

    def eq(self, o: Any) -> Tile:
        return self._ew("eq", self, o)

    def ne(self, o: Any) -> Tile:
        return self._ew("ne", self, o)

    def __and__(self, o: Any) -> Tile:
        return self._ew("and", self, o)

    def __rand__(self, o: Any) -> Tile:
        return self._ew("and", o, self)

    def __or__(self, o: Any) -> Tile:
        return self._ew("or", self, o)

    def __ror__(self, o: Any) -> Tile:
        return self._ew("or", o, self)

    def __invert__(self) -> Tile:
        return self._ew("not", self)

    # --- misuse ---------------------------------------------------------------------------
    def __bool__(self) -> bool:
        raise self._ctx.error("bool", self._ctx.loc(),
                              f"the tile {describe(self.value)} has no Python truth value "
                              "(use hl.where for elementwise choice, hl.if_ for runtime branches)")

    def __iter__(self) -> Any:
        raise self._ctx.error("iter", self._ctx.loc(),
                              f"the tile {describe(self.value)} is not iterable (index it: x[i], or "
                              "x.tile(shape, origin))")

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"Tile(%{self.value.name}: {self.value.type})"
