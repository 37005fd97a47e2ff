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

from hexlayout.layout import Layout, composition, left_inverse

from ..lowered import Alu, Instr, RegRef
from .copy import _colex_strides as _colex
from .views import RegisterTile

__all__ = ["reshape_maps", "join_tv", "join_source_tv", "join_sources", "lower_moves", "lower_reshape",
           "lower_join"]


def _rowmajor(shape: tuple[int, ...]) -> list[int]:
    return list(reversed(_colex(tuple(reversed(shape)))))


def _one_way(x: tuple[int, ...], y: tuple[int, ...]) -> Layout:
    lx = Layout(tuple(x), tuple(_rowmajor(x)))
    ly = Layout(tuple(reversed(y)), tuple(reversed(_colex(y))))
    return composition(ly, lx)


def reshape_maps(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[Layout, Layout]:
    """``(R, R^-1)``: colex index of ``x`` -> colex index of ``y`` under a row-major reshape, and back."""
    if int(np.prod(x)) != int(np.prod(y)):
        raise ValueError(f"cannot reshape a {x} tile ({int(np.prod(x))} elements) to {y} "
                         f"({int(np.prod(y))} elements)")
    return _one_way(x, y), _one_way(y, x)


def join_sources(shape: tuple[int, ...], k: int, axis: int, interleave: bool) -> tuple[Layout, int]:
    """``(E, step)`` of the module docstring for ``k`` sources of ``shape`` joined along ``axis``."""
    out = list(shape)
    out[axis] *= k
    s = _colex(tuple(out))
    strides = list(s)
    if interleave:
        strides[axis] *= k
    step = s[axis] if interleave else shape[axis] * s[axis]
    return Layout(tuple(shape), tuple(strides)), step


def join_tv(f: Layout, shape: tuple[int, ...], k: int, axis: int, interleave: bool) -> Layout:
    """The result layout of a join whose sources all have the TV layout ``f``."""
    emb, step = join_sources(shape, k, axis, interleave)
    g = composition(emb, f)
    t, v = g[0], g[1]
    if interleave:      # the sources' values alternate: runs along the axis stay contiguous
        return Layout((t.shape, (k, v.shape)), (t.stride, (step, v.stride)))
    return Layout((t.shape, (v.shape, k)), (t.stride, (v.stride, step)))


def join_source_tv(r: Layout, shape: tuple[int, ...], k: int, axis: int, interleave: bool) -> Layout | None:
    """The inverse of ``join_tv``: the layout ``f`` the sources must share so that the join's
    result has the TV layout ``r`` (``join_tv(f) == r`` as functions), or None when none does.

    ``r``'s value ``v_r`` (colex position ``t + T v_r`` of its ``(T, V)`` domain) is value ``v``
    of source ``j`` with ``v_r = j + k v`` (interleave) or ``v_r = v + (V / k) j``
    (concatenation); source 0's values are ``r o P`` with ``P = (T, V / k) : (1, T k)`` or
    ``(1, T)``, and they are ``E o f`` (``join_sources``), so ``f = E^-1 o r o P`` with
    ``E^-1`` the left inverse of the injective ``E``. The result is checked forward: ``r``
    must hold source ``j``'s values where ``join_tv`` puts them (else None: the required
    layout splits a source's element runs, e.g. keeps two nibbles of one word in two threads)."""
    nt, nv = r[0].size(), r[1].size()
    if nv % k:
        return None
    emb, _ = join_sources(shape, k, axis, interleave)
    pick = Layout((nt, nv // k), (1, nt * k if interleave else nt))
    try:
        f = composition(left_inverse(emb), composition(r, pick))
        f = Layout((f[0].shape, f[1].shape), (f[0].stride, f[1].stride))
        back = join_tv(f, shape, k, axis, interleave)
    except (ValueError, IndexError, TypeError):
        return None
    a = np.asarray([r(i) for i in range(nt * nv)])
    b = np.asarray([back(i) for i in range(nt * nv)])
    if back.size() != r.size() or not (a == b).all():
        return None
    src = np.asarray([f(i) for i in range(f.size())])
    if src.min() < 0 or src.max() >= int(np.prod(shape)):
        return None
    return f


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
