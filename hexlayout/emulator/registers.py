"""The register file: one byte array ``[threads, count * itemsize]`` per ``RegArray``.

Registers are stored as raw bytes with a typed view (``typed(array)``, shape
``[threads, count]`` in the array's numpy dtype), so instructions that move bits
(loads, stores, ldmatrix, mma fragments of another declared type) copy bytes and
arithmetic uses the typed view. Registers start as ``0xFF`` bytes (NaN for floats, -1
for integers): a kernel that reads a register it never wrote gets visibly wrong results.

Asynchronous use (wgmma): ``pending_write[array]`` marks elements that an in-flight
wgmma will write (its D): reading or writing them is an error until ``wgmma.wait_group``;
``pending_read[array]`` marks elements an in-flight wgmma reads (a register A): writing
them is an error. Marks hold the wgmma record id (0 = none).
"""

from __future__ import annotations

import numpy as np

from hexlayout.ir.lowered import RegArray

__all__ = ["RegisterFile"]


class RegisterFile:
    def __init__(self, arrays: list[RegArray], threads: int, fill: int = 0xFF) -> None:
        self.threads = threads
        self.raw: dict[RegArray, np.ndarray] = {}
        self.views: dict[RegArray, np.ndarray] = {}
        self.itemsize: dict[RegArray, int] = {}
        self.fill = fill
        self.pending_write: dict[RegArray, np.ndarray] = {}
        self.pending_read: dict[RegArray, np.ndarray] = {}
        for a in arrays:
            self.add(a)

    def add(self, a: RegArray) -> None:
        dt = np.dtype(a.dtype.numpy())
        raw = np.full((self.threads, a.count * dt.itemsize), self.fill, dtype=np.uint8)
        self.raw[a] = raw
        self.views[a] = raw.view(dt)
        self.itemsize[a] = dt.itemsize

    def ensure(self, a: RegArray) -> None:
        """Register arrays not listed in ``kernel.registers`` are created on first use."""
        if a not in self.raw:
            self.add(a)

    def typed(self, a: RegArray) -> np.ndarray:
        return self.views[a]

    def pending_marks(self, a: RegArray, write: bool) -> np.ndarray:
        table = self.pending_write if write else self.pending_read
        m = table.get(a)
        if m is None:
            m = np.zeros((self.threads, a.count), dtype=np.int32)
            table[a] = m
        return m
