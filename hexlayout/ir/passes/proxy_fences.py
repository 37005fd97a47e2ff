"""Proxy fences: ``fence.proxy.async.shared::cta`` wherever the generic proxy's shared-memory
writes reach an async-proxy reader (as Triton's fence insertion does).

Generic-proxy writes of shared memory: ``st.shared`` (``StShared``), ``stmatrix``
(``Stmatrix``), ``cp.async`` (``CpAsync``; its bytes land at the ``cp.async.wait_group`` that
completes it, so a fence goes after that wait). Async-proxy reads: a wgmma's shared
operands (``Wgmma`` with a ``SmemDesc``) and a TMA store's source (``TmaStore``). PTX requires
each writing thread to execute the fence after its writes and before the async-proxy read
(then the barrier or mbarrier that orders writer and reader orders the fence too). The
emulator checks exactly this (``hexlayout.emulator.proxy``) and stays the safety net for a
lowered program built without this pass.

``insert_proxy_fences(kernel)`` walks the program in order with the set of shared buffers
(byte ranges) holding unfenced generic writes; at an async-proxy read of one of them it
puts one ``FenceProxyAsync`` right after the last generic write at the same nesting level
(a write nested in a loop or branch: after that loop or branch), so the writers execute it
before any synchronization that follows their writes; where the writes came from outside the
current body (a loop's previous iteration), right before the reader. A fence clears the
whole set (it orders every prior write of the thread), so a fence the program already has
(``hl.fence_proxy_async``, the TMA store lowering's own) is never doubled, and one fence
before a loop serves every iteration: a loop or branch that reads a buffer written before
it gets the fence before it, not inside. Only architectures with an async proxy (sm_90+)
need it; the kernel is returned unchanged when no fence is missing.
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
    SmemBuffer,
    SmemDesc,
    Stmatrix,
    StShared,
    TmaStore,
    Wgmma,
)

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
    if isinstance(ins, Wgmma):
        return [o.buffer for o in (ins.a, ins.b) if isinstance(o, SmemDesc)]
    if isinstance(ins, TmaStore):
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


def _hits(dirty: set[_Range], bufs: list[SmemBuffer]) -> bool:
    return any(lo < d_hi and d_lo < hi for lo, hi in map(_range, bufs) for d_lo, d_hi in dirty)


class _Pass:
    def __init__(self) -> None:
        self.inserted = 0

    def body(self, body: list[Instr], dirty: set[_Range]) -> tuple[list[Instr], set[_Range]]:
        """``body`` with its fences, and the unfenced set after it (``dirty`` on entry)."""
        out: list[Instr] = []
        dirty = set(dirty)
        after_write: int | None = None      # where a fence goes: after the last write at this level

        def fence() -> None:
            nonlocal after_write
            at = len(out) if after_write is None else after_write
            out.insert(at, FenceProxyAsync(origin="proxy fence (inserted)"))
            self.inserted += 1
            dirty.clear()
            after_write = None

        for ins in body:
            if isinstance(ins, FenceProxyAsync):
                out.append(ins)
                dirty.clear()
                after_write = None
                continue
            if isinstance(ins, (ForLoop, IfThen)):
                subs = [ins.body] if isinstance(ins, ForLoop) else [ins.then_body, ins.else_body]
                if dirty and _hits(dirty, [b for s in subs for b in async_reads(s)]):
                    fence()                 # once, before the loop / branch
                if isinstance(ins, ForLoop):
                    _, carried = _Pass().body(ins.body, set())      # written late in an iteration
                    new_body, end = self.body(ins.body, dirty | carried)
                    new: Instr = dataclasses.replace(ins, body=new_body)
                    after = dirty | end                              # zero or more iterations
                else:
                    then_body, t_end = self.body(ins.then_body, dirty)
                    else_body, e_end = self.body(ins.else_body, dirty)
                    new = dataclasses.replace(ins, then_body=then_body, else_body=else_body)
                    after = t_end | e_end
                out.append(new)
                if after - dirty:
                    after_write = len(out)
                dirty = after
                continue
            if dirty and _hits(dirty, _reads(ins)):
                fence()
            out.append(ins)
            w = generic_write(ins)
            if w is not None:
                dirty.add(_range(w))
                after_write = len(out)
            elif isinstance(ins, CpAsyncWait) and dirty:
                after_write = len(out)      # cp.async copies land (are written) at the wait
        return out, dirty


def insert_proxy_fences(kernel: LoweredKernel) -> LoweredKernel:
    """``kernel`` with a ``FenceProxyAsync`` wherever a generic-proxy shared write reaches an
    async-proxy read without one (see the module docstring); ``kernel`` itself when none is
    missing (it is never changed in place)."""
    p = _Pass()
    body, _ = p.body(kernel.body, set())
    return dataclasses.replace(kernel, body=body) if p.inserted else kernel
