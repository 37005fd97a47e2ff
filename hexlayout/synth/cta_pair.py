"""Synthesized 2-CTA tile pairs (sm_100a): a one-CTA ``hl.mma`` of a 2-CTA cluster whose two CTAs
load the same B tile becomes one ``tcgen05.mma.cta_group::2`` per pair, each CTA staging half of B.

A kernel of ``(2, 1, 1)`` clusters in which each CTA runs ``c[128, N] (+)= a[128, K] @ b[N, K]^T`` with
its own 128 rows of A and a B tile both CTAs load at the same coordinates computes, per pair, exactly
what one ``tcgen05.mma.cta_group::2`` of ``M = 256`` computes when CTA ``r`` stages only rows ``r N / 2
..`` of B (``ir.tiled_umma``: the pair form of ``hl.mma``, ``b`` of ``N / 2`` rows, ``c`` of ``N``
columns). ``pair_rewrite`` finds that pattern and rewrites a copy of the program into the pair form
(the program given is never changed):

* every B shared buffer's N mode is halved (the buffer and all its views);
* each TMA load of B both CTAs issue (a global view at origin ``(n0, ..)``, extent ``e``) loads rows
  ``n0 + r N / 2`` (``r`` the cluster rank), extent ``min(e - r N / 2, N / 2)``;
* a multicast load of B (the sm_90a cluster idiom: CTA ``r``, in a branch on the rank, loads rows
  ``lo ..`` of B's tile into both CTAs, ``lo`` in its half) loads them into its own CTA only, at row
  ``lo - r N / 2`` of its half;
* every TMA load completing on a barrier of the B loads (the stage's ``full`` barriers; A's loads must
  complete there too) completes on the even CTA's barrier (``pair_barrier``, the bytes of both CTAs);
* an ``arrive.expect_tx`` on those barriers expecting ``t`` bytes (``t`` = the bytes of its loads, A's
  ``t_A`` and B's ``t_B``) is made by the even CTA only, expecting ``2 t_A + t_B`` (both CTAs' A, the
  pair's B once);
* a wait on those barriers is the even CTA's only: the odd CTA's threads that waited there run the
  ``hl.mma`` (which issues nothing on the odd CTA) and then wait for the pair's commit as before
  (``wgmma_commit`` / ``arrive(who="mma")``: the even CTA's ``tcgen05.commit`` multicast to both CTAs,
  ``ir.lower.umma``), so every program wait after the MMAs stays correct in both CTAs.

The class covered (anything else keeps ``cta_group::1`` with the reason in ``explain``): sm_100a, a
kernel of ``(2, 1, 1)`` clusters; every ``hl.mma`` on shared operands has 128 rows of A per CTA, ``N``
(the accumulator's columns = B's rows) a multiple of 32 up to 256, 16-bit or 8-bit operands without
block scales; B is a view of a shared buffer (its N mode whole: slices and transposes only) with no
given layout that only those mmas read and only TMA loads (``mbarrier=``, no mask) write, each from
a global view read by nothing else whose origin and extent, like the bounds and conditions of every
loop and branch around the loads and the mmas, do not depend on the cluster rank (the block index
``x`` appears only under ``// c`` with ``c`` even: both CTAs of a cluster, blocks ``2j`` and ``2j +
1``, see the same value) - or multicast loads into both CTAs, each issued by one rank (a branch whose
condition is constant for each rank) into a constant window of rows of that rank's half, the windows
of each rank covering its half once, and the B row of buffer row 0 (the origin less the window's
first row) not depending on the rank; A's buffer (not B's) is written by TMA loads only, none
multicast; the
loads' barriers hold nothing but A and B loads and every ``expect_tx`` on them expects exactly the
bytes of their loads; a ``hl.cluster_sync()`` follows the barriers' initialization (the odd CTA's
loads complete on the even CTA's barriers); a loop that issues MMAs into an accumulator and also reads
it (a loop over tiles: the epilogue of tile ``t`` before the MMAs of tile ``t + 1``) is run by the
MMAs' threads alone (no warp roles inside), and gets a barrier ``pair_acc_free`` of the even CTA that
the odd CTA arrives on when its iteration ends and the even CTA waits on before the next one's MMAs
overwrite the odd CTA's accumulator (the pair GEMM's ``acc_free``, ``_free_accumulators``); and where
the MMAs are
waited for inside their loop, no MMA releases a stage (``arrive(who="mma")``): the odd CTA's waits
are then paced by its own stage releases, and the lowering gives the pair as many commit barriers
as that ring has stages (``ir.lower.umma``).

Whether the pair pays is ``umma_choice.pair_costs``: never more shared bytes, TMA bytes or MMA issues
per CTA, so it is taken wherever the class holds; a rewritten program that does not synthesize (no
shared layout the pair's descriptors accept, e.g.) falls back to the one-CTA program with the error
as the reason (``hexlayout.synth.solve.synthesize``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

from hexlayout.ir.expr import (
    BinOp,
    Expr,
    ExprLike,
    Select,
    UnOp,
    Var,
    as_expr,
    const_value,
    emin,
    is_const,
    substitute,
)
from hexlayout.ir.tile import (
    Alloc,
    Block,
    ClusterSync,
    Copy,
    For,
    GlobalView,
    If,
    Mbarrier,
    MbarrierArrive,
    MbarrierInit,
    MbarrierWait,
    Mma,
    Op,
    Permute,
    Slice,
    TileKernel,
    Value,
    WgmmaWait,
)
from hexlayout.ir.types import Scope
from hexlayout.ir.walk import Visit, walk_with_context

from .shared import root_mode_map, uses_of
from .umma_choice import PairCost, pair_costs

__all__ = ["PairChoice", "pair_rewrite"]

_PAIR_CLUSTERS = ((2,), (2, 1), (2, 1, 1))


@dataclass
class PairChoice:
    """Whether the kernel's mmas became a 2-CTA pair: ``paired``, ``reason`` (why not, or what was
    rewritten), the first mma concerned and the per-CTA costs of both forms (``pair_costs``)."""

    paired: bool
    reason: str
    mma: Mma | None = None
    costs: dict[int, PairCost] = field(default_factory=dict)

    def refused(self, reason: str) -> PairChoice:
        return PairChoice(False, reason, self.mma, self.costs)


class _Refused(Exception):
    pass


def _loc(op: Op | None) -> str:
    return f" at {op.loc}" if op is not None and op.loc is not None else ""


def _rank_free(e: ExprLike, bx: Var) -> bool:
    """Whether ``e`` provably has the same value in both CTAs of a ``(2, 1, 1)`` cluster (blocks
    ``2j`` and ``2j + 1`` along x): ``bx`` appears only as ``bx // c`` with ``c`` even."""
    if not isinstance(e, Expr):
        return True
    if isinstance(e, Var):
        return e != bx
    if isinstance(e, BinOp):
        if e.op == "//" and isinstance(e.a, Var) and e.a == bx and is_const(e.b):
            return const_value(e.b) % 2 == 0
        return _rank_free(e.a, bx) and _rank_free(e.b, bx)
    if isinstance(e, UnOp):
        return _rank_free(e.a, bx)
    if isinstance(e, Select):
        return all(_rank_free(x, bx) for x in (e.cond, e.a, e.b))
    return is_const(e)          # a run-time register value (RegRead): not known to be the same


