"""The async proxy (sm_90): shared memory written by ordinary stores and read by TMA.

Ordinary shared-memory stores (``st.shared``, ``stmatrix``) go through the generic proxy; a
TMA store (``cp.async.bulk.tensor`` shared -> global) reads through the async proxy. PTX
requires each writing thread to execute ``fence.proxy.async.shared::cta`` after its writes
before the bulk copy that reads them (then a barrier orders the fence before the issuing
thread). The emulator keeps, per shared byte, the thread whose generic write has not been
fenced yet (``-1``: none); ``FenceProxyAsync`` by a thread clears its bytes, and a TMA store
that reads an unfenced byte is an ``AsyncHazardError`` naming the writer. (The barrier
between the fence and the read is checked by the race detector as for any other read.)
"""

from __future__ import annotations

import numpy as np

from hexlayout.ir.lowered import FenceProxyAsync, Instr

from .errors import AsyncHazardError
from .machine import Active, Machine

__all__ = ["HANDLERS", "note_generic_write", "check_async_read"]

_KEY = "proxy.unfenced"


def _unfenced(m: Machine) -> np.ndarray:
    arr = m.state.get(_KEY)
    if arr is None:
        arr = m.state[_KEY] = np.full(m.smem.nbytes, -1, dtype=np.int64)
    return arr


def note_generic_write(m: Machine, tids: np.ndarray, idx: np.ndarray) -> None:
    """Byte addresses ``idx`` (``[n, nb]``) written by threads ``tids`` (``[n]``) through the
    generic proxy."""
    arr = _unfenced(m)
    arr[np.asarray(idx).reshape(len(tids), -1)] = np.asarray(tids).reshape(-1, 1)


def check_async_read(m: Machine, ins: Instr, idx: np.ndarray) -> None:
    """A read through the async proxy of byte addresses ``idx``: every generic write to them
    must have been fenced by its writer."""
    arr = m.state.get(_KEY)
    if arr is None:
        return
    writers = arr[np.asarray(idx).reshape(-1)]
    bad = writers >= 0
    if bad.any():
        addr = int(np.asarray(idx).reshape(-1)[np.argmax(bad)])
        m.fail(AsyncHazardError, ins,
               f"the TMA store reads shared byte {addr}, written by thread {int(writers[np.argmax(bad)])} "
               "through the generic proxy (st.shared / stmatrix) without a fence.proxy.async.shared::cta "
               "after the write", thread=int(writers[np.argmax(bad)]))


def fence_proxy_async(m: Machine, ins: FenceProxyAsync, x: Active) -> None:
    arr = m.state.get(_KEY)
    if arr is not None:
        arr[np.isin(arr, x.tids)] = -1


HANDLERS = {FenceProxyAsync: fence_proxy_async}
