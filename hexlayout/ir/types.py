"""Types of the tile-level IR: element types, memory scopes, layout variables, tile types.

A tile value has type ``TileType(dtype, shape, scope, layout)``:

- ``scope`` is where it lives: ``global`` (a view of a kernel argument), ``shared``
  (a block-wide buffer) or ``register`` (distributed over the threads of a block).
- ``layout`` depends on the scope. Global and shared: ``coord -> element offset``
  (a ``Layout`` or a swizzled ``ComposedLayout``). Register: a TV layout
  ``(thread, value) -> m + M*n`` over the tile (CuTe convention, thread mode first).
- Before synthesis a layout may be a ``LayoutVar``: an unknown the solver fills in.
  ``LayoutVar`` can carry partial knowledge (a required stride, a swizzle family).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hexlayout.layout import ComposedLayout, Layout
from hexlayout.layout.inttuple import IntTuple, fmt

__all__ = [
    "DType", "f16", "bf16", "f32", "f64", "i8", "u8", "i32", "u32", "i4", "u4", "e4m3", "e5m2", "b16",
    "i64", "bool_", "dtype_from_name", "Scope", "LayoutVar", "TileType", "LayoutLike",
]


@dataclass(frozen=True)
class DType:
    """An element type: ``name`` (PTX-like), width in bits, kind (float/int/uint/bits)."""

    name: str
    bits: int
    kind: str
    c_name: str

    @property
    def bytes(self) -> float:
        return self.bits / 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    def numpy(self) -> Any:
        """The numpy dtype used to emulate values of this type (ml_dtypes for bf16 / fp8)."""
        import numpy as np

        if self.name in ("bf16", "e4m3", "e5m2"):
            import ml_dtypes

            return {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
                    "e5m2": ml_dtypes.float8_e5m2}[self.name]
        table = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8, "u8": np.uint8,
                 "i32": np.int32, "u32": np.uint32, "i64": np.int64, "b16": np.uint16, "pred": np.bool_,
                 "i4": np.int8, "u4": np.uint8}
        return np.dtype(table[self.name])

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


f16 = DType("f16", 16, "float", "half")
bf16 = DType("bf16", 16, "float", "__nv_bfloat16")
f32 = DType("f32", 32, "float", "float")
f64 = DType("f64", 64, "float", "double")
e4m3 = DType("e4m3", 8, "float", "__nv_fp8_e4m3")
e5m2 = DType("e5m2", 8, "float", "__nv_fp8_e5m2")
i4 = DType("i4", 4, "int", "int8_t")
u4 = DType("u4", 4, "uint", "uint8_t")
i8 = DType("i8", 8, "int", "int8_t")
u8 = DType("u8", 8, "uint", "uint8_t")
b16 = DType("b16", 16, "bits", "uint16_t")
i32 = DType("i32", 32, "int", "int")
u32 = DType("u32", 32, "uint", "unsigned")
i64 = DType("i64", 64, "int", "long long")
bool_ = DType("pred", 1, "bits", "bool")

_DTYPES = {d.name: d for d in (f16, bf16, f32, f64, e4m3, e5m2, i4, u4, i8, u8, b16, i32, u32, i64, bool_)}
_ALIASES = {"float16": "f16", "half": "f16", "bfloat16": "bf16", "float32": "f32", "float": "f32",
            "float64": "f64", "int8": "i8", "uint8": "u8", "int32": "i32", "uint32": "u32", "int64": "i64",
            "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "bool": "pred"}


def dtype_from_name(name: Any) -> DType:
    """``DType`` for a name (``'f16'``, ``'bfloat16'``), a numpy / torch dtype, or a DType."""
    if isinstance(name, DType):
        return name
    s = str(name).replace("torch.", "")
    s = _ALIASES.get(s, s)
    if s in _DTYPES:
        return _DTYPES[s]
    raise ValueError(f"unknown element type {name!r}; known: {', '.join(sorted(_DTYPES))}")


class Scope(str, Enum):
    GLOBAL = "global"
    SHARED = "shared"
    REGISTER = "register"

    def __str__(self) -> str:
        return self.value


_var_ids = itertools.count()


@dataclass(eq=False)
class LayoutVar:
    """An unknown layout, filled in by synthesis.

    ``hints`` records partial constraints the author gave (e.g. ``{"stride": (None, 1)}``
    for a known unit stride on mode 1, or ``{"swizzle": "128B"}``).
    """

    name: str = ""
    hints: dict[str, Any] = field(default_factory=dict)
    id: int = field(default_factory=lambda: next(_var_ids))

    def __str__(self) -> str:
        return f"?{self.name or 'L'}{self.id}"

    __repr__ = __str__


LayoutLike = Layout | ComposedLayout | LayoutVar | None


@dataclass(eq=False)
class TileType:
    dtype: DType
    shape: tuple[int, ...]
    scope: Scope
    layout: LayoutLike = None

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def has_layout(self) -> bool:
        return isinstance(self.layout, (Layout, ComposedLayout))

    def with_layout(self, layout: LayoutLike) -> TileType:
        return TileType(self.dtype, self.shape, self.scope, layout)

    def __str__(self) -> str:
        shp = fmt(tuple(self.shape)) if not isinstance(self.shape, int) else str(self.shape)
        lay = "auto" if self.layout is None else str(self.layout)
        return f"{self.scope}<{self.dtype}{shp}, {lay}>"


def shape_tuple(shape: IntTuple) -> tuple[int, ...]:
    return tuple(shape) if isinstance(shape, tuple) else (shape,)
