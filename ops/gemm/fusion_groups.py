"""Grouped prologues of a GEMM operand: per-group dequantization as models write it.

A weight ``W[R, C]`` dequantized with one scale (and zero point) per group of ``g``
consecutive columns is written through views::

    (w.view(R, C // g, g).to(dtype) - zero[R, C // g, 1]) * scale[R, C // g, 1]  ->  .view(R, C)

The front end gives such a prologue in the kernel's flattened frame (leading dimensions
collapsed: ``w`` as ``[R * C/g, g]``, ``scale`` as ``[R * C/g, 1]``, a ``view`` node to
``[R, C/g, g]`` then one to ``[R, C]``). A reshape keeps the row-major order of elements, so
element ``(q, j)`` of a node of frame ``[R * C/g, g]`` is element ``(r, c) = (q // (C/g),
(q % (C/g)) * g + j)`` of the operand: every node computes the same values in the operand's
``R x C`` frame, the views are identities there (``alias``), and an input of the grouped
frame is read in the operand frame as

- ``[R * C/g, g]`` (full): the input reshaped to ``[R, C]``;
- ``[R * C/g, 1]`` (one value per group): ``in[r, c // g]`` of the input reshaped to
  ``[R, C/g]`` (``InputSpec.group``);
- ``[1, g]`` (one value per position in a group): ``in[0, c % g]`` (``InputSpec.period``);
- ``[1, 1]``: a broadcast scalar tile.

``regroup(nodes, out, inputs, where)`` checks a prologue's frames (shape propagation over
its nodes with each value flattened to ``[prod(leading), last]``), replaces its views by
``alias`` and says how each input is read: ``{input: ("full" | "group" | "period", g)}``.
Frames that are not a grouping of the operand's columns (``C' | C``), views of broadcast
values and other views (``permute``, ``unsqueeze``, ...) raise ``FusionUnsupported``.
"""

from __future__ import annotations

from typing import Any

from hexlayout.fusion.aten import VIEWS
from hexlayout.fusion.spec import FusionUnsupported, Node

__all__ = ["regroup", "flat2", "flat_views", "grouped_host"]

_RESHAPES = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
_REDUCTIONS = ("aten.mean.dim", "aten.sum.dim_IntList", "aten.amax.default")


def flat2(shape: tuple[int, ...]) -> tuple[int, int]:
    """``shape`` flattened to ``[prod(leading), last]`` (a scalar / vector: one row)."""
    if not shape:
        return (1, 1)
    lead = 1
    for s in shape[:-1]:
        lead *= s
    return (lead, shape[-1])


def _numel(s: tuple[int, int]) -> int:
    return s[0] * s[1]


def _reshaped(src: tuple[int, int], target: Any, where: str, j: int) -> tuple[int, int]:
    dims = list(target)
    if dims.count(-1) > 1 or any(not isinstance(d, int) for d in dims):
        raise FusionUnsupported(f"{where}: prologue node {j}: a view to {target} (static sizes, one -1)")
    if -1 in dims:
        known = 1
        for d in dims:
            known *= d if d != -1 else 1
        dims[dims.index(-1)] = _numel(src) // max(known, 1)
    return flat2(tuple(dims))


def _broadcast(shapes: list[tuple[int, int]], where: str, j: int) -> tuple[int, int]:
    out = [1, 1]
    for s in shapes:
        for m in (0, 1):
            if s[m] != 1:
                if out[m] not in (1, s[m]):
                    raise FusionUnsupported(f"{where}: prologue node {j}: shapes {shapes} do not broadcast")
                out[m] = s[m]
    return (out[0], out[1])