def _context_rank_free(v: Visit, bx: Var, skip_rank_tests: bool = False) -> str | None:
    """Why the loops and branches around ``v.op`` may differ between the CTAs (None: they do not;
    ``skip_rank_tests``: branches that test the rank itself are ``_branch_rank``'s)."""
    for p in v.parents:
        if isinstance(p, If) and p.warp_groups is None and not _rank_free(p.cond, bx) and not (
                skip_rank_tests and is_const(substitute(p.cond, {bx: 2 * Var("cluster", lo=0)}))):
            return f"the branch{_loc(p)} (if {p.cond}) depends on the cluster rank"
        if hasattr(p, "start") and not (_rank_free(p.start, bx) and _rank_free(p.stop, bx)):
            return f"the loop{_loc(p)} runs a number of times that depends on the cluster rank"
    return None


def _view_chain(v: Value, defs: dict[int, Op]) -> list[Op]:
    """The view ops from ``v``'s root buffer to ``v``."""
    out = []
    while v.base is not None:
        op = defs.get(v.id)
        if op is None:
            break
        out.append(op)
        v = op.src       # type: ignore[attr-defined]
    return out[::-1]


def _whole_n(v: Value, nmode: int, defs: dict[int, Op], modes: dict) -> bool:
    """Whether the view ``v`` keeps its root's mode ``nmode`` whole (only slices of other modes and
    transposes between them)."""
    if v.base is None:
        return True
    if not all(isinstance(o, (Slice, Permute)) for o in _view_chain(v, defs)):
        return False
    return nmode in modes.get(v.id, (None, []))[1]


