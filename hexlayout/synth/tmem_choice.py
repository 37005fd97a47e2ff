"""How a ``tcgen05.mma`` accumulator reaches registers (sm_100a): the TMEM layout, the
``tcgen05.ld`` shape and repetition, and the register layout the epilogue then works in.

For one CTA's share of an ``M x N`` accumulator (``M`` the whole MMA's M, ``cta_group`` 1 or
2) held in TMEM by ``arch.tmem.accumulator_layout`` (row ``i``, column ``j`` -> lane, column),
the four warps of an epilogue warp group each read their lane quarter (warp ``w`` lanes
``32w .. 32w+31``). A candidate is a shape ``s`` (``32x32b``, ``16x64b``, ``16x128b``,
``16x256b``) with ``.num`` ``x``: a load covers ``lanes(s)`` lanes x ``x * columns(s)`` columns
of the quarter, and the warp issues ``(rows in its quarter / lanes(s)) * (N / (x * columns(s)))``
loads. The register TV layout maps ``(thread t, value v) -> i + M_cta * j``: the accumulator
element thread ``t`` holds in its ``v``-th register, values ordered load by load (columns
outer, then lane halves), each load's registers in PTX order (``arch.tmem.tmem_copy_layout``).

Shapes whose lanes hold no accumulator row are not candidates (M = 64 keeps rows in the first
16 lanes of each quarter: only the ``16x*`` shapes). The cost ranks candidates by: loads per
warp (fewest), then the widest run of consecutive columns a thread holds (wider vector stores
in the epilogue), then registers per load (fewest: less pressure). ``max_regs`` bounds the
registers one load writes (the whole tile in one ``32x32b.x128`` load needs 128).

Example:
    >>> best = tmem_epilogue_candidates(128, 64)[0]
    >>> (best.shape, best.num, str(best.register_tv))
    ('32x32b', 64, '(128,64):(1,128)')
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hexlayout.arch.tmem import TMEM_LANES, TMEM_SHAPES, accumulator_layout, tmem_copy_layout
from hexlayout.layout import Layout, coalesce
from hexlayout.layout.tv_maps import fit_tv

__all__ = ["TmemEpilogue", "tmem_epilogue_candidates", "choose_tmem_epilogue", "TmemOperandStore",
           "tmem_a_candidates"]


@dataclass(frozen=True)
class TmemEpilogue:
    """A way to load an accumulator from TMEM: ``tcgen05.ld.{shape}.x{num}``, ``loads`` per warp,
    the accumulator's TMEM layout and the register TV layout of the 128 epilogue threads."""

    m: int
    n: int
    cta_group: int
    shape: str
    num: int
    loads: int
    accumulator: Layout
    register_tv: Layout
    cost: tuple[int, int, int]
    #: (lane within the warp's quarter, column) where each of a warp's loads starts, in register order
    origins: tuple[tuple[int, int], ...] = ()

    @property
    def regs_per_load(self) -> int:
        return TMEM_SHAPES[self.shape].regs * self.num


def _register_table(m: int, n: int, cta_group: int, shape: str,
                    num: int) -> tuple[np.ndarray, tuple[tuple[int, int], ...]] | None:
    """``[128, values]`` accumulator index ``i + M_cta * j`` of each register and the origins of a
    warp's loads (lane within its quarter, column; the same for the four warps), or None when a
    load would touch a lane or column that holds no accumulator element."""
    addr = np.asarray(accumulator_layout(m, n, cta_group).indices())  # element -> lane << 16 | column
    inv = np.full((TMEM_LANES, int(addr.max() & 0xFFFF) + 1), -1, dtype=np.int64)
    inv[addr >> 16, addr & 0xFFFF] = np.arange(addr.size)
    s = TMEM_SHAPES[shape]
    frag = tmem_copy_layout(shape, num).indices().reshape(-1, 32).T  # [lane of warp, reg] -> cell
    f_lane, f_col = frag % s.lanes, frag // s.lanes
    width = s.columns * num
    if inv.shape[1] % width:
        return None
    table = []
    origins = set()
    for w in range(4):
        per_warp = []
        warp_origins = []
        for c0 in range(0, inv.shape[1], width):
            for l0 in range(32 * w, 32 * w + 32, s.lanes):
                got = inv[l0 + f_lane, c0 + f_col]
                if (got < 0).all():
                    continue  # lanes of the quarter that hold no rows (M = 64)
                if (got < 0).any():
                    return None
                per_warp.append(got)
                warp_origins.append((l0 - 32 * w, c0))
        if not per_warp:
            return None
        table.append(np.concatenate(per_warp, axis=1))
        origins.add(tuple(warp_origins))
    if len({t.shape for t in table}) != 1 or len(origins) != 1:
        return None
    out = np.concatenate(table, axis=0)
    ok = np.array_equal(np.sort(out.reshape(-1)), np.arange(addr.size))
    return (out, origins.pop()) if ok else None


