"""Lowering of register-tile math: elementwise ops (with broadcasting), fill, iota, reduce.

Element ``(t, v)`` of the result is at tile coordinate ``c = f(t, v)``. An operand of
shape ``S'`` (1 where it broadcasts) supplies its element at ``c'`` (``c`` with the
broadcast coordinates at 0); it must hold ``c'`` in the same thread at a value index
``v'`` that does not depend on the thread, so that every thread runs the same code:
``dst[v] = op(src0[v'0(v)], src1[v'1(v)], ...)``. Runs of consecutive ``v`` with
consecutive ``v'`` become one instruction over several elements.

``reduce`` along ``axis``: each thread first combines its own values that share the
reduced coordinate; threads that hold partials of the same output coordinate then
combine by XOR butterflies of warp shuffles over the lane bits in which they differ
(they must lie in one warp and form an XOR-closed set). The result's TV layout must give
each of those threads the combined value at the same index. With ``valid`` (the in-bounds
extent along ``axis`` of a ragged view's padding, ``hexlayout.ir.padding``), a value whose
coordinate along ``axis`` is ``>= valid`` enters the accumulation as the reduction's identity
(``select(c < valid, x, identity)``: 0 for sum, -inf for max, +inf for min; the extreme
integers for integer types), so padding never takes part.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexlayout.layout.inttuple import crd2idx

from ..expr import Var, as_expr
from ..functions import AluFunction, alu_function
from ..lowered import Alu, Instr, RegArray, RegRef, Shfl
from .views import RegisterTile, tile_coords

__all__ = ["lower_elementwise", "lower_fill", "lower_iota", "lower_reduce", "value_map", "REDUCE_OPS",
           "reduce_identity"]

#: reduction -> the ALU function that combines two partials
REDUCE_OPS = {"sum": alu_function("add"), "max": alu_function("max"), "min": alu_function("min")}


def reduce_identity(fn: str, dtype: Any) -> float | int:
    """The identity of reduction ``fn`` in ``dtype``: ``fn(x, identity) == x`` for every ``x``
    (0 for sum; -inf / +inf for max / min of floats, the smallest / largest value of integers)."""
    if fn == "sum":
        return 0
    if dtype.kind in ("int", "uint"):
        lo, hi = (0, (1 << dtype.bits) - 1) if dtype.kind == "uint" else (-(1 << (dtype.bits - 1)),
                                                                        (1 << (dtype.bits - 1)) - 1)
        return lo if fn == "max" else hi
    return float("-inf") if fn == "max" else float("inf")


def _coords_table(reg: RegisterTile) -> list[np.ndarray]:
    return tile_coords(reg.index_table(), reg.shape)


def value_map(dst: RegisterTile, src: RegisterTile) -> np.ndarray | str:
    """``v'`` per ``v`` such that thread ``t``'s ``src`` value ``v'`` is at the (broadcast)
    coordinate of its ``dst`` value ``v``; a reason string when no thread-independent map exists."""
    if len(src.shape) > len(dst.shape):
        return f"rank {len(src.shape)} does not broadcast against rank {len(dst.shape)}"
    src_shape = (1,) * (len(dst.shape) - len(src.shape)) + tuple(src.shape)   # numpy: align right
    if src.threads != dst.threads:
        return f"tiles spread over {src.threads} and {dst.threads} threads"
    dcoords = _coords_table(dst)
    sidx = np.zeros_like(dcoords[0])
    scale = 1
    for k, (s, d) in enumerate(zip(src_shape, dst.shape)):
        if s not in (1, d):
            return f"extent {s} of mode {k} does not broadcast to {d}"
        if s != 1:
            sidx = sidx + dcoords[k] * scale
        scale *= s
    stable = src.index_table()                                   # [t, v'] -> src tile index
    nt, nv = sidx.shape
    out = np.full(nv, -1, dtype=np.int64)
    for v in range(nv):
        hits = stable == sidx[:, v:v + 1]                        # [t, v'] where thread t holds it
        if not hits.any(axis=1).all():
            t = int(np.argmin(hits.any(axis=1)))
            return f"thread {t} does not hold the element its value {v} needs"
        common = np.all(hits, axis=0)
        if not common.any():
            return f"value {v} needs a thread-dependent source register"
        out[v] = int(np.argmax(common))
    return out


def _runs(pairs: list[tuple[int, ...]]) -> list[tuple[tuple[int, ...], int]]:
    """Group ``[(v, v'0, v'1...)]`` into runs where every index advances by one (or stays, for
    broadcast scalars marked -1)."""
    runs: list[tuple[tuple[int, ...], int]] = []
    for p in pairs:
        if runs:
            start, n = runs[-1]
            if all((s == -1 and q == -1) or (s != -1 and q == s + n) for s, q in zip(start, p)):
                runs[-1] = (start, n + 1)
                continue
        runs.append((p, 1))
    return runs


def lower_elementwise(op: str | AluFunction, dst: RegisterTile, srcs: list[Any]) -> list[Instr] | str:
    """``dst = op(*srcs)`` (``op``: an ALU function or its name); a src is a RegisterTile, a
    number, an Expr or a ScalarParam."""
    maps: list[np.ndarray | None] = []
    for s in srcs:
        if isinstance(s, RegisterTile):
            m = value_map(dst, s)
            if isinstance(m, str):
                return m
            maps.append(m)
        else:
            maps.append(None)
    pairs = []
    for v in range(dst.values):
        pairs.append((v,) + tuple(int(m[v]) if m is not None else -1 for m in maps))
    out: list[Instr] = []
    for start, n in _runs(pairs):
        args: list[Any] = []
        for s, m, st in zip(srcs, maps, start[1:]):
            args.append(RegRef(s.array, st, n) if m is not None else s)
        out.append(Alu(op, RegRef(dst.array, start[0], n), tuple(args)))
    return out


def lower_fill(dst: RegisterTile, value: float | int) -> list[Instr]:
    return [Alu("mov", RegRef(dst.array, 0, dst.values), (value,))]


def lower_iota(dst: RegisterTile, axis: int, tid: Var) -> list[Instr]:
    """``dst[v] = coordinate[axis]`` of ``f(tid, v)`` (an integer expression per value)."""
    out: list[Instr] = []
    for v in range(dst.values):
        idx = as_expr(crd2idx(as_expr(tid) + dst.threads * v, dst.tv.shape, dst.tv.stride))
        out.append(Alu("mov", RegRef(dst.array, v, 1), (tile_coords(idx, dst.shape)[axis],)))
    return out


def lower_reduce(fn: str, dst: RegisterTile, src: RegisterTile, axis: int, scratch: RegArray,
                 tid: Any = None, exchange: Any = None, valid: Any = None,
                 overwrite: bool = False) -> list[Instr] | str:
    """``dst = reduce_fn(src, axis)`` (``dst`` has extent 1 along ``axis``); with ``valid`` (an
    integer expression) only the source elements whose coordinate along ``axis`` is below it
    take part (the others count as the identity; ``tid`` is then needed); ``overwrite``: the
    others are set to the identity in ``src`` itself (no copy of the tile lives on).

    When the threads sharing a result element lie in several warps, the warps' partials go
    through shared memory: ``exchange(nbytes) -> (SmemBuffer, barrier_factory)`` provides a
    scratch buffer; one lane per warp part writes, a barrier, every thread combines all parts,
    a barrier. Without ``exchange`` such a reduction is refused."""
    if fn not in REDUCE_OPS:
        return f"unknown reduction {fn!r}; known: {', '.join(REDUCE_OPS)}"
    op = REDUCE_OPS[fn]
    if dst.shape[axis] != 1 or any(a != b for k, (a, b) in enumerate(zip(dst.shape, src.shape))
                                   if k != axis):
        return f"result shape {dst.shape} is not {src.shape} reduced along axis {axis}"
    if dst.threads != src.threads:
        return f"tiles spread over {src.threads} and {dst.threads} threads"
    scoords = _coords_table(src)
    # output tile index of every source element
    oidx = np.zeros_like(scoords[0])
    scale = 1
    for k, s in enumerate(dst.shape):
        if k != axis:
            oidx = oidx + scoords[k] * scale
        scale *= s
    dtable = dst.index_table()                                   # [t, v'] -> dst tile index
    nt = src.threads
    if fn == "sum" and len(np.unique(src.index_table())) != src.index_table().size:
        return "the source tile is replicated across threads; a sum would count elements twice"
    out: list[Instr] = []
    # 1. within each thread: the source values per destination value must not depend on t
    groups: list[list[int]] = []
    for vd in range(dst.values):
        target = dtable[:, vd:vd + 1]
        members = oidx == target                                 # [t, v]
        if not members.any(axis=1).all():
            return f"a thread holds no source element for its result value {vd}"
        if not np.all(members == members[:1]):
            return f"result value {vd} gathers different source values in different threads"
        groups.append([int(v) for v in np.nonzero(members[0])[0]])
    if valid is not None and tid is None:
        return "a reduction over a ragged view's padding needs the thread index"
    ident = reduce_identity(fn, src.dtype) if valid is not None else None

    def element(v: int, into: RegRef) -> RegRef:
        """Source value ``v``, or the identity where its coordinate along ``axis`` is padding."""
        x = RegRef(src.array, v, 1)
        if valid is None:
            return x
        idx = as_expr(crd2idx(as_expr(tid) + src.threads * v, src.tv.shape, src.tv.stride))
        inside = as_expr(tile_coords(idx, src.shape)[axis]) < as_expr(valid)
        if overwrite:
            out.append(Alu("select", x, (inside, x, ident)))
            return x
        out.append(Alu("select", into, (inside, x, ident)))
        return into

    for vd, g in enumerate(groups):
        dref = RegRef(dst.array, vd, 1)
        first = element(g[0], dref)
        if first is not dref:
            out.append(Alu("mov", dref, (first,)))
        for v in g[1:]:
            out.append(Alu(op, dref, (dref, element(v, RegRef(scratch, 0, 1)))))
    # 2. across threads: threads holding partials of the same output element
    bits = 0
    for vd in range(dst.values):
        for t in range(nt):
            target = dtable[t, vd]
            holders = np.nonzero((oidx == target).any(axis=1))[0]
            diff = 0
            for h in holders:
                diff |= int(h) ^ int(holders[0])
            if len(holders) != 1 << bin(diff).count("1"):
                return "the threads sharing a result element do not form an XOR butterfly group"
            if not np.all(dtable[holders, vd] == target):
                return "the threads sharing a result element keep it at different value indices"
            bits |= diff
    lanes_bits, warp_bits = bits & 31, bits >> 5
    whole = RegRef(dst.array, 0, dst.values)
    if lanes_bits:
        tmp = RegRef(scratch, 0, dst.values)
        for b in range(5):
            if lanes_bits >> b & 1:
                out.append(Shfl(tmp, whole, "bfly", 1 << b))
                out.append(Alu(op, whole, (whole, tmp)))
    if warp_bits:
        if exchange is None or tid is None:
            return "the reduction spans several warps and no shared scratch was provided"
        out += _cross_warp(op, dst, scratch, lanes_bits, warp_bits, tid, exchange)
    return out


def _cross_warp(op: AluFunction, dst: RegisterTile, scratch: RegArray, lanes_bits: int, warp_bits: int,
                tid: Any, exchange: Any) -> list[Instr]:
    """Combine the per-warp partials of ``dst`` through shared memory (see ``lower_reduce``)."""
    from ..lowered import LdShared, SharedRef, StShared

    t = as_expr(tid)
    warp = t // 32
    part: Any = 0
    nparts = 1
    for b in range(warp_bits.bit_length()):
        if warp_bits >> b & 1:
            part = as_expr(part) + ((warp >> b) & 1) * nparts
            nparts *= 2
    out_size = 1
    for e in dst.shape:
        out_size *= e
    buf, barrier = exchange(nparts * out_size * dst.dtype.bits // 8)
    bits = dst.dtype.bits
    writer = (t & lanes_bits).eq(0) if lanes_bits else None
    instrs: list[Instr] = []
    for vd in range(dst.values):
        idx = as_expr(crd2idx(t + dst.threads * vd, dst.tv.shape, dst.tv.stride))
        instrs.append(StShared(SharedRef(buf, as_expr(part) * out_size + idx), RegRef(dst.array, vd, 1), bits,
                               pred=writer))
    instrs.append(barrier())
    for vd in range(dst.values):
        idx = as_expr(crd2idx(t + dst.threads * vd, dst.tv.shape, dst.tv.stride))
        d = RegRef(dst.array, vd, 1)
        tmp = RegRef(scratch, vd, 1)
        instrs.append(LdShared(d, SharedRef(buf, idx), bits))
        for q in range(1, nparts):
            instrs.append(LdShared(tmp, SharedRef(buf, q * out_size + idx), bits))
            instrs.append(Alu(op, d, (d, tmp)))
    instrs.append(barrier())
    return instrs
