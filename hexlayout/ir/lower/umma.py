"""Lowering of an ``mma`` to ``tcgen05.mma`` (sm_100a): the accumulator in tensor memory.

Under a ``TiledUmma`` choice (``hexlayout.ir.tiled_umma``) the lowering owns everything
Blackwell-specific, so a kernel written for sm_90a (``hl.mma`` on shared tiles, wgmma fence /
commit / wait) runs unchanged:

* **TMEM allocation**: the accumulators of the kernel's tcgen05 mmas get consecutive column
  ranges (``N`` columns each, in order of lowering) of one allocation of ``ncols`` = the next
  power of two >= max(32, total) columns. The kernel starts with warp 0 allocating them
  (``tcgen05.alloc`` writes the address to a shared word) and relinquishing the allocation
  permit, a fenced block barrier, and every thread reading the address into ``tmem_base``;
  it ends with a fenced block barrier and warp 0's ``tcgen05.dealloc``.
* **A from TMEM** (``TiledUmma.a_store``: ``a`` is a register tile, a ``_TS`` atom): each such op
  gets ``R`` sets of ``a_columns`` TMEM columns (after the columns allocated so far), ``R`` = one
  more than the most executions of the op whose MMAs may be in flight at its store
  (``ir.mma_in_flight``: commits and ``wgmma_wait``, the tensor cores' arrivals on barriers at a
  constant index or a ring index ``(k + c) % S`` and the waits on them); execution ``e`` (a
  per-thread counter, kept only when ``R > 1``) writes set ``e % R``, so none of the ``R - 1``
  latest executions, in flight, has its A rewritten (an MMA is retired in order of commits). The
  sets are shared with the other such ops that are never stored while its MMA may be in flight nor
  it while theirs may (``a_ranges``; the range holds the most sets of its members). A store that may
  find unboundedly many executions in flight (no wait in the loop retires them) is an error naming
  the op. Before the first of a run of consecutive such ops of a block (only ``wgmma_fence`` between
  them), every thread writes each op's A registers into its current set with the op's ``tcgen05.st``
  (warp ``w``: lanes ``32*(w%4) + lane``, columns ``set + column`` of the store's origins), then
  ``tcgen05.wait::st``, ``tcgen05.fence::before_thread_sync``, a barrier of the threads and
  ``tcgen05.fence::after_thread_sync``, so that the issuing thread's MMAs see every warp's stores
  (the run may hold windows of shared tiles, the B operands, between its mmas); the MMA of k-step
  ``k`` reads A at column ``set + k * 8``. The emulator and the PTX executor report a store into
  columns an in-flight MMA reads (a wait for an earlier barrier phase than the latest arrival's,
  which the flow assumes, retires fewer MMAs than counted).
* **A staged through shared memory** (``TiledUmma.a_stage``: ``a`` is a register tile, an ``_SS``
  atom): each such op gets a ring of ``R`` buffers of ``a_stage.layout`` (K-major, swizzled,
  aligned to 1024 bytes) in shared memory, ``R`` = one more than the most executions of the op
  whose MMAs may be in flight at its store (``stage_depths``: the flow of ``ir.mma_in_flight``, as
  for an A in TMEM); execution ``e`` (a per-thread counter, kept only when ``R >
  1``) writes buffer ``e % R``. Before the MMAs every thread stores its registers there
  (``st.shared``, ``copy.lower_reg_mem``), then ``fence.proxy.async`` (the MMA reads through the
  async proxy), a barrier of the threads running the op and ``tcgen05.fence::after_thread_sync``;
  the MMAs read the buffer through descriptors as a shared A. An MMA is retired in order of
  commits, so the executions in flight at a store are the ``R - 1`` latest: none reads buffer
  ``e % R``. A store that may find unboundedly many in flight (no ``wgmma_wait`` in the loop) is
  an error naming the op; the emulator reports a buffer written under an in-flight MMA.
* **mma**: the elected thread of the threads running the op issues (in one branch), for each
  k-step and N block, ``tcgen05.mma`` with D at ``tmem_base + column``, A and B shared-memory
  descriptors (those of wgmma, ``ir.lower.mma._desc``); ``accumulate`` is ``enable_input_d``
  of the first k-step. The accumulator's register tile is then *pending*: its values are in
  TMEM. An op (a loop, a branch, the mma itself) whose first tcgen05 mma on an accumulator
  whose values are in registers may add to it (``accumulate`` not ``False``: ``hl.zeros``
  then ``hl.mma``) is preceded by a ``tcgen05.st`` of those registers (the load's shape and
  addresses), ``wait::st`` and a fenced barrier of the threads.
* **a pair of CTAs** (``TiledUmma.cta_group == 2``, a kernel of 2-CTA clusters): warp 0 of each
  CTA allocates (and frees) with ``cta_group::2`` and the prologue's barrier is a cluster barrier
  (the pair's TMEM is allocated before any MMA); only the elected thread of the even CTA issues,
  with the descriptors of its own tiles (each CTA's A: its 128 rows; B: its half, the same
  offsets in both CTAs), and commits with ``tcgen05.commit.cta_group::2`` multicast to both CTAs'
  ``tc_done`` barrier, so every thread of both CTAs waits on its own barrier as for one CTA (both
  count the commits; where a loop waits both on a ring whose TMA loads complete on the even CTA's
  barrier and for the MMAs' commits - the MMAs retired per k-tile, their stages released by the
  consumers, no ``arrive(who="mma")`` in the kernel - ``B`` is at least that ring's
  stages, rounded up to a power of two: the odd CTA's waiters are paced only by their own stage
  releases, so the even CTA may issue up to a ring of commits beyond the one they wait for, none
  of which may land on that barrier twice). The kernel's tcgen05 mmas are all of one
  cta_group; the epilogue's barrier
  before the deallocation is a cluster barrier too. An accumulator whose register values a pair's
  MMA would add to is an error (its ``tcgen05.st`` would need a cluster barrier in the loop); one
  no op wrote before (an MMA role's loop-carried stage) needs no store, as for one CTA. Handed
  to reader roles, both CTAs' readers load their own lanes; the author's arrive releasing the
  columns goes to the even CTA's barrier (``hl.arrive(..., cta=0)``), which the issuer waits on.
* **block scales** (a block-scaled atom: ``hl.mma(..., scale_a=, scale_b=)``): each operand's
  factors get their own TMEM columns (``arch.block_scale.scale_columns``, from a multiple of 4,
  after the accumulators allocated so far), once per mma op; the issuing thread copies them,
  before its MMAs, with one ``tcgen05.cp.32x128b.warpx4`` per 512-byte atom of the scale tile
  (its shared layout must be ``scale_smem_layout``: rows ``128 i``, k-blocks ``4 j`` at byte
  ``512 (j + i * kgroups)``, TMEM column ``(rows / 32) j + 4 i``), and the MMA of k-step ``k``, whose
  ``nsf = K / VS`` factors per row are k-blocks ``f = k nsf ..`` (1X: 1; FP4 2X: 2, 4X: 4), reads
  column ``(rows / 32) (f // 4)`` on, bytes ``f % 4 ..``. Packed e2m1 operands (``op.packed``: u8
  tiles of ``K / 2`` bytes a row) are described as 8-bit operands, a K = 64 step being 32 bytes. The
  thread's tcgen05 operations run in issue order, so the next k-tile's copy into the same columns
  follows this k-tile's MMAs (as CUTLASS's block-scaled mainloops do).
* **arrive(bar, who="mma")** -> the issuing thread's ``tcgen05.commit`` onto ``bar`` (a pair's:
  ``cta_group::2``, multicast to both CTAs): the barrier's arrival once the mmas issued so far
  completed (a pipeline stage released by the tensor cores); not counted as a commit here.
* **wgmma_commit** -> the elected thread's ``tcgen05.commit`` onto barrier ``c % B`` of the
  lowering's ``tc_done[B]`` mbarriers (``B`` = the largest ``n`` of the kernel's
  ``wgmma_wait(n)`` + 1), ``c`` the commits so far (a per-thread counter ``tc_commits``);
  **wgmma_wait(n)** -> every thread waits for commit ``j = c - 1 - n`` (if any): barrier
  ``j % B``, phase parity ``(j // B) & 1``, then ``tcgen05.fence::after_thread_sync``.
  With ``B = n + 1`` a barrier never runs two phases ahead of its waiters: commit ``j + B`` is
  issued only after ``j`` was waited for. **wgmma_fence** -> ``tcgen05.fence::after_thread_sync``.
* **epilogue**: before the first op (in program order, in the block of the mma or an
  enclosing one) that reads or writes the pending register tile other than a tcgen05 mma,
  every warp loads its share with the ``tcgen05.ld`` the choice names (warp ``w`` of warp
  group ``g``: lanes ``32*(w%4) + lane``; for a load origin at column ``c`` of the group's
  columns, TMEM column ``(c // chunk) * chunk * G + g * chunk + c % chunk``),
  ``tcgen05.wait::ld``, then a fenced barrier of those threads so that no next MMA into the
  same columns is issued before every warp's load completed.
* **the load waits for its MMAs**: the lowering tracks, per accumulator, whether an MMA on it
  may be *uncommitted* (issued after the last ``wgmma_commit``) or *unwaited* (not yet covered
  by a ``wgmma_wait(0)``), over every path (a loop body starts from the fixpoint of its entry
  and its back edge, an ``If`` joins its branches). A load of an uncommitted accumulator is an
  error (no barrier would ever say its MMA finished); a load of an unwaited one is preceded by
  a wait for the latest commit (barrier ``(c-1) % B``, parity ``((c-1) // B) & 1``, then
  ``tcgen05.fence::after_thread_sync``) - a ``tcgen05.commit`` tracks every earlier MMA of its
  thread, and the latest commit's barrier never runs a phase ahead of it, so that wait is
  always sound. A load placed in program order before the author's ``wgmma_wait`` (the
  previous tile's epilogue at the top of a loop whose MMAs follow) so still reads finished
  results.
* **an accumulator handed to another warp role** (``ir.accumulator_handoff``: an op other than
  an mma on it runs in another warp-group region than the mma, e.g. an MMA warp group and
  epilogue warp groups): its register tile and its tiling's ``tcgen05.ld`` belong to the
  readers' threads; the MMA role only issues into its columns. The readers load it before
  their first op naming it, inside their loops (a load per iteration) and inside a branch
  that holds a barrier wait (the author's wait for the MMAs' commit): ``tcgen05.fence::
  after_thread_sync``, the loads, ``wait::ld``, ``tcgen05.fence::before_thread_sync`` - no
  commit wait or barrier of the lowering's, since the commit counter is the issuer's: the
  author orders them (``hl.arrive(full, s, who="mma")`` after the MMAs, ``hl.wait`` on it
  before the read, an arrive on an empty barrier after it that the MMA role waits on before
  its next MMA into those columns); the emulator rejects either order missing. Each handed-off
  accumulator gets its own columns (a rotation of stages: one register tile per stage).
* **loop-carried accumulators**: an accumulator defined before a loop whose body issues a
  tcgen05 mma on it is in TMEM at every iteration's start: it is stored (``tcgen05.st``)
  before the loop even when that mma does not accumulate, so a read at the top of the body
  (before that iteration's mma) loads the previous iteration's result (or, on the first, the
  registers' values; a tile no op wrote before the loop, an ``Alloc``'s undefined registers,
  is not stored: TMEM's undefined columns stand for them); a body that writes its registers
  after loading them ends with a ``tcgen05.st`` so the next iteration sees them. Where the
  lowering cannot keep that invariant (the mma in a warp-group branch of the loop, the loop run
  by more threads) it is an error naming the op.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hexlayout.arch.block_scale import (
    SF_ATOM_BYTES,
    SF_ATOM_KBLOCKS,
    SF_ATOM_ROWS,
    scale_columns,
    scale_smem_layout,
)
from hexlayout.arch.dtypes import S32, U32
from hexlayout.arch.tmem import TMEM_COLUMNS, TMEM_DP

from ..expr import ExprLike, RegRead, as_expr, select
from ..lowered import (
    Alu,
    BarSync,
    ClusterBarrier,
    FenceProxyAsync,
    IfThen,
    Instr,
    LdShared,
    MbarInit,
    MbarRef,
    MbarWait,
    RegArray,
    RegRef,
    SharedRef,
    SmemBuffer,
    SmemDesc,
    elect_if,
)
from ..lowered_tcgen05 import (
    Tcgen05Commit,
    Tcgen05Cp,
    Tcgen05Fence,
    Tcgen05Ld,
    Tcgen05Mma,
    Tcgen05St,
    Tcgen05Wait,
    TmemAlloc,
    TmemDealloc,
    TmemRef,
    TmemRelinquish,
)
from ..mma_in_flight import MAX_RING, InFlight, commit_cap, conflicts, in_flight, ring_depths
from ..tile import (
    Alloc,
    Copy,
    For,
    If,
    Mbarrier,
    MbarrierArrive,
    MbarrierWait,
    Mma,
    Op,
    Permute,
    Slice,
    SubTile,
    Sync,
    Value,
)
from ..tile import WgmmaCommit as TileWgmmaCommit
from ..tile import WgmmaFence as TileWgmmaFence
from ..tile import WgmmaWait as TileWgmmaWait
from ..tiled_umma import TiledUmma
from ..types import Scope
from .copy import lower_reg_mem
from .mma import _desc
from .views import RegisterTile, SharedTileView

__all__ = ["TmemState", "is_umma", "lower_umma", "umma_commit", "umma_arrive", "umma_wait", "umma_fence",
           "same_region_ops", "a_ranges", "stage_depths"]

BAR = "tc_done"


@dataclass
class _Pending:
    tile: RegisterTile
    tu: TiledUmma
    column: int
    region: tuple[int, int]
    rid: int = -1           # the accumulator's root value id


Flow = tuple[frozenset[int], frozenset[int]]   # (unwaited, uncommitted) accumulator root ids


@dataclass
class TmemState:
    """The tensor memory of one lowering: the accumulators' columns, registers, barriers."""

    base: RegArray
    commits: RegArray
    barriers: int
    columns: dict[int, int] = field(default_factory=dict)       # accumulator root id -> first column
    used: int = 0
    pending: dict[int, _Pending] = field(default_factory=dict)  # accumulator root id -> its load
    unwaited: frozenset[int] = frozenset()      # accumulators an MMA no wgmma_wait(0) covers may write
    uncommitted: frozenset[int] = frozenset()   # accumulators an MMA issued after the last commit may write
    first_op: dict[int, int] = field(default_factory=dict)   # root id -> uid of the op first naming it
    first_write: dict[int, int] = field(default_factory=dict)  # root id -> pre-order index of 1st writer
    order: dict[int, int] = field(default_factory=dict)        # op uid -> its pre-order index
    scale_cols: dict[tuple[int, str], int] = field(default_factory=dict)   # (mma uid, "a"/"b") -> column
    a_cols: dict[int, int] = field(default_factory=dict)     # mma uid -> first column of its TMEM A
    a_stored: set[int] = field(default_factory=set)          # mma uids whose A the block stored already
    a_range: tuple[dict[int, int], dict[int, int], dict[int, int]] | None = None   # a_ranges
    a_counters: dict[int, RegArray] = field(default_factory=dict)  # mma uid -> its A sets' counter (R > 1)
    depths: dict[int, int] | None = None                     # mma uid -> buffers of its staged A ring
    stages: dict[int, tuple[SharedTileView, RegArray | None]] = field(default_factory=dict)
    range_cols: dict[int, int] = field(default_factory=dict)  # range -> first column
    group: int = 1              # the cta_group of the kernel's tcgen05 mmas
    ring_counters: list[RegArray] = field(default_factory=list)   # staged A rings' execution counters
    even: ExprLike = 1          # (cta_group::2) this CTA is the even one of its pair

    @staticmethod
    def of(lw: Any) -> TmemState:
        """The lowering's state, created on first use."""
        if lw.tmem is None:
            waits = [op.pending for op in lw.tk.body.walk() if isinstance(op, TileWgmmaWait)]
            lw.tmem = TmemState(lw.scratch("tmem_base", U32, 1), lw.scratch("tc_commits", S32, 1),
                                max([int(w) for w in waits], default=0) + 1)
            lw.mbars[BAR] = MbarRef(BAR, 0, lw.tmem.barriers)
            groups = {tu.cta_group for tu in lw.assignment.mma.values() if isinstance(tu, TiledUmma)}
            if len(groups) > 1:
                raise ValueError("the kernel's tcgen05 mmas mix one-CTA and pair (cta_group::2) MMAs; every "
                                 "tcgen05 instruction of a kernel takes one cta_group")
            if groups == {2}:
                launch = lw.tk.launch
                if tuple(launch.cluster or ()) not in ((2,), (2, 1), (2, 1, 1)):
                    raise ValueError(f"a pair's tcgen05 mma (cta_group::2) is lowered for clusters of "
                                     f"(2, 1, 1) CTAs; the kernel's cluster is {launch.cluster}")
                lw.tmem.group = 2
                lw.tmem.even = (as_expr(launch.block_index[0]) % 2).eq(0)
                stages = _paced_ring(lw.tk.body)
                if stages > lw.tmem.barriers:       # the odd CTA's waits may lag by a ring (docstring)
                    lw.tmem.barriers = 1 << (stages - 1).bit_length()
                    lw.mbars[BAR] = MbarRef(BAR, 0, lw.tmem.barriers)
            for i, o in enumerate(lw.tk.body.walk()):
                lw.tmem.order[o.uid] = i
                for v in o.values():
                    lw.tmem.first_op.setdefault(v.root.id, o.uid)
                for v in ([] if isinstance(o, Alloc) else o.outputs()):
                    lw.tmem.first_write.setdefault(v.root.id, i)
        return lw.tmem

    @property
    def ncols(self) -> int:
        n = 32
        while n < self.used:
            n *= 2
        return n

    def bar(self, index: ExprLike) -> MbarRef:
        return MbarRef(BAR, index, self.barriers)

    def column_of(self, root: Value, tu: TiledUmma) -> int:
        if root.id not in self.columns:
            if self.used + tu.columns > TMEM_COLUMNS:
                raise ValueError(f"the tcgen05 accumulators need {self.used + tu.columns} TMEM columns, more "
                                 f"than the {TMEM_COLUMNS} there are")
            self.columns[root.id] = self.used
            self.used += tu.columns
        return self.columns[root.id]

    def a_column_of(self, uid: int, tu: TiledUmma, lw: Any = None) -> int:
        """The first TMEM column of the A operand of the mma ``uid`` (a ``_TS`` tiling): its
        range's (``a_ranges``: ``R`` sets of ``a_columns`` each), allocated when first used."""
        if uid not in self.a_cols:
            if self.a_range is None:
                self.a_range = a_ranges(lw) if lw is not None else ({}, {}, {})
            ranges, depth, sets = self.a_range
            rng = ranges.get(uid, -uid - 1)
            if depth.get(uid, 1) > MAX_RING:
                op = next(o for o in lw.tk.body.walk() if o.uid == uid)
                raise ValueError(f"the register A %{op.a.name} is written to TMEM while up to "
                                 f"{depth[uid] - 1} earlier executions of the mma may still read it (no "
                                 "wgmma_wait, nor a wait on a barrier its MMAs arrive on at a constant or "
                                 "ring index, bounds them): wait for the MMAs before the mma runs again")
            if rng not in self.range_cols:
                need = self.used + tu.a_columns * sets.get(rng, 1)
                if need > TMEM_COLUMNS:
                    raise ValueError(f"the tcgen05 accumulators and A operands in TMEM need {need} columns, "
                                     f"more than the {TMEM_COLUMNS} there are: "
                                     "stage a register A through a shared tile (hl.copy, then hl.mma on it)")
                self.range_cols[rng] = self.used
                self.used = need
            self.a_cols[uid] = self.range_cols[rng]
        return self.a_cols[uid]

    def a_sets(self, uid: int) -> int:
        """``R``, the column sets the mma ``uid``'s A rotates through (``a_ranges``)."""
        return 1 if self.a_range is None else self.a_range[1].get(uid, 1)

    def a_set_column(self, lw: Any, op: Mma, tu: TiledUmma) -> ExprLike:
        """The first TMEM column of the set the current execution of ``op`` writes its A into:
        its range's first column, plus ``(e % R) * a_columns`` for execution ``e`` (a per-thread
        counter, kept only when ``R > 1``; ``a_bump`` advances it after the MMAs)."""
        col = self.a_column_of(op.uid, tu, lw)
        depth = self.a_sets(op.uid)
        if depth == 1:
            return col
        if op.uid not in self.a_counters:
            counter = lw.scratch(f"{op.a.root.name}_aset", S32, 1)
            self.a_counters[op.uid] = counter
            self.ring_counters.append(counter)
        return _mod(RegRead(self.a_counters[op.uid], 0), depth) * tu.a_columns + col

    def a_bump(self, op: Mma) -> list[Instr]:
        """The increment of ``op``'s execution counter (none when its A has one set)."""
        counter = self.a_counters.get(op.uid)
        if counter is None:
            return []
        bump = Alu("add", RegRef(counter, 0, 1), (RegRef(counter, 0, 1), 1))
        bump.origin = "tcgen05.st of the register A operand"
        return [bump]

    def a_stores_before(self, lw: Any, ops: list[Op]) -> list[Instr]:
        """``ops[0]`` an mma whose register A goes to TMEM and is not stored yet: the
        ``tcgen05.st`` of its A and of the A of the such mmas that follow it (``wgmma_fence``
        between them), then one wait, fence pair and barrier (module docstring)."""
        run: list[tuple[Mma, TiledUmma]] = []
        for o in ops:
            tu = lw.assignment.mma.get(o.uid) if isinstance(o, Mma) else None
            if isinstance(tu, TiledUmma) and tu.a_store is not None:
                run.append((o, tu))  # type: ignore[arg-type]
            elif not (isinstance(o, TileWgmmaFence) or _memory_view(o)):
                break
        if not run or run[0][0] is not ops[0] or ops[0].uid in self.a_stored:
            return []
        gtid = as_expr(lw.gtid)
        lane0 = (gtid // 32) % 4 * 32
        base = RegRead(self.base, 0)
        out: list[Instr] = []
        for o, tu in run:
            a = lw.register_of(o.a, o)
            s = tu.a_store
            per = 32 // o.a.type.dtype.bits
            regs = s.regs_per_store * per          # register tile elements per store
            if a.values != regs * len(s.origins):
                raise ValueError(f"the register A %{o.a.name} holds {a.values} values per thread; its "
                                 f"tcgen05.st.{s.shape}.x{s.num} write {regs * len(s.origins)}")
            col = self.a_set_column(lw, o, tu)
            for q, (lane, c) in enumerate(s.origins):
                taddr = base + (lane0 + lane) * TMEM_DP + col + c
                out.append(Tcgen05St(s.shape, s.num, taddr, RegRef(a.array, q * regs, regs), loc=o.loc))
            self.a_stored.add(o.uid)
        sync = [Tcgen05Wait("st"), Tcgen05Fence("before_thread_sync"), lw.region_barrier(),
                Tcgen05Fence("after_thread_sync")]
        for ins in sync:
            ins.loc = run[-1][0].loc
        out += sync
        for ins in out:
            ins.origin = "tcgen05.st of the register A operand"
        return out

    def stage_a(self, lw: Any, op: Mma, tu: TiledUmma, a: RegisterTile) -> tuple[list[Instr], SharedTileView,
                                                                               list[Instr]]:
        """The stores of ``op``'s register A into its ring buffer with the fence and barrier
        after them, the buffer's view, and the counter's increment (module docstring)."""
        if self.depths is None:
            self.depths = stage_depths(lw)
        sg = tu.a_stage
        if op.uid not in self.stages:
            depth = self.depths.get(op.uid, 1)
            if depth > MAX_RING:
                raise ValueError(f"the register A %{op.a.name} is staged through shared memory while up "
                                 f"to {depth - 1} earlier executions of the mma may still read it (no "
                                 "wgmma_wait bounds them): wait for the MMAs (wgmma_wait) before the mma "
                                 "runs again")
            buf = SmemBuffer(lw._reg_name(f"{op.a.root.name}_stage"), op.a.type.dtype,
                             -(-sg.nbytes * depth // 128) * 128, -(-lw.smem_top // 1024) * 1024, 1024)
            lw.smem.append(buf)
            lw.smem_top = buf.offset + buf.nbytes
            view = SharedTileView.of(buf, op.a.type.dtype, (sg.m, sg.k), sg.layout)
            counter = lw.scratch(f"{op.a.root.name}_ring", S32, 1) if depth > 1 else None
            self.stages[op.uid] = (view, counter)
            if counter is not None:
                self.ring_counters.append(counter)
        view, counter = self.stages[op.uid]
        bump: list[Instr] = []
        if counter is not None:
            depth = self.depths[op.uid]
            view = replace(view, base=_mod(RegRead(counter, 0), depth) * (sg.m * sg.k))
            bump = [Alu("add", RegRef(counter, 0, 1), (RegRef(counter, 0, 1), 1))]
        plan = lower_reg_mem(a, view, False, lw.gtid, op.a.type.dtype.bits)
        if isinstance(plan, str):
            raise ValueError(f"the register A %{op.a.name} staged through shared memory: {plan}")
        out = plan.instrs + [FenceProxyAsync(), lw.region_barrier(), Tcgen05Fence("after_thread_sync")]
        for ins in out + bump:
            ins.origin = "st.shared of the register A operand"
        return out, view, bump

    def scale_column_of(self, uid: int, role: str, ncols: int) -> int:
        """The first TMEM column of the block scales of operand ``role`` of mma ``uid`` (4-aligned)."""
        key = (uid, role)
        if key not in self.scale_cols:
            start = -(-self.used // 4) * 4
            if start + ncols > TMEM_COLUMNS:
                raise ValueError(f"the tcgen05 accumulators and block scales need {start + ncols} TMEM "
                                 f"columns, more than the {TMEM_COLUMNS} there are")
            self.scale_cols[key] = start
            self.used = start + ncols
        return self.scale_cols[key]

    # --- the kernel's prologue and epilogue ---------------------------------------------------
    def prologue(self, lw: Any) -> list[Instr]:
        word, _ = lw.exchange_buffer("tmem_addr", U32, 16)
        tid = as_expr(lw.tid)
        warp0 = tid < 32
        out: list[Instr] = [MbarInit(self.bar(i), 1, pred=tid.eq(0)) for i in range(self.barriers)]
        g = self.group
        out += [Alu("mov", RegRef(self.commits, 0, 1), (0,))] + [
            Alu("mov", RegRef(c, 0, 1), (0,)) for c in self.ring_counters]
        out += [
                TmemAlloc(SharedRef(word, 0), self.ncols, g, pred=warp0), TmemRelinquish(g, pred=warp0),
                Tcgen05Fence("before_thread_sync"), BarSync() if g == 1 else ClusterBarrier(),
                Tcgen05Fence("after_thread_sync"), LdShared(RegRef(self.base, 0, 1), SharedRef(word, 0), 32)]
        for ins in out:
            ins.origin = "tensor memory allocation"
        return out

    def epilogue(self, lw: Any) -> list[Instr]:
        bar = BarSync() if self.group == 1 else ClusterBarrier()
        out: list[Instr] = [Tcgen05Fence("before_thread_sync"), bar, Tcgen05Fence("after_thread_sync"),
                            TmemDealloc(RegRead(self.base, 0), self.ncols, self.group,
                                        pred=as_expr(lw.tid) < 32)]
        for ins in out:
            ins.origin = "tensor memory deallocation"
        return out

    # --- the accumulator's way to registers ---------------------------------------------------
    def loads_before(self, lw: Any, op: Op) -> list[Instr]:
        """The TMEM loads of the pending accumulators ``op`` (or an op nested in it) touches."""
        out: list[Instr] = []
        for rid in [r for r in self.pending if _touches(op, r)]:
            if rid in lw.handoff and _descend(op):     # another role's: loaded where read, after its wait
                continue
            p = self.pending.pop(rid)
            handoff = lw.handoff.get(rid)
            if p.region != lw.group_threads[-1] and handoff != lw.group_threads[-1]:
                lo, hi = p.region
                raise ValueError(f"the accumulator %{p.tile.array.name} of a tcgen05 mma run by threads "
                                 f"[{lo}, {hi}) is read by threads {list(lw.group_threads[-1])}, not the "
                                 f"warp role its tile belongs to")
            out += self._load(lw, p, handoff=p.region != lw.group_threads[-1])
        return out

    @property
    def flow(self) -> Flow:
        return self.unwaited, self.uncommitted

    @flow.setter
    def flow(self, f: Flow) -> None:
        self.unwaited, self.uncommitted = f

    def _load(self, lw: Any, p: _Pending, store: bool = False, handoff: bool = False) -> list[Instr]:
        """The accumulator's ``tcgen05.ld`` (``store``: ``tcgen05.st`` of its registers;
        ``handoff``: read by another warp role than the MMA's, ordered by the author's barriers
        alone - the commit counter and flow are the issuer's)."""
        tu = p.tu
        out: list[Instr] = []
        if handoff:
            pass
        elif not store and p.rid in self.uncommitted:
            raise ValueError(f"the accumulator %{p.tile.array.name} is read while a tcgen05 mma on it may "
                             "not be committed yet (no wgmma_commit after that mma on every path here), so "
                             "no barrier says when its result is in tensor memory: commit (and wgmma_wait) "
                             "before reading it")
        if not store and p.rid in self.unwaited:      # no wgmma_wait(0) covers it on every path
            out += _wait_for(self, 0)
            self.unwaited = self.uncommitted
        gtid = as_expr(lw.gtid)
        lane0 = (gtid // 32) % 4 * 32
        col0 = p.column + (gtid // 128) * tu.chunk          # warp group g: chunks g, g + G, ...
        base = RegRead(self.base, 0)
        regs = tu.regs_per_load
        for q, (lane, col) in enumerate(tu.loads):
            col = col // tu.chunk * tu.chunk * tu.groups + col % tu.chunk
            taddr = base + (lane0 + lane) * TMEM_DP + col0 + col
            regs_q = RegRef(p.tile.array, q * regs, regs)
            out.append(Tcgen05St(tu.ld_shape, tu.ld_num, taddr, regs_q) if store
                       else Tcgen05Ld(tu.ld_shape, tu.ld_num, regs_q, taddr))
        if handoff:        # after the author's wait on the MMAs' commit; before its release (an arrive)
            out = [Tcgen05Fence("after_thread_sync"), *out, Tcgen05Wait("ld"),
                   Tcgen05Fence("before_thread_sync")]
        else:
            out += [Tcgen05Wait("st" if store else "ld"), Tcgen05Fence("before_thread_sync"),
                    lw.region_barrier(), Tcgen05Fence("after_thread_sync")]
        for ins in out:
            ins.origin = f"tcgen05.{'st' if store else 'ld'} of the accumulator"
        return out

    def stores_before(self, lw: Any, op: Op) -> list[Instr]:
        """The ``tcgen05.st`` of accumulators whose values are in registers and which the first
        tcgen05 mma on them in ``op`` (or nested in it) may add to (``accumulate`` not False), or
        which ``op``, a loop, carries from one iteration to the next (defined before it)."""
        out: list[Instr] = []
        seen: set[int] = set()
        for o in same_region_ops(op):
            tu = lw.assignment.mma.get(o.uid) if isinstance(o, Mma) else None
            if not isinstance(tu, TiledUmma) or o.c.root.id in seen:
                continue
            rid = o.c.root.id
            seen.add(rid)
            carried = isinstance(op, For) and self.defined_outside(rid, op)
            if rid in self.pending or (o.accumulate is False and not carried):
                continue
            written = self.written_before(rid, op)
            if tu.cta_group == 2 and written:
                raise ValueError(f"the pair's tcgen05 mma (cta_group::2) on %{o.c.name} would add to "
                                 "register values (its tcgen05.st into both CTAs' TMEM would need a cluster "
                                 "barrier): give its first mma accumulate=False (or k > 0 in a k-loop with "
                                 "nothing to add before)")
            p = _Pending(lw.register_of(o.c, o), tu, self.column_of(o.c.root, tu), lw.group_threads[-1], rid)
            if written:
                out += self._load(lw, p, store=True)
            self.pending[rid] = p           # its values are in TMEM now (until a register use loads them)
        return out


    def written_before(self, rid: int, op: Op) -> bool:
        """Whether an op before ``op`` in program order writes the tile ``rid`` (an ``Alloc``'s
        registers are undefined until written: TMEM's columns, as undefined, stand for them without
        a ``tcgen05.st``)."""
        return self.first_write.get(rid, len(self.order)) < self.order.get(op.uid, -1)

    def defined_outside(self, rid: int, op: Op) -> bool:
        """Whether the tile ``rid`` is first named before ``op`` (not inside it)."""
        inside = {o.uid for b in op.blocks() for o in b.walk()}
        return self.first_op.get(rid) not in inside

    # --- loops and branches ---------------------------------------------------------------
    def enter_loop(self, lw: Any, op: For) -> tuple[dict[int, _Pending], Flow]:
        """The state at ``op``'s entry, and the body's start state of the commit/wait flow: the
        fixpoint of the entry and the back edge (``flow_after``)."""
        entry = self.flow
        self.flow = _join(entry, _loop_top(lw, op, entry))
        return dict(self.pending), entry

    def leave_loop(self, lw: Any, op: For, state: tuple[dict[int, _Pending], Flow]) -> list[Instr]:
        """The instructions ending ``op``'s body so that every iteration starts in the state the
        body was lowered for (module docstring, loop-carried accumulators); the flow after the
        loop."""
        entry_pending, entry_flow = state
        region = lw.group_threads[-1]
        out: list[Instr] = []
        for rid, p in self.pending.items():
            if rid not in entry_pending and self.defined_outside(rid, op) and _reads(op, rid):
                raise ValueError(f"the accumulator %{p.tile.array.name} is carried from one iteration of "
                                 "the loop to the next by a tcgen05 mma the loop's threads do not all run (a "
                                 "warp-group branch in the loop), and the loop reads it; the lowering cannot "
                                 "place its tcgen05.ld: put the loop inside the warp-group branch")
        for rid, p in entry_pending.items():
            if rid not in self.pending and p.region == region and _writes(op, rid):
                out += self._load(lw, p, store=True)         # the body's registers are newer than TMEM
                self.pending[rid] = p
        self.flow = _flow_op(lw, op, entry_flow)
        return out

    def leave_if(self, lw: Any, op: If, entry: Flow) -> None:
        """The flow after ``op``: its branches joined (and the fall-through, without else)."""
        self.flow = _flow_op(lw, op, entry)

def same_region_ops(op: Op) -> list[Op]:
    """``op`` and the ops nested in it that run on the same threads (not inside a warp-group
    branch), in program order."""
    if isinstance(op, If) and op.warp_groups:
        return []
    out = [op]
    for b in op.blocks():
        for o in b.ops:
            out += same_region_ops(o)
    return out


def _is_ts(lw: Any, op: Op) -> bool:
    tu = lw.assignment.mma.get(op.uid) if isinstance(op, Mma) else None
    return isinstance(tu, TiledUmma) and tu.a_store is not None


def _is_staged(lw: Any, op: Op) -> bool:
    tu = lw.assignment.mma.get(op.uid) if isinstance(op, Mma) else None
    return isinstance(tu, TiledUmma) and tu.a_stage is not None


def _record(lw: Any, tracked: Any) -> dict[int, list[InFlight]]:
    """The in-flight flow (``ir.mma_in_flight``) of the ``tracked`` mmas over the kernel."""
    return in_flight(lw.tk.body.ops, lambda o: tracked(lw, o), commit_cap(lw.tk.body))


def stage_depths(lw: Any) -> dict[int, int]:
    """The buffers of each staged register A's ring (mma uid -> ``R``): one more than the most
    executions of the op whose MMAs may be in flight at any of its stores (``ir.mma_in_flight``;
    the waits the lowering adds before accumulator loads only retire more)."""
    return ring_depths(lw.tk.body.ops, lambda o: _is_staged(lw, o), commit_cap(lw.tk.body))


def a_ranges(lw: Any) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """The TMEM columns of the A-in-TMEM mmas: ``(range of each mma uid, column sets R of each mma
    uid, column sets of each range)``. An mma's ``R`` is one more than the most of its own
    executions whose MMAs may be in flight at its store (``ir.mma_in_flight``): its execution ``e``
    writes set ``e % R``, so none of the ``R - 1`` latest, in flight, is rewritten. Mmas share a
    range when neither is stored while the other's MMA may be in flight (at every store of either
    the other is retired: the waits the lowering adds before accumulator loads only retire more, so
    the rule is conservative); the range then holds the most sets of its members, each member
    rotating through its own ``R``. Greedy in program order: an mma takes the first range none of
    whose mmas conflicts with it (the unrolled copies of a k-step alternate between two ranges; the
    tail's copies after the loop reuse them)."""
    record = _record(lw, _is_ts)
    depth = ring_depths([], lambda o: False, 1, record)
    cols = {uid: lw.assignment.mma[uid].a_columns for uid in record}
    ranges: list[list[int]] = []
    out: dict[int, int] = {}
    for uid in record:
        for i, members in enumerate(ranges):
            if cols[members[0]] == cols[uid] and not any(conflicts(record, uid, v) for v in members):
                members.append(uid)
                out[uid] = i
                break
        else:
            ranges.append([uid])
            out[uid] = len(ranges) - 1
    sets = {i: max(depth[u] for u in members) for i, members in enumerate(ranges)}
    return out, depth, sets


def _loop_level(block: Any) -> list[Op]:
    """The ops of ``block`` and of its branches, not of its nested loops."""
    out: list[Op] = []
    for o in block.ops:
        out.append(o)
        if not isinstance(o, For):
            for b in o.blocks():
                out += _loop_level(b)
    return out


def _paced_ring(body: Any) -> int:
    """The stages of the deepest ring whose TMA loads complete on a pair's even CTA's barrier
    (``pair_barrier``) and whose barrier a loop waits on beside a ``wgmma_wait`` (the MMAs retired
    per k-tile: the odd CTA's waiters are paced by their own releases of that ring); 1 if none, or
    if the MMAs release stages themselves (``arrive(who="mma")``: then the author paces the odd CTA,
    as the pair GEMM's accumulator barrier does)."""
    if any(isinstance(o, MbarrierArrive) and o.who == "mma" for o in body.walk()):
        return 1            # the MMAs release stages: the odd CTA's waiters are not paced by them
    counts = {id(o.mbarrier): o.mbarrier.count for o in body.walk()
              if isinstance(o, Copy) and o.pair_barrier and isinstance(o.mbarrier, Mbarrier)}
    best = 1
    for loop in body.walk():
        if not isinstance(loop, For):
            continue
        level = _loop_level(loop.body)
        if any(isinstance(o, TileWgmmaWait) for o in level):
            best = max([best] + [counts[id(o.bar)] for o in level
                                 if isinstance(o, MbarrierWait) and id(o.bar) in counts])
    return best


def _memory_view(op: Op) -> bool:
    """Whether ``op`` only names a window of a shared or global tile (no register changes)."""
    return isinstance(op, (Slice, SubTile, Permute)) and all(v.scope != Scope.REGISTER for v in op.results())


def _descend(op: Op) -> bool:
    """Whether the load of a handed-off accumulator read in ``op`` goes inside it: a loop (a load
    per iteration), a warp-group branch, or a branch holding a barrier wait (the author's wait
    for the MMAs' commit may be there); before any other op reading it."""
    if isinstance(op, For) or (isinstance(op, If) and op.warp_groups):
        return True
    return any(isinstance(o, (MbarrierWait, Sync)) for b in op.blocks() for o in b.walk())


def _touches(op: Op, root_id: int) -> bool:
    """Whether ``op`` or an op nested in it reads or writes the tile ``root_id`` other than as the
    accumulator of an mma (a tcgen05 mma keeps it in TMEM)."""
    ops = [op] + [o for b in op.blocks() for o in b.walk()]
    for o in ops:
        for v in o.values():
            if v.root.id == root_id and not (isinstance(o, Mma) and v is o.c):
                return True
    return False


def _reads(op: Op, root_id: int) -> bool:
    """Whether an op nested in ``op`` reads the tile ``root_id`` other than as an mma's accumulator."""
    return any(v.root.id == root_id for b in op.blocks() for o in b.walk()
               if not isinstance(o, Mma) for v in o.inputs())


def _writes(op: Op, root_id: int) -> bool:
    """Whether an op nested in ``op`` writes the tile ``root_id`` other than as an mma's accumulator."""
    return any(v.root.id == root_id for b in op.blocks() for o in b.walk()
               if not isinstance(o, Mma) for v in o.outputs())


def _join(a: Flow, b: Flow) -> Flow:
    return a[0] | b[0], a[1] | b[1]


def is_umma(lw: Any, op: Op) -> bool:
    """Whether ``op`` is an mma lowered to tcgen05 (a ``TiledUmma`` choice)."""
    return isinstance(op, Mma) and isinstance(lw.assignment.mma.get(op.uid), TiledUmma)


def _flow_ops(lw: Any, ops: list[Op], f: Flow) -> Flow:
    for o in ops:
        f = _flow_op(lw, o, f)
    return f


def _loop_top(lw: Any, op: For, entry: Flow) -> Flow:
    """The commit/wait flow at the start of ``op``'s body on any iteration: the least fixpoint
    of ``top = entry | after(body, top)`` (sets only grow, so it ends)."""
    top = entry
    while True:
        nxt = _join(entry, _flow_ops(lw, op.body.ops, top))
        if nxt == top:
            return top
        top = nxt


def _flow_op(lw: Any, op: Op, f: Flow) -> Flow:
    """The (unwaited, uncommitted) accumulators after ``op``: a tcgen05 mma adds its accumulator to
    both, ``wgmma_commit`` empties the uncommitted, ``wgmma_wait(0)`` leaves unwaited only the
    uncommitted; a loop may run zero times, a branch joins its paths."""
    unwaited, uncommitted = f
    if is_umma(lw, op):
        rid = op.c.root.id
        return unwaited | {rid}, uncommitted | {rid}
    if isinstance(op, TileWgmmaCommit):
        return unwaited, frozenset()
    if isinstance(op, TileWgmmaWait):
        return (uncommitted, uncommitted) if int(op.pending) == 0 else f
    if isinstance(op, For):
        return _join(f, _flow_ops(lw, op.body.ops, _loop_top(lw, op, f)))
    if isinstance(op, If):
        out = _flow_ops(lw, op.then_body.ops, f)
        return _join(out, _flow_ops(lw, op.else_body.ops, f) if op.else_body is not None else f)
    return f


def lower_umma(lw: Any, op: Mma, tu: TiledUmma, a: Any, b: Any, c: RegisterTile) -> list[Instr]:
    """The single-thread ``tcgen05.mma`` issues of ``op`` (module docstring)."""
    a_tmem = tu.a_store is not None
    a_reg = a_tmem or tu.a_stage is not None
    if not (isinstance(a, RegisterTile if a_reg else SharedTileView) and isinstance(b, SharedTileView)):
        src = ("a register tile stored to TMEM" if a_tmem else "a register tile staged through shared memory"
               if a_reg else "shared memory")
        raise ValueError(f"{tu.atom.name} reads A from {src} and B from shared memory")
    m, n, k = tu.tile_mnk
    per_unit = 2 if op.packed == "e2m1" else 1          # packed e2m1: two elements a byte of the u8 tile
    if (m, n, k) != (op.c.type.shape[0], op.c.type.shape[1], op.a.type.shape[1] * per_unit):
        raise ValueError(f"{tu} covers {m}x{n}x{k}, the operands are "
                         f"{op.c.type.shape[0]}x{op.c.type.shape[1]}x{op.a.type.shape[1] * per_unit}")
    handoff = lw.handoff.get(op.c.root.id)      # read by another warp role (ir.accumulator_handoff)
    if tu.threads != (lw.gthreads if handoff is None else handoff[1] - handoff[0]):
        raise ValueError(f"{tu} is read by {tu.threads} threads; {lw.gthreads} threads run the mma")
    if handoff is not None and tu.a_store is not None:
        raise ValueError(f"the accumulator %{op.c.name} is read by another warp role; the mma's register A "
                         "is written to TMEM by the threads running it: give it a shared A")
    if c.values * c.threads != m * n:
        raise ValueError(f"the accumulator %{op.c.name} is not one register tile of {m}x{n} values")
    st = TmemState.of(lw)
    col = st.column_of(op.c.root, tu)
    tm = tu.issue()
    first: ExprLike = 1
    if op.accumulate is False:
        first = 0
    elif op.accumulate is not True:
        first = select(as_expr(op.accumulate), 1, 0)
    base = RegRead(st.base, 0)
    atom_n = tu.atom.shape_mnk[1]
    bits = op.a.type.dtype.bits
    out: list[Instr] = []
    scales = _block_scales(lw, op, tu, st, base) if tu.atom.scale_type else None
    if scales is not None:
        out += scales[0]
    stores: list[Instr] = []
    bump: list[Instr] = []
    if tu.a_stage is not None:
        stores, a, bump = st.stage_a(lw, op, tu, a)
    if a_tmem:
        if op.uid not in st.a_stored:       # lowered alone (not by a block: a legality check)
            stores = st.a_stores_before(lw, [op])
        a_col = st.a_set_column(lw, op, tu)
        bump = st.a_bump(op)
        a_step = tu.atom.shape_mnk[2] * bits // 32          # columns of one k-step of A
    for inst in tm.instances():
        descs: list[Any] = []
        operands = (("b", b, 1, tu.atom.b_major, inst.r_n),) if a_tmem else (
            ("a", a, 0, tu.atom.a_major, inst.r_m), ("b", b, 1, tu.atom.b_major, inst.r_n))
        if a_tmem:
            descs.append(TmemRef(base + a_col + inst.k * a_step))
        for role, view, mode, major, r in operands:
            d = _desc(tm, view, mode, major, lw.gtid, r, inst.k, bits, tu.cta_group, per_unit)
            if isinstance(d, str):
                raise ValueError(f"operand {role}: {d}")
            descs.append(d)
        sf = {} if scales is None else scales[1](inst.k, inst.r_n * atom_n)
        out.append(Tcgen05Mma(tu.atom.name, base + col + inst.r_n * atom_n, descs[0], descs[1],
                              first if inst.k == 0 else 1, **sf))
    rid = op.c.root.id
    st.pending[rid] = _Pending(c, tu, col, lw.group_threads[-1], rid)
    st.unwaited, st.uncommitted = st.unwaited | {rid}, st.uncommitted | {rid}
    if tu.cta_group == 2 and (tu.n_atoms != 1 or op.b.type.shape[0] * 2 != n):
        raise ValueError(f"{tu}: the pair's B must be one atom's N, each CTA's b holding half of it")
    return stores + [_issuer(lw, st, out)] + bump   # one branch around the issuing thread's MMAs


def _issuer(lw: Any, st: TmemState, body: list[Instr]) -> IfThen:
    """The branch of the issuing thread - the first of the region's threads (of the even CTA of a
    pair) - around ``body``: an ``ElectIf`` (elect.sync in its warp: no per-instruction loop
    over active lanes in the SASS)."""
    lo = lw.group_threads[-1][0]
    return elect_if(lw.tid, lo, body, also=1 if st.group == 1 else st.even)


def _scale_view(lw: Any, op: Mma, v: Value, role: str) -> SharedTileView:
    """The shared view of ``op``'s block scales of ``role``, checked to be in the layout
    ``tcgen05.cp`` reads (``arch.block_scale.scale_smem_layout``)."""
    view = lw.view(v, op)
    if not isinstance(view, SharedTileView) or view.swizzle is not None:
        raise ValueError(f"block scales {role} %{v.name}: the factors are copied to tensor memory from an "
                         "unswizzled shared tile")
    rows, kb = view.shape
    if rows % SF_ATOM_ROWS:
        raise ValueError(f"block scales {role} %{v.name}: {rows} rows are not whole 128-row atoms")
    want = scale_smem_layout(rows, kb)
    grid = np.arange(rows * kb)
    got = view.offsets(grid) - view.offsets(np.zeros(1, dtype=np.int64))[0]
    if not np.array_equal(got, np.asarray(want.indices())):
        raise ValueError(f"block scales {role} %{v.name}: shared layout {view.layout} is not the layout "
                         f"tcgen05.cp reads, {want}")
    return view


def _block_scales(lw: Any, op: Mma, tu: TiledUmma, st: TmemState, base: Any) -> tuple[list[Instr], Any]:
    """The ``tcgen05.cp`` of both operands' factors into their TMEM columns, and for an MMA at
    (k-step, first B row) its factor operands (module docstring)."""
    if op.scale_a is None or op.scale_b is None:
        raise ValueError(f"{tu.atom.name} is block-scaled: the mma needs scale_a and scale_b")
    atom_n = tu.atom.shape_mnk[1]
    if tu.n_atoms > 1 and atom_n % 32:
        raise ValueError(f"{tu}: B's factors of an N block start at row {atom_n}, not a multiple of 32")
    cps: list[Instr] = []
    cols = {}
    for role, v in (("a", op.scale_a), ("b", op.scale_b)):
        view = _scale_view(lw, op, v, role)
        rows, kb = view.shape
        col = st.scale_column_of(op.uid, role, scale_columns(rows, kb))
        kg = -(-kb // SF_ATOM_KBLOCKS)
        for i in range(rows // SF_ATOM_ROWS):
            for j in range(kg):
                src = SmemDesc(view.buffer, as_expr(view.base) + SF_ATOM_BYTES * (j + i * kg), 0, 0, 128)
                cps.append(Tcgen05Cp("32x128b.warpx4", base + col + (rows // 32) * j + 4 * i, src))
        cols[role] = (col, rows)

    nsf = tu.atom.shape_mnk[2] // tu.atom.scale_vec        # factors per row one MMA reads

    def operands(k: int, n0: int) -> dict[str, Any]:
        (ca, ra), (cb, rb) = cols["a"], cols["b"]
        first = k * nsf                                     # the MMA's first k-block
        g = first // SF_ATOM_KBLOCKS
        return {"sfa": base + ca + (ra // 32) * g, "sfb": base + cb + (rb // 32) * g + n0 // 32,
                "sfa_id": first % SF_ATOM_KBLOCKS, "sfb_id": first % SF_ATOM_KBLOCKS}

    return cps, operands


def umma_commit(lw: Any) -> list[Instr]:
    """``wgmma_commit`` on sm_100a: a ``tcgen05.commit`` onto the next ``tc_done`` barrier."""
    st = TmemState.of(lw)
    st.uncommitted = frozenset()
    cnt = RegRead(st.commits, 0)
    if st.group == 2:          # the pair's commit lands on both CTAs' barrier
        commit = Tcgen05Commit(st.bar(_mod(cnt, st.barriers)), cta_group=2, multicast=3)
    else:
        commit = Tcgen05Commit(st.bar(_mod(cnt, st.barriers)))
    return [_issuer(lw, st, [commit]), Alu("add", RegRef(st.commits, 0, 1), (RegRef(st.commits, 0, 1), 1))]


def umma_arrive(lw: Any, bar: MbarRef) -> list[Instr]:
    """``hl.arrive(bar, who="mma")``: the issuing thread's ``tcgen05.commit`` onto ``bar`` (a pair's
    multicast to both CTAs' barrier). It signals the completion of the mmas issued so far but is
    not a ``wgmma_commit``: the accumulators stay uncommitted for their ``tcgen05.ld`` (no
    ``tc_done`` barrier says they are done) until a ``wgmma_commit``."""
    st = TmemState.of(lw)
    commit = Tcgen05Commit(bar, cta_group=2, multicast=3) if st.group == 2 else Tcgen05Commit(bar)
    return [_issuer(lw, st, [commit])]


def umma_wait(lw: Any, pending: int) -> list[Instr]:
    """``wgmma_wait(pending)`` on sm_100a: wait until at most ``pending`` commits are running."""
    st = TmemState.of(lw)
    if pending >= st.barriers:
        raise ValueError(f"wgmma_wait({pending}) with {st.barriers} commit barriers")
    if pending == 0:
        st.unwaited = st.uncommitted
    return _wait_for(st, pending)


def _wait_for(st: TmemState, pending: int) -> list[Instr]:
    """Every thread waits for commit ``c - 1 - pending`` (if there was one)."""
    j = as_expr(RegRead(st.commits, 0)) - 1 - pending
    wait = [MbarWait(st.bar(_mod(j, st.barriers)), _div(j, st.barriers) & 1),
            Tcgen05Fence("after_thread_sync")]
    return [IfThen(as_expr(RegRead(st.commits, 0)) > pending, wait)]


def _mod(x: Any, n: int) -> Any:
    """``x % n`` of a non-negative counter (a mask when ``n`` is a power of two)."""
    return x & (n - 1) if n & (n - 1) == 0 else x % n


def _div(x: Any, n: int) -> Any:
    """``x // n`` of a non-negative counter (a shift when ``n`` is a power of two)."""
    return x >> (n.bit_length() - 1) if n & (n - 1) == 0 else x // n


def umma_fence(lw: Any) -> list[Instr]:
    """``wgmma_fence`` on sm_100a: order the tcgen05 ops after the preceding thread synchronization."""
    return [Tcgen05Fence("after_thread_sync")]
