"""Lowering of a copy from an ``hl.offline`` tensor into a register tile (``hexlayout.ir.offline``).

The copy is always legal for an injective register layout ``L: (t, v) -> i`` covering the
``(TR, TU)`` unit tile once: the tensor's storage order is *defined* by ``L`` (thread-major
inverse), so thread ``t``'s ``V`` values are the contiguous units::

    tile_base + t * V + v,   tile_base = r0 * stride_r + u0 * TR

(``(r0, u0)`` the view's origin, a multiple of the tile: tile ``(r0 / TR, u0 / TU)`` of a
tensor with ``K_u`` units per row starts at unit ``(r0 / TR * K_u / TU + u0 / TU) * TR * TU =
r0 * K_u + u0 * TR``), loaded as ``w``-unit vectors, ``w`` the largest power of two dividing
``V`` with ``w * bits <= 128`` (and within the tensor's declared alignment). The emulator and
the PTX executor run the resulting ``ld.global`` instructions unchanged. Only loads; no masks
(the op pads the tensor to whole tiles; the launch checks the row length is a multiple of the
tile's).

A replicated register layout (threads holding the same values: thread modes of stride 0, a
``(BN, 1)`` column of scales broadcast across a fragment's K threads) is lowered through its
owners (``owners``): ``L'`` the layout with those modes removed, ``T'`` owners, and thread ``t``
reads the run of its owner ``t' = sum ((t // P) % s) Q`` over the kept modes ``(P, s, Q)``::

    tile_base + t' * V + v

4-bit elements in whole words per thread are stored in the nibble-interleaved in-word order
(``hexlayout.ir.offline.in_word_order``): the vectors are loaded into a scratch run ``P`` and
each byte ``b`` of each word ``w`` of the tile is given back its logical nibbles (unpacked
values ``i = 8 w + 2 b`` and ``i + 1``, stored at nibbles ``n(i)``, ``n(i + 1)`` of the word)
by one ``nibble_pair`` function of the two bytes of ``P`` that hold them::

    X[4 w + b] = ((P[4 w + n(i) // 2] >> 4 (n(i) % 2)) & 15) | ((P[4 w + n(i + 1) // 2] >> ...) & 15) << 4

which the code generator sees through (``hexlayout.codegen.byte_sources``): a conversion of
the unpacked values reads ``P``'s words, and ``X`` is left dead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexlayout.ir.offline import OfflineLayout, in_word_order
from hexlayout.layout import Layout, flatten

from ..expr import Const, Var, as_expr
from ..functions.bits import nibble_pair
from ..lowered import Alu, GlobalRef, Instr, LdGlobal, RegArray, RegRef
from .copy import CopyPlan, Requirement
from .rejection import Rejection
from .views import GlobalTileView, RegisterTile

__all__ = ["lower_offline_load", "is_offline", "logical_bytes", "owners"]


def is_offline(view: object) -> bool:
    """Whether ``view`` is a global view of an ``hl.offline`` tensor."""
    return isinstance(view, GlobalTileView) and getattr(view.param, "offline", False)


def _static(x: object) -> int | None:
    if isinstance(x, int):
        return x
    return x.value if isinstance(x, Const) else None


def owners(tv: Layout, threads: int) -> tuple[Layout, list[tuple[int, int, int]]]:
    """The compact layout of a register TV layout whose threads may replicate one another, and
    the thread modes it keeps: ``tv``'s thread modes of stride 0 (the threads that hold the same
    values: a column broadcast across the K threads of an mma fragment) removed. Returns
    ``(tv', modes)``: ``tv'`` maps ``(t', v)`` (``t'`` the *owner*, colexicographic over the kept
    modes) as ``tv`` maps ``(t, v)``, and ``modes`` the kept modes ``(P, s, Q)``: thread ``t``'s
    owner is ``t' = sum ((t // P) % s) * Q``. Without stride-0 thread modes ``tv' = tv``."""
    flat = flatten(tv[0])
    shapes = flat.shape if isinstance(flat.shape, tuple) else (flat.shape,)
    strides = flat.stride if isinstance(flat.stride, tuple) else (flat.stride,)
    kept_s: list[int] = []
    kept_d: list[int] = []
    modes: list[tuple[int, int, int]] = []
    p = q = 1
    for sh, st in zip(shapes, strides):
        if st != 0 and sh != 1:
            kept_s.append(sh)
            kept_d.append(st)
            modes.append((p, sh, q))
            q *= sh
        p *= sh
    if len(kept_s) == len([s for s in shapes if s != 1]):
        return tv, [(1, threads, 1)]
    thread = Layout(tuple(kept_s) or (1,), tuple(kept_d) or (0,))
    return Layout((thread.shape, tv[1].shape), (thread.stride, tv[1].stride)), modes


def _check(reg: RegisterTile, mem: GlobalTileView, load: bool) -> str | None:
    """Why the copy cannot be an offline load, or ``None``."""
    name = mem.param.name
    if not load:
        return f"offline tensor {name} is read-only: it can only be copied into a register tile"
    if mem.gather is not None or len(mem.shape) != 2 or mem.modes != (0, 1):
        return (f"offline tensor {name}: copy a plain 2-d view hl.view({name}, (TR, TK), (r0, k0)) "
                "(no gathered rows, slices or permutes)")
    compact, _ = owners(reg.tv, reg.threads)
    table = compact.indices()
    if table.size != mem.shape[0] * mem.shape[1] or not np.array_equal(
            np.sort(table.reshape(-1)), np.arange(table.size)):
        return (f"offline tensor {name}: the register tile's layout {reg.tv} does not give each element "
                "of the tile to exactly one thread, or to threads that hold the same values (a partial "
                "layout, or one whose threads share values in another way, has no storage order)")
    for k, (o, s) in enumerate(zip(mem.origin, mem.shape)):
        so = _static(o)
        if so is not None and so % s:
            return f"offline tensor {name}: the view's origin {o} in mode {k} is not a multiple of {s}"
    return None


def logical_bytes(dst: RegArray, src: RegArray, nibbles: tuple[int, ...]) -> list[Instr]:
    """``dst``'s logical bytes from the run ``src`` stored in the in-word nibble order
    ``nibbles`` (see the module docstring): one ``nibble_pair`` per byte."""
    out: list[Instr] = []
    for w in range(src.count // 4):
        for b in range(4):
            lo, hi = nibbles[2 * b], nibbles[2 * b + 1]
            fn = nibble_pair(4 * (lo % 2), 4 * (hi % 2))
            out.append(Alu(fn, RegRef(dst, 4 * w + b, 1), (RegRef(src, 4 * w + lo // 2, 1),
                                                            RegRef(src, 4 * w + hi // 2, 1))))
    return out


def lower_offline_load(reg: RegisterTile, mem: GlobalTileView, load: bool, tid: Var,
                       elem_bits: int, scratch: Any = None) -> CopyPlan | Rejection:
    """The loads of the offline view ``mem`` into ``reg`` (see the module docstring), the
    plan's ``offline`` the layout it defines. ``scratch(dtype, count)``: a new register array
    (the run an in-word nibble order is loaded into; without it, the logical order)."""
    why = _check(reg, mem, load)
    if why is not None:
        return Rejection(why)
    tr, tu = mem.shape
    compact, modes = owners(reg.tv, reg.threads)
    n_owners = compact.size() // reg.values
    v_count = reg.values
    widest = min(128, 8 * mem.param.align_bytes)  # a tensor declared .aligned(n): vectors of n bytes at most
    w = 1
    while w * 2 * elem_bits <= widest and v_count % (w * 2) == 0:
        w *= 2
    r0, u0 = mem.origin
    base = as_expr(r0) * mem.param.stride[0] + as_expr(u0) * tr
    owner = as_expr(tid) if len(modes) == 1 and modes[0] == (1, reg.threads, 1) else sum(
        ((as_expr(tid) // p) % s) * q for p, s, q in modes)
    bits = mem.param.offline
    nibbles = in_word_order(bits, v_count) if scratch is not None and elem_bits == 8 else ()
    run = scratch(reg.array.dtype, v_count) if nibbles else reg.array
    instrs: list[Instr] = []
    for n in range(v_count // w):
        off = base + owner * v_count + w * n
        instrs.append(LdGlobal(RegRef(run, w * n, w), GlobalRef(mem.param, off), w * elem_bits))
    if nibbles:
        instrs += logical_bytes(reg.array, run, nibbles)
    name = mem.param.name
    reqs = [Requirement(name, "align_bytes", w * elem_bits // 8, reason=f"{w}-unit offline vectors"),
            Requirement(name, "extent_multiple", tu, 1, reason=f"offline tiles of {tu} units per row")]
    plan = CopyPlan(instrs, f"ld.global.b{w * elem_bits} (offline)", w, reqs,
                    scratch=[run] if nibbles else [])
    unit_tile = (tr, tu * (2 if bits == 4 else 1))
    plan.offline = OfflineLayout.of(name, unit_tile, bits, compact, n_owners, w * elem_bits // 8, nibbles,
                                    replicas=reg.threads // n_owners)
    return plan