def _nbytes(v: Value) -> int:
    return v.type.size * v.type.dtype.bits // 8


def _plan(tk: TileKernel) -> tuple[list[Mma], dict[int, int], dict[str, tuple[int, int]],
                                   dict[int, tuple[int, int, int]], list[int]]:
    """The analysis of the module docstring: the mmas, the B buffers (root id -> N mode), the
    loads' barriers (name -> (A bytes, B bytes) of their loads) and the multicast loads of B (uid ->
    (the rank issuing it, its first row of B, its rows)) and the tile loops (``_tile_loops``);
    ``_Refused`` with the reason."""
    visits = {v.op.uid: v for v in walk_with_context(tk)}
    ops = [v.op for v in visits.values()]
    bx = tk.launch.block_index[0]
    mmas = [o for o in ops if isinstance(o, Mma)]
    defs = {o.result.id: o for o in ops if isinstance(o, (Slice, Permute)) or type(o).__name__ == "SubTile"}
    modes = root_mode_map(tk)
    uses = uses_of(tk)
    gviews = {o.result.id: o for o in ops if isinstance(o, GlobalView)}
    b_roots, a_roots = _operand_roots(mmas, modes, defs, visits, bx)
    if set(b_roots) & a_roots:
        raise _Refused("a shared tile is both an A and a B operand")
    bars, halves = _operand_loads(tk, ops, mmas, b_roots, a_roots, uses, gviews, defs, modes, visits, bx)
    b_bars = {id(c.mbarrier) for rid in b_roots for c in uses.get(rid, []) if isinstance(c, Copy)}
    out = _barrier_bytes(tk, ops, bars, b_bars, a_roots, b_roots, uses)
    _check_prologue(tk, b_bars)
    loops = _tile_loops(tk, mmas, visits)
    _check_pacing(tk, mmas, visits)
    return mmas, b_roots, out, halves, loops


def _operand_roots(mmas: list[Mma], modes: Any, defs: dict[int, Any], visits: dict[int, Visit],
                   bx: Var) -> tuple[dict[int, int], set[int]]:
    """The shared tiles the mmas read: B's (root id -> its N mode) and A's; ``_Refused`` when an
    mma is outside the pair's class."""
    b_roots: dict[int, int] = {}
    a_roots: set[int] = set()
    for op in mmas:
        m, k = op.a.type.shape
        n = op.c.type.shape[1]
        if op.scale_a is not None:
            raise _Refused(f"the mma{_loc(op)} is block-scaled: a pair's block-scaled tcgen05.mma is not "
                           "built")
        if op.atom is not None:
            raise _Refused(f"the mma{_loc(op)} names its atom ({op.atom})")
        if m != 128:
            raise _Refused(f"the mma{_loc(op)} has M = {m} rows of A per CTA; the pair's tcgen05.mma takes "
                           "128 per CTA (M = 256 for the pair)")
        if n % 32 or n > 256 or op.b.type.shape[0] != n:
            raise _Refused(f"the mma{_loc(op)} has N = {n}: a pair splits B's N rows in two halves of N / 2 "
                           "(N a multiple of 32 up to 256, one atom)")
        if op.a.type.dtype.bits not in (8, 16) or op.c.type.dtype.name != "f32":
            raise _Refused(f"the mma{_loc(op)}: the pair is built for 8- and 16-bit operands into f32")
        root, bm = modes.get(op.b.id, (op.b, [0, 1]))
        nmode = bm[0]
        if root.type.has_layout:
            raise _Refused(f"B's shared tile %{root.name} has a given layout ({root.type.layout}): the pair "
                           "stages half of it in a layout synthesis chooses")
        if not _whole_n(op.b, nmode, defs, modes) or root.type.shape[nmode] != n:
            raise _Refused(f"the mma's B %{op.b.name}{_loc(op)} is not a whole-N view of its shared tile "
                           f"%{root.name}")
        if b_roots.get(root.id, nmode) != nmode:
            raise _Refused(f"B's shared tile %{root.name} is read with N along two modes")
        b_roots[root.id] = nmode
        a_roots.add(op.a.root.id)
        why = _context_rank_free(visits[op.uid], bx)
        if why is not None:
            raise _Refused(f"the mma{_loc(op)}: {why}")
    return b_roots, a_roots


