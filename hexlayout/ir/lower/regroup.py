"""Layouts and lowering of ``Reshape`` and ``Join`` (``hexlayout.ir.regroup``).

Layouts (for synthesis):

- reshape: ``tv(y) = R o tv(x)`` with ``R = Ly o Lx``: ``Lx`` maps ``x``'s coordinates to the
  row-major position (a layout of ``x``'s shape with row-major strides), ``Ly`` maps a
  row-major position of ``y`` to ``y``'s colex index (a layout of ``y``'s reversed shape with
  ``y``'s colex strides reversed); ``R^-1`` the same with ``x`` and ``y`` swapped. A bijective
  relation, propagated either way.
- join of ``k`` sources with layout ``f`` (all sources share one layout): ``E o f`` embeds a
  source's elements in the result (``E``: a layout of the source shape with the result's
  colex strides, the joined axis's stride multiplied by ``k`` when interleaving), and one
  more value mode of extent ``k`` steps between the sources (stride ``S[axis] * s[axis]``
  for concatenation, ``s[axis]`` for interleaving, ``s`` the result's colex strides):
  ``tv(result) = (T, (V, k)) : ((E o f)_T, ((E o f)_V, step))``, so thread ``t`` holds in
  value ``v + V j`` the element source ``j`` holds in value ``v`` (interleaving puts the
  new mode first, ``(T, (k, V))``: value ``j + k v``, so a run of ``w`` contiguous
  elements in each source is a run of ``k w`` in the result).

Lowering: one register move (a ``bitcast``: the bits, no conversion) per run of values,
found numerically (every thread must find the element at one source slot: values never
leave their thread); the result may have any layout with that property (the compiler
removes the moves).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexlayout.layout.tv_maps import join_sources

from ..lowered import Alu, Instr, RegRef
from ..regroup import Join, Reshape
from .rules import LOWERING
from .views import RegisterTile

__all__ = ["lower_moves", "lower_reshape",
           "lower_join"]


def lower_moves(dst: RegisterTile, dst_index: np.ndarray, srcs: list[tuple[RegisterTile, np.ndarray]]
                ) -> list[Instr] | str:
    """Moves filling ``dst`` from ``srcs``. ``dst_index``: ``[t, v] -> element id`` of ``dst``;
    each source comes with its ``[t, v] -> element id`` table in the same numbering. Every
    thread must find each of its elements in one slot of one source, the same for all
    threads (else a string saying which element leaves its thread)."""
    where: dict[int, tuple[int, int]] = {}
    for j, (_, table) in enumerate(srcs):
        for t in range(table.shape[0]):
            for v in range(table.shape[1]):
                where.setdefault(t * (1 << 40) + int(table[t, v]), (j, v))
    pick: list[tuple[int, int]] = []
    for v in range(dst_index.shape[1]):
        found = None
        for t in range(dst_index.shape[0]):
            w = where.get(t * (1 << 40) + int(dst_index[t, v]))
            if w is None:
                return (f"thread {t} holds element {int(dst_index[t, v])} of the result in value {v} but no "
                        "source value of its own: the values would have to move between threads "
                        "(rearrange them first)")
            if found is None:
                found = w
            elif w != found:
                return (f"value {v} of the result comes from different source slots in different threads "
                        f"({found} and {w}): the layouts do not line up")
        assert found is not None
        pick.append(found)
    out: list[Instr] = []
    v = 0
    while v < len(pick):
        j, s = pick[v]
        n = 1
        while v + n < len(pick) and pick[v + n] == (j, s + n):
            n += 1
        out.append(Alu("bitcast", RegRef(dst.array, v, n), (RegRef(srcs[j][0].array, s, n),)))
        v += n
    return out


def _flat(table: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Colex tile indices -> row-major positions."""
    crd = np.unravel_index(table, shape, order="F")
    return np.ravel_multi_index(crd, shape, order="C")


@LOWERING.register(Reshape)
def lower_reshape(lw: Any, op: Any) -> list[Instr]:
    """``Reshape``: moves from the source's registers (``lw``: the lowering)."""
    src = lw.register_of(op.src, op)
    dst = lw.register_of(op.result, op)
    if src.threads != dst.threads:
        raise lw.fail(op, "the reshaped tile is held by another number of threads")
    res = lower_moves(dst, _flat(dst.index_table(), dst.shape), [(src, _flat(src.index_table(), src.shape))])
    if isinstance(res, str):
        raise lw.fail(op, f"reshape of %{op.src.name} {src.shape} to {dst.shape}: {res}")
    return res


@LOWERING.register(Join)
def lower_join(lw: Any, op: Any) -> list[Instr]:
    """``Join``: moves from every source's registers into the result's."""
    srcs = [lw.register_of(s, op) for s in op.srcs]
    dst = lw.register_of(op.result, op)
    shape = srcs[0].shape
    emb, step = join_sources(shape, len(srcs), op.axis, op.interleave)
    tables = []
    for j, s in enumerate(srcs):
        idx = s.index_table()
        crd = np.unravel_index(idx, shape, order="F")
        tables.append((s, sum(c * st for c, st in zip(crd, emb.stride)) + j * step))
    res = lower_moves(dst, dst.index_table(), tables)
    if isinstance(res, str):
        kind = "interleave" if op.interleave else "concat"
        raise lw.fail(op, f"{kind} along axis {op.axis}: {res}")
    return res
