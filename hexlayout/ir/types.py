"""Types of the tile-level IR: element types, memory scopes, layout variables, tile types.

Element types are ``hexlayout.arch``'s ``DType`` (re-exported here with short names:
``f16``, ``bf16``, ``f32``, ``i8`` = ``s8``, ``i32`` = ``s32``, ``e4m3``, ...).

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

from hexlayout.arch.dtypes import B16 as b16
from hexlayout.arch.dtypes import BF16 as bf16
from hexlayout.arch.dtypes import E4M3 as e4m3
from hexlayout.arch.dtypes import E5M2 as e5m2
from hexlayout.arch.dtypes import F16 as f16
from hexlayout.arch.dtypes import F32 as f32
from hexlayout.arch.dtypes import F64 as f64
from hexlayout.arch.dtypes import PRED as bool_
from hexlayout.arch.dtypes import S4 as i4
from hexlayout.arch.dtypes import S8 as i8
from hexlayout.arch.dtypes import S32 as i32
from hexlayout.arch.dtypes import S64 as i64
from hexlayout.arch.dtypes import U4 as u4
from hexlayout.arch.dtypes import U8 as u8
from hexlayout.arch.dtypes import U32 as u32
from hexlayout.arch.dtypes import DType
from hexlayout.arch.dtypes import get_dtype as dtype_from_name
from hexlayout.layout import ComposedLayout, Layout
from hexlayout.layout.inttuple import IntTuple, fmt

__all__ = [
    "DType", "f16", "bf16", "f32", "f64", "i8", "u8", "i32", "u32", "i4", "u4", "e4m3", "e5m2", "b16",
    "i64", "bool_", "dtype_from_name", "Scope", "LayoutVar", "TileType", "LayoutLike",
]


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