def _operand_loads(tk: TileKernel, ops: list[Op], mmas: list[Mma], b_roots: dict[int, int],
                   a_roots: set[int], uses: Any, gviews: dict[int, Any], defs: dict[int, Any], modes: Any,
                   visits: dict[int, Visit], bx: Var) -> tuple[dict[int, tuple[Mbarrier, list[Copy]]],
                                                                dict[int, tuple[int, int, int]]]:
    """The TMA loads into the operands' shared tiles by barrier, and the multicast loads of B
    (uid -> (the rank issuing it, its first row of B, its rows)); ``_Refused`` when a load is outside
    the pair's class."""
    bars: dict[int, tuple[Mbarrier, list[Copy]]] = {}
    halves: dict[int, tuple[int, int, int]] = {}      # multicast load uid -> (rank, first row, rows)
    windows: dict[tuple[int, int], list[tuple[int, int]]] = {}
    root_of = {v.root.id: v.root for o in ops for v in o.values()}
    for rid in list(b_roots) + sorted(a_roots):
        is_b = rid in b_roots
        for op in uses.get(rid, []):
            if isinstance(op, Alloc) or (isinstance(op, Mma) and op in mmas
                                         and (op.b.root.id if is_b else op.a.root.id) == rid
                                         and (op.a.root.id if is_b else op.b.root.id) != rid):
                continue
            if not (isinstance(op, Copy) and op.dst.root.id == rid and op.src.id in gviews):
                raise _Refused(f"{op.name}{_loc(op)} reads or writes the mma operand's shared tile "
                               f"%{op.values()[0].root.name if op.values() else '?'} (only the mmas may read "
                               "it and TMA loads write it)")
            if not isinstance(op.mbarrier, Mbarrier) or op.mask is not None or op.pair_barrier:
                raise _Refused(f"the copy{_loc(op)} into the mma operand's shared tile is not a TMA load "
                               "completing on an mbarrier")
            bars.setdefault(id(op.mbarrier), (op.mbarrier, []))[1].append(op)
            if op.multicast is not None:
                if not is_b:
                    raise _Refused(f"the load of A{_loc(op)} is a multicast TMA: each CTA of a pair has its "
                                   "own rows of A")
                half = _multicast_half(op, b_roots[rid], visits[op.uid], gviews[op.src.id], defs, bx)
                halves[op.uid] = half
                windows.setdefault((rid, half[0]), []).append(half[1:])
            elif is_b:
                gv = gviews[op.src.id]
                whole = _whole_n(op.dst, b_roots[rid], defs, modes)
                if not whole or len(gv.origin) != len(op.src.type.shape):
                    raise _Refused(f"the load of B{_loc(op)} does not write whole rows of its N mode")
                exprs = list(gv.origin) + list(gv.extent)
                if not all(_rank_free(e, bx) for e in exprs):
                    raise _Refused(f"the load of B{_loc(op)} reads coordinates that depend on the cluster "
                                   f"rank ({', '.join(str(e) for e in gv.origin)}): the CTAs do not share "
                                   "its B tile")
                if sum(1 for o in ops if gv.result in o.inputs()) != 1:
                    raise _Refused(f"the global view of B{_loc(gv)} is read by more than its load")
                why = _context_rank_free(visits[op.uid], bx)
                if why is not None:
                    raise _Refused(f"the load of B{_loc(op)}: {why}")
    for (rid, r), ws in windows.items():
        half = root_of[rid].type.shape[b_roots[rid]] // 2
        ws.sort()
        if any(lo < r * half or lo + h > (r + 1) * half for lo, h in ws) or \
                any(a[0] + a[1] > b[0] for a, b in zip(ws, ws[1:])) or sum(h for _, h in ws) != half:
            raise _Refused(f"the multicast loads of CTA {r} into B's shared tile %{root_of[rid].name} write "
                           f"rows {[(lo, lo + h) for lo, h in ws]}, not its half of the pair's B "
                           f"({r * half} .. {(r + 1) * half}) once")
    if {rid for rid, _ in windows} and len({r for _, r in windows}) != 2:
        raise _Refused("the multicast loads of B are issued by one CTA of the cluster only")
    return bars, halves


