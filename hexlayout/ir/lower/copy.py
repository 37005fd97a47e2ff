"""Lowering of tile copies to per-thread instructions.

Notation: a register tile has TV layout ``f: (t, v) -> i`` (tile index), a memory tile an
offset map ``g: i -> element offset``; an instruction atom has a source TV layout ``p``
and a destination TV layout ``q`` over a reference domain ``R`` (CuTe's Copy_Traits,
recast from bits to elements). The data movement is legal when
``f o q^-1 = g o p^-1`` up to the choice of which register values an issue fills.

- Register <-> memory with plain vector instructions (ld/st.global, ld/st.shared): each
  thread moves runs of ``w`` consecutive register values whose offsets are consecutive
  and ``w``-aligned: ``g(f(t, w*n + j)) == g(f(t, w*n)) + j``. The widest ``w`` with
  ``w * bits <= 128`` that holds for every thread is chosen.
- Shared -> register with ldmatrix (and register -> shared with stmatrix): issue ``n`` of
  warp ``w`` fills register values ``[n*Vq, (n+1)*Vq)``; reference element ``a`` goes to
  lane/value ``q^-1(a)``, i.e. tile index ``phi(a) = f(32w + lane(q^-1(a)), n*Vq + val(q^-1(a)))``.
  Lane ``l`` then supplies the row starting at ``g(phi(p(l, 0)))``; legal when each row's
  ``Vp`` elements are contiguous and 16-byte aligned: ``g(phi(p(l, j))) == g(phi(p(l, 0))) + j``.
- Global -> shared (cp.async) has no register tile: threads take ``w``-element vectors in
  the global tensor's memory order (coalesced: thread ``t`` takes vectors ``t + T*n``);
  legal when both sides are contiguous and aligned over each vector. Predicated-off
  vectors (outside the tensor) zero-fill shared memory.

Every check is done numerically over all threads and values; every emitted address is the
symbolic composition of the same maps evaluated at the thread index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexlayout.arch.banks import bank_conflicts
from hexlayout.arch.sectors import global_sectors
from hexlayout.layout import Layout, left_inverse, upcast
from hexlayout.layout.inttuple import crd2idx
from hexlayout.layout.tv import copy_thread_layout
from hexlayout.layout.tv_maps import colex_strides
from hexlayout.memo import memoized

from ..expr import Const, Expr, ExprLike, Var, as_expr, evaluate, free_vars
from ..lowered import (
    CpAsync,
    GlobalRef,
    Instr,
    LdGlobal,
    Ldmatrix,
    LdShared,
    MbarRef,
    RegArray,
    RegRef,
    SharedRef,
    StGlobal,
    Stmatrix,
    StShared,
    TmaDesc,
    TmaLoad,
)
from .rejection import Rejection
from .views import GENERIC_STRIDE, GlobalTileView, RegisterTile, SharedTileView, tile_coords

__all__ = ["CopyPlan", "vector_width", "lower_reg_mem", "lower_ldmatrix", "lower_stmatrix",
           "lower_gmem_to_smem", "lower_mem_to_mem", "lower_tma_load", "Requirement"]


@dataclass(frozen=True)
class Requirement:
    """A condition on launch arguments that the lowered code relies on (checked at launch)."""

    param: str
    kind: str        # "align_bytes" | "stride_multiple" | "extent_multiple" | "stride_bytes_multiple"
    #                  | "size_multiple" (the size variable ``size`` is a multiple of ``value``)
    value: int
    mode: int = -1   # the tensor mode it concerns; -1: the whole tensor / every non-unit stride
    reason: str = ""
    size: str = ""   # size_multiple: the name of the size variable


@dataclass
class CopyPlan:
    instrs: list[Instr]
    instruction: str
    vector_elems: int
    requirements: list[Requirement]
    desc: TmaDesc | None = None                                  # the tensor map a TMA plan uses
    scratch: list[RegArray] = field(default_factory=list)        # temporary registers it uses
    offline: Any = None                                          # the OfflineLayout an offline load defines


MemView = GlobalTileView | SharedTileView


@memoized(1 << 16)
def _tv_index(tv: Layout, threads: int, tid: ExprLike, v: ExprLike) -> Expr:
    """The tile index ``tv(tid + threads * v)`` as an expression (memoized: a synthesis
    lowers the same copy under many candidate layouts)."""
    return as_expr(crd2idx(as_expr(tid) + threads * as_expr(v), tv.shape, tv.stride))


def vector_width(offs: np.ndarray, max_elems: int, min_elems: int = 1) -> int:
    """Largest power-of-two ``w`` in ``[min_elems, max_elems]`` such that along the last axis
    runs of ``w`` offsets are consecutive and start ``w``-aligned (0 if none)."""
    n = offs.shape[-1]
    w = max_elems
    while w >= min_elems:
        if n % w == 0:
            grp = offs.reshape(offs.shape[:-1] + (n // w, w))
            first = grp[..., :1]
            if np.all(grp == first + np.arange(w)) and np.all(first % w == 0):
                return w
        w //= 2
    return 0


def _global_requirements(view: MemView, w: int, elem_bits: int, vec_mode: int | None) -> list[Requirement]:
    """Launch-time conditions for ``w``-element vector accesses of a global view; ``mode``
    is the tensor's mode (not the tile's)."""
    if not isinstance(view, GlobalTileView) or w <= 1:
        return []
    reqs = [Requirement(view.param.name, "align_bytes", w * elem_bits // 8,
                        reason=f"{w}-element vector accesses")]
    for k in range(len(view.strides)):
        if view.static_stride(k) is None:
            reqs.append(Requirement(view.param.name, "stride_multiple", w, view.modes[k],
                                    reason=f"{w}-element vectors start aligned in every row"))
    if vec_mode is not None:
        reqs.append(Requirement(view.param.name, "extent_multiple", w, view.modes[vec_mode],
                                reason=f"a {w}-element vector is either wholly in bounds or wholly out"))
    return reqs + _origin_size_requirements(view, w)


def _origin_size_requirements(view: GlobalTileView, w: int) -> list[Requirement]:
    """Sizes that move the view's origin by themselves (``origin=(r, I + c)``: the offset
    ``c_v * v`` of size ``v`` at block index 0) must keep ``w``-element vectors aligned:
    ``v`` a multiple of ``w / gcd(c_v, w)`` (checked at launch, as the synthesis assumed)."""
    if view.gather is not None:
        return []
    base = view.base
    sizes: set[Var] = set()
    for e in (*view.param.shape, *view.param.stride):
        sizes |= free_vars(e)
    used = free_vars(base)
    out = []
    for v in sorted(used & sizes, key=lambda x: x.name):
        env = {u: (1 if u is v else 0) for u in used}
        try:
            c = int(evaluate(base, env))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue
        need = w // math.gcd(c, w) if c else 1
        if need > 1:
            out.append(Requirement(view.param.name, "size_multiple", need,
                                   reason=f"the origin of {w}-element vector accesses of {view.param.name} "
                                   f"moves with {v.name}", size=v.name))
    return out


def declared_vector_bits(view: MemView) -> int:
    """The widest access (bits) the declaration of ``view``'s tensor allows: its declared
    alignment (``hl.f16[...].aligned(n)``: the data pointer, every row and every view origin
    are ``n``-byte aligned), 128 for shared memory."""
    if isinstance(view, GlobalTileView):
        return max(8, view.param.align_bytes * 8)
    return 128


#: An odd factor: a size known to be a multiple of exactly ``d`` is evaluated as ``d * _ODD``.
_ODD = 1_000_003


def origin_alignment(view: MemView, max_elems: int) -> int:
    """The largest power of two ``w <= max_elems`` dividing the element offset of ``view``'s
    origin for every block index and loop counter; symbolic sizes and strides count as
    aligned (the launcher checks the strides and extents vectors need) unless the tensor
    carries launch facts about them (``GlobalParam.divisibility``: a size that is a multiple
    of ``d`` only). The offset is taken as linear in those variables: it is checked at 0 and
    at 1 in each block index or loop counter alone, and at ``d * odd`` in each size with a
    fact (a row origin at an odd static column, ``origin=(r, 301)``, or at an odd size,
    ``origin=(r, I + c)`` with ``I`` odd, allows no 2-element vector)."""
    if not isinstance(view, GlobalTileView) or max_elems <= 1 or view.gather is not None:
        return max_elems
    base = view.base
    sizes: set[Var] = set()
    for e in (*view.param.shape, *view.param.stride):
        sizes |= free_vars(e)
    others = sorted(free_vars(base) - sizes, key=lambda v: v.name)
    env0 = {**{v: GENERIC_STRIDE for v in sizes}, **{v: 0 for v in others}}
    facts = dict(view.param.divisibility)
    weak = sorted((v for v in sizes & free_vars(base) if v.name in facts), key=lambda v: v.name)
    try:
        values = [int(evaluate(base, env0))]
        for v in others:
            values.append(int(evaluate(base, {**env0, v: 1})))
        for v in weak:
            values.append(int(evaluate(base, {**env0, v: facts[v.name] * _ODD})))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return max_elems              # an origin read from memory: assumed aligned, as before
    w = max_elems
    while w > 1 and any(x % w for x in values):
        w //= 2
    return w


def _vector_mode(view: MemView, w: int) -> int | None:
    if not isinstance(view, GlobalTileView) or w <= 1:
        return None
    for k in range(len(view.shape)):
        if view.static_stride(k) == 1:
            return k
    return None


def lower_reg_mem(reg: RegisterTile, mem: MemView, load: bool, tid: Var, elem_bits: int,
                  max_bits: int = 128) -> CopyPlan | str:
    """Plain vector loads (``load``) or stores between a register tile and a memory tile (not a
    view of an ``hl.offline`` tensor: ``offline.lower_offline_load``)."""
    if isinstance(mem, GlobalTileView) and mem.param.offline:  # VectorRule lowers plain copies of it
        return Rejection(f"offline tensor {mem.param.name}: only a plain, unmasked copy of a view into a "
                         "register tile reads it (its storage order is that tile's layout)")
    table = reg.index_table()
    offs = mem.offsets(table)
    widest = max(1, min(max_bits, declared_vector_bits(mem)) // elem_bits)
    w = vector_width(offs, origin_alignment(mem, widest))
    if w == 0:
        return Rejection("no element run is contiguous in memory",
                         layouts=(("register", reg.tv), ("memory", _mem_layout(mem))))
    instrs: list[Instr] = []
    for n in range(reg.values // w):
        idx = _tv_index(reg.tv, reg.threads, tid, w * n)
        ref = RegRef(reg.array, w * n, w)
        bits = w * elem_bits
        if isinstance(mem, GlobalTileView):
            g = GlobalRef(mem.param, mem.offset(idx))
            pred = mem.inbounds(idx)
            pred_e = None if isinstance(pred, Const) and pred.value else pred
            instrs.append(LdGlobal(ref, g, bits, pred=pred_e) if load
                          else StGlobal(g, ref, bits, pred=pred_e))
        else:
            s = SharedRef(mem.buffer, mem.offset(idx))
            instrs.append(LdShared(ref, s, bits) if load else StShared(s, ref, bits))
    kind = ("ld" if load else "st") + (".global" if isinstance(mem, GlobalTileView) else ".shared")
    reqs = _global_requirements(mem, w, elem_bits, _vector_mode(mem, w))
    return CopyPlan(instrs, f"{kind}.b{w * elem_bits}", w, reqs)


def _ldsm_tables(reg: RegisterTile, mem: SharedTileView, q: Layout,
                 p: Layout) -> tuple[np.ndarray, int, int] | str:
    """Shared offsets ``[warp, issue, lane, j]`` each lane's row element ``j`` maps to."""
    vq = q.size() // 32
    vp = p.size() // 32
    if reg.values % vq:
        return f"the register tile has {reg.values} values per thread, not a multiple of {vq}"
    if reg.threads % 32:
        return "the register tile does not span whole warps"
    try:
        qinv = left_inverse(q)
    except ValueError as e:
        return f"the atom's register layout is not invertible: {e}"
    a = p.indices().reshape(vp, 32).T                       # [lane, j] -> ref element
    qi = np.asarray(crd2idx(a, qinv.shape, qinv.stride))
    lane_q, val_q = qi % 32, qi // 32
    table = reg.index_table()                                # [t, v] -> tile index
    nw, ni = reg.threads // 32, reg.values // vq
    w = np.arange(nw)[:, None, None, None]
    n = np.arange(ni)[None, :, None, None]
    t = 32 * w + lane_q[None, None]
    v = n * vq + val_q[None, None]
    idx = table[t, v]
    return mem.offsets(idx), vq, vp


