"""Candidate layouts of shared tiles, checked against every use.

A shared root buffer of shape ``(R, C)`` (plus trailing stage modes) gets candidates in
order of preference, for a contiguous mode ``d`` taken from the global tensors it is
copied with (the mode with stride 1 there; both modes are tried):

1. wgmma canonical layouts ``tile_to_shape(gmma_smem_atom(bits, major, swizzle), (R, C))``
   for 128/64/32-byte swizzles and none (when the architecture has wgmma);
2. rows along ``d`` with each conflict-free ``Swizzle<B,M,S>`` (``swizzle.py``);
3. rows along ``d`` padded by the smallest conflict-free padding (z3);
4. plain rows along ``d``;
5. rows along ``d`` with every other chunk-moving swizzle (``chunk_swizzles``): tried only
   when none of the above is conflict-free for the accesses the program makes (the solver
   stops at the first conflict-free candidate). The cost of a candidate counts the bank
   conflicts of every access, the writes and the reads: a tile written by rows and read by
   columns (a transpose through shared memory that feeds no mma) needs a swizzle that XORs
   the chunk index with high row bits, which 2. does not offer.

A root read as the block scales of an mma (``hl.mma(..., scale_a=, scale_b=)``) has one
candidate, the layout the block-scaled ``tcgen05.mma``'s ``tcgen05.cp`` reads
(``arch.block_scale.scale_smem_layout``: 512-byte atoms of 128 rows x 4 k-blocks), each stage
a whole number of atoms (``block_scale_candidate``).

Trailing stage modes are appended with the stride of a whole (swizzle-period aligned)
tile. A user hint (``hl.auto(swizzle="128B")``, ``hl.auto(stride=(None, 1))``) filters the
list. Each candidate is checked by lowering every op that touches the buffer (the
lowering is the legality oracle: it proves ldmatrix rows, cp.async / TMA boxes, wgmma
descriptors) and scored by the static cost of the instructions it produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexlayout.arch.block_scale import SF_ATOM_BYTES, SF_ATOM_KBLOCKS, SF_ATOM_ROWS, scale_smem_layout
from hexlayout.arch.gmma import gmma_smem_atom
from hexlayout.ir.tile import Mma, Op, Permute, Slice, SubTile, TileKernel, Value
from hexlayout.ir.types import LayoutVar, Scope, TileType
from hexlayout.layout import ComposedLayout, Layout, composition, cosize, select, tile_to_shape

from .swizzle import chunk_swizzles, conflict_free_padding, conflict_free_swizzles

__all__ = ["SharedCandidate", "shared_candidates", "root_mode_map", "WGMMA_LAYOUT_ARCHS",
           "block_scale_candidate", "scale_roots"]

#: Architectures whose shared-memory MMA operands are read through descriptors of the canonical
#: K- / MN-major layouts (wgmma on sm_90a, tcgen05.mma on sm_100a: the same layouts).
WGMMA_LAYOUT_ARCHS = ("sm_90a", "sm_100a")


@dataclass(frozen=True)
class SharedCandidate:
    layout: Layout | ComposedLayout
    kind: str              # "gmma", "swizzle", "padded", "plain"
    note: str
    mode: int | None = None    # the mode whose elements are contiguous (rows along it), if one is

    def __str__(self) -> str:
        return f"{self.layout} ({self.note})"


def _stage(tile: Layout | ComposedLayout, extra: tuple[int, ...]) -> Layout | ComposedLayout:
    if not extra:
        return tile
    inner = tile.layout_b if isinstance(tile, ComposedLayout) else tile
    step = cosize(inner)
    if isinstance(tile, ComposedLayout):
        period = tile.layout_a.period()
        step = -(-step // period) * period
    shapes = [inner.shape[0], inner.shape[1]]
    strides = [inner.stride[0], inner.stride[1]]
    for e in extra:
        shapes.append(e)
        strides.append(step)
        step *= e
    lay = Layout(tuple(shapes), tuple(strides))
    return ComposedLayout(tile.layout_a, tile.offset, lay) if isinstance(tile, ComposedLayout) else lay


def _rows(shape: tuple[int, int], d: int, pad: int = 0) -> Layout:
    r, c = shape
    if d == 1:
        return Layout((r, c), (c + pad, 1))
    return Layout((r, c), (1, r + pad))


_HINT_BYTES = {"none": 0, "32B": 32, "64B": 64, "128B": 128}


def shared_candidates(v: Value, contiguous: list[int], has_wgmma: bool, elem_bits: int,
                      hints: dict[str, Any] | None = None) -> list[SharedCandidate]:
    """Candidates for shared root ``v`` (see the module docstring); ``hints``: the layout
    hints to filter by (default: those of ``v``'s ``hl.auto(...)``; ``{}``: none)."""
    shape = tuple(v.type.shape)
    if len(shape) == 1:
        return [SharedCandidate(Layout(shape[0]), "plain", "contiguous")]
    if len(shape) > 2 and any(d >= 2 for d in contiguous):
        return _matrix_in_later_modes(v, contiguous, has_wgmma, elem_bits, hints)
    base, extra = (shape[0], shape[1]), tuple(shape[2:])
    if hints is None:
        hints = v.type.layout.hints if isinstance(v.type.layout, LayoutVar) else {}
    eb = elem_bits // 8
    out: list[SharedCandidate] = []
    order = []
    for d in contiguous + [1, 0]:
        if d not in order:
            order.append(d)
    if has_wgmma and elem_bits in (8, 16, 32):
        for d in order:
            major = "K" if d == 1 else "MN"       # for the root's own (mode 0, mode 1) order
            for swz in (128, 64, 32, 0):
                try:
                    tile = tile_to_shape(gmma_smem_atom(elem_bits, major, swz), base)
                except ValueError:
                    continue
                note = f"wgmma canonical, mode {d} contiguous, {swz or 'no'}-byte swizzle"
                out.append(SharedCandidate(_stage(tile, extra), "gmma", note, d))
    for d in order:
        row_bytes = base[d] * elem_bits // 8
        rows = base[1 - d]
        for sw in conflict_free_swizzles(row_bytes, rows, elem_bits):
            if sw.bits == 0:
                continue
            tile = composition(sw, _rows(base, d))
            out.append(SharedCandidate(_stage(tile, extra), "swizzle",
                                       f"rows along mode {d}, {sw} (conflict-free)", d))
        pad = conflict_free_padding(row_bytes, elem_bits) if eb >= 1 else None
        if pad:
            out.append(SharedCandidate(_stage(_rows(base, d, pad), extra), "padded",
                                       f"rows along mode {d} padded by {pad} elements", d))
        out.append(SharedCandidate(_stage(_rows(base, d), extra), "plain", f"rows along mode {d}", d))
    for d in order:
        usual = set(conflict_free_swizzles(base[d] * elem_bits // 8, base[1 - d], elem_bits))
        for sw in chunk_swizzles(base[d] * elem_bits // 8, base[1 - d], elem_bits):
            if sw not in usual:
                out.append(SharedCandidate(_stage(composition(sw, _rows(base, d)), extra), "swizzle",
                                           f"rows along mode {d}, {sw}", d))
    if "swizzle" in hints:
        want = hints["swizzle"]
        want_bytes = _HINT_BYTES.get(want) if isinstance(want, str) else None
        out = [c for c in out if _swizzle_bytes(c.layout, elem_bits) == want_bytes]
    if "stride" in hints:
        out = [c for c in out if _strides_match(c.layout, hints["stride"])]
    return out


def _matrix_in_later_modes(v: Value, contiguous: list[int], has_wgmma: bool, elem_bits: int,
                           hints: dict[str, Any] | None) -> list[SharedCandidate]:
    """Candidates for a tile whose contiguous mode ``d`` is not among its first two (a tile
    of leading stage modes, ``(2, 2, 32, 64)`` sliced ``sh[i, j]``): those of the tile with
    modes ``(d - 1, d)`` first and the others after (as stages), modes put back in place."""
    shape = tuple(v.type.shape)
    d = next(d for d in contiguous if d >= 2)
    perm = [d - 1, d] + [k for k in range(len(shape)) if k not in (d - 1, d)]
    moved = Value(v.name, TileType(v.type.dtype, tuple(shape[k] for k in perm), v.type.scope, v.type.layout))
    inv = [perm.index(k) for k in range(len(shape))]
    out = []
    for c in shared_candidates(moved, [1], has_wgmma, elem_bits, hints):
        lay = c.layout
        if isinstance(lay, ComposedLayout):
            lay = ComposedLayout(lay.layout_a, lay.offset, select(lay.layout_b, *inv))
        else:
            lay = select(lay, *inv)
        out.append(SharedCandidate(lay, c.kind, c.note, None if c.mode is None else perm[c.mode]))
    return out


def block_scale_candidate(shape: tuple[int, ...]) -> SharedCandidate | None:
    """The layout of a block-scale root ``(rows, k-blocks, stages...)`` (None: the rows are not whole
    128-row atoms)."""
    if len(shape) < 2 or shape[0] % SF_ATOM_ROWS:
        return None
    rows, kb, extra = shape[0], shape[1], tuple(shape[2:])
    tile = scale_smem_layout(rows, kb)
    step = SF_ATOM_BYTES * (rows // SF_ATOM_ROWS) * -(-kb // SF_ATOM_KBLOCKS)   # whole atoms per stage
    shapes, strides = [tile.shape[0], tile.shape[1]], [tile.stride[0], tile.stride[1]]
    for e in extra:
        shapes.append(e)
        strides.append(step)
        step *= e
    return SharedCandidate(Layout(tuple(shapes), tuple(strides)), "block_scale",
                           "block scale factors (512-byte atoms of 128 rows x 4 k-blocks, tcgen05.cp)", None)


def scale_roots(tk: TileKernel) -> set[int]:
    """Ids of the shared roots an mma reads as block scales."""
    return {v.root.id for op in tk.body.walk() if isinstance(op, Mma)
            for v in (op.scale_a, op.scale_b) if v is not None}


def _swizzle_bytes(lay: Any, elem_bits: int) -> int | None:
    if not isinstance(lay, ComposedLayout):
        return 0
    sw = lay.layout_a
    eb = elem_bits // 8
    if sw.bits == 0:
        return 0
    return (1 << sw.bits) * 16 if sw.shift == 3 and (1 << sw.base) * eb == 16 else None


def _strides_match(lay: Any, want: tuple[Any, ...]) -> bool:
    inner = lay.layout_b if isinstance(lay, ComposedLayout) else lay
    for k, w in enumerate(want):
        if w is not None and (k >= inner.rank or inner[k].stride != w):
            return False
    return True


def root_mode_map(tk: TileKernel) -> dict[int, tuple[Value, list[int]]]:
    """For every shared view value: (its root, the root mode of each of its modes)."""
    out: dict[int, tuple[Value, list[int]]] = {}
    for op in tk.body.walk():
        if isinstance(op, (Slice, SubTile, Permute)) and op.src.type.scope == Scope.SHARED:
            root, modes = out.get(op.src.id, (op.src, list(range(len(op.src.type.shape)))))
            if isinstance(op, Slice):
                modes = [m for m, i in zip(modes, op.index) if i is None]
            elif isinstance(op, Permute):
                modes = [modes[p] for p in op.perm]
            out[op.result.id] = (root, modes)
    return out


def uses_of(tk: TileKernel) -> dict[int, list[Op]]:
    """Ops touching each shared root (by root value id)."""
    out: dict[int, list[Op]] = {}
    for op in tk.body.walk():
        for v in op.operands():
            if v.type.scope == Scope.SHARED and op not in out.setdefault(v.root.id, []):
                if not isinstance(op, (Slice, SubTile, Permute)):
                    out[v.root.id].append(op)
    return out
