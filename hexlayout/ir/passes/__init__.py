"""Passes over the lowered per-thread program (``hexlayout.ir.lowered``).

Each pass maps a ``LoweredKernel`` to an equivalent one; the emulator and the code
generator consume the result, so what is emulated is what is printed.

- ``loops.optimize_loops``: loop-invariant code motion and strength reduction of the
  address, predicate and stage-index expressions of sequential loops (``licm``).
"""

from .loops import optimize_loops

__all__ = ["optimize_loops"]