def _barrier_bytes(tk: TileKernel, ops: list[Op], bars: dict[int, tuple[Mbarrier, list[Copy]]],
                   b_bars: set[int], a_roots: set[int], b_roots: dict[int, int],
                   uses: Any) -> dict[str, tuple[int, int]]:
    """The stage barriers' loads: name -> (A bytes, B bytes); ``_Refused`` when A's loads complete
    elsewhere, a barrier completes other copies or an arrive expects other bytes."""
    a_bars = {id(c.mbarrier) for rid in a_roots for c in uses.get(rid, []) if isinstance(c, Copy)}
    if not b_bars or a_bars - b_bars:
        raise _Refused("A's loads do not complete on the barriers of B's loads (the even CTA could not "
                       "wait for the odd CTA's A before the pair's MMA)")
    if len({b.name for b in tk.mbarriers}) != len(tk.mbarriers):
        raise _Refused("two mbarriers of the kernel share a name")
    out: dict[str, tuple[int, int]] = {}
    for key in b_bars:
        bar, copies = bars[key]
        others = [o for o in ops if isinstance(o, Copy) and o.mbarrier is bar and o not in copies]
        if others:
            raise _Refused(f"the barrier %{bar.name} also completes the copy{_loc(others[0])}")
        a_bytes = sum(_nbytes(c.dst) for c in copies if c.dst.root.id in a_roots)
        b_bytes = sum(_nbytes(c.dst) for c in copies if c.dst.root.id in b_roots)
        for o in ops:
            if isinstance(o, MbarrierArrive) and o.bar is bar and o.tx_bytes not in (0, a_bytes + b_bytes):
                raise _Refused(f"the arrive on %{bar.name}{_loc(o)} expects {o.tx_bytes} bytes, its loads "
                               f"bring {a_bytes + b_bytes}")
            if isinstance(o, MbarrierArrive) and o.bar is bar and o.cta is not None:
                raise _Refused(f"the arrive on %{bar.name}{_loc(o)} goes to another CTA")
        out[bar.name] = (a_bytes, b_bytes)
    return out


def _branch_rank(v: Visit, bx: Var) -> tuple[int | None, str | None]:
    """The one cluster rank that runs ``v.op`` when a branch around it tests the rank (``None``: both
    run it), or the reason it is not known."""
    q = Var("cluster", lo=0)
    runs = [True, True]
    for p in v.parents:
        if not isinstance(p, If) or p.warp_groups is not None or _rank_free(p.cond, bx):
            continue
        then = any(o is v.op for o in p.then_body.walk())
        for r in (0, 1):
            c = substitute(p.cond, {bx: 2 * q + r})
            if not is_const(c):
                return None, f"the branch{_loc(p)} (if {p.cond}) is not a test of the cluster rank"
            runs[r] = runs[r] and bool(const_value(c)) == then
    if runs == [True, True]:
        return None, None
    if runs == [False, False]:
        return None, "no CTA runs it"
    return runs.index(True), None


