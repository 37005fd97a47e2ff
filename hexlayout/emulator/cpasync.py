"""``cp.async`` (sm_80): asynchronous global -> shared copies in per-thread commit groups.

* ``CpAsync``: every thread of the group issues a copy of ``nbytes`` (4, 8, 16) to its
  shared address; threads the predicate switches off copy nothing and zero-fill (src-size
  0). The global source is read at issue; the shared bytes are *pending*: reading or
  writing them is an error until the copy completes. Issue checks the destination for
  write-after-read / write-after-write races.
* ``CpAsyncCommit``: each executing thread closes its current group.
* ``CpAsyncWait(n)`` (``cp.async.wait_group n``): in each executing thread, all committed
  groups but the ``n`` most recent complete: their bytes land in shared memory as writes of
  that thread (other threads need a bar.sync before reading them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hexlayout.ir.lowered import CpAsync, CpAsyncCommit, CpAsyncWait

from .errors import IllegalInstructionError
from .machine import Active, AsyncOp, Machine
from .memory import gather_bytes

__all__ = ["HANDLERS", "AsyncGroups", "group_state", "complete_rows", "wait_limit", "wait_groups"]


@dataclass
class AsyncGroups:
    """The commit groups of one family of asynchronous operations (cp.async, TMA stores):
    per thread the number of groups it has committed, and the idents of the operations not
    yet retired by a wait."""

    committed: np.ndarray
    open: list[int] = field(default_factory=list)


def group_state(m: Machine, family: str) -> AsyncGroups:
    """The ``AsyncGroups`` of ``family`` in the block (made empty on first use)."""
    return m.family_state(family, lambda: AsyncGroups(np.zeros(m.T, dtype=np.int64)))


def _state(m: Machine) -> AsyncGroups:
    return group_state(m, "cp.async")


def cp_async(m: Machine, ins: CpAsync, x: Active) -> None:
    nb = ins.nbytes
    if nb not in (4, 8, 16):
        m.fail(IllegalInstructionError, ins, f"cp.async of {nb} bytes; it copies 4, 8 or 16 bytes")
    if ins.cache == "cg" and nb != 16:
        m.fail(IllegalInstructionError, ins, f"cp.async.cg copies 16 bytes, not {nb}")
    tids = x.group
    data = np.zeros((len(tids), nb), dtype=np.uint8)
    mask = np.ones(len(tids), dtype=bool) if x.mask is None else x.mask
    if len(x.tids):
        t, gaddr = m.global_addresses(ins.src, x.env, x.tids, nb, ins)
        data[mask] = gather_bytes(t.raw, gaddr, nb)
        m.count_gmem(ins, x.tids, gaddr, nb)
    saddr = m.smem_addresses(ins.dst, x.group_env, tids, nb, ins)
    idx = m.byte_idx(saddr, nb)
    m.smem_write_check(ins, tids, idx)
    st = _state(m)
    op = m.new_async(
        "cp.async",
        ins,
        tids,
        addr=idx,
        data=data,
        group=st.committed[tids].copy(),
        done=np.zeros(len(tids), dtype=bool),
    )
    m.shadow.pend_write[idx] = op.ident
    st.open.append(op.ident)
    m.count_smem(ins, tids, saddr, nb)


def cp_async_commit(m: Machine, ins: CpAsyncCommit, x: Active) -> None:
    _state(m).committed[x.tids] += 1


def complete_rows(m: Machine, op: AsyncOp, sel: np.ndarray) -> None:
    """Land rows ``sel`` of a pending shared-memory write ``op`` as writes by their threads."""
    assert op.addr is not None and op.data is not None and op.done is not None
    idx = op.addr[sel]
    m.smem.raw[idx] = op.data[sel]
    m.shadow.clear_marks(m.shadow.pend_write, idx, op.ident)
    if m.async_proxy_reads and op.kind == "cp.async":  # through the generic proxy (TMA: async)
        from .proxy import note_generic_write

        note_generic_write(m, op.tids[sel], idx)
    if m.options.check_races:
        remote = isinstance(op.extra, tuple) and op.extra[0] == "remote"  # a peer CTA's multicast
        m.shadow.record_write(
            op.tids[sel], idx, m.site_id(op.instr), op.epochs[sel] if op.epochs is not None else None,
            gids=op.extra[1][sel] if remote else None,
        )
    op.done[sel] = True


def wait_limit(m: Machine, committed: np.ndarray, tids: np.ndarray,
               pending: int) -> tuple[np.ndarray, np.ndarray]:
    """``(waiting, limit)`` of a wait for all but ``pending`` groups: which threads wait (a mask
    over the block) and, per thread, the first group it may leave in flight."""
    waiting = np.zeros(m.T, dtype=bool)
    waiting[tids] = True
    return waiting, committed - int(pending)


def wait_groups(m: Machine, st: AsyncGroups, tids: np.ndarray, pending: int,
                finish: Callable[[AsyncOp, np.ndarray, np.ndarray], bool]) -> None:
    """A wait of threads ``tids`` for all but ``pending`` of their groups of ``st``:
    ``finish(op, waiting, limit)`` (``waiting``, ``limit`` as ``wait_limit`` gives them)
    completes what the wait retires of each open operation and says whether it is done now;
    the done ones leave ``m.async_ops`` and ``st.open``."""
    waiting, limit = wait_limit(m, st.committed, tids, pending)
    still = []
    for ident in st.open:
        op = m.async_ops[ident]
        if finish(op, waiting, limit):
            del m.async_ops[ident]
        else:
            still.append(ident)
    st.open = still


def cp_async_wait(m: Machine, ins: CpAsyncWait, x: Active) -> None:
    def finish(op: AsyncOp, waiting: np.ndarray, limit: np.ndarray) -> bool:
        sel = waiting[op.tids] & ~op.done & (op.group < limit[op.tids])
        if sel.any():
            complete_rows(m, op, sel)
        return bool(op.done.all())

    wait_groups(m, _state(m), x.tids, ins.pending, finish)


HANDLERS = {CpAsync: cp_async, CpAsyncCommit: cp_async_commit, CpAsyncWait: cp_async_wait}