def _matrix_atom_layouts(atom: Any, elem_bits: int, reg_side: str) -> tuple[Layout, Layout] | str:
    if atom.kind in ("ldmatrix", "stmatrix") and atom.name.endswith("_T") and elem_bits != 16:
        return f"{atom.name} transposes 16-bit elements; the tile holds {elem_bits}-bit elements"
    if 16 % elem_bits and elem_bits % 16:
        return f"{elem_bits}-bit elements do not pack into 16-bit matrix elements"
    try:
        reg_l = upcast(atom.dst_layout if reg_side == "dst" else atom.src_layout, elem_bits)
        row_l = upcast(atom.src_layout if reg_side == "dst" else atom.dst_layout, elem_bits)
    except ValueError as e:
        return str(e)
    return reg_l, row_l


def _matrix_issue_address(reg: RegisterTile, mem: SharedTileView, q: Layout, p: Layout, tid: Var,
                          n: int) -> Expr:
    vq = q.size() // 32
    lane = as_expr(tid) % 32
    warp = as_expr(tid) // 32
    qinv = left_inverse(q)
    a0 = crd2idx(lane, p.shape, p.stride)
    qi = as_expr(crd2idx(as_expr(a0), qinv.shape, qinv.stride))
    t = warp * 32 + qi % 32
    v = n * vq + qi // 32
    return mem.offset(_tv_index(reg.tv, reg.threads, t, v))