def _multicast_half(op: Copy, nmode: int, v: Visit, gv: GlobalView, defs: dict[int, Op],
                    bx: Var) -> tuple[int, int, int]:
    """(rank, first row, rows) of a multicast load of B into both CTAs: the rank that issues it (a
    branch on the rank around it), the window of B's N mode it writes (a constant ``SubTile`` offset),
    and the check that the B row of buffer row ``j`` (its global origin less the window's first row,
    plus ``j``) does not depend on the rank; ``_Refused`` otherwise."""
    if not is_const(op.multicast) or const_value(op.multicast) != 3:
        raise _Refused(f"the multicast load of B{_loc(op)} writes CTAs {op.multicast}, not both of the pair")
    r, why = _branch_rank(v, bx)
    if r is None:
        raise _Refused(f"the multicast load of B{_loc(op)}: {why or 'both CTAs issue it'} (each CTA of the "
                       "pair loads its own half)")
    chain = _view_chain(op.dst, defs)
    if not chain or type(chain[0]).__name__ != "SubTile" or \
            not all(isinstance(o, (Slice, Permute)) for o in chain[1:]):
        raise _Refused(f"the multicast load of B{_loc(op)} does not write a window of rows of B's shared "
                       "tile")
    sub = chain[0]
    off = sub.offset[nmode]      # type: ignore[attr-defined]
    rows = sub.result.type.shape[nmode]
    if not is_const(off):
        raise _Refused(f"the multicast load of B{_loc(op)} writes rows from {off}, not a constant")
    dm = list(range(len(sub.result.type.shape)))
    for o in chain[1:]:
        if isinstance(o, Slice):
            dm = [m for m, i in zip(dm, o.index) if i is None]
        else:
            dm = [dm[p] for p in o.perm]      # type: ignore[attr-defined]
    if nmode not in dm or len(gv.origin) != len(dm):
        raise _Refused(f"the multicast load of B{_loc(op)} does not write whole rows of its N mode")
    i = dm.index(nmode)
    base = [as_expr(e) - (const_value(off) if j == i else 0) for j, e in enumerate(gv.origin)]
    if not all(_rank_free(e, bx) for e in base):
        raise _Refused(f"the multicast loads of B{_loc(op)} read rows that depend on the cluster rank "
                       f"(row 0 of the tile at {', '.join(str(e) for e in base)})")
    why = _context_rank_free(v, bx, skip_rank_tests=True)
    if why is not None:
        raise _Refused(f"the load of B{_loc(op)}: {why}")
    return r, const_value(off), rows


def _check_pacing(tk: TileKernel, mmas: list[Mma], visits: dict[int, Visit]) -> None:
    """The odd CTA's waits for the MMAs inside their loop are paced by its own stage releases: refused
    when the MMAs release stages themselves (``arrive(who="mma")``), which would let the even CTA
    run unboundedly many commits ahead of them."""
    mma_release = next((o for o in tk.body.walk() if isinstance(o, MbarrierArrive) and o.who == "mma"), None)
    if mma_release is None:
        return
    for op in mmas:
        for loop in visits[op.uid].loops:
            wait = next((o for o in loop.body.walk() if isinstance(o, WgmmaWait)), None)
            if wait is not None:
                raise _Refused(f"the MMAs release stages themselves (arrive(who=\"mma\"){_loc(mma_release)}) "
                               f"and are waited for in their loop{_loc(wait)}: nothing would keep the odd "
                               "CTA's waits within the commit barriers of the even CTA's commits")


def _check_prologue(tk: TileKernel, bars: set[int]) -> None:
    """A ``hl.cluster_sync()`` follows the last initialization of the loads' barriers (top level)."""
    last = max((i for i, o in enumerate(tk.body.ops) if isinstance(o, MbarrierInit) and id(o.bar) in bars),
               default=None)
    if last is None or not any(isinstance(o, ClusterSync) for o in tk.body.ops[last:]):
        raise _Refused("no hl.cluster_sync() follows the initialization of the loads' barriers (the odd "
                       "CTA's loads complete on the even CTA's barriers)")