def _run(table: np.ndarray, rows: int, n: int) -> int:
    """The shortest, over threads, of the longest run of consecutive columns of one row a thread holds."""
    key = np.sort((table % rows) * (n + 1) + table // rows, axis=1)
    step = np.diff(key, axis=1) == 1
    cur = np.ones(len(key), dtype=np.int64)
    best = cur.copy()
    for k in range(step.shape[1]):
        cur = np.where(step[:, k], cur + 1, 1)
        best = np.maximum(best, cur)
    return int(best.min())


def _fragments(m: int, n: int, cta_group: int,
               max_regs: int) -> Iterator[tuple[str, int, np.ndarray, tuple[tuple[int, int], ...]]]:
    """``(shape, num, table, origins)`` of every ``tcgen05.ld/st`` that moves an ``m x n`` block of
    32-bit cells in the accumulator layout (``_register_table``), at most ``max_regs`` registers."""
    for shape in ("32x32b", "16x64b", "16x128b", "16x256b"):
        s = TMEM_SHAPES[shape]
        for num in s.nums:
            if s.regs * num > max_regs:
                continue
            got = _register_table(m, n, cta_group, shape, num)
            if got is not None:
                yield shape, num, got[0], got[1]


def tmem_epilogue_candidates(m: int, n: int, cta_group: int = 1, max_regs: int = 128) -> list[TmemEpilogue]:
    """Every legal way to load the accumulator, best first (see the module docstring)."""
    acc = accumulator_layout(m, n, cta_group)
    rows = m // cta_group
    out = []
    for shape, num, table, origins in _fragments(m, n, cta_group, max_regs):
        s = TMEM_SHAPES[shape]
        tv = fit_tv(table)
        if tv is None:
            continue
        tv = coalesce(tv, (1, 1))
        loads = table.shape[1] // (s.regs * num)
        cost = (loads, -_run(table, rows, n), s.regs * num)
        out.append(TmemEpilogue(m, n, cta_group, shape, num, loads, acc, tv, cost, origins))
    out.sort(key=lambda e: (e.cost, e.shape))
    return out


def choose_tmem_epilogue(m: int, n: int, cta_group: int = 1, max_regs: int = 128) -> TmemEpilogue:
    """The best candidate; ``ValueError`` naming the accumulator when there is none."""
    cands = tmem_epilogue_candidates(m, n, cta_group, max_regs)
    if not cands:
        raise ValueError(f"no tcgen05.ld shape loads an {m} x {n} accumulator (cta_group::{cta_group}) "
                         f"with at most {max_regs} registers per load")
    return cands[0]


@dataclass(frozen=True)
class TmemOperandStore:
    """A way to write an ``m x k`` A operand of ``bits``-bit elements from registers into TMEM:
    ``tcgen05.st.{shape}.x{num}``, ``stores`` per warp at ``origins`` (lane within the warp's
    quarter, column), and the element register TV layout of the 128 threads."""

    m: int
    k: int
    bits: int
    shape: str
    num: int
    stores: int
    register_tv: Layout
    cost: tuple[int, ...]
    origins: tuple[tuple[int, int], ...] = ()

    @property
    def columns(self) -> int:
        """TMEM columns of the operand."""
        return self.k * self.bits // 32

    @property
    def regs_per_store(self) -> int:
        return TMEM_SHAPES[self.shape].regs * self.num


def tmem_a_candidates(m: int, k: int, bits: int, max_regs: int = 128) -> list[TmemOperandStore]:
    """Every ``tcgen05.st`` that writes an ``m x k`` A operand (``m`` 64 or 128) from the
    registers of 128 threads, best first (module docstring)."""
    per = 32 // bits
    words = k // per
    out = []
    for shape, num, table, origins in _fragments(m, words, 1, max_regs):   # table: word i + m * j
        s = TMEM_SHAPES[shape]
        i, j = table % m, table // m
        elems = np.stack([i + m * (per * j + h) for h in range(per)], axis=2).reshape(len(table), -1)
        tv = fit_tv(elems)
        if tv is None:
            continue
        stores = table.shape[1] // (s.regs * num)
        rows = max(len(np.unique(r % m)) for r in table)
        cost = (stores, rows, -_run(table, m, words), s.regs * num)
        out.append(TmemOperandStore(m, k, bits, shape, num, stores, coalesce(tv, (1, 1)), cost, origins))
    out.sort(key=lambda e: (e.cost, e.shape))
    return out