def regroup(nodes: tuple[Node, ...], out: int, inputs: list[Any],
            where: str) -> tuple[tuple[Node, ...], dict[int, tuple[str, int]]]:
    """The prologue ``nodes`` (value: node ``out``) with its views made identities, and how
    each input of a grouped frame is read (see the module docstring). A prologue without
    views is returned as it is (no inputs grouped)."""
    body = nodes[:out + 1]
    if not any(n.op in VIEWS for n in body):
        return nodes, {}
    if any(n.op in _REDUCTIONS for n in body):
        raise FusionUnsupported(f"{where}: a prologue with both a row reduction and views")
    shapes: list[tuple[int, int] | None] = []      # None: a number

    def shape_of(a: Any) -> tuple[int, int] | None:
        if not isinstance(a, tuple) or not a or a[0] == "const":
            return None
        if a[0] == "node":
            return shapes[a[1]]
        t = inputs[a[1]]
        return flat2(tuple(t.shape)) if hasattr(t, "shape") else None

    for j, n in enumerate(body):
        if n.op in _RESHAPES:
            src = shape_of(n.args[0])
            if src is None or n.args[0][0] != "node":
                raise FusionUnsupported(f"{where}: prologue node {j} ({n.op}) views an input (the host's)")
            shapes.append(_reshaped(src, n.args[1][1], where, j))
        elif n.op in VIEWS:
            raise FusionUnsupported(f"{where}: prologue node {j} ({n.op}) is a view inside a prologue (only "
                                    "reshapes that group the operand's columns fuse)")
        else:
            args = [s for s in (shape_of(a) for a in n.args) if s is not None]
            shapes.append(_broadcast(args, where, j) if args else (1, 1))
    frame = shapes[out]
    assert frame is not None
    rows, cols = frame
    # the frame each node runs in: its own when it holds the operand's elements, else its readers'
    frames: list[tuple[int, int] | None] = [s if s is not None and _numel(s) == rows * cols else None
                                            for s in shapes]
    for j in range(len(body) - 1, -1, -1):
        if frames[j] is None:
            frames[j] = next((frames[u] for u in range(j + 1, len(body)) if ("node", j) in body[u].args
                              and frames[u] is not None), None)
    for j, fr in enumerate(frames):
        if fr is None:
            raise FusionUnsupported(f"{where}: prologue node {j} ({body[j].op}) of shape {shapes[j]} is "
                                    f"read in no frame of the {rows} x {cols} operand")
        if fr[1] != cols and (fr[1] > cols or cols % fr[1]):
            raise FusionUnsupported(f"{where}: prologue node {j} ({body[j].op}) runs in a {fr[0]} x {fr[1]} "
                                    f"frame, not groups of the {rows} x {cols} operand's columns")
        if body[j].op in _RESHAPES and shapes[body[j].args[0][1]] != frames[body[j].args[0][1]]:
            raise FusionUnsupported(f"{where}: prologue node {j} views a broadcast value")
    groups: dict[int, tuple[str, int]] = {}
    for j, n in enumerate(body):
        fr = frames[j]
        assert fr is not None
        for a in n.args:
            if not (isinstance(a, tuple) and a and a[0] == "input") or not hasattr(inputs[a[1]], "shape"):
                continue
            a_shape = flat2(tuple(inputs[a[1]].shape))
            g = fr[1]
            if g == cols or a_shape == (1, 1):
                how = None
            elif a_shape == fr:
                how = ("full", g)
            elif a_shape == (fr[0], 1):
                how = ("group", g)
            elif a_shape == (1, g):
                how = ("period", g)
            else:
                raise FusionUnsupported(f"{where}: prologue input {a[1]} of shape "
                                        f"{tuple(inputs[a[1]].shape)} does not broadcast to the {fr[0]} "
                                        f"x {g} frame of groups")
            if groups.get(a[1], how) != how or (how is None and a[1] in groups):
                raise FusionUnsupported(f"{where}: prologue input {a[1]} is read in two frames")
            if how is not None:
                groups[a[1]] = how
    new = tuple(Node("aten.alias.default", n.args[:1]) if n.op in _RESHAPES else n for n in body)
    return new + tuple(nodes[out + 1:]), groups


def grouped_host(t: Any, how: tuple[str, int], frame: tuple[int, int]) -> Any:
    """Input ``t`` of a grouped frame as the kernel reads it in the operand ``frame``
    (``[R, C]``, ``[R, C/g]`` or ``[1, g]``; contiguous and 16-byte aligned)."""
    import torch

    rows, cols = frame
    kind, g = how
    shape = {"full": (rows, cols), "group": (rows, cols // g), "period": (1, g)}[kind]
    h = t.reshape(shape)
    if not h.is_contiguous() or h.data_ptr() % 16:
        h = h.clone(memory_format=torch.contiguous_format)
    return h


def flat_views(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """``nodes`` with every reshape to rank > 2 reshaping to its ``[prod(leading), last]``
    flattening instead: the same values in the flattened frame the front end gives the
    inputs (``w.to(f16).view(R, C/g, g) * scale`` with ``scale`` as ``[R * C/g, 1]``)."""
    out = []
    for n in nodes:
        shape = n.args[1][1] if n.op in _RESHAPES and len(n.args) > 1 and n.args[1][0] == "const" else None
        if shape is not None and len(shape) > 2:
            lead = -1 if -1 in shape[:-1] else flat2(tuple(shape))[0]
            n = Node(n.op, (n.args[0], ("const", (lead, shape[-1])), *n.args[2:]), n.kwargs)
        out.append(n)
    return tuple(out)
