"""Proxy fences: ``fence.proxy.async.shared::cta`` wherever the generic proxy's shared-memory
writes reach an async-proxy reader (as Triton's fence insertion does).

Generic-proxy writes of shared memory: ``st.shared`` (``StShared``), ``stmatrix``
(``Stmatrix``), ``cp.async`` (``CpAsync``; its bytes land at the ``cp.async.wait_group`` that
completes it: in flight until then, it needs no fence yet, and one goes after that wait).
Async-proxy reads: a wgmma's or a tcgen05.mma's shared operands (``Wgmma`` / ``Tcgen05Mma``
with a ``SmemDesc``: sm_100a reads its descriptors through the async proxy as sm_90a does), a
``tcgen05.cp``'s source (``Tcgen05Cp``) and a TMA store's source (``TmaStore``). PTX requires
each writing thread to execute the fence after its writes and before the async-proxy read
(then the barrier or mbarrier that orders writer and reader orders the fence too). The emulator
checks exactly this (``hexlayout.emulator.proxy``) and stays the safety net for a lowered
program built without this pass.

``insert_proxy_fences(kernel)`` walks the program in order with the set of shared buffers
(byte ranges) holding unfenced generic writes, and puts one ``FenceProxyAsync``

- at an async-proxy read of one of them: right after the last generic write at the same
  nesting level (a write nested in a loop or branch: after that loop or branch), so the
  writers execute it before the synchronization that follows their writes; where the writes
  came from outside the current body (a loop's previous iteration), right before the reader;
- before a loop or branch that would otherwise read such a buffer before fencing it itself:
  one fence before the loop serves every iteration;
- in a branch (code other threads may skip while running other code, as warp-specialized
  roles do), after stores (st.shared, stmatrix) to a buffer the kernel reads through the
  async proxy anywhere, when the branch (or a loop body in it: every iteration) would
  otherwise end, or arrive on an mbarrier, with them unfenced: the reader may be another
  role's code.

A fence clears the whole set (it orders every prior write of the thread), so a fence the
program already has (``hl.fence_proxy_async``, the TMA store lowering's own) is never
doubled. Only architectures with an async proxy (sm_90+) need it; the kernel is returned
unchanged (the same object) when no fence is missing.
"""

from __future__ import annotations

import dataclasses

from hexlayout.ir.lowered import (
    CpAsync,
    CpAsyncWait,
    FenceProxyAsync,
    ForLoop,
    IfThen,
    Instr,
    LoweredKernel,
    MbarArrive,
    SmemBuffer,
    SmemDesc,
    Stmatrix,
    StShared,
    TmaStore,
    Wgmma,
)
from hexlayout.ir.lowered_tcgen05 import Tcgen05Cp, Tcgen05Mma

__all__ = ["insert_proxy_fences", "generic_write", "async_reads"]

_Range = tuple[int, int]


def _range(b: SmemBuffer) -> _Range:
    return (b.offset, b.offset + b.nbytes)


def generic_write(ins: Instr) -> SmemBuffer | None:
    """The shared buffer ``ins`` writes through the generic proxy (None: none)."""
    if isinstance(ins, (StShared, Stmatrix, CpAsync)):
        return ins.dst.buffer
    return None


def _reads(ins: Instr) -> list[SmemBuffer]:
    """The shared buffers ``ins`` itself reads through the async proxy."""
    if isinstance(ins, Wgmma | Tcgen05Mma):
        return [o.buffer for o in (ins.a, ins.b) if isinstance(o, SmemDesc)]
    if isinstance(ins, TmaStore | Tcgen05Cp):
        return [ins.src.buffer]
    return []


def async_reads(body: list[Instr]) -> list[SmemBuffer]:
    """Every shared buffer read through the async proxy in ``body``, nested bodies included."""
    out: list[SmemBuffer] = []
    for ins in body:
        out += _reads(ins)
        for sub in ("body", "then_body", "else_body"):
            out += async_reads(getattr(ins, sub, None) or [])
    return out


def _overlap(r: _Range, ranges: set[_Range]) -> bool:
    return any(r[0] < hi and lo < r[1] for lo, hi in ranges)


def _hits(dirty: set[_Range], bufs: list[SmemBuffer]) -> bool:
    return any(_overlap(_range(b), dirty) for b in bufs)


_State = set[tuple[str, int, int]]      # ("w", lo, hi): unfenced writes; ("p", lo, hi): cp.async in flight


def _written(state: _State) -> set[_Range]:
    return {(lo, hi) for k, lo, hi in state if k == "w"}


