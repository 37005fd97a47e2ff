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
from dataclasses import dataclass
from typing import Any

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import Expr, ExprLike, Var

__all__ = ["Tensor", "Dim", "dims", "resolve_dim"]


class Dim:
    """A named symbolic size for annotations: ``M, N, K = hl.dims("M N K")``; ``f16[M, K]``.

    Equivalent to the string ``"M"`` (``f16["M", "K"]``) but visible to linters; supports
    ``+ - * //`` with ints and other ``Dim``s (``f16[M, 2 * D]``).
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def _op(self, o: Any, sym: str, rev: bool = False) -> Dim:
        a, b = self.text, (o.text if isinstance(o, Dim) else str(int(o)))
        return Dim(f"({b}) {sym} ({a})" if rev else f"({a}) {sym} ({b})")

    def __add__(self, o: Any) -> Dim:
        return self._op(o, "+")

    def __radd__(self, o: Any) -> Dim:
        return self._op(o, "+", True)

    def __sub__(self, o: Any) -> Dim:
        return self._op(o, "-")

    def __rsub__(self, o: Any) -> Dim:
        return self._op(o, "-", True)

    def __mul__(self, o: Any) -> Dim:
        return self._op(o, "*")

    def __rmul__(self, o: Any) -> Dim:
        return self._op(o, "*", True)

    def __floordiv__(self, o: Any) -> Dim:
        return self._op(o, "//")

    def __eq__(self, o: object) -> bool:
        return isinstance(o, Dim) and o.text == self.text

    def __hash__(self) -> int:
        return hash(("dim", self.text))

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def dims(names: str) -> Any:
    """``hl.dims("M N K")`` -> ``(Dim("M"), Dim("N"), Dim("K"))`` (one name: that ``Dim``)."""
    out = tuple(Dim(n) for n in names.replace(",", " ").split())
    return out[0] if len(out) == 1 else out


@dataclass(frozen=True)
class Tensor:
    """A global tensor type: element type, shape, strides (elements) and pointer alignment."""

    dtype: DType
    shape: tuple[Any, ...]
    stride: tuple[Any, ...] | None = None
    align_bytes: int = 16

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
        """The same type with explicit element strides: ``hl.f16["M", "K"].strides("K", 1)``."""
        if len(stride) == 1 and isinstance(stride[0], (tuple, list)):
            stride = tuple(stride[0])
        return Tensor(self.dtype, self.shape, tuple(stride), self.align_bytes)

    def aligned(self, align_bytes: int) -> Tensor:
        return Tensor(self.dtype, self.shape, self.stride, align_bytes)

    def __str__(self) -> str:
        shp = ", ".join(map(str, self.shape))
        st = "" if self.stride is None else f".strides({', '.join(map(str, self.stride))})"
        return f"{self.dtype}[{shp}]{st}"


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
