"""Right and left (quasi-)inverses of a layout, and the largest common vector of two layouts.

- ``right_inverse(L) = R``: ``L(R(i)) == i`` for all ``i < size(R)``; R is the largest
  such layout built from the contiguous run of L's modes starting at stride 1 (modes
  ``s_k:d_k`` of ``coalesce(L)`` in increasing stride order with ``d_0 = 1`` and
  ``d_{k+1} = s_k d_k``; ``R`` maps them back to their colexicographic position).
  Stride-0 and negative-stride modes never start or continue the run (CuTe C++).
- ``left_inverse(L) = R``: ``R(L(i)) == i`` for all ``i < size(L)`` when L is injective
  (in general ``L(R(L(i))) == L(i)``), following CuTe C++ (pycute differs here). Built
  from the non-zero strides of ``coalesce(L)`` in increasing order: each contributes a
  mode ``d_k / size(previous modes) : position of mode k``, then the extent of the
  largest-stride mode is appended.

Deliberate deviations from C++ (which asserts statically): ``left_inverse`` raises
ValueError for negative strides and when a stride is not divisible by the size of the
modes below it ("left inverse divisibility condition").
- ``max_common_vector(A, B)``: the number of leading elements on which A and B agree
  with ``A(B^{-1}(i)) == i`` (the widest vector both can move at once).
"""

from __future__ import annotations

from .layout import Layout, coalesce

__all__ = ["right_inverse", "left_inverse", "max_common_layout", "max_common_vector"]


def _flat_sorted(layout: Layout, name: str) -> tuple[list[int], list[int], list[int], list[int]]:
    """The coalesced ``layout``'s shapes, strides and prefix products of the shapes (as
    flat lists), and its mode indices by increasing stride; ``name`` (the caller) refuses
    anything but a ``Layout``."""
    if not isinstance(layout, Layout):
        raise ValueError(f"{name}: {layout!r} is not a Layout")
    c = coalesce(layout)
    shp = list(c.shape) if isinstance(c.shape, tuple) else [c.shape]
    std = list(c.stride) if isinstance(c.stride, tuple) else [c.stride]
    pre = [1]
    for s in shp:
        pre.append(pre[-1] * s)
    order = sorted(range(len(std)), key=lambda k: std[k])
    return shp, std, pre, order


def right_inverse(layout: Layout | None) -> Layout | None:
    """CuTe's ``right_inverse``: ``layout(R(i)) == i`` for ``0 <= i < size(R)``."""
    if layout is None:
        return None
    shp, std, pre, order = _flat_sorted(layout, "right_inverse")
    rs, rd = [1], [0]
    curr = 1
    for i in order:
        if std[i] == curr:
            rs.append(shp[i])
            rd.append(pre[i])
            curr = shp[i] * std[i]
    return coalesce(Layout(tuple(rs), tuple(rd)))


def left_inverse(layout: Layout | None) -> Layout | None:
    """CuTe's ``left_inverse``: ``R(layout(i)) == i`` for ``0 <= i < size(layout)`` if injective."""
    if layout is None:
        return None
    shp, std, pre, order = _flat_sorted(layout, "left_inverse")
    if any(d < 0 for d in std):
        raise ValueError(f"left_inverse({layout}): negative strides are not supported")
    rs: list[int] = []
    rd: list[int] = [0]
    for i in order:
        if std[i] == 0:
            continue
        sz = 1
        for s in rs:
            sz *= s
        if std[i] % sz != 0:
            raise ValueError(
                f"left_inverse({layout}): left inverse divisibility condition fails: stride "
                f"{std[i]} is not divisible by {sz} (the layout is not injective or its modes interleave)"
            )
        rs.append(std[i] // sz)
        rd.append(pre[i])
    rs.append(shp[order[-1]])
    return coalesce(Layout(tuple(rs), tuple(rd)))


def max_common_layout(a: Layout, b: Layout) -> Layout:
    """``R`` with ``a(R(i)) == i`` and ``b(R(i)) == i`` for ``i < size(R)``."""
    from .composition import composition

    inv_b = right_inverse(b)
    common = coalesce(composition(a, inv_b))
    first = common[0] if isinstance(common.shape, tuple) else common
    if first.stride == 1:
        return composition(inv_b, first)
    return Layout(1, 0)


def max_common_vector(a: Layout, b: Layout) -> int:
    from .composition import composition

    common = coalesce(composition(a, right_inverse(b)))
    first = common[0] if isinstance(common.shape, tuple) else common
    return first.shape if first.stride == 1 else 1
