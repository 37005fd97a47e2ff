"""Candidate ``tcgen05.mma`` tilings (sm_100a) for an ``mma`` op whose operands are in shared
memory: the atom, its repetition along N, the accumulator's TMEM layout and the ``tcgen05.ld``
that brings it to the registers of the threads running the op.

For ``c[M,N] (+)= a[M,K] @ b[N,K]^T`` with ``a`` and ``b`` shared, run by ``T = 128 * G``
threads (G warp groups), one thread issues ``SM100_{M}x{n}x{k}`` atoms (``cta_group::1``, so
``M`` is 64 or 128) with ``n`` the largest N the instruction accepts that divides ``N``
(``N / n`` atoms side by side in TMEM columns) and ``K / k`` k-steps; the descriptor majors
range over K- and MN-major for A and for B (as for wgmma). The accumulator lives in TMEM
(``arch.tmem.accumulator_layout``, ``N`` 32-bit columns); each warp group reads ``N/G``
columns with the ``tcgen05.ld`` shapes ``tmem_choice`` ranks for an ``M x N/G``
accumulator: one contiguous block per group, or (G > 1) blocks of one load's width dealt
round-robin to the groups (so that a window of columns is spread over every thread, as a
staged epilogue needs). The register layout of ``c`` is what that load gives. Candidates
are ordered by the load ranking first, then contiguous before dealt, then K-major before
MN-major.

**A pair of CTAs** (``cta_group::2``): an op whose accumulator has twice as many columns as
``b`` has rows (``c[M, N]``, ``b[N/2, K]``: ``b`` is this CTA's half of the pair's B, the
language's pair form of ``hl.mma`` in a kernel of 2-CTA clusters) gets the tilings of one
``SM100_2x1SM_{2M}x{N}x{k}`` atom: ``M = 128`` rows per CTA (the pair's 256), ``N`` up to 256 in one
atom (so that the pair's B is the concatenation of the two halves), each CTA's ``128 x N`` share
of the accumulator in its own TMEM (``accumulator_layout(256, N, 2)``: row ``i`` in lane ``i``),
read with the loads ``tmem_choice`` ranks for it. It pays twice over the one-CTA MMA: each CTA
stages and reads only half of B, and one instruction covers both CTAs' rows.

**A register tile as A** (``a`` in registers, ``b`` shared): tcgen05.mma cannot read registers,
so A reaches the tensor core through tensor memory (``tcgen05.st`` into the A columns of a ``_TS``
atom) or shared memory (``st.shared`` into a buffer the lowering allocates, read by the ``_SS``
atom's descriptor: ``smem_stage.smem_a_stage``). ``a_source_costs`` states the cost model, per
execution of the op (one k-step group) and per warp:

* TMEM: ``stores`` ``tcgen05.st`` (``tmem_choice.tmem_a_candidates``, usually 1) + ``wait::st``
  + two ``tcgen05.fence`` + a barrier of the warp group (the issuing thread must see every
  warp's stores; consecutive register-A mmas share one wait, fence pair and barrier), and
  ``R x K x bits / 32`` TMEM columns beside the accumulator: ``R`` sets of A's columns, one more
  than the executions of the op whose MMAs may still read A at its store
  (``ir.mma_in_flight``; synthesis passes it as ``a_sets``), so no store rewrites an A in flight.
  Only one warp group of one CTA (128 threads, ``cta_group::1``), no block scales, 8- or 16-bit A;
* shared: ``S = M x K / (T x e)`` ``st.shared`` of ``e`` elements (16 bytes where the threads
  share the tile evenly) per thread and as many address computations, a ``fence.proxy.async``
  (tcgen05.mma reads through the async proxy), a barrier of the ``T`` threads and
  ``tcgen05.fence::after_thread_sync``: ``2 S + 3``; and ``M x K x bits / 8`` bytes of shared
  memory per buffer of the ring, ``R`` buffers (``ir.lower.umma.stage_depths``: as many as
  executions of the op may be in flight at its store, plus one).

Per op, with ``C`` the TMEM columns of the kernel's other accumulators (``other_columns``),
TMEM is chosen when it is possible, ``R x K x bits / 32 <= MAX_A_COLUMNS``, ``R x K x bits / 32 + N
+ C <= 512`` and its instructions do not exceed shared's (ties go to TMEM: no shared bytes); else
shared memory (``register_a_source``). One ``tcgen05.st`` per warp moves what takes ``M x K x
bits / 16384`` ``st.shared.v4`` per thread: they tie at a single k-step of M = 64 (5 and 5), TMEM
is cheaper from there on (M = 64, K = 64: 5 against 11), so shared memory is chosen where TMEM
does not fit: two warp groups, A (all its sets) over 256 columns, A beside accumulators over 512
columns.
What neither source serves is refused (``register_a_refusal``, the diagnostic's reason): an op
with unboundedly many executions in flight at its store (``R`` over ``ir.mma_in_flight.MAX_RING``), a pair
of CTAs (``cta_group::2``: the odd CTA's stores would need a cluster barrier before the even
CTA's issue), a block-scaled op, a tile no K-major canonical layout holds. ``explain`` shows the
comparison (``a_source_comparison``). The TMEM columns also bound the CTAs an SM holds (512 /
the allocation): ``ir.lower.umma.a_ranges`` lets mmas that are never in flight together share
them.

**Whether a pair pays** (``pair_costs``, the choice of ``synth.cta_pair`` for a one-CTA program of
2-CTA clusters whose CTAs load the same B tile): per CTA and k-tile of ``BM x BN x BK`` (``e`` bytes an
element), the one-CTA MMAs stage ``BN x BK`` elements of B (``BN BK e`` shared bytes a stage, ``(BM + BN)
BK e`` TMA bytes a k-tile) and issue ``BK / 16`` MMAs in each CTA; the pair stages ``BN / 2 x BK`` (``BN BK
e / 2`` bytes, ``(BM + BN / 2) BK e`` TMA bytes) and the even CTA issues ``BK / 16`` MMAs for both CTAs
(the odd CTA none). The pair is never more in any of the three, and strictly less in the first two, so
it is chosen wherever it applies (its conditions, not its costs, decide).

A block-scaled op (``scale_a`` / ``scale_b`` given) gets the block-scaled atoms
``SM100_128x{n}x32_F32{A}{B}_UE8M0_SS`` (kind::mxf8f6f4: ``M = 128``, ``n`` a multiple of 8 up to
256, A and B e4m3 / e5m2, possibly mixed) or, for packed e2m1 operands (``operand_form``), the FP4
atoms ``SM100_128x{n}x64_F32E2M1E2M1_{UE8M0|UE4M3}_VS{32|16}_{MXF4|MXF4NVF4}_SS`` of the factor
type and scale vector the scale tiles give (``arch.sm100.block_scaled_kind``, K-major only); its
factors' layouts are ``arch.block_scale``'s.

Example:
    >>> from hexlayout.arch.dtypes import BF16, F32
    >>> tu = umma_tilings(128, 256, 64, BF16, BF16, F32, 256)[0]
    >>> (tu.atom.name, tu.n_atoms, tu.k_tiles, tu.ld_shape, tu.ld_num)
    ('SM100_128x256x16_F32BF16BF16_SS', 1, 4, '32x32b', 128)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hexlayout.arch import get_atom
from hexlayout.arch.dtypes import E2M1, DType
from hexlayout.arch.sm100 import (
    block_scaled_kind,
    block_scaled_n_values,
    kind_of,
    umma_block_scaled_atom,
    umma_n_values,
)
from hexlayout.arch.tmem import TMEM_COLUMNS, TMEM_SHAPES
from hexlayout.ir.mma_in_flight import MAX_RING
from hexlayout.ir.tile import Mma
from hexlayout.ir.tiled_umma import TiledUmma
from hexlayout.ir.types import Scope
from hexlayout.layout import Layout, size
from hexlayout.layout.tv_maps import fit_tv

from .smem_stage import SmemOperandStage, smem_a_stage
from .tmem_choice import tmem_a_candidates, tmem_epilogue_candidates

__all__ = ["umma_tilings", "umma_candidates", "umma_refusal", "ASourceCost", "a_source_costs",
           "register_a_source", "register_a_refusal", "a_source_comparison", "PairCost", "pair_costs"]

#: epilogue loads offered to the search per atom (best first; ``tmem_choice`` ranks them)
MAX_LOADS = 4
#: TMEM columns one mma's register A may take (the rest of the 512 stay for accumulators)
MAX_A_COLUMNS = 256


@dataclass(frozen=True)
class ASourceCost:
    """What feeding a register A operand to tcgen05.mma costs per execution of the op, per warp:
    instructions besides the MMAs (``moves``: the stores; ``sync``: waits, fences, barriers),
    TMEM columns and shared bytes (per pipeline stage) it occupies."""

    source: str          # "tmem" or "smem"
    moves: int
    sync: int
    tmem_columns: int
    smem_bytes: int
    detail: str

    @property
    def instructions(self) -> int:
        return self.moves + self.sync


def a_source_costs(m: int, k: int, bits: int, threads: int = 128, a_sets: int = 1) -> dict[str, ASourceCost]:
    """The cost model of the module docstring for an ``m x k`` register A of ``bits``-bit elements
    run by ``threads`` threads: ``{"tmem": ..., "smem": ...}`` (a source absent when it cannot
    hold the tile: no ``tcgen05.st`` writes it, no K-major canonical layout holds it); ``a_sets``:
    ``R``, the sets of TMEM columns (or shared buffers) A rotates through, one per execution of the
    op that may be in flight at its store plus one (``ir.mma_in_flight``).

    Example:
        >>> c = a_source_costs(64, 64, 16)
        >>> (c["tmem"].moves, c["tmem"].sync, c["smem"].moves, c["smem"].sync)
        (1, 4, 8, 3)
    """
    out = {}
    stage = smem_a_stage(m, k, bits, threads)
    if stage is not None:
        sts, width = stage.stores, stage.vector_elems * bits
        out["smem"] = ASourceCost("smem", 2 * sts, 3, 0, stage.nbytes * a_sets,
                                  f"{sts} st.shared.b{width} + {sts} address computations per thread, "
                                  "fence.proxy.async, barrier, tcgen05.fence::after_thread_sync")
    cands = tmem_a_candidates(m, k, bits) if threads == 128 else []
    if cands:
        best = cands[0]
        out["tmem"] = ASourceCost("tmem", best.stores, 4, best.columns * a_sets, 0,
                                  f"{best.stores} tcgen05.st.{best.shape}.x{best.num} per warp, wait::st, "
                                  "fence::before_thread_sync, barrier, fence::after_thread_sync")
    return out


@dataclass(frozen=True)
class PairCost:
    """What one CTA of a 2-CTA cluster spends per k-tile on a ``BM x BN x BK`` one-CTA tile: the
    shared bytes of one stage of B, the TMA bytes it loads (A and B) and the ``tcgen05.mma`` it
    issues (``cta_group`` 1: each CTA its own; 2: the pair's, issued by the even CTA; per CTA: half)."""

    cta_group: int
    b_smem_bytes: int
    tma_bytes: int
    mma_issues: float

    def __str__(self) -> str:
        who = "one CTA per MMA" if self.cta_group == 1 else "a pair of CTAs per MMA"
        return (f"cta_group::{self.cta_group} ({who}): B {self.b_smem_bytes} shared bytes a stage, "
                f"{self.tma_bytes} TMA bytes and {self.mma_issues:g} tcgen05.mma per CTA and k-tile")


def pair_costs(bm: int, bn: int, bk: int, bits: int) -> dict[int, PairCost]:
    """The per-CTA costs of the one-CTA MMAs (key 1) and of the pair's (key 2) for a CTA tile of
    ``bm x bn x bk`` with ``bits``-bit operands (module docstring: whether a pair pays).

    Example:
        >>> c = pair_costs(128, 256, 64, 16)
        >>> (c[1].b_smem_bytes, c[2].b_smem_bytes, c[1].tma_bytes, c[2].tma_bytes, c[2].mma_issues)
        (32768, 16384, 49152, 32768, 2.0)
    """
    e = bits // 8
    steps = bk // (256 // bits)
    return {1: PairCost(1, bn * bk * e, (bm + bn) * bk * e, steps),
            2: PairCost(2, bn // 2 * bk * e, (bm + bn // 2) * bk * e, steps / 2)}


def register_a_source(m: int, n: int, k: int, da: DType, db: DType, dc: DType, threads: int,
                      scaled: bool = False, cta_group: int = 1,
                      other_columns: int = 0, a_sets: int = 1) -> tuple[str | None, str]:
    """Where a register A of an ``m x n x k`` tcgen05.mma goes (module docstring): ``("tmem",
    why not shared)``, ``("smem", why not TMEM)`` or ``(None, why neither)``; ``other_columns``: the
    TMEM columns of the kernel's other accumulators; ``a_sets``: the sets of A's ring
    (``a_source_costs``)."""
    if scaled:
        return None, ("a block-scaled tcgen05.mma on a register A is not built (its factors' tcgen05.cp "
                      "reads shared tiles; stage A through a shared tile: hl.copy, then hl.mma on it)")
    if cta_group != 1:
        return None, ("a pair's tcgen05.mma (cta_group::2) on a register A is not built (the odd CTA's "
                      "stores would need a cluster barrier before the even CTA's issue)")
    why = umma_refusal(m, n, k, da, db, dc, threads)
    if why is not None:
        return None, why
    if a_sets > MAX_RING:
        return None, (f"up to {a_sets - 1} earlier executions of the mma may still read A where it runs (no "
                      "wgmma_wait, nor a wait on a barrier its MMAs arrive on at a constant or ring index, "
                      "bounds them), so no ring of TMEM columns or shared buffers holds A: wait for the MMAs "
                      "before the mma runs again")
    costs = a_source_costs(m, k, da.bits, threads, a_sets)
    t, sm = costs.get("tmem"), costs.get("smem")
    if threads != 128:
        why_t = f"{threads} threads: tcgen05.st writes A from one warp group's lanes (128 threads)"
    elif da.bits not in (8, 16):
        why_t = f"{da.name} A: only 8- and 16-bit A operands are read from TMEM"
    elif t is None:
        why_t = f"no tcgen05.st writes a {m}x{k} A operand into TMEM"
    elif t.tmem_columns > MAX_A_COLUMNS or t.tmem_columns + n + other_columns > TMEM_COLUMNS:
        sets = f" ({a_sets} sets of {t.tmem_columns // a_sets}: executions in flight)" if a_sets > 1 else ""
        why_t = (f"A in TMEM needs {t.tmem_columns} columns{sets} beside the accumulators' "
                 f"{n + other_columns} (at most {MAX_A_COLUMNS} for A, {TMEM_COLUMNS} in all)")
    elif sm is not None and t.instructions > sm.instructions:
        why_t = (f"A through TMEM takes {t.instructions} instructions per k-tile, through shared memory "
                 f"{sm.instructions}")
    else:
        return "tmem", ("" if sm is None else f"shared memory takes {sm.instructions} instructions per "
                        f"k-tile, TMEM {t.instructions}")
    if sm is None:
        return None, (f"{why_t}; no K-major canonical shared layout holds a {m}x{k} {da.name} A for "
                      f"{threads} threads")
    return "smem", why_t


def register_a_refusal(m: int, n: int, k: int, da: DType, db: DType, dc: DType, threads: int,
                       scaled: bool = False, cta_group: int = 1, other_columns: int = 0,
                       a_sets: int = 1) -> str | None:
    """Why no tcgen05 tiling takes a register A (None: TMEM or shared memory feeds it;
    ``register_a_source``)."""
    src, why = register_a_source(m, n, k, da, db, dc, threads, scaled, cta_group, other_columns, a_sets)
    return why if src is None else None


def _scale_form(scaled: bool | tuple[str, int]) -> tuple[str, int] | None:
    """``(factor type, VS)`` of a ``scaled`` argument (True: UE8M0 per 32 K elements)."""
    if scaled is True:
        return ("ue8m0", 32)
    return scaled or None


def umma_refusal(m: int, n: int, k: int, da: DType, db: DType, dc: DType, threads: int,
                 scaled: bool | tuple[str, int] = False, cta_group: int = 1) -> str | None:
    """Why no tcgen05 tiling computes an ``m x n x k`` tile (``m`` rows per CTA) for ``threads``
    threads (None: one may); ``scaled``: block-scaled, True or ``(factor type, VS)`` (kind::mxf8f6f4,
    or kind::mxf4 / mxf4nvf4 for e2m1 operands); ``cta_group`` 2: the pair form."""
    form = _scale_form(scaled)
    try:
        kind = block_scaled_kind(da, db, *form) if form else kind_of(da)
    except ValueError as e:
        return str(e)
    if cta_group == 2:
        if scaled:
            return "a block-scaled tcgen05.mma of a pair of CTAs (cta_group::2) is not built"
        if m != 128:
            return (f"M = {m} rows per CTA: the pair's tcgen05.mma (cta_group::2) is built for 128 rows per "
                    "CTA (M = 256 for the pair)")
        if n > 256 or n % 16:
            return (f"N = {n}: the pair's tcgen05.mma computes the pair's B (both halves) in one atom, N a "
                    "multiple of 16 up to 256")
    if form:
        if dc.name != "f32":
            return f"the block-scaled tcgen05.mma (kind::{kind}) accumulates into f32"
        if m != 128:
            return f"M = {m}: the one-CTA block-scaled tcgen05.mma computes M = 128 rows"
        if n % 8:
            return f"N = {n} is not a multiple of 8 (the block-scaled tcgen05.mma's N step)"
    elif da.name != db.name or dc.name != "f32":
        return f"tcgen05.mma kind::{kind} is built for A = B types with an f32 accumulator"
    if cta_group == 1 and m not in (64, 128):
        return f"M = {m}: a one-CTA tcgen05.mma (cta_group::1) computes M = 64 or 128 rows"
    if threads % 128:
        return f"{threads} threads: the accumulator is read from TMEM by whole warp groups (128 threads)"
    if n > TMEM_COLUMNS:
        return f"N = {n}: the f32 accumulator needs {n} TMEM columns, more than the {TMEM_COLUMNS} there are"
    step = 256 // da.bits
    if k % step:
        return f"K = {k} is not a multiple of the atom's K = {step}"
    if n % (threads // 128):
        return f"N = {n} does not split over {threads // 128} warp groups"
    return None


def umma_tilings(m: int, n: int, k: int, da: DType, db: DType, dc: DType, threads: int,
                 majors: tuple[tuple[str, str], ...] = (("K", "K"), ("K", "MN"), ("MN", "K"), ("MN", "MN")),
                 scaled: bool = False, cta_group: int = 1, a_register: bool = False,
                 other_columns: int = 0, a_sets: int = 1) -> list[TiledUmma]:
    """The tcgen05 tilings of the module docstring, best first (empty: see ``umma_refusal``);
    ``m`` rows per CTA, ``cta_group`` 2: the pair's (one atom of the pair's M = 2m, N = n);
    ``a_register``: A is a register tile, written into TMEM (``_TS`` atoms) or staged through
    shared memory (``_SS`` atoms, A K-major) as ``register_a_source`` decides with the kernel's
    other accumulators taking ``other_columns`` TMEM columns and A's ring ``a_sets`` sets."""
    if umma_refusal(m, n, k, da, db, dc, threads, scaled, cta_group) is not None:
        return []
    form = _scale_form(scaled)
    if form and da.bits == 4:                       # e2m1 operands are K-major only
        majors = tuple(mj for mj in majors if mj == ("K", "K"))
    stores: list = [None]
    stage: SmemOperandStage | None = None
    a_tmem = False
    if a_register:
        src, _ = register_a_source(m, n, k, da, db, dc, threads, scaled, cta_group, other_columns, a_sets)
        if src is None:
            return []
        if src == "tmem":
            a_tmem = True
            stores = tmem_a_candidates(m, k, da.bits)[:2]
        else:
            stage = smem_a_stage(m, k, da.bits, threads)
        majors = tuple(dict.fromkeys(("K", bm) for _, bm in majors))
    m_atom = m * cta_group
    if cta_group == 2:
        ns = [n]
    else:
        ns = [x for x in (block_scaled_n_values(1, m) if scaled else umma_n_values(1, m)) if n % x == 0]
    if not ns:
        return []
    atom_n = max(ns)
    groups = threads // 128
    per = n // groups
    pair = "2x1SM_" if cta_group == 2 else ""
    out = []
    for ep in tmem_epilogue_candidates(m_atom, per, cta_group)[:MAX_LOADS]:
        width = TMEM_SHAPES[ep.shape].columns * ep.num
        for chunk in dict.fromkeys((per, width) if groups > 1 else (per,)):
            full = _dealt(ep.register_tv, m, per, groups, chunk)
            if full is None:
                continue
            for am, bm in majors:
                src = "TS" if a_tmem else "SS"
                name = (umma_block_scaled_atom(m_atom, atom_n, da, db, cta_group, scale_type=form[0],
                                               vs=form[1]).name if form else
                        f"SM100_{pair}{m_atom}x{atom_n}x{256 // da.bits}_{dc.cute}{da.cute}{db.cute}_{src}")
                atom = get_atom(name, b_major=bm) if a_tmem else get_atom(name, a_major=am, b_major=bm)
                for a_store in stores:
                    out.append(TiledUmma(atom, n // atom_n, k // atom.shape_mnk[2], threads, ep.shape, ep.num,
                                         ep.origins, full, chunk, a_store=a_store, a_stage=stage,
                                         a_sets=a_sets if a_register else 1))
    return out


def _dealt(tv: Layout, m: int, per: int, groups: int, chunk: int) -> Layout | None:
    """The register TV layout over ``128 * groups`` threads when warp group ``g`` holds, in the
    layout ``tv`` of one group over ``m x per``, the column blocks ``g, g + groups, ...`` of
    ``chunk`` columns: group column ``c`` is tile column ``(c // chunk) * chunk * groups +
    g * chunk + c % chunk`` (None: not a layout)."""
    if groups == 1:
        return tv
    idx = _table(tv)
    i, c = idx % m, idx // m
    out = np.concatenate([i + m * ((c // chunk) * chunk * groups + g * chunk + c % chunk)
                          for g in range(groups)], axis=0)
    return fit_tv(out)


def _table(tv: Layout) -> np.ndarray:
    """``[thread, value]`` of a TV layout's values."""
    t, v = size(tv[0]), size(tv[1])
    return np.asarray(tv.indices(), dtype=np.int64).reshape(v, t).T


def umma_candidates(op: Mma, threads: int, other_columns: int = 0, a_sets: int = 1) -> list[TiledUmma]:
    """The tcgen05 tilings of ``op`` run by ``threads`` threads: B in shared memory, A in shared
    memory or a register tile fed through TMEM or shared memory (module docstring; the kernel's
    other accumulators take ``other_columns`` TMEM columns, a register A's ring ``a_sets`` sets), no
    atom given (``atom=`` names an
    mma.sync / wgmma atom, not built on sm_100a); the pair's (``cta_group::2``) when ``c`` has
    twice ``b``'s rows."""
    a, b, c = op.a.type, op.b.type, op.c.type
    if a.scope not in (Scope.SHARED, Scope.REGISTER) or b.scope != Scope.SHARED or c.scope != Scope.REGISTER \
            or op.atom is not None:
        return []
    m = a.shape[0]
    da, db, k, form = operand_form(op)
    group = 2 if c.shape[1] == 2 * b.shape[0] else 1
    return umma_tilings(m, c.shape[1], k, da, db, c.dtype, threads, scaled=form or False,
                        cta_group=group, a_register=a.scope == Scope.REGISTER, other_columns=other_columns,
                        a_sets=a_sets)


def operand_form(op: Mma) -> tuple[DType, DType, int, tuple[str, int] | None]:
    """``(A type, B type, K, block scale)`` of ``op``: packed e2m1 operands (``op.packed``) are
    ``u8`` tiles of ``K / 2`` bytes a row (``arch.fp4``); the block scale ``(factor type, VS)``:
    ``ue4m3`` for ``ue4m3`` scale tiles, else ``ue8m0``, and ``VS = K /`` the scale tile's columns
    (None: not block-scaled)."""
    a, b = op.a.type, op.b.type
    packed = getattr(op, "packed", None)
    da, db = (E2M1, E2M1) if packed == "e2m1" else (a.dtype, b.dtype)
    k = a.shape[1] * (2 if packed == "e2m1" else 1)
    if op.scale_a is None:
        return da, db, k, None
    st = op.scale_a.type
    return da, db, k, ("ue4m3" if st.dtype.name == "ue4m3" else "ue8m0", k // max(1, st.shape[1]))


def a_source_comparison(tu: TiledUmma) -> str:
    """Why ``tu`` feeds its register A through TMEM rather than shared memory, or the reverse: the
    cost model's numbers for both (``explain`` shows it beside the choice)."""
    m, _, k = tu.tile_mnk
    c = a_source_costs(m, k, tu.atom.a_dtype.bits, tu.threads, tu.a_sets)
    t, sm = c.get("tmem"), c.get("smem")
    ring = f" in {tu.a_sets} sets" if tu.a_sets > 1 else ""
    shared = (f"{sm.instructions} instructions ({sm.detail}; {sm.smem_bytes} bytes{ring or ' per stage'})"
              if sm is not None else "none (no K-major canonical layout holds it)")
    tmem = (f"{t.instructions} ({t.detail}; {t.tmem_columns} columns{ring})" if t is not None
            else "none (no tcgen05.st writes it from these threads)")
    if tu.a_store is not None:
        return f"A source by cost per k-tile and warp: shared memory {shared} against TMEM's {tmem}"
    return f"A source by cost per k-tile and warp: TMEM {tmem} against shared memory's {shared}"
