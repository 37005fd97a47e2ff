"""Checks for collective instructions: whole warps / warp groups must execute them."""

from __future__ import annotations

import numpy as np

from hexlayout.ir.lowered import Instr

from .errors import DivergenceError
from .machine import Machine

__all__ = ["whole_units"]


def whole_units(m: Machine, ins: Instr, tids: np.ndarray, size: int, what: str) -> np.ndarray:
    """``tids`` as ``[units, size]`` rows of complete, aligned warps (32) or warp groups (128)."""
    n = len(tids)
    if n % size == 0 and n:
        grid = tids.reshape(-1, size)
        if np.all(grid == grid[:, :1] + np.arange(size)) and np.all(grid[:, 0] % size == 0):
            return grid
    units = np.unique(tids // size)
    for u in units:
        have = np.isin(np.arange(u * size, (u + 1) * size), tids)
        if not have.all():
            missing = int(np.arange(u * size, (u + 1) * size)[~have][0])
            m.fail(
                DivergenceError,
                ins,
                f"{what} needs all {size} threads of its "
                f"{'warp' if size == 32 else 'warp group'} {int(u)} active, thread {missing} is not",
                thread=missing,
            )
    raise AssertionError("unreachable")
