"""Lowering of a block-level mma ``c += a @ b^T`` to mma.sync / wgmma issues.

The register tiles must carry the TiledMma's TV layouts (``a_tv``, ``b_tv``, ``c_tv``),
compared as functions ``(t, v) -> tile index``. Issue ``(r, k)`` of every worker then
reads the contiguous value runs described in ``hexlayout.ir.tiled_mma``.

For wgmma a shared-memory operand is passed as a matrix descriptor: the ``atom_m x atom_k``
(or ``atom_n x atom_k``) sub-tile of worker ``w``'s task starts at element
``L(m0 + M*k0)`` of the operand's (unswizzled) layout, with ``m0`` the task's row offset
(a function of the warp-group index) and ``k0 = k * atom_k``; its leading / stride byte
offsets come from ``hexlayout.arch.gmma.make_gmma_desc``, which also proves the sub-tile
is a canonical wgmma layout. Every instance is checked to share those offsets. When the
start ``L(m0(w) + M*k0)`` is affine in the worker ``w`` (``L(m0(0)) + w * step``, checked
for every worker), the offset is written so: a sum of the view's base, a constant and a
warp-uniform term, which the code generator adds to one descriptor instead of rebuilding it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexlayout.arch import atom_spec
from hexlayout.arch.gmma import make_gmma_desc
from hexlayout.layout import ComposedLayout, Layout, composition
from hexlayout.layout.inttuple import crd2idx
from hexlayout.layout.tv_maps import same_function

from ..expr import ExprLike, Var, as_expr, select
from ..lowered import Alu, Instr, MmaSync, RegRef, SmemDesc, Wgmma
from ..tiled_mma import TiledMma
from .rejection import Rejection
from .views import RegisterTile, SharedTileView

__all__ = ["lower_mma"]


def _check_tv(name: str, reg: RegisterTile, want: Layout, threads: int) -> Rejection | None:
    if reg.threads != threads:
        return Rejection(f"{name} is spread over {reg.threads} threads, the mma over {threads}", operand=name)
    if not same_function(reg.tv, want):
        return Rejection(f"the register layout of {name} {reg.tv} is not the mma's {name} layout {want}",
                         operand=name, layouts=((name, reg.tv), (f"mma {name}", want)))
    return None


def _task_offset(tm: TiledMma, dim: int, worker: ExprLike, r: int) -> ExprLike:
    """Atom-tile coordinate along ``dim`` of the ``r``-th projected task of ``worker``
    (an int for an int worker, an Expr for a symbolic one)."""
    proj = tm.warps.tv_layout(dims=(dim,))
    return crd2idx(worker + tm.warps.num_workers * r, proj.shape, proj.stride)


def _desc(tm: TiledMma, view: SharedTileView, dim: int, major: str, tid: Var, r: int, k: int,
          elem_bits: int, cta_group: int = 1, per_unit: int = 1) -> SmemDesc | str:
    """Descriptor of the operand sub-tile of task ``r`` at k-step ``k`` (symbolic in the warp group);
    ``cta_group`` 2: of one CTA's share (half the atom's rows) of a pair's tcgen05.mma operand;
    ``per_unit``: the atom's K elements per unit of the view (packed e2m1 in a u8 tile: 2, so a
    K = 64 step is 32 units of ``elem_bits`` = 8)."""
    m_a, n_a, k_a = tm.atom.shape_mnk
    k_a //= per_unit
    ext = (m_a if dim == 0 else n_a) // cta_group
    big = view.shape[0]
    inner = view.layout
    sub = composition(inner, Layout((ext, k_a), (1, big)))
    period = view.swizzle.period() if view.swizzle is not None else 1
    fields = set()
    bases: list[int] = []
    for w in range(tm.warps.num_workers):
        start = _task_offset(tm, dim, w, r) * ext + big * (k * k_a)
        base = int(inner(start))
        bases.append(base)
        offs = np.asarray(crd2idx(start + np.arange(ext)[:, None] + big * np.arange(k_a)[None, :],
                                  inner.shape, inner.stride))
        if not np.array_equal(offs, base + sub.indices().reshape(k_a, ext).T):
            return f"the {ext}x{k_a} sub-tiles of layout {inner} are not translates of one layout"
        lay = ComposedLayout(view.swizzle, base % period, sub) if view.swizzle is not None else sub
        try:
            d = make_gmma_desc(lay, major, elem_bits, ext, k_a, base_address=0)
        except ValueError as e:
            return str(e)
        fields.add((d.leading_byte_offset, d.stride_byte_offset, d.swizzle))
    if len(fields) != 1:
        return "the operand sub-tiles of different warp groups need different descriptors"
    lbo, sbo, swz = fields.pop()
    worker = as_expr(tid) // tm.atom_threads
    step = bases[1] - bases[0] if len(bases) > 1 else 0
    if all(b == bases[0] + w * step for w, b in enumerate(bases)):
        # affine in the worker: base(w) = base(0) + w * step (a sum the code generator and the
        # loop passes keep as separate terms: a warp-uniform part, a constant, a stage offset)
        offset = as_expr(view.base) + bases[0] + (worker * step if step else 0)
    else:
        start_e = _task_offset(tm, dim, worker, r) * ext + big * (k * k_a)
        offset = as_expr(view.base) + crd2idx(as_expr(start_e), inner.shape, inner.stride)
    return SmemDesc(view.buffer, offset, {0: 0, 128: 1, 64: 2, 32: 3}[swz], lbo, sbo, major)


def lower_mma(tm: TiledMma, a: RegisterTile | SharedTileView, b: RegisterTile | SharedTileView,
              c: RegisterTile, tid: Var, elem_bits: int,
              accumulate: bool | ExprLike = True) -> list[Instr] | str:
    """Instructions for ``c += a @ b^T`` (``accumulate``: ``False`` or a run-time zero gives
    ``c = a @ b^T``), or the reason it cannot be lowered. wgmma: the first k-step of each
    output tile carries ``accumulate`` as its scale-d (0: D = A*B); mma.sync (no such operand):
    ``c`` is zeroed (``False``) or selected (``accumulate ? c : 0``) before the first k-step."""
    atom = tm.atom
    err = _check_tv("c", c, tm.c_tv(), tm.threads)
    if err:
        return err
    regs_a = isinstance(a, RegisterTile)
    regs_b = isinstance(b, RegisterTile)
    if atom.kind == "mma.sync":
        if not (regs_a and regs_b):
            return f"{atom.name} reads A and B from registers; copy the shared tiles to registers first"
        for name, reg, want in (("a", a, tm.a_tv()), ("b", b, tm.b_tv())):
            err = _check_tv(name, reg, want, tm.threads)
            if err:
                return err
    else:
        if regs_a != (atom.a_source == "rmem"):
            return f"{atom.name} reads A from {'registers' if atom.a_source == 'rmem' else 'shared memory'}"
        if regs_b:
            return f"{atom.name} reads B from shared memory"
        if regs_a:
            err = _check_tv("a", a, tm.a_tv(), tm.threads)
            if err:
                return err
    va, vb, vc = atom.values_a, atom.values_b, atom.values_c
    out: list[Instr] = []
    first_scale: ExprLike = 1                 # scale-d of a wgmma at the first k-step
    if accumulate is False:
        first_scale = 0
    elif accumulate is not True:
        first_scale = select(as_expr(accumulate), 1, 0)
    if atom.kind == "mma.sync" and accumulate is not True:
        whole = RegRef(c.array, 0, c.values)
        out.append(Alu("mov", whole, (0,)) if accumulate is False else
                   Alu("select", whole, (as_expr(accumulate), whole, 0)))
    desc_cache: dict[tuple[str, int, int], SmemDesc] = {}

    def desc(role: str, view: Any, mode: int, major: Any, r: int, k: int) -> SmemDesc | Rejection:
        """The shared-memory descriptor of operand ``role`` at atom tile ``r``, k-step ``k`` (one
        per key), or why there is none."""
        key = (role, r, k)
        if key not in desc_cache:
            dsc = _desc(tm, view, mode, major, tid, r, k, elem_bits)
            if isinstance(dsc, str):
                return Rejection(dsc, operand=role, layouts=((role, view.full_layout),))
            desc_cache[key] = dsc
        return desc_cache[key]

    for inst in tm.instances():
        d_ref = RegRef(c.array, vc * inst.r, vc)
        if regs_a:
            a_op: RegRef | SmemDesc | Rejection = RegRef(a.array, va * tm.a_start(inst), va)
        else:
            a_op = desc("a", a, 0, atom.a_major, inst.r_m, inst.k)
            if isinstance(a_op, Rejection):
                return a_op
        if atom.kind == "mma.sync":
            b_op: RegRef | SmemDesc = RegRef(b.array, vb * tm.b_start(inst), vb)
            out.append(MmaSync(atom_spec(atom), d_ref, a_op, b_op, d_ref))
        else:
            b_desc = desc("b", b, 1, atom.b_major, inst.r_n, inst.k)
            if isinstance(b_desc, Rejection):
                return b_desc
            scale_d = first_scale if inst.k == 0 else 1
            out.append(Wgmma(atom_spec(atom), d_ref, a_op, b_desc, scale_d))
    return out
