"""Proxies the kernel function sees while it is traced.

- ``GlobalTensor``: a global tensor argument. ``a.shape`` / ``a.stride`` are ints or
  ``Expr`` (symbolic sizes are ``Var``s named as in the annotation); ``a.tile(tile,
  origin)`` is ``hl.view(a, tile, origin)``; ``a[i, j]`` loads one element (an ``Expr``),
  ``a[idx, 0:64]`` with integer index tiles is a gathered view (``indirect``).
- ``Tile``: a tile value (global view, shared or register tile) wrapping an IR ``Value``.
  ``x.shape`` (ints), ``x.dtype``, ``x.scope``, ``x.layout``, ``x.nbytes``. Views:
  ``x[:, :, s]`` (modes fixed at indices, runtime indices allowed -> ``Slice``),
  ``x[0:64, :]`` / ``x.tile((64, 32), (m, k))`` (a window at element offsets ->
  ``SubTile``), ``x.T`` / ``x.permute(1, 0)`` (``Permute``). Operators on register tiles
  are elementwise ops with numpy broadcasting: ``+ - * /``, ``// %`` on integer tiles
  (floor division, as Python's), unary ``-``, ``abs``,
  comparisons ``< <= > >=`` and ``x.eq(y)`` / ``x.ne(y)`` (predicate tiles), ``& | ~``
  on predicate tiles (logical) and integer tiles (bitwise), ``^ << >>`` on integer tiles
  (``>>`` arithmetic for signed, logical for unsigned types). Augmented assignments
  (``acc *= alpha``) update the tile in place. A tile has no truth value: ``if x:``
  raises ``KernelError``. Put the tile on the left of an operator whose other operand is
  an ``Expr`` (``cols + n0``, not ``n0 + cols``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import ExprLike
from hexlayout.ir.tile import GlobalParam, Value
from hexlayout.ir.types import LayoutLike, Scope

if TYPE_CHECKING:
    from .context import TraceContext

__all__ = ["GlobalTensor", "Tile", "describe", "shape_str", "METHODS", "method"]

F = TypeVar("F", bound=Callable[..., Any])

#: The ops behind the methods and operators of ``Tile`` and ``GlobalTensor`` (``a.tile(...)``,
#: ``a[i]``, ``t.T``, ``t.to(dt)``, ``t + u``, ...), by name. They are defined by the modules above
#: this one (``views``, ``ops``, ``math``, ``memory``, ``indirect``), which register them with
#: ``method`` when ``hexlayout.lang`` is imported; the classes here only dispatch.
METHODS: dict[str, Callable[..., Any]] = {}


def method(name: str) -> Callable[[F], F]:
    """Register the decorated function as the op behind the tensor method ``name``."""

    def register(fn: F) -> F:
        METHODS[name] = fn
        return fn

    return register


def shape_str(shape: tuple[Any, ...]) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


def describe(v: Value) -> str:
    """``%ra f16(128,32) register`` for messages."""
    return f"%{v.name} {v.type.dtype}{shape_str(v.type.shape)} {v.type.scope}"


class GlobalTensor:
    """A global tensor argument, as the kernel function sees it while it is traced.

    ``a.shape`` / ``a.stride`` are ints or ``Expr`` (symbolic sizes are variables named as
    in the annotation: ``hl.f16["M", "K"]`` gives ``M`` and ``K``); element ``(i, j)`` is
    at element offset ``i * stride[0] + j * stride[1]`` from the data pointer. Operations
    take tiles of it: ``a.tile(tile, origin)`` (``hl.view``).

    Example:
        >>> @hl.kernel(threads=128)
        ... def k(a: hl.f16["M", "K"]):
        ...     print(a, a.shape, a.stride)
        >>> _ = k.trace()
        GlobalTensor(a: f16[M, K]) (Expr(M), Expr(K)) (Expr(K), 1)
    """

    #: the op (in ``METHODS``) that makes this tensor's views: ``hl.view`` itself; a tensor
    #: whose views are of another kind (4-bit, ``packed_global``) names its own
    view_op = "view"

    def __init__(self, param: GlobalParam, ctx: TraceContext) -> None:
        self.param = param
        self._ctx = ctx

    @property
    def name(self) -> str:
        """The argument's name."""
        return self.param.name

    @property
    def dtype(self) -> DType:
        """The element type."""
        return self.param.dtype

    @property
    def shape(self) -> tuple[ExprLike, ...]:
        """The extents, one per mode: ints or ``Expr`` (symbolic sizes)."""
        return tuple(self.param.shape)

    @property
    def stride(self) -> tuple[ExprLike, ...]:
        """The element strides, one per mode: ints or ``Expr`` (row-major unless annotated)."""
        return tuple(self.param.stride)

    @property
    def ndim(self) -> int:
        """The number of modes."""
        return len(self.param.shape)

    def tile(self, tile: tuple[int, ...], origin: tuple[Any, ...] | None = None, *, rows: Tile | None = None,
             valid_rows: ExprLike | None = None, name: str | None = None) -> Tile:
        """The ``tile``-shaped window at ``origin``: ``hl.view(self, tile, origin, ...)``.

        ``y[c] = self[origin + c]``, out-of-bounds elements read as 0 and never written.

        Args:
            tile (tuple[int, ...]): static positive extents, one per mode.
            origin (tuple[int | Expr | None, ...] | None): the first element's coordinate
                (default all zeros; ``None`` in mode 0 with ``rows``).
            rows (Tile | None): an integer register tile of row indices (gathered rows).
            valid_rows (int | Expr | None): with ``rows``, how many leading rows are valid.
            name (str | None): the value's name in the IR.

        Returns:
            Tile: a global tile of shape ``tile``.

        Raises:
            KernelError: as ``hl.view``.

        Example:
            The (pid_m, k)-th 128x32 tile of ``a``::

                @hl.kernel(threads=128)
                def tiles(a: hl.f16["M", "K"]):
                    pid_m = hl.grid(hl.spatial(4))
                    for k in hl.range(8):
                        t = a.tile((128, 32), (pid_m * 128, k * 32))
                        assert t.shape == (128, 32)

                tiles.trace()
        """
        return METHODS["view"](self, tile, origin, rows=rows, valid_rows=valid_rows, name=name)

    def __getitem__(self, index: Any) -> Any:
        """numpy-style indexing of a global tensor: a scalar load, a gathered or a plain view.

        Integers / ``Expr`` only: one element is loaded (``hl.load``): an integer ``Expr``,
        the same in every thread. With integer index tiles among the indices: a gathered
        view, numpy's advanced indexing (the index tiles broadcast together; their shape
        replaces the indexed modes; ``:`` / ``a:b`` keep a mode); elements whose coordinates
        fall outside the tensor read 0 and are never written. With slices only: the plain
        view. ``hexlayout.lang.indirect`` gives the rules.

        Args:
            index (tuple): one entry per mode (missing trailing modes are ``:``): an int or
                ``Expr``, a slice with a static width, or an integer index tile.

        Returns:
            Expr | Tile: the loaded value, or a global tile.

        Raises:
            KernelError: an index of the wrong kind, rank or range (see ``hl.load``),
                index tiles that do not broadcast, a slice without a static width.

        Example:
            A sequence length loaded from memory, and K rows gathered through a block table::

                @hl.kernel(threads=128)
                def paged(k: hl.f16["NB", 16, 128], table: hl.i32["B", "MB"], lens: hl.i32["B"]):
                    s = hl.grid(hl.spatial(lens.shape[0]))
                    n = lens[s]
                    pos = hl.iota((64,), 0)
                    page = hl.register(hl.i32, (64,))
                    hl.copy(table[s, pos >> 4], page)
                    rows = k[hl.where(pos < n, page, -1), pos & 15, :]
                    assert rows.shape == (64, 128)

                paged.trace()
        """
        return METHODS["index_global"](self, index)

    def __bool__(self) -> bool:
        from .context import current

        ctx = current("bool")
        raise ctx.error("bool", ctx.loc(), f"the global tensor {self.name} has no Python truth value")

    def __repr__(self) -> str:
        shp = ", ".join(map(str, self.param.shape))
        return f"GlobalTensor({self.name}: {self.dtype}[{shp}])"


