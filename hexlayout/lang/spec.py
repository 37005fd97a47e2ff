"""``Tensor``: the type of a global tensor argument, as written in kernel annotations.

``a: hl.f16["M", "K"]`` is ``Tensor(f16, ("M", "K"))``. Shape and stride entries are
ints (static), strings naming symbolic sizes (``"M"``; a small expression over names such
as ``"2*D"`` or ``"H*D"`` is allowed), ``Dim``s (``M, K = hl.dims("M K")``; ``f16[M, K]``,
which linters accept) or ``Expr``. The same name in several annotations
(or a scalar argument of that name) is the same size variable. ``stride=None`` means
row-major contiguous (last mode stride 1). ``align_bytes`` is the guaranteed alignment
of the data pointer.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import Expr, ExprLike, Var

__all__ = ["Tensor", "Dim", "dims", "resolve_dim"]


def _dim_op(sym: str, rev: bool = False) -> Callable[[Dim, Any], Dim]:
    """The ``Dim`` operator ``sym`` with an int or another ``Dim``: the size expression
    ``(a) sym (b)`` of the two texts (``rev``: the reflected operator, the other operand left)."""

    def op(self: Dim, o: Any) -> Dim:
        a, b = self.text, (o.text if isinstance(o, Dim) else str(int(o)))
        return Dim(f"({b}) {sym} ({a})" if rev else f"({a}) {sym} ({b})")

    return op


class Dim:
    """A named symbolic size for annotations, visible to linters: ``M, K = hl.dims("M K")``.

    ``hl.f16[M, K]`` is the same type as ``hl.f16["M", "K"]``: every annotation (and a
    scalar argument) naming ``M`` refers to one size variable. ``Dim``s combine with ints
    and other ``Dim``s by ``+ - * //`` into size expressions (``hl.f16[M, 2 * D]``).

    Example:
        >>> M, D = hl.dims("M D")
        >>> hl.f16[M, 2 * D]
        Tensor(dtype=f16, shape=(M, (2) * (D)), stride=None, align_bytes=16)
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    __add__ = _dim_op("+")
    __radd__ = _dim_op("+", rev=True)
    __sub__ = _dim_op("-")
    __rsub__ = _dim_op("-", rev=True)
    __mul__ = _dim_op("*")
    __rmul__ = _dim_op("*", rev=True)
    __floordiv__ = _dim_op("//")

    def __eq__(self, o: object) -> bool:
        return isinstance(o, Dim) and o.text == self.text

    def __hash__(self) -> int:
        return hash(("dim", self.text))

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def dims(names: str) -> Any:
    """Named symbolic sizes: ``hl.dims("M N K")`` is ``(Dim("M"), Dim("N"), Dim("K"))``.

    Args:
        names (str): names separated by spaces or commas.

    Returns:
        Dim | tuple[Dim, ...]: one ``Dim`` per name (a single name gives that ``Dim``).

    Example:
        >>> M, N = hl.dims("M, N")
        >>> str(hl.f32[M, N]), hl.dims("K")
        ('f32[M, N]', K)
    """
    out = tuple(Dim(n) for n in names.replace(",", " ").split())
    return out[0] if len(out) == 1 else out


