"""Shared-memory bank model: wavefronts of one warp-wide request.

Shared memory has 32 banks of 4 bytes; the 4-byte word at byte address ``a`` is word
``a // 4`` in bank ``(a // 4) % 32``. A request is split into phases by access width:

* 1, 2, 4 bytes: one phase of 32 lanes;
* 8 bytes: two phases (half-warps, lanes 0-15 and 16-31);
* 16 bytes: four phases (quarter-warps of 8 lanes; ldmatrix rows, ld.shared.v4, cp.async 16 B).

A phase needs as many wavefronts as the largest number of *distinct* words that fall in one
bank (the same word read by several lanes is a broadcast and free); a phase with no
active lane needs none. The request's wavefronts are the sum over its phases; the
minimum is the number of phases with an active lane, and ``conflicts = wavefronts - minimum``.
A 16-byte phase is conflict-free exactly when its (up to) 8 chunks fall in distinct
16-byte bank groups (or coincide).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


__all__ = ["BankReport", "bank_conflicts", "ldmatrix_bank_conflicts", "NUM_BANKS", "BANK_BYTES"]

NUM_BANKS = 32
BANK_BYTES = 4
_LANES_PER_PHASE = {1: 32, 2: 32, 4: 32, 8: 16, 16: 8}


@dataclass(frozen=True)
class BankReport:
    """Wavefronts of a request (ints, or arrays over a batch of requests)."""

    wavefronts: int | np.ndarray
    min_wavefronts: int | np.ndarray
    conflicts: int | np.ndarray

    @property
    def conflict_free(self) -> bool | np.ndarray:
        return self.conflicts == 0


def bank_conflicts(addresses: np.ndarray | list[int], width: int,
                   active: np.ndarray | list[bool] | None = None) -> BankReport:
    """Wavefronts needed by a warp-wide shared-memory access of ``width`` bytes per lane.

    ``addresses``: byte addresses, shape ``(..., lanes)`` with ``lanes <= 32`` (lane order;
    missing lanes are inactive); a negative address, or ``active == False``, marks an
    inactive lane. Leading dimensions are a batch of independent requests (vectorized).
    Each active address must be a multiple of ``width``.
    """
    import numpy as np
    if width not in _LANES_PER_PHASE:
        raise ValueError(f"bank_conflicts: width {width} bytes is not one of 1, 2, 4, 8, 16")
    addr = np.asarray(addresses, dtype=np.int64)
    if addr.ndim == 0:
        addr = addr.reshape(1)
    scalar = addr.ndim == 1
    lanes = addr.shape[-1]
    if lanes > 32:
        raise ValueError(f"bank_conflicts: {lanes} lanes, a warp has 32")
    act = addr >= 0
    if active is not None:
        act = act & np.broadcast_to(np.asarray(active, dtype=bool), addr.shape)
    if lanes < 32:
        pad = [(0, 0)] * (addr.ndim - 1) + [(0, 32 - lanes)]
        addr = np.pad(addr, pad, constant_values=-1)
        act = np.pad(act, pad, constant_values=False)
    if np.any(act & (addr % width != 0)):
        bad = addr[act & (addr % width != 0)].reshape(-1)[0]
        raise ValueError(f"bank_conflicts: address {int(bad)} is not aligned to the access width {width} B")
    batch = addr.shape[:-1]
    per_phase = _LANES_PER_PHASE[width]
    nphase = 32 // per_phase
    nwords = max(1, width // BANK_BYTES)
    words = addr[..., None] // BANK_BYTES + np.arange(nwords)            # (..., 32, nwords)
    keys = np.where(act[..., None], words, -1).reshape(-1, nphase, per_phase * nwords)
    keys = np.sort(keys, axis=-1)
    first = np.ones(keys.shape, dtype=bool)
    first[..., 1:] = keys[..., 1:] != keys[..., :-1]
    distinct = first & (keys >= 0)                                        # one entry per distinct word
    rows = keys.shape[0] * nphase
    flat_row = np.broadcast_to(np.arange(rows).reshape(keys.shape[0], nphase, 1), keys.shape)
    bank = np.where(distinct, keys % NUM_BANKS, 0)
    counts = np.bincount((flat_row * NUM_BANKS + bank)[distinct], minlength=rows * NUM_BANKS)
    per_phase_wf = counts.reshape(keys.shape[0], nphase, NUM_BANKS).max(axis=-1)
    phase_active = act.reshape(-1, nphase, per_phase).any(axis=-1)
    wf = per_phase_wf.sum(axis=-1).reshape(batch)
    mn = phase_active.sum(axis=-1).reshape(batch)
    if scalar:
        return BankReport(int(wf), int(mn), int(wf - mn))
    return BankReport(wf, mn, wf - mn)


def ldmatrix_bank_conflicts(row_addresses: np.ndarray | list[int], num: int = 4) -> BankReport:
    """Wavefronts of ``ldmatrix``/``stmatrix .x{num}``: lanes ``0 .. 8*num-1`` give 16-byte
    row addresses, each 8-lane phase reads its 8 rows (the other lanes are ignored)."""
    import numpy as np
    if num not in (1, 2, 4):
        raise ValueError(f"ldmatrix: .x{num} is not one of .x1, .x2, .x4")
    addr = np.asarray(row_addresses, dtype=np.int64)
    lane = np.arange(addr.shape[-1])
    return bank_conflicts(addr, 16, active=lane < 8 * num)
