"""CuTe's layout algebra with CuTe C++ names and semantics.

A ``Layout`` maps coordinates of its shape to integers: ``L(c) = <c, stride>``, 1-D
indices split colexicographically. ``Swizzle`` and ``ComposedLayout`` express swizzled
shared-memory layouts; ``composition``, ``complement``, the inverses, divides and
products are CuTe's operations; ``make_layout_tv`` builds thread-value layouts.
Strings print in CuTe form: ``((4,8),(2,2)):((32,1),(16,8))``.
"""

from .complement import complement
from .composed import ComposedLayout, make_composed_layout
from .composition import composition, with_shape
from .divide import flat_divide, logical_divide, tiled_divide, zipped_divide
from .inttuple import crd2idx, idx2crd, prefix_product, suffix_product
from .inverse import left_inverse, max_common_layout, max_common_vector, right_inverse
from .layout import (
    Layout,
    append,
    coalesce,
    cosize,
    depth,
    filter,
    filter_zeros,
    flatten,
    group,
    make_layout,
    make_ordered_layout,
    prepend,
    rank,
    select,
    size,
    slice_and_offset,
)
from .parse import parse_inttuple, parse_layout
from .product import (
    blocked_product,
    flat_product,
    logical_product,
    raked_product,
    tile_to_shape,
    tiled_product,
    zipped_product,
)
from .recast import downcast, recast_layout, upcast
from .swizzle import Swizzle
from .tv import make_layout_tv, tv_coords, tv_inverse, tv_table

__all__ = [
    "Layout", "ComposedLayout", "Swizzle", "make_layout", "make_ordered_layout", "make_composed_layout",
    "size", "cosize", "rank", "depth", "flatten", "coalesce", "filter", "filter_zeros", "append",
    "prepend", "select", "group", "slice_and_offset", "crd2idx", "idx2crd", "prefix_product",
    "suffix_product", "composition", "with_shape", "complement", "right_inverse", "left_inverse",
    "max_common_layout",
    "max_common_vector", "logical_divide", "zipped_divide", "tiled_divide", "flat_divide",
    "logical_product", "zipped_product", "tiled_product", "flat_product", "blocked_product",
    "raked_product", "tile_to_shape", "upcast", "downcast", "recast_layout", "make_layout_tv",
    "tv_coords", "tv_inverse", "tv_table", "parse_layout", "parse_inttuple",
]