@dataclass(frozen=True)
class Tensor:
    """The type of a global tensor argument: element type, shape, strides, pointer alignment.

    ``a: hl.f16["M", "K"]`` is ``Tensor(f16, ("M", "K"))``. Shape and stride entries are
    ints (static), strings naming symbolic sizes (``"M"``, or a small expression of names
    and ints with ``+ - * //`` such as ``"2*D"``), ``Dim``s or ``Expr``. The same name in
    several annotations (or a scalar argument of that name) is one size variable.
    ``stride=None`` means row-major contiguous: ``stride[i] = prod(shape[i+1:])``; element
    ``c`` is at ``sum_i c[i] * stride[i]`` elements from the data pointer, which is
    aligned to ``align_bytes``. ``offline``: the op stores it in the order synthesis chooses
    (``hl.offline``).

    Example:
        >>> t = hl.Tensor(hl.f16, ("M", "K"))
        >>> t == hl.f16["M", "K"], str(t.strides("K", 1))
        (True, 'f16[M, K].strides(K, 1)')
    """

    dtype: DType
    shape: tuple[Any, ...]
    stride: tuple[Any, ...] | None = None
    align_bytes: int = 16
    offline: bool = field(default=False, repr=False)   # str() shows it: offline(u4[R, K])

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple):
            object.__setattr__(self, "shape", tuple(self.shape) if isinstance(self.shape, list)
                               else (self.shape,))
        if self.stride is not None:
            if not isinstance(self.stride, tuple):
                object.__setattr__(self, "stride", tuple(self.stride))
            if len(self.stride) != len(self.shape):
                raise ValueError(f"Tensor {self}: {len(self.stride)} strides for {len(self.shape)} modes")

    def strides(self, *stride: Any) -> Tensor:
        """The same type with explicit element strides.

        Args:
            *stride (int | str | Dim | Expr): one stride per mode (or one tuple of them).

        Returns:
            Tensor: a copy with ``stride`` set.

        Raises:
            ValueError: the number of strides differs from the number of modes.

        Example:
            A column-major (M, K) matrix::

                @hl.kernel(threads=128)
                def colmajor(a: hl.f16["M", "K"].strides(1, "M")):
                    assert a.stride[0] == 1

                colmajor.trace()
        """
        if len(stride) == 1 and isinstance(stride[0], (tuple, list)):
            stride = tuple(stride[0])
        return Tensor(self.dtype, self.shape, tuple(stride), self.align_bytes, self.offline)

    def aligned(self, align_bytes: int) -> Tensor:
        """The same type with another guaranteed alignment.

        ``aligned(n)`` promises that the data pointer, every row and every view origin the
        kernel addresses are ``n``-byte aligned, and no more: copies of this tensor use
        vectors of at most ``n`` bytes (cp.async needs ``n >= 4``, TMA ``n = 16``). The
        default, 16, lets the kernel assume 16-byte vectors; the launcher checks the
        strides and extents they need, and a launch that breaks them (f16 rows of 301
        elements, the second half of a ``[T, 2*I]`` row with ``I`` odd, a view with an
        offset) runs a build specialized on its alignment (``hexlayout.ir.divisibility``).
        ``aligned(2)`` makes one build serve every such row from the start.

        Args:
            align_bytes (int): the alignment in bytes (default of a type: 16).

        Returns:
            Tensor: a copy with ``align_bytes`` set.

        Example:
            >>> hl.f16["M", "K"].aligned(4).align_bytes
            4
        """
        return Tensor(self.dtype, self.shape, self.stride, align_bytes, self.offline)

    def __str__(self) -> str:
        shp = ", ".join(map(str, self.shape))
        st = "" if self.stride is None else f".strides({', '.join(map(str, self.stride))})"
        text = f"{self.dtype}[{shp}]{st}"
        return f"offline({text})" if self.offline else text


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b}


def resolve_dim(x: Any, vars: dict[str, Var]) -> ExprLike:
    """An int, ``Expr``, or string (names become size ``Var``s in ``vars``) as an ``ExprLike``."""
    if isinstance(x, bool):
        raise ValueError(f"{x!r} is not a size")
    if isinstance(x, (int, Expr)):
        return x
    if isinstance(x, Dim):
        x = x.text
    if isinstance(x, str):
        try:
            tree = ast.parse(x.strip(), mode="eval").body
        except SyntaxError:
            raise ValueError(f"size expression {x!r} does not parse") from None
        return _eval(tree, x, vars)
    raise ValueError(f"{x!r} is not a size (int, name string or expression)")


def _eval(node: ast.AST, text: str, vars: dict[str, Var]) -> ExprLike:
    if isinstance(node, ast.Name):
        if node.id not in vars:
            vars[node.id] = Var(node.id, 0, None, kind="size")
        return vars[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, text, vars), _eval(node.right, text, vars))
    raise ValueError(f"size expression {text!r}: only names, integers, + - * // are allowed")