def _tile_loops(tk: TileKernel, mmas: list[Mma], visits: dict[int, Visit]) -> list[int]:
    """The loops (uids) that issue MMAs into an accumulator and also read or write it otherwise: a
    loop over tiles, whose next MMAs must wait until the odd CTA's epilogue read its accumulator
    (``_free_accumulators``). Refused where that is not one loop run by the threads of the MMAs (a
    warp-group branch inside it: the MMAs and the epilogue in different roles)."""
    out: list[int] = []
    for op in mmas:
        rid = op.c.root.id
        hits = []
        for loop in visits[op.uid].loops:
            if is_const(loop.start) and is_const(loop.stop) and \
                    const_value(loop.stop) - const_value(loop.start) <= loop.step:
                continue            # runs at most once
            if any(not isinstance(o, Mma) and any(v.root.id == rid for v in o.values())
                   for o in loop.body.walk()):
                hits.append(loop)
        if len(hits) > 1:
            raise _Refused(f"the accumulator %{op.c.name} is read or written in two nested loops"
                           f"{_loc(hits[0])} that issue its MMAs")
        for loop in hits:
            if any(isinstance(o, If) and o.warp_groups for o in loop.body.walk()):
                raise _Refused(f"the accumulator %{op.c.name} is read in the loop{_loc(loop)} that issues "
                               "its next MMAs by other warp roles (write the pair form, ordering them with a "
                               "barrier)")
            if loop.uid not in out:
                out.append(loop.uid)
    return out


def _free_accumulators(tk: TileKernel, loops: list[int], even: Expr) -> None:
    """For each tile loop (``_tile_loops``): a barrier ``pair_acc_free<i>`` of the even CTA (1 arrival)
    the odd CTA arrives on at the end of every iteration but the last (its epilogue has read the
    accumulator), and the even CTA waits on at the start of every iteration but the first, before
    the iteration's MMAs may overwrite the odd CTA's accumulator (the pair GEMM's ``acc_free``)."""
    sync = next(i for i, o in enumerate(tk.body.ops) if isinstance(o, ClusterSync)
                and not any(isinstance(x, MbarrierInit) for x in tk.body.ops[i:]))
    found = [o for o in tk.body.walk() if isinstance(o, For) and o.uid in loops]
    for n, loop in enumerate(found):
        bar = Mbarrier(f"pair_acc_free{n}", 1, loc=loop.loc)
        tk.mbarriers.append(bar)
        tk.body.ops.insert(sync, MbarrierInit(bar, 0, 1, loc=loop.loc))
        sync += 1
        it = (as_expr(loop.var) - loop.start) // loop.step
        wait = MbarrierWait(bar, 0, (it - 1) % 2, loc=loop.loc)
        arrive = MbarrierArrive(bar, 0, who="one", cta=0, loc=loop.loc)
        loop.body.ops.insert(0, If((as_expr(loop.var) > loop.start) & even, Block([wait]), loc=loop.loc))
        last = as_expr(loop.var) + loop.step < loop.stop
        loop.body.ops.append(If(last & even.logical_not(), Block([arrive]), loc=loop.loc))


def pair_rewrite(tk: TileKernel, arch: str) -> tuple[TileKernel | None, PairChoice | None]:
    """The pair form of ``tk`` (a rewritten copy) and the choice, or ``(None, choice)`` with the reason
    it is not paired, or ``(None, None)`` where there is nothing to decide (not sm_100a, not a kernel of
    2-CTA clusters, no mma on shared operands, or the program already in the pair form)."""
    if arch != "sm_100a" or tuple(tk.launch.cluster or ()) not in _PAIR_CLUSTERS or not tk.launch.block_index:
        return None, None
    mmas = [o for o in tk.body.walk() if isinstance(o, Mma)
            and o.a.type.scope == Scope.SHARED and o.b.type.scope == Scope.SHARED]
    if not mmas or any(o.c.type.shape[1] == 2 * o.b.type.shape[0] for o in mmas):
        return None, None
    first = mmas[0]
    m, k = first.a.type.shape
    costs = pair_costs(m, first.c.type.shape[1], k, first.a.type.dtype.bits)
    choice = PairChoice(False, "", first, costs)
    if any(o.a.type.scope != Scope.SHARED for o in tk.body.walk() if isinstance(o, Mma)):
        return None, choice.refused("an mma of the kernel reads a register A (every tcgen05.mma of a kernel "
                                    "takes one cta_group)")
    try:
        _, b_roots, bars, mcast, loops = _plan(tk)
    except _Refused as e:
        return None, choice.refused(str(e))
    out = copy.deepcopy(tk)            # op uids and value ids kept
    _rewrite(out, b_roots, bars, mcast)
    _free_accumulators(out, loops, (as_expr(out.launch.block_index[0]) % 2).eq(0))
    n = first.c.type.shape[1]
    why = (f"both CTAs of each cluster load the same {n}-row B tile: each stages its half ({n // 2} rows), "
           "the even CTA issues tcgen05.mma.cta_group::2 for both")
    return out, PairChoice(True, why, first, costs)


