"""Passes over the lowered per-thread program (``hexlayout.ir.lowered``).

Each pass maps a ``LoweredKernel`` to an equivalent one; the emulator and the code
generator consume the result, so what is emulated is what is printed.

- ``loops.optimize_loops``: loop-invariant code motion and strength reduction of the
  address, predicate and stage-index expressions of sequential loops (``licm``).
- ``proxy_fences.insert_proxy_fences``: ``fence.proxy.async`` wherever generic-proxy shared
  writes reach an async-proxy reader (wgmma, TMA store) without one (sm_90+).
"""

from .loops import optimize_loops
from .proxy_fences import insert_proxy_fences

__all__ = ["optimize_loops", "insert_proxy_fences"]