_Method = Callable[..., "Tile"]


def _operators(fn: str | tuple[str, str]) -> tuple[_Method, _Method, _Method]:
    """``(x op o, o op x, x op= o)`` of a ``Tile`` as the elementwise function ``fn``; a pair
    ``(logical, bitwise)`` picks by the tile's type (``Tile._bitwise``). The in-place form
    writes ``x``."""
    def name(t: Tile) -> str:
        return fn if isinstance(fn, str) else t._bitwise(*fn)

    def forward(self: Tile, o: Any) -> Tile:
        return self._ew(name(self), self, o)

    def reflected(self: Tile, o: Any) -> Tile:
        return self._ew(name(self), o, self)

    def inplace(self: Tile, o: Any) -> Tile:
        return self._ew(name(self), self, o, out=self)

    return forward, reflected, inplace


class Tile:
    """A tile value, as the kernel function sees it while it is traced.

    A tile is a global view, a shared tile or a register tile with a static shape, an
    element type and a layout (``hl.auto`` until synthesis decides it). It wraps the IR
    ``Value`` (``x.value``).

    - Views alias their source (writing through a view writes the source): ``x[i, :, s]``
      fixes modes (ints or ``Expr``), ``x[0:64, :]`` / ``x.tile(shape, origin)`` take a
      window, ``x.T`` / ``x.permute(...)`` reorder modes.
    - Operators on register tiles are elementwise with numpy broadcasting, producing new
      register tiles: ``+ - * /`` (``y[c] = x[c] op z[c]``), unary ``-`` and ``abs``,
      comparisons ``< <= > >=`` and ``x.eq(z)`` / ``x.ne(z)`` giving predicate (``bool_``)
      tiles, ``& | ~`` on predicate tiles (logical) and ``& | ^ ~ << >>`` on integer tiles
      (bitwise; ``>>`` is arithmetic for signed, logical for unsigned types; a shift by at
      least the width of the type gives 0, or the sign bits). Python numbers and integer ``Expr`` broadcast
      as scalars; put the tile on the left when the other operand is an ``Expr``
      (``cols + n0``). Augmented assignments (``acc *= alpha``) update the tile in place.
    - A tile has no truth value and is not iterable: ``if x:`` and ``for v in x:`` raise
      ``KernelError``.

    Example:
        >>> @hl.kernel(threads=128)
        ... def k():
        ...     x = hl.zeros((64, 32), hl.f32)
        ...     print(x.shape, x.dtype, x.scope, (x * 2.0 + 1.0).shape, x.T.shape)
        >>> _ = k.trace()
        (64, 32) f32 register (64, 32) (32, 64)
    """

    __slots__ = ("value", "_ctx")
    __array_priority__ = 1000  # numpy scalars on the left defer to our reflected operators

    def __init__(self, value: Value, ctx: TraceContext) -> None:
        self.value = value
        self._ctx = ctx

    # --- type ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The value's name in the IR (``%name`` in printed kernels and messages)."""
        return self.value.name

    @property
    def shape(self) -> tuple[int, ...]:
        """The static extents, one int per mode."""
        return tuple(self.value.type.shape)

    @property
    def dtype(self) -> DType:
        """The element type."""
        return self.value.type.dtype

    @property
    def scope(self) -> Scope:
        """The memory: ``Scope.GLOBAL``, ``Scope.SHARED`` or ``Scope.REGISTER``."""
        return self.value.type.scope

    @property
    def layout(self) -> LayoutLike:
        """The layout: a ``Layout`` / ``ComposedLayout``, ``None`` (a global view with
        symbolic strides) or a ``LayoutVar`` that synthesis solves."""
        return self.value.type.layout

    @property
    def ndim(self) -> int:
        """The number of modes."""
        return len(self.value.type.shape)

    @property
    def size(self) -> int:
        """The number of elements, ``prod(shape)``."""
        return self.value.type.size

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tile, ``size * dtype.bits / 8`` (e.g. the ``tx_bytes`` of a TMA copy of it)."""
        return self.value.type.size * self.dtype.bits // 8

    # --- views --------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> Tile:
        """A view of some modes or a window: ``x[i, :, s]``, ``x[0:64, :]``, ``x[..., k]``.

        Per mode, an int or integer ``Expr`` fixes the mode at that index (the result drops
        it: ``y[c'] = x[c' with i inserted]``), ``:`` keeps it, ``a:b`` with a static
        width ``b - a`` keeps the window ``[a, b)`` (``a`` may be an ``Expr``), and one
        ``...`` stands for the remaining modes. Negative static indices count from the end.
        Static indices are bounds-checked; a runtime index is checked when its bounds prove
        it out of range. The view aliases ``x`` (``Slice`` / ``SubTile`` ops); its layout
        is derived from ``x``'s.

        Args:
            index (int | Expr | slice | Ellipsis | tuple): one entry per mode (missing
                trailing modes are kept).

        Returns:
            Tile: the view, of ``x``'s scope and element type.

        Raises:
            KernelError: more indices than modes; several ``...``; a slice step; a window
                whose width is not static and positive; an index that is not an integer or
                is out of range.

        Example:
            Stage ``s`` of a multi-stage shared buffer, and one row window::

                @hl.kernel(threads=128)
                def stages():
                    sa = hl.shared(hl.f16, (64, 32, 3))
                    for s in range(3):
                        assert sa[:, :, s].shape == (64, 32)
                    assert sa[0:16, ..., 0].shape == (16, 32)

                stages.trace()
        """
        return METHODS["getitem"](self, index)

    def __setitem__(self, index: Any, src: Any) -> None:
        """Write into a view: ``x[index] = src`` is ``hl.assign(x[index], src)``.

        ``x[...] = src`` writes the whole tile. ``src`` (a tile, broadcast, or a number)
        must have ``x``'s element type.

        Args:
            index (int | Expr | slice | Ellipsis | tuple): as for ``x[index]``.
            src (Tile | float): the values written.

        Returns:
            None.

        Raises:
            KernelError: as ``x[index]`` and ``hl.assign``.

        Example:
            Reset a running maximum in place::

                @hl.kernel(threads=128)
                def reset():
                    m = hl.zeros((64, 1), hl.f32)
                    m[...] = float("-inf")

                reset.trace()
        """
        dst = self if index is Ellipsis else METHODS["getitem"](self, index)
        METHODS["assign"](dst, src)

    def tile(self, shape: tuple[int, ...], origin: tuple[ExprLike, ...] | None = None, *,
             name: str | None = None) -> Tile:
        """The ``shape`` window of this tile at element offsets ``origin`` (a view).

        ``y[c] = x[origin + c]``; the window must lie inside the tile (checked when the
        origin is static or its bounds prove it out of range).

        Args:
            shape (tuple[int, ...]): static positive extents, one per mode.
            origin (tuple[int | Expr, ...] | None): the window's first element (default 0).
            name (str | None): the value's name in the IR.

        Returns:
            Tile: the view (``SubTile``), of this tile's scope and element type.

        Raises:
            KernelError: ``shape`` is not static and positive or has another rank;
                ``origin`` has another length or a non-integer entry; the window leaves the tile.

        Example:
            The K-slices of a shared tile fed to successive mma steps::

                @hl.kernel(threads=128)
                def ksteps():
                    sa = hl.shared(hl.f16, (64, 64))
                    sb = hl.shared(hl.f16, (64, 64))
                    acc = hl.zeros((64, 64), hl.f32)
                    for kk in range(4):
                        hl.mma(sa.tile((64, 16), (0, 16 * kk)), sb.tile((64, 16), (0, 16 * kk)), acc)

                ksteps.trace()
        """
        return METHODS["subtile"](self, shape, origin, name=name)

    def permute(self, *perm: int) -> Tile:
        """A view with the modes reordered: result mode ``i`` is source mode ``perm[i]``.

        ``y[c_perm] = x[c]`` with ``y.shape[i] = x.shape[perm[i]]``.

        Args:
            *perm (int): a permutation of ``range(ndim)`` (or one tuple of it).

        Returns:
            Tile: the view (``Permute``).

        Raises:
            KernelError: ``perm`` is not a permutation of the modes.

        Example:
            Move a stage mode to the front::

                @hl.kernel(threads=128)
                def front():
                    sa = hl.shared(hl.f16, (64, 32, 2))
                    assert sa.permute(2, 0, 1).shape == (2, 64, 32)

                front.trace()
        """
        return METHODS["permute"](self, perm[0] if len(perm) == 1 and isinstance(perm[0], tuple) else perm)

    @property
    def T(self) -> Tile:  # noqa: N802 - numpy's name
        """The transposed view: the modes in reverse order (``y[j, i] = x[i, j]``).

        Returns:
            Tile: the view (``Permute``), e.g. a (K, N) tile as the (N, K) ``b`` of ``hl.mma``.

        Example:
            Use a row-major (K, N) shared tile as the (N, K) operand::

                @hl.kernel(threads=128)
                def kn():
                    sa = hl.shared(hl.f16, (64, 32))
                    sb = hl.shared(hl.f16, (32, 64))
                    acc = hl.zeros((64, 64), hl.f32)
                    hl.mma(sa, sb.T, acc)

                kn.trace()
        """
        return METHODS["permute"](self, tuple(reversed(range(self.ndim))))

    def to(self, dtype: DType) -> Tile:
        """Convert to ``dtype``: ``hl.cast(self, dtype)``.

        Args:
            dtype (DType): the result's element type.

        Returns:
            Tile: a new register tile of this tile's shape.

        Raises:
            KernelError: as ``hl.cast``.

        Example:
            An f16 copy of an accumulator::

                @hl.kernel(threads=128)
                def half():
                    acc = hl.zeros((64, 64), hl.f32)
                    assert acc.to(hl.f16).dtype == hl.f16

                half.trace()
        """
        return METHODS["cast"](self, dtype)

    # --- arithmetic ---------------------------------------------------------------------
    def _ew(self, fn: str, *args: Any, out: Tile | None = None) -> Tile:
        return METHODS["elementwise"](fn, args, out=out)

    __add__, __radd__, __iadd__ = _operators("add")
    __sub__, __rsub__, __isub__ = _operators("sub")
    __mul__, __rmul__, __imul__ = _operators("mul")
    __truediv__, __rtruediv__, __itruediv__ = _operators("div")
    __floordiv__, __rfloordiv__, _ = _operators("floordiv")
    __mod__, __rmod__, _ = _operators("mod")

    def __neg__(self) -> Tile:
        return self._ew("neg", self)

    def __abs__(self) -> Tile:
        return self._ew("abs", self)

    __lt__ = _operators("lt")[0]
    __le__ = _operators("le")[0]
    __gt__ = _operators("gt")[0]
    __ge__ = _operators("ge")[0]

    def eq(self, o: Any) -> Tile:
        """Elementwise equality: a predicate tile ``y[c] = (x[c] == o[c])`` (broadcast).

        {compare}

        Example:
            The diagonal of a 64x64 tile::

                @hl.kernel(threads=128)
                def diag():
                    rows = hl.iota((64, 1), 0)
                    cols = hl.iota((1, 64), 1)
                    assert rows.eq(cols).shape == (64, 64)

                diag.trace()
        """
        return self._ew("eq", self, o)

    def ne(self, o: Any) -> Tile:
        """Elementwise inequality: a predicate tile ``y[c] = (x[c] != o[c])`` (broadcast).

        {compare}

        Example:
            Every element off the diagonal::

                @hl.kernel(threads=128)
                def offdiag():
                    rows = hl.iota((64, 1), 0)
                    cols = hl.iota((1, 64), 1)
                    assert rows.ne(cols).dtype == hl.bool_

                offdiag.trace()
        """
        return self._ew("ne", self, o)

    def _bitwise(self, logical: str, bits: str) -> str:
        """The function of ``& | ~`` on this tile: the logical one on predicates, the
        bitwise one on integers (other types are refused by its typing rule)."""
        return logical if self.dtype.name == "pred" else bits

    __and__, __rand__, __iand__ = _operators(("and", "bitand"))
    __or__, __ror__, __ior__ = _operators(("or", "bitor"))

    def __invert__(self) -> Tile:
        return self._ew(self._bitwise("not", "bitnot"), self)

    __xor__, __rxor__, __ixor__ = _operators("bitxor")
    __lshift__, __rlshift__, __ilshift__ = _operators("shl")
    __rshift__, __rrshift__, __irshift__ = _operators("shr")
    del _

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


#: the argument, result and errors of ``Tile.eq`` and ``Tile.ne``
_COMPARE = """Args:
            o (Tile | float | Expr): a register tile of the same element type, or a scalar.

        Returns:
            Tile: a register ``bool_`` tile of the broadcast shape.

        Raises:
            KernelError: the shapes do not broadcast or the element types differ."""
for _m in (Tile.eq, Tile.ne):
    _m.__doc__ = (_m.__doc__ or "").replace("{compare}", _COMPARE)