def _rewrite(tk: TileKernel, b_roots: dict[int, int], bars: dict[str, tuple[int, int]],
             mcast: dict[int, tuple[int, int, int]]) -> None:
    """The pair form (module docstring), in place on ``tk`` (a copy)."""
    modes = root_mode_map(tk)
    defs = {o.result.id: o for o in tk.body.walk()
            if isinstance(o, (Slice, Permute)) or type(o).__name__ == "SubTile"}
    bx = tk.launch.block_index[0]
    rank = as_expr(bx) % 2
    even = rank.eq(0)
    ops = list(tk.body.walk())
    # B buffers and their views: the N mode halved
    roots = {v.root.id: v.root for o in ops for v in o.values() if v.root.id in b_roots}
    halves = {rid: r.type.shape[b_roots[rid]] // 2 for rid, r in roots.items()}
    seen: set[int] = set()
    for o in ops:
        for v in o.values():
            rid = v.root.id
            if rid not in b_roots or v.id in seen:
                continue
            seen.add(v.id)
            if any(type(d).__name__ == "SubTile" for d in _view_chain(v, defs)):
                continue            # a window of rows (a multicast load's): its rows stay
            nmode = b_roots[rid]
            vm = list(range(len(v.type.shape))) if v.base is None else modes[v.id][1]
            shape = tuple(s // 2 if m == nmode else s for s, m in zip(v.type.shape, vm))
            v.type = replace(v.type, shape=shape)
    for o in ops:
        if isinstance(o, Copy) and o.uid in mcast:       # CTA r's rows r H .. go to rows 0 .. of its half
            r = mcast[o.uid][0]
            sub = _view_chain(o.dst, defs)[0]
            nmode = b_roots[o.dst.root.id]
            sub.offset = tuple(as_expr(x) - r * halves[o.dst.root.id] if j == nmode else x  # type: ignore
                               for j, x in enumerate(sub.offset))   # type: ignore[attr-defined]
            o.multicast = None
        elif isinstance(o, Copy) and o.dst.root.id in b_roots:
            half = halves[o.dst.root.id]
            nmode = b_roots[o.dst.root.id]
            dm = list(range(len(o.dst.type.shape))) if o.dst.base is None else modes[o.dst.id][1]
            i = dm.index(nmode)
            gv = next(g for g in ops if isinstance(g, GlobalView) and g.result is o.src)
            origin, extent = list(gv.origin), list(gv.extent)
            origin[i] = as_expr(origin[i]) + rank * half
            extent[i] = emin(as_expr(extent[i]) - rank * half, half)
            gv.origin, gv.extent = tuple(origin), tuple(extent)
            gv.result.type = replace(gv.result.type, shape=tuple(half if j == i else s for j, s in
                                                                  enumerate(gv.result.type.shape)))
    # the loads' barriers (named as in the original: the copy's objects are new)
    for o in ops:
        if isinstance(o, Copy) and isinstance(o.mbarrier, Mbarrier) and o.mbarrier.name in bars:
            o.pair_barrier = True
    _guard(tk.body, bars, even)


def _guard(block: Block, bars: dict[str, tuple[int, int]], even: Expr) -> None:
    """Waits on the loads' barriers and their ``expect_tx`` arrives: the even CTA's only, expecting both
    CTAs' A and the pair's B once."""
    for i, o in enumerate(block.ops):
        if isinstance(o, MbarrierWait) and o.bar.name in bars:
            block.ops[i] = If(even, Block([o]), loc=o.loc)
        elif isinstance(o, MbarrierArrive) and o.bar.name in bars and o.tx_bytes:
            a, b = bars[o.bar.name]
            o.tx_bytes = 2 * a + b
            block.ops[i] = If(even, Block([o]), loc=o.loc)
        else:
            for nested in o.blocks():
                _guard(nested, bars, even)