def _fenced(state: _State) -> _State:
    return {e for e in state if e[0] == "p"}


def _landed(state: _State) -> _State:
    return {("w", lo, hi) for _, lo, hi in state}


class _Pass:
    def __init__(self, read: set[_Range], memo: dict | None = None) -> None:
        self.read = read            # every buffer the kernel reads through the async proxy
        self.inserted = 0
        self.memo: dict = {} if memo is None else memo

    def probe(self, body: list[Instr], state: _State, role: bool) -> tuple[int, _State]:
        """The fences ``body`` would get from ``state`` on entry, and the state after it."""
        key = (id(body), frozenset(state), role)
        if key not in self.memo:
            p = _Pass(self.read, self.memo)
            end = p.body(body, state, role)[1]
            self.memo[key] = (p.inserted, end)
        return self.memo[key]

    def needs(self, ins: ForLoop | IfThen, state: _State, without: _State, role: bool) -> bool:
        """Whether the loop / branch ``ins`` reads through the async proxy, before fencing it
        itself, a buffer whose writes are unfenced on entry (``state``; ``without``: the state
        were the writes before it fenced)."""
        subs = [ins.body] if isinstance(ins, ForLoop) else [ins.then_body, ins.else_body]
        inner = role or isinstance(ins, IfThen)
        return sum(self.probe(b, state, inner)[0] for b in subs) > sum(self.probe(b, without, inner)[0]
                                                                        for b in subs)

    def body(self, body: list[Instr], state: _State, role: bool = False) -> tuple[list[Instr], _State]:
        """``body`` with its fences, and the state after it (``state`` on entry); ``role``:
        ``body`` is inside a branch (other threads may run other code meanwhile)."""
        out: list[Instr] = []
        st = set(state)
        after_write: int | None = None      # where a fence goes: after the last write at this level
        shared = False                      # in a branch: stores to async-read buffers not yet fenced

        def fence() -> None:
            nonlocal after_write, shared, st
            at = len(out) if after_write is None else after_write
            out.insert(at, FenceProxyAsync(origin="proxy fence (inserted)"))
            self.inserted += 1
            st = _fenced(st)
            after_write, shared = None, False

        for ins in body:
            if isinstance(ins, FenceProxyAsync):
                out.append(ins)
                st = _fenced(st)
                after_write, shared = None, False
                continue
            if shared and isinstance(ins, MbarArrive):
                fence()                     # a branch's stores, before it signals another role
            if isinstance(ins, (ForLoop, IfThen)):
                loop = isinstance(ins, ForLoop)
                # written late in an iteration, unfenced (or in flight) when the next begins
                carried = self.probe(ins.body, set(), role)[1] if loop else set()
                if _written(st) and self.needs(ins, st | carried, _fenced(st) | carried, role):
                    fence()                 # once, before the loop / branch
                if loop:
                    new_body, end = self.body(ins.body, st | carried, role)
                    new: Instr = dataclasses.replace(ins, body=new_body)
                    after = st | end                                 # zero or more iterations
                else:
                    then_body, t_end = self.body(ins.then_body, st, True)
                    else_body, e_end = self.body(ins.else_body, st, True)
                    new = dataclasses.replace(ins, then_body=then_body, else_body=else_body)
                    after = t_end | e_end
                out.append(new)
                if _written(after) - _written(st):
                    after_write = len(out)
                st = after
                continue
            if _hits(_written(st), _reads(ins)):
                fence()
            out.append(ins)
            w = generic_write(ins)
            if isinstance(ins, CpAsync):
                st.add(("p", *_range(ins.dst.buffer)))       # written when a wait lands it
            elif w is not None:
                st.add(("w", *_range(w)))
                after_write = len(out)
                shared = shared or (role and _overlap(_range(w), self.read))
            elif isinstance(ins, CpAsyncWait) and any(e[0] == "p" for e in st):
                st = _landed(st)
                after_write = len(out)      # cp.async copies land (are written) at the wait
        if shared:
            fence()                         # a branch's stores, read through the async proxy elsewhere
        return out, st


def insert_proxy_fences(kernel: LoweredKernel) -> LoweredKernel:
    """``kernel`` with a ``FenceProxyAsync`` wherever a generic-proxy shared write reaches an
    async-proxy read without one (see the module docstring); ``kernel`` itself when none is
    missing (it is never changed in place)."""
    p = _Pass({_range(b) for b in async_reads(kernel.body)})
    body, _ = p.body(kernel.body, set())
    return dataclasses.replace(kernel, body=body) if p.inserted else kernel
