"""CuTe's ``ComposedLayout<A, O, B>``: the function ``c -> A(O + B(c))``.

``A`` is usually a ``Swizzle`` (a swizzled shared-memory layout is ``Sw o 0 o L``),
``O`` an integer offset and ``B`` a ``Layout``, which gives the shape. Slicing keeps A
and folds the slice's offset into O; composition, divides and products apply to B.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .inttuple import IntTuple, fmt, is_int
from .layout import Layout, _has_none, slice_and_offset

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ComposedLayout", "make_composed_layout"]


class ComposedLayout:
    __slots__ = ("layout_a", "offset", "layout_b")

    def __init__(self, layout_a: Any, offset: int, layout_b: Layout) -> None:
        if not isinstance(layout_b, Layout):
            raise ValueError(f"ComposedLayout: inner layout {layout_b!r} is not a Layout")
        if not callable(layout_a):
            raise ValueError(f"ComposedLayout: outer function {layout_a!r} is not callable")
        self.layout_a = layout_a
        self.offset = int(offset)
        self.layout_b = layout_b

    @property
    def shape(self) -> IntTuple:
        return self.layout_b.shape

    @property
    def rank(self) -> int:
        return self.layout_b.rank

    def size(self) -> int:
        return self.layout_b.size()

    def cosize(self) -> int:
        """Upper bound of the image: the outer function's cosize over B's codomain."""
        return int(self.indices().max()) + 1

    def __len__(self) -> int:
        return self.rank

    def __getitem__(self, i: Any) -> ComposedLayout:
        return ComposedLayout(self.layout_a, self.offset, self.layout_b[i])

    def __call__(self, *args: Any) -> Any:
        if len(args) == 0:
            return self
        crd = args[0] if len(args) == 1 else tuple(args)
        if _has_none(crd):
            sub, off = slice_and_offset(crd, self.layout_b)
            return ComposedLayout(self.layout_a, self.offset + off, sub)
        return self.layout_a(self.offset + self.layout_b(crd))

    def indices(self) -> np.ndarray:
        import numpy as np
        return np.asarray(self.layout_a(self.offset + self.layout_b.indices()), dtype=np.int64)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ComposedLayout) and (self.layout_a, self.offset, self.layout_b) == (
            other.layout_a, other.offset, other.layout_b)

    def __hash__(self) -> int:
        return hash((self.layout_a, self.offset, self.layout_b))

    def __str__(self) -> str:
        return f"{self.layout_a} o {self.offset} o {self.layout_b}"

    def __repr__(self) -> str:
        return f"ComposedLayout({self.layout_a!r}, {self.offset!r}, {self.layout_b!r})"


def make_composed_layout(layout_a: Any, offset: int, layout_b: Layout) -> ComposedLayout:
    if not is_int(offset):
        raise ValueError(f"make_composed_layout: offset {fmt(offset)} is not an int")
    return ComposedLayout(layout_a, offset, layout_b)
