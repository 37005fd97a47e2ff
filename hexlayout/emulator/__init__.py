"""A thread-level CPU emulator of lowered hexlayout kernels, with PTX semantics.

``run(kernel, args, blocks=None)`` executes a ``LoweredKernel`` block by block; each
block's threads run vectorized with numpy, split into cooperative thread groups where
control flow diverges (warp specialization), synchronizing through bar.sync and mbarriers.
It checks what the hardware would silently get wrong - out-of-bounds and misaligned
accesses, shared-memory races (happens-before with vector clocks), use of data of
unfinished cp.async / TMA / wgmma operations, deadlocks - raising an ``EmulationError``
that names the instruction, its origin and source line; and it counts shared-memory bank
wavefronts and global-memory sectors per instruction site (``EmulatorReport``).

Modules: ``machine`` (block state, checked accessors), ``memory``, ``registers``, ``shadow``
(race detection), ``interpreter`` / ``scheduler`` (execution), one module per instruction
family (``memops``, ``cpasync``, ``ldmatrix``, ``mma``, ``wgmma`` with ``gmma_desc``, ``tma``,
``mbarrier``, ``alu``), ``report``, ``errors``.
"""

from . import errors
from .errors import *  # noqa: F403 - the error kinds, re-exported (errors.__all__)
from .report import EmulatorReport, SiteStats
from .run import grid_of, run

__all__ = ["run", "grid_of", "EmulatorReport", "SiteStats", *errors.__all__]
