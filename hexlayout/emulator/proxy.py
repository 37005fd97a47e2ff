"""The async proxy (sm_90): shared memory written by ordinary stores and read by TMA / wgmma.

Ordinary shared-memory stores (``st.shared``, ``stmatrix``) and landed ``cp.async`` copies go
through the generic proxy; a TMA store (``cp.async.bulk.tensor`` shared -> global) and a
wgmma's or tcgen05.mma's shared operands (matrix descriptors) and a tcgen05.cp's source are read
through the async proxy. PTX requires
each writing thread to execute ``fence.proxy.async.shared::cta`` after its writes before the
async-proxy read (then a barrier orders the fence before the reading threads). The emulator
keeps, per shared byte, the thread whose generic write has not been fenced yet (``-1``:
none); ``FenceProxyAsync`` by a thread clears its bytes, and an async-proxy read of an
unfenced byte is an ``AsyncHazardError`` naming the writer. (The barrier between the fence
and the read is checked by the race detector as for any other read.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hexlayout.ir.lowered import FenceProxyAsync, ForLoop, IfThen, Instr, LoweredKernel, SmemDesc, Wgmma
from hexlayout.ir.lowered_tcgen05 import Tcgen05Cp, Tcgen05Mma

from .errors import AsyncHazardError

if TYPE_CHECKING:
    from .machine import Active, Machine

__all__ = ["HANDLERS", "note_generic_write", "check_async_read", "reads_async_proxy"]

_KEY = "proxy.unfenced"


def _unfenced(m: Machine) -> np.ndarray:
    return m.family_state(_KEY, lambda: np.full(m.smem.nbytes, -1, dtype=np.int64))


def reads_async_proxy(kernel: LoweredKernel) -> bool:
    """``kernel`` has tensor maps or a wgmma with a shared-memory operand descriptor."""
    if kernel.tma:
        return True

    def walk(body: list[Instr]) -> bool:
        for ins in body:
            is_mma = isinstance(ins, Wgmma | Tcgen05Mma)
            if is_mma and (isinstance(ins.a, SmemDesc) or isinstance(ins.b, SmemDesc)):
                return True
            if isinstance(ins, Tcgen05Cp):
                return True
            if isinstance(ins, ForLoop) and walk(ins.body):
                return True
            if isinstance(ins, IfThen) and (walk(ins.then_body) or walk(ins.else_body)):
                return True
        return False

    return walk(kernel.body)


def note_generic_write(m: Machine, tids: np.ndarray, idx: np.ndarray) -> None:
    """Byte addresses ``idx`` (``[n, nb]``) written by threads ``tids`` (``[n]``) through the
    generic proxy."""
    arr = _unfenced(m)
    arr[np.asarray(idx).reshape(len(tids), -1)] = np.asarray(tids).reshape(-1, 1)


def check_async_read(m: Machine, ins: Instr, idx: np.ndarray, reader: str = "the TMA store") -> None:
    """A read through the async proxy of byte addresses ``idx`` by ``reader``: every generic
    write to them must have been fenced by its writer."""
    arr = m.state.get(_KEY)
    if arr is None:
        return
    writers = arr[np.asarray(idx).reshape(-1)]
    bad = writers >= 0
    if bad.any():
        addr = int(np.asarray(idx).reshape(-1)[np.argmax(bad)])
        m.fail(AsyncHazardError, ins,
               f"{reader} reads shared byte {addr}, written by thread {int(writers[np.argmax(bad)])} "
               "through the generic proxy (st.shared / stmatrix / cp.async) without a "
               "fence.proxy.async.shared::cta (hl.fence_proxy_async) after the write",
               thread=int(writers[np.argmax(bad)]))


def fence_proxy_async(m: Machine, ins: FenceProxyAsync, x: Active) -> None:
    arr = m.state.get(_KEY)
    if arr is not None:
        arr[np.isin(arr, x.tids)] = -1


HANDLERS = {FenceProxyAsync: fence_proxy_async}
