"""The state of one thread block while it runs, and the checked accessors instructions use.

``Machine`` owns the registers, shared memory, the race shadow, the asynchronous operations
in flight (cp.async groups, TMA, wgmma), the mbarriers and named barriers, and the report.
Instruction handlers go through its accessors, which enforce the lowered-IR contract:

* expressions are evaluated per active thread (``ev_vec``) or must be thread-uniform
  (``ev_uniform``: loop bounds, register slice starts, mbarrier indices);
* register slices are bounds-checked and may not touch registers of an in-flight wgmma;
* shared and global accesses are bounds- and alignment-checked, shared ones also against
  pending asynchronous writes / reads and the happens-before race shadow;
* shared-memory wavefronts and global sectors are counted per instruction site.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from hexlayout.arch.banks import bank_conflicts
from hexlayout.ir.expr import Expr, ExprLike, Var, evaluate, reg_reads, to_c
from hexlayout.ir.lowered import GlobalRef, Instr, LoweredKernel, RegRef, SharedRef

from .errors import (
    AsyncHazardError,
    DivergenceError,
    EmulationError,
    IllegalInstructionError,
    MisalignedAccessError,
    OutOfBoundsError,
    RaceError,
)
from .memory import GlobalTensor, SharedMemory, byte_index
from .proxy import note_generic_write, reads_async_proxy
from .registers import RegisterFile
from .report import EmulatorReport
from .shadow import Conflict, SmemShadow

__all__ = ["Machine", "Active", "AsyncOp", "Options"]


@dataclass
class Options:
    """``check_races``: happens-before race detection on shared memory; ``count``: bank and
    sector counters; ``poison``: fill byte of fresh registers / shared memory (0xFF = NaN)."""

    check_races: bool = True
    count: bool = True
    poison: int = 0xFF


@dataclass
class Active:
    """The threads executing one instruction: ``tids`` (active, sorted), ``env`` (thread
    variable bound to ``tids``), and the enclosing group (``group``; ``mask`` selects the
    active ones, ``None`` when all are)."""

    tids: np.ndarray
    env: dict[Var, Any]
    group: np.ndarray
    group_env: dict[Var, Any]
    mask: np.ndarray | None


@dataclass
class AsyncOp:
    """An asynchronous operation in flight: ``kind`` in {"cp.async", "TMA load", "wgmma",
    "TMA store"}; ``tids`` issuing threads; ``addr`` ``[n, nb]`` shared byte addresses it
    writes (with ``data``) or reads; ``group`` per issuing thread (commit group number)."""

    ident: int
    kind: str
    instr: Instr
    tids: np.ndarray
    addr: np.ndarray | None = None
    data: np.ndarray | None = None
    group: np.ndarray | None = None
    done: np.ndarray | None = None
    epochs: np.ndarray | None = None
    extra: Any = None


_WAIT_FOR = {"wgmma": "wgmma.wait_group", "TMA store": "cp.async.bulk.wait_group.read",
             "tcgen05.mma": "tcgen05.commit and a wait on its mbarrier", "tcgen05.ld": "tcgen05.wait::ld"}


class Machine:
    def __init__(
        self,
        kernel: LoweredKernel,
        tensors: dict[int, GlobalTensor],
        scalars: Mapping[Var, int],
        block: tuple[int, ...],
        report: EmulatorReport,
        options: Options,
    ) -> None:
        self.kernel = kernel
        self.T = kernel.threads
        self.block = block
        self.report = report
        self.options = options
        self.tensors = tensors
        self.regs = RegisterFile(kernel.registers, self.T, options.poison)
        self.smem = SharedMemory(kernel, options.poison)
        self.shadow = SmemShadow(self.smem.nbytes, self.T)
        self.sites: list[Instr] = []
        self._site_ids: dict[int, int] = {}
        env: dict[Var, Any] = dict(scalars)
        for v, b in zip(kernel.block_index, block):
            env[v] = int(b)
        self.base_env = env
        self.tvar = kernel.thread_index
        self.async_ops: dict[int, AsyncOp] = {}
        self._next_async = 1
        self.state: dict[str, Any] = {}  # per-family state (cp.async groups, mbarriers, ...)
        #: the machines of this block's cluster (rank order) and this block's rank; ``exited``
        #: once every thread has finished (``scheduler.run_cluster`` sets them)
        self.cluster: list[Machine] = [self]
        self.rank = 0
        self.exited = False
        #: the kernel reads shared memory through the async proxy (tensor maps, wgmma descriptors)
        self.async_proxy_reads = reads_async_proxy(kernel)

    def family_state(self, key: str, make: Callable[[], Any]) -> Any:
        """The state an instruction family keeps in this block under ``key`` (made by ``make()``
        the first time)."""
        st = self.state.get(key)
        if st is None:
            st = self.state[key] = make()
        return st

    # ---- errors -------------------------------------------------------------------
    def fail(self, cls: type[EmulationError], ins: Instr | None, detail: str, **fields: Any) -> NoReturn:
        raise cls(detail, kernel=self.kernel.name, instr=ins, block=self.block, **fields)

    def fail_first(self, bad: np.ndarray, cls: type[EmulationError], ins: Instr, tids: np.ndarray,
                   off: np.ndarray, buffer: str, detail: Callable[[int], str]) -> None:
        """If any ``bad[i]``, fail with ``cls`` for the first such access ``i``: thread ``tids[i]``
        at element offset ``off[i]`` of ``buffer``, the problem in words ``detail(i)``."""
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            self.fail(cls, ins, detail(i), thread=int(tids[i]), buffer=buffer, address=int(off[i]))

    def site_id(self, ins: Instr) -> int:
        i = self._site_ids.get(id(ins))
        if i is None:
            i = len(self.sites)
            self._site_ids[id(ins)] = i
            self.sites.append(ins)
        return i

    def new_async(self, kind: str, ins: Instr, tids: np.ndarray, **kw: Any) -> AsyncOp:
        op = AsyncOp(self._next_async, kind, ins, tids, **kw)
        self._next_async += 1
        self.async_ops[op.ident] = op
        return op

    def peer(self, rank: int, ins: Instr, what: str) -> Machine:
        """The machine of the cluster's CTA ``rank``, which must not have exited (``what``: the
        access, for the message)."""
        if not 0 <= rank < len(self.cluster):
            self.fail(IllegalInstructionError, ins, f"{what}: CTA rank {rank} is outside the cluster of "
                      f"{len(self.cluster)} CTA(s)")
        p = self.cluster[rank]
        if p.exited:
            self.fail(IllegalInstructionError, ins, f"{what}: block {p.block} (cluster rank {rank}) has "
                      "already exited; end the kernel with a cluster barrier (hl.cluster_sync()) so that no "
                      "CTA exits while a peer may still write into it")
        return p

    def multicast_targets(self, mask: ExprLike | None, env: Mapping[Var, Any], ins: Instr, what: str,
                          thread: int | None = None) -> list[Machine]:
        """The CTAs a multicast reaches: this one without ``mask``, else the cluster ranks whose bit
        is set in the uniform ``mask`` (non-zero, no bit past the cluster; ``what``: the access)."""
        if mask is None:
            return [self]
        bits = self.ev_uniform(mask, env, ins, f"{what} mask")
        if bits <= 0 or bits >> len(self.cluster):
            self.fail(IllegalInstructionError, ins, f"{what} mask {bits:#x} does not select CTAs of the "
                      f"cluster of {len(self.cluster)}", **({} if thread is None else {"thread": thread}))
        return [self.peer(r, ins, what) for r in range(len(self.cluster)) if bits >> r & 1]

    # ---- expressions ----------------------------------------------------------------
    def with_registers(self, e: ExprLike, env: Mapping[Var, Any]) -> Mapping[Any, Any]:
        """``env`` plus the register values an expression reads (``RegRead`` leaves), for the
        threads ``env`` binds to the thread index."""
        reads = reg_reads(e)
        if not reads:
            return env
        tids = env.get(self.tvar)
        out: dict[Any, Any] = dict(env)
        for r in reads:
            self.regs.ensure(r.array)
            vals = self.regs.typed(r.array)
            out[r.array] = vals[tids] if tids is not None else vals
        return out

    def ev_vec(self, e: ExprLike, env: Mapping[Var, Any], n: int) -> np.ndarray:
        v = evaluate(e, self.with_registers(e, env))
        if isinstance(v, np.ndarray):
            return v.astype(np.int64, copy=False).reshape(-1) if v.size == n else np.broadcast_to(v, (n,))
        return np.full(n, int(v), dtype=np.int64)

    def ev_uniform(self, e: ExprLike, env: Mapping[Var, Any], ins: Instr, what: str) -> int:
        v = evaluate(e, self.with_registers(e, env))
        if isinstance(v, np.ndarray):
            if v.size == 0:
                return 0
            first = v.reshape(-1)[0]
            if np.any(v != first):
                tids = env.get(self.tvar)
                bad = int(np.flatnonzero(v.reshape(-1) != first)[0])
                t = int(tids[bad]) if isinstance(tids, np.ndarray) else None
                self.fail(
                    DivergenceError,
                    ins,
                    f"{what} `{to_c(e)}` must be the same in every thread, but it "
                    f"is {int(first)} in thread {int(tids[0]) if t is not None else '?'} and "
                    f"{int(v.reshape(-1)[bad])} in thread {t}",
                    thread=t,
                )
            return int(first)
        return int(v)

    # ---- registers --------------------------------------------------------------------
    def reg_range(self, ref: RegRef, env: Mapping[Var, Any], ins: Instr) -> tuple[int, int]:
        self.regs.ensure(ref.array)
        start = self.ev_uniform(ref.start, env, ins, f"start of register slice {ref.array.name}")
        if start < 0 or start + ref.count > ref.array.count:
            self.fail(
                OutOfBoundsError,
                ins,
                f"register slice {ref.array.name}[{start}:{start + ref.count}] is "
                f"outside the register array ({ref.array.count} elements)",
                buffer=ref.array.name,
                address=start,
            )
        return start, start + ref.count

    def _check_reg_pending(
        self, ref: RegRef, tids: np.ndarray, lo: int, hi: int, ins: Instr, write: bool
    ) -> None:
        tables = [self.regs.pending_write] + ([self.regs.pending_read] if write else [])
        for table in tables:
            marks = table.get(ref.array)
            if marks is None:
                continue
            sub = marks[tids, lo:hi]
            if sub.any():
                r, c = np.argwhere(sub)[0]
                op = self.async_ops.get(int(sub[r, c]))
                act = "writes" if table is self.regs.pending_write else "reads"
                kind = "wgmma" if op is None else op.kind
                self.fail(
                    AsyncHazardError,
                    ins,
                    f"{'writes' if write else 'reads'} register "
                    f"{ref.array.name}[{lo + int(c)}] that an in-flight {kind} {act}; wait for it with "
                    f"{_WAIT_FOR.get(kind, 'its wait')} first",
                    thread=int(tids[r]),
                    buffer=ref.array.name,
                    address=lo + int(c),
                    other_instr=None if op is None else op.instr,
                )

    def _checked_range(self, ref: RegRef, tids: np.ndarray, env: Mapping[Var, Any], ins: Instr, write: bool,
                       check_pending: bool) -> tuple[int, int]:
        """``reg_range``, and (``check_pending``) no in-flight wgmma access it would race with."""
        lo, hi = self.reg_range(ref, env, ins)
        if check_pending:
            self._check_reg_pending(ref, tids, lo, hi, ins, write=write)
        return lo, hi

    def _byte_columns(self, ref: RegRef, lo: int, hi: int) -> slice:
        """The raw byte columns of elements ``[lo, hi)`` of ``ref``'s array."""
        isz = self.regs.itemsize[ref.array]
        return slice(lo * isz, hi * isz)

    def read_regs(
        self, ref: RegRef, tids: np.ndarray, env: Mapping[Var, Any], ins: Instr, check_pending: bool = True
    ) -> np.ndarray:
        """Typed copy ``[n, count]`` of the slice for threads ``tids``."""
        lo, hi = self._checked_range(ref, tids, env, ins, False, check_pending)
        return self.regs.typed(ref.array)[tids, lo:hi]

    def read_reg_bytes(
        self, ref: RegRef, tids: np.ndarray, env: Mapping[Var, Any], ins: Instr, check_pending: bool = True
    ) -> np.ndarray:
        lo, hi = self._checked_range(ref, tids, env, ins, False, check_pending)
        return self.regs.raw[ref.array][tids, self._byte_columns(ref, lo, hi)]

    def write_regs(
        self,
        ref: RegRef,
        tids: np.ndarray,
        env: Mapping[Var, Any],
        ins: Instr,
        values: Any,
        check_pending: bool = True,
    ) -> None:
        lo, hi = self._checked_range(ref, tids, env, ins, True, check_pending)
        self.regs.typed(ref.array)[tids, lo:hi] = values

    def write_reg_bytes(
        self,
        ref: RegRef,
        tids: np.ndarray,
        env: Mapping[Var, Any],
        ins: Instr,
        data: np.ndarray,
        check_pending: bool = True,
    ) -> None:
        lo, hi = self._checked_range(ref, tids, env, ins, True, check_pending)
        self.regs.raw[ref.array][tids, self._byte_columns(ref, lo, hi)] = data

    def reg_bytes_of(self, ref: RegRef) -> int:
        self.regs.ensure(ref.array)
        return ref.count * self.regs.itemsize[ref.array]

    # ---- addresses --------------------------------------------------------------------
    def smem_addresses(
        self,
        ref: SharedRef,
        env: Mapping[Var, Any],
        tids: np.ndarray,
        nbytes: int,
        ins: Instr,
        align: int | None = None,
    ) -> np.ndarray:
        """Absolute shared byte addresses ``[n]`` of ``ref`` for ``tids``, checked: inside the
        buffer for ``nbytes`` bytes, aligned to ``align`` (default ``nbytes``)."""
        buf = ref.buffer
        esize = np.dtype(buf.dtype.numpy()).itemsize
        off = self.ev_vec(ref.offset, env, len(tids))
        rel = off * esize
        self.fail_first(
            (rel < 0) | (rel + nbytes > buf.nbytes), OutOfBoundsError, ins, tids, off, buf.name,
            lambda i: f"shared buffer {buf.name!r} ({buf.nbytes} bytes, {buf.dtype}): access of "
            f"{nbytes} bytes at element offset {int(off[i])} (byte {int(rel[i])}) is out of bounds",
        )
        addr = rel + buf.offset
        a = nbytes if align is None else align
        self.fail_first(
            addr % a != 0, MisalignedAccessError, ins, tids, off, buf.name,
            lambda i: f"shared buffer {buf.name!r}: {nbytes}-byte access at element offset {int(off[i])} "
            f"(shared address {int(addr[i])}) is not aligned to {a} bytes",
        )
        return addr

    def global_addresses(
        self, ref: GlobalRef, env: Mapping[Var, Any], tids: np.ndarray, nbytes: int, ins: Instr
    ) -> tuple[GlobalTensor, np.ndarray]:
        """``(tensor, byte addresses [n])`` of ``ref`` for ``tids``, bounds- and alignment-checked."""
        t = self.tensors.get(id(ref.param))
        if t is None:
            self.fail(
                IllegalInstructionError, ins, f"global tensor {ref.param.name!r} is not a kernel parameter"
            )
        off = self.ev_vec(ref.offset, env, len(tids))
        es = t.esize
        if nbytes % es:
            self.fail(
                IllegalInstructionError,
                ins,
                f"{nbytes}-byte access of tensor {t.name!r} is not a whole "
                f"number of {t.param.dtype} elements",
                buffer=t.name,
            )
        self.fail_first(
            (off < 0) | (off + nbytes // es > t.extent), OutOfBoundsError, ins, tids, off, t.name,
            lambda i: f"global tensor {t.name!r} (extent {t.extent} elements, shape {t.shape}, strides "
            f"{t.strides}): access of {nbytes // es} element(s) at element offset {int(off[i])} is out "
            "of bounds",
        )
        addr = off * es
        self.fail_first(
            addr % nbytes != 0, MisalignedAccessError, ins, tids, off, t.name,
            lambda i: f"global tensor {t.name!r}: {nbytes}-byte vector access at element offset "
            f"{int(off[i])} (byte {int(addr[i])}) is not {nbytes}-byte aligned",
        )
        return t, addr

    # ---- checked shared-memory traffic ----------------------------------------------
    def _conflict(self, ins: Instr, c: Conflict) -> NoReturn:
        other = self.sites[c.other_site] if c.other_site >= 0 else None
        buf = self.smem.buffer_at(c.address)
        verb = {"read-after-write": "reads", "write-after-write": "writes", "write-after-read": "writes"}[
            c.what
        ]
        prev = {"read-after-write": "written", "write-after-write": "written", "write-after-read": "read"}[
            c.what
        ]
        self.fail(
            RaceError,
            ins,
            f"{c.what} race on shared buffer {buf!r}, shared address {c.address}: thread "
            f"{c.thread} {verb} bytes {prev} by thread {c.other_thread}"
            + (f" of block {self.cluster[c.other_rank].block} (cluster rank {c.other_rank})"
               if 0 <= c.other_rank < len(self.cluster) else "")
            + " without an intervening synchronization (bar.sync / mbarrier)",
            thread=c.thread,
            buffer=buf,
            address=c.address,
            other_instr=other,
            other_thread=c.other_thread,
        )

    def _pending(self, ins: Instr, marks: np.ndarray, idx: np.ndarray, verb: str, tids: np.ndarray) -> None:
        hit = self.shadow.first_mark(marks, idx)
        if hit is None:
            return
        addr, ident = hit
        op = self.async_ops.get(ident)
        buf = self.smem.buffer_at(addr)
        row = int(np.argwhere(idx == addr)[0][0]) if idx.ndim == 2 else 0
        kind = op.kind if op is not None else "asynchronous operation"
        if marks is self.shadow.pend_write:
            how = {
                "cp.async": "wait for it (cp.async.wait_group) and synchronize first",
                "TMA load": "wait on its mbarrier first",
            }.get(kind, "wait for it first")
            msg = (
                f"{verb} shared buffer {buf!r} at shared address {addr} while an incomplete {kind} "
                f"writes it; {how}"
            )
        else:
            msg = (
                f"{verb} shared buffer {buf!r} at shared address {addr} while an in-flight {kind} reads it; "
                f"wait for it ({_WAIT_FOR.get(kind, 'its wait')}) first"
            )
        self.fail(
            AsyncHazardError,
            ins,
            msg,
            thread=int(tids[min(row, len(tids) - 1)]),
            buffer=buf,
            address=addr,
            other_instr=None if op is None else op.instr,
        )

    def smem_read(self, ins: Instr, tids: np.ndarray, idx: np.ndarray) -> None:
        """Check and record reads of byte addresses ``idx`` (``[n, nb]``) by ``tids``."""
        self._pending(ins, self.shadow.pend_write, idx, "reads", tids)
        if self.options.check_races:
            c = self.shadow.read(tids, idx, self.site_id(ins))
            if c is not None:
                self._conflict(ins, c)

    def smem_write_check(self, ins: Instr, tids: np.ndarray, idx: np.ndarray) -> None:
        self._pending(ins, self.shadow.pend_write, idx, "writes", tids)
        self._pending(ins, self.shadow.pend_read, idx, "writes", tids)
        if self.options.check_races:
            c = self.shadow.check_write(tids, idx)
            if c is not None:
                self._conflict(ins, c)

    def smem_write(self, ins: Instr, tids: np.ndarray, idx: np.ndarray, data: np.ndarray) -> None:
        """Check, perform and record a write of ``data`` (``[n, nb]`` uint8) at ``idx``."""
        self.smem_write_check(ins, tids, idx)
        self.smem.raw[idx] = data
        if self.async_proxy_reads:  # TMA stores / wgmma may read it through the async proxy
            note_generic_write(self, tids, idx)
        if self.options.check_races:
            self.shadow.record_write(tids, idx, self.site_id(ins))

    # ---- counters ---------------------------------------------------------------------
    def count_smem(self, ins: Instr, tids: np.ndarray, addr: np.ndarray, width: int, ldsm: int = 0) -> None:
        """Wavefronts of the warp requests made by ``tids`` at byte addresses ``addr``."""
        if not self.options.count:
            return
        warps = tids >> 5
        uw, inv = np.unique(warps, return_inverse=True)
        grid = np.full((len(uw), 32), -1, dtype=np.int64)
        grid[inv, tids & 31] = addr
        if ldsm:
            lane = np.arange(32)
            rep = bank_conflicts(grid, 16, active=(lane < 8 * ldsm) & (grid >= 0))
        elif width in (1, 2, 4, 8, 16):
            rep = bank_conflicts(grid, width)
        else:
            return
        s = self.report.site(ins)
        s.smem_wavefronts += int(np.sum(rep.wavefronts))
        s.smem_ideal_wavefronts += int(np.sum(rep.min_wavefronts))

    def count_gmem(self, ins: Instr, tids: np.ndarray, addr: np.ndarray, width: int) -> None:
        """Requests (one per warp), distinct 32-byte sectors and ideal sectors per request."""
        if not self.options.count or len(tids) == 0:
            return
        warps = tids >> 5
        first = addr // 32
        last = (addr + width - 1) // 32
        span = int((last - first).max()) + 1
        secs = (first.reshape(-1, 1) + np.arange(span)).reshape(-1)
        valid = secs <= np.repeat(last, span)
        wsec = np.repeat(warps, span)[valid]
        keys = np.unique(wsec * (1 << 40) + secs[valid])
        uaddr = np.unique(warps * (1 << 40) + addr)
        per_warp_addrs = np.bincount(np.searchsorted(np.unique(warps), uaddr >> 40))
        s = self.report.site(ins)
        s.gmem_requests += len(np.unique(warps))
        s.gmem_sectors += len(keys)
        s.gmem_ideal_sectors += int(np.sum(-(-per_warp_addrs * width // 32)))
        s.gmem_bytes += len(tids) * width

    # ---- helpers ------------------------------------------------------------------
    @staticmethod
    def expr_str(e: ExprLike) -> str:
        return to_c(e) if isinstance(e, Expr) else str(e)

    @staticmethod
    def byte_idx(addr: np.ndarray, nbytes: int) -> np.ndarray:
        return byte_index(addr, nbytes)