def _lower_matrix(reg: RegisterTile, mem: SharedTileView, atom: Any, tid: Var, elem_bits: int,
                  load: bool) -> CopyPlan | str:
    lay = _matrix_atom_layouts(atom, elem_bits, "dst" if load else "src")
    if isinstance(lay, str):
        return lay
    q, p = lay
    res = _ldsm_tables(reg, mem, q, p)
    if isinstance(res, str):
        return res
    offs, vq, vp = res
    first = offs[..., :1]
    lays = (("register", reg.tv), ("shared", mem.full_layout))
    if not np.all(offs == first + np.arange(vp)):
        return Rejection(f"the {vp} elements of a matrix row are not contiguous in shared memory",
                         instruction=atom.name, layouts=lays)
    if not np.all(first % vp == 0):
        return Rejection("matrix rows do not start on 16-byte boundaries", instruction=atom.name,
                         layouts=lays)
    num = q.size() * elem_bits // 1024          # 8x8 matrices of 16-bit elements per issue
    instrs: list[Instr] = []
    trans = atom.name.endswith("_T")
    for n in range(reg.values // vq):
        addr = SharedRef(mem.buffer, _matrix_issue_address(reg, mem, q, p, tid, n))
        ref = RegRef(reg.array, n * vq, vq)
        if load:
            instrs.append(Ldmatrix(ref, addr, num, trans))
        else:
            instrs.append(Stmatrix(addr, ref, num, trans))
    return CopyPlan(instrs, atom.name, vq, [])


def lower_ldmatrix(reg: RegisterTile, mem: SharedTileView, atom: Any, tid: Var,
                   elem_bits: int) -> CopyPlan | str:
    return _lower_matrix(reg, mem, atom, tid, elem_bits, load=True)


def lower_stmatrix(reg: RegisterTile, mem: SharedTileView, atom: Any, tid: Var,
                   elem_bits: int) -> CopyPlan | str:
    return _lower_matrix(reg, mem, atom, tid, elem_bits, load=False)


def _memory_order(view: GlobalTileView) -> list[int]:
    """Tile modes ordered from the contiguous one outwards (static strides first, by size)."""
    def key(k: int) -> tuple[int, int]:
        d = view.static_stride(k)
        return (0, d) if d is not None else (1, k)
    return sorted(range(len(view.shape)), key=key)


def lower_gmem_to_smem(src: GlobalTileView, dst: SharedTileView, tid: Var, threads: int, elem_bits: int,
                       cache: str = "cg") -> CopyPlan | str:
    """cp.async of the widest legal vector (4, 8 or 16 bytes), coalesced in global memory."""
    order = _memory_order(src)
    inner = order[0]
    if src.static_stride(inner) != 1:
        return "no mode of the global tile is contiguous (stride 1)"
    uneven: str | None = None     # why the narrowest width tried could not be shared by the threads
    spread = False
    declared = declared_vector_bits(src) // 8
    if declared < 4:
        return (f"{src.param.name} is declared {declared}-byte aligned; cp.async moves 4, 8 or 16 "
                "aligned bytes")
    for w_bytes in (16, 8, 4):
        w = w_bytes * 8 // elem_bits
        if w < 1 or src.shape[inner] % w or w_bytes > declared or origin_alignment(src, w) < w:
            continue
        tv = copy_thread_layout(src.shape, order, w, threads)
        if isinstance(tv, str):
            uneven = f"{w_bytes} bytes: {tv}"
            continue
        spread = True
        table = tv.indices().reshape(-1, threads).T            # [t, (j, n)]
        nvec = table.shape[1] // w
        vec_idx = table.reshape(threads, nvec, w)              # [t, n, j]
        if vector_width(src.offsets(vec_idx), w, w) != w or vector_width(dst.offsets(vec_idx), w, w) != w:
            continue
        instrs: list[Instr] = []
        for n in range(nvec):
            idx = as_expr(crd2idx(as_expr(tid) + threads * (w * n), tv.shape, tv.stride))
            pred = src.inbounds(idx)
            pred_e = None if isinstance(pred, Const) and pred.value else pred
            instrs.append(CpAsync(SharedRef(dst.buffer, dst.offset(idx)),
                                  GlobalRef(src.param, src.offset(idx)),
                                  w_bytes, cache if w_bytes == 16 else "ca", pred=pred_e))
        reqs = _global_requirements(src, w, elem_bits, inner)
        return CopyPlan(instrs, f"cp.async.{cache if w_bytes == 16 else 'ca'}.{w_bytes}", w, reqs)
    if uneven is not None and not spread:
        return f"no vector width of 4, 8 or 16 bytes spreads evenly over the {threads} threads ({uneven})"
    return "no vector width of 4, 8 or 16 bytes is contiguous and aligned on both sides"


def lower_mem_to_mem(src: MemView, dst: MemView, tid: Var, threads: int, elem_bits: int,
                     tmp: RegArray) -> CopyPlan | str:
    """Through registers: vector loads into ``tmp`` then vector stores.

    The thread arrangement is coalesced on the global side: ``w``-element vectors along the
    global tensor's contiguous mode (the widest ``w`` both sides' alignment allows), whole
    vectors on the global side; the shared side moves the widest runs the arrangement leaves
    contiguous there (one element at a time through a transposed view). Among the
    arrangements ``copy_thread_layout`` offers (a whole row of vectors per group of threads,
    or ``run``-vector segments of several rows, each at least one 32-byte sector), the one
    with the fewest shared-memory wavefronts plus global sectors (``_arrangement_cost``) is
    taken, the whole-row one on ties: a transposed shared tile read or written column-wise
    spreads over the banks when a warp covers several columns."""
    glob = src if isinstance(src, GlobalTileView) else dst
    has_global = isinstance(glob, GlobalTileView)
    order = _memory_order(glob) if has_global else list(range(len(src.shape)))
    uneven: str | None = None     # why the narrowest width tried could not be shared by the threads
    spread = False
    eb = max(1, elem_bits // 8)
    for w_bits in (128, 64, 32, 16, 8):
        w = w_bits // elem_bits
        if w < 1 or w_bits > min(declared_vector_bits(src), declared_vector_bits(dst)):
            continue
        best: tuple[float, CopyPlan] | None = None
        for run in _runs(src.shape, order, w, eb, threads if has_global else 0):
            tv = copy_thread_layout(src.shape, order, w, threads, run)
            if isinstance(tv, str):
                if run is None:
                    uneven = f"{w_bits // 8} bytes: {tv}"
                    break
                continue
            spread = True
            reg = RegisterTile(tmp, src.dtype, src.shape, tv, threads)
            if tmp.count < reg.values:
                return f"temporary register array too small ({tmp.count} < {reg.values})"
            ld = lower_reg_mem(reg, src, True, tid, elem_bits, w_bits)
            st = lower_reg_mem(reg, dst, False, tid, elem_bits, w_bits)
            if isinstance(ld, str) or isinstance(st, str):
                continue
            # the global side moves whole w-vectors; without one, both sides do
            if any(p.vector_elems != w for p, v in ((ld, src), (st, dst)) if v is glob or not has_global):
                continue
            plan = CopyPlan(ld.instrs + st.instrs, f"{ld.instruction}+{st.instruction}", w,
                            ld.requirements + st.requirements)
            if not has_global:
                return plan
            cost, ideal = _arrangement_cost(reg, ((src, ld.vector_elems), (dst, st.vector_elems)), eb)
            if best is None or cost < best[0]:
                best = (cost, plan)
            if cost == ideal:
                break                 # no arrangement does better: keep the earliest
        if best is not None:
            return best[1]
    if uneven is not None and not spread:
        return f"no vector width spreads evenly over the {threads} threads ({uneven})"
    return "no vector width is contiguous on both sides"


def _runs(shape: tuple[int, ...], order: list[int], w: int, eb: int, threads: int) -> list[int | None]:
    """The arrangements ``lower_mem_to_mem`` tries, best first: whole rows (``None``), then
    segments of ``run`` vectors (powers of two, at least one 32-byte sector, fewer than a row),
    longest first; only whole rows without a global side (``threads == 0``) or a second mode."""
    out: list[int | None] = [None]
    row = shape[order[0]] // w
    if threads == 0 or len(shape) < 2:
        return out
    run = 1
    while run * 2 < row:
        run *= 2
    while run >= 1 and run * w * eb >= 32:
        if row % run == 0:
            out.append(run)
        run //= 2
    return out


def _arrangement_cost(reg: RegisterTile, sides: tuple[tuple[MemView, int], ...],
                      eb: int) -> tuple[float, float]:
    """Static cost of moving ``reg``'s values to or from each ``(view, vector width)`` side:
    shared-memory wavefronts (bank model) plus global 32-byte sectors, summed over the
    warp-wide requests; and the same with conflict-free shared accesses (the least possible
    for these global sectors)."""
    table = reg.index_table()                                   # [t, v]
    cost = ideal = 0.0
    for view, ws in sides:
        offs = view.offsets(table)[:, ::ws] * eb                 # [t, request]
        t = offs.shape[0]
        if t % 32:
            offs = np.pad(offs, ((0, 32 - t % 32), (0, 0)), constant_values=-1)
        req = offs.T.reshape(offs.shape[1], -1, 32)              # [request, warp, lane]
        if isinstance(view, SharedTileView):
            rep = bank_conflicts(req.reshape(-1, 32), ws * eb)
            cost += float(np.sum(rep.wavefronts))
            ideal += float(np.sum(rep.min_wavefronts))
        else:
            sec = float(np.sum(global_sectors(req.reshape(-1, 32), ws * eb)))
            cost += sec
            ideal += sec
    return cost, ideal


def _tma_swizzle_bytes(view: SharedTileView, elem_bits: int) -> int | str:
    sw = view.swizzle
    if sw is None or sw.bits == 0:
        return 0
    base = 4 - (elem_bits // 8).bit_length() + 1
    if sw.shift != 3 or sw.base != base or sw.bits not in (1, 2, 3):
        return (f"shared swizzle {sw} is not a TMA byte swizzle Swizzle<B,4,3> "
                f"(Swizzle<B,{base},3> for {elem_bits}-bit elements)")
    return 16 << sw.bits


def lower_tma_load(src: GlobalTileView, dst: SharedTileView, bar: MbarRef, elect: ExprLike,
                   elem_bits: int, name: str) -> tuple[CopyPlan, TmaDesc] | str:
    """TMA box loads of a global tile into shared memory, completing on ``bar``.

    The box runs along the tile's contiguous mode (innermost, at most one swizzle row when
    swizzled) and the tile's other modes; tensor modes outside the tile get extent 1. The
    shared layout must be exactly what TMA writes: box ``b`` at a period-aligned start
    ``s_b``, element ``e`` of the box at ``s_b + Sw(e0 + B0*(e1 + B1*...))``.
    """
    eb = elem_bits // 8
    if elem_bits % 8 or eb not in (1, 2, 4, 8):
        return f"TMA moves 1-, 2-, 4- or 8-byte elements, not {elem_bits}-bit"
    if declared_vector_bits(src) < 128:
        return f"{src.param.name} is declared {src.param.align_bytes}-byte aligned; TMA needs 16-byte rows"
    inner = next((k for k in range(len(src.shape)) if src.static_stride(k) == 1), None)
    if inner is None:
        return "no mode of the global tile is contiguous (stride 1)"
    swz = _tma_swizzle_bytes(dst, elem_bits)
    if isinstance(swz, str):
        return swz
    rank = len(src.param.shape)
    inner_mode = src.modes[inner]
    dims = (inner_mode,) + tuple(m for m in reversed(range(rank)) if m != inner_mode)
    box_inner = src.shape[inner] if not swz else min(src.shape[inner], swz // eb)
    if src.shape[inner] % box_inner:
        return f"the contiguous extent {src.shape[inner]} is not a multiple of the box row {box_inner}"
    if (box_inner * eb) % 16:
        return f"a box row of {box_inner * eb} bytes is not a multiple of 16 bytes"
    tile_of_mode = {m: k for k, m in enumerate(src.modes)}
    box = tuple(box_inner if m == inner_mode else (src.shape[tile_of_mode[m]] if m in tile_of_mode else 1)
                for m in dims)
    if any(b > 256 for b in box):
        return f"box {box} has an extent above 256"
    box_elems = 1
    for b in box:
        box_elems *= b
    period = dst.swizzle.period() if dst.swizzle is not None else 1
    # verify the shared layout, box by box
    n = 1
    for s in src.shape:
        n *= s
    idx = np.arange(n)
    coords = tile_coords(idx, src.shape)
    want = np.zeros(n, dtype=np.int64)
    b_of = coords[inner] // box_inner
    lin = np.zeros(n, dtype=np.int64)
    scale = 1
    for m, ext in zip(dims, box):
        if m == inner_mode:
            e = coords[inner] % box_inner
        elif m in tile_of_mode:
            e = coords[tile_of_mode[m]]
        else:
            continue
        lin += e * scale
        scale *= ext
    nboxes = src.shape[inner] // box_inner
    starts = []
    first_idx = [0] * len(src.shape)
    for b in range(nboxes):
        first_idx[inner] = b * box_inner
        start = int(crd2idx(int(sum(c * s for c, s in zip(first_idx, colex_strides(src.shape)))),
                            dst.layout.shape, dst.layout.stride))
        if start % period or (start * eb) % 128:
            return (f"box {b} starts at element {start} of the shared tile, not aligned to "
                    f"{max(period * eb, 128)} bytes")
        starts.append(start)
    sw = dst.swizzle
    for b in range(nboxes):
        sel = b_of == b
        want[sel] = starts[b] + (sw(lin[sel]) if sw is not None else lin[sel])
    got = np.asarray(crd2idx(idx, dst.layout.shape, dst.layout.stride))
    got = sw(got) if sw is not None else got
    if not np.array_equal(got, want):
        bad = int(np.argwhere(got != want)[0][0])
        return (f"the shared layout {dst.full_layout} is not the layout TMA writes for box {box} "
                f"with {swz or 'no'}-byte swizzle (tile element {tuple(int(c[bad]) for c in coords)} is at "
                f"{int(got[bad])}, TMA puts it at {int(want[bad])})")
    desc = TmaDesc(name, src.param, box, dims, swz)
    instrs: list[Instr] = []
    for b in range(nboxes):
        crd = tuple(as_expr(src.origin[m]) + (b * box_inner if m == inner_mode else 0) for m in dims)
        instrs.append(TmaLoad(SharedRef(dst.buffer, as_expr(dst.base) + starts[b]), desc, crd, bar,
                              pred=elect))
    reqs = [Requirement(src.param.name, "align_bytes", 16, reason="TMA global address"),
            Requirement(src.param.name, "stride_bytes_multiple", 16, reason="TMA global strides")]
    return CopyPlan(instrs, "SM90_TMA_LOAD", box_inner, reqs), desc


def _mem_layout(view: MemView) -> Any:
    """The layout of a memory view, for a rejection: shared layout or global strides."""
    if isinstance(view, SharedTileView):
        return view.full_layout
    return f"{view.shape}:{view.strides}"


