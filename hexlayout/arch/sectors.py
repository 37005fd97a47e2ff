"""Global-memory sector model: the 32-byte sectors one warp-wide request touches.

A global access of ``width`` bytes at byte address ``a`` touches the sectors
``a // 32 .. (a + width - 1) // 32``; a warp's request costs one transaction per *distinct*
sector its active lanes touch (L1/L2 move whole 32-byte sectors). A request is coalesced
when that count equals ``ceil(distinct bytes / 32)``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SECTOR_BYTES", "global_sectors"]

SECTOR_BYTES = 32


def global_sectors(addresses: np.ndarray | list[int], width: int) -> np.ndarray:
    """Distinct 32-byte sectors of each request: ``addresses`` has shape ``(..., lanes)``
    (byte addresses, lane order; a negative address marks an inactive lane); the result has
    the leading shape ``(...)``."""
    addr = np.asarray(addresses, dtype=np.int64)
    if addr.ndim == 1:
        addr = addr[None]
        scalar = True
    else:
        scalar = False
    batch = addr.shape[:-1]
    flat = addr.reshape(-1, addr.shape[-1])
    first = flat // SECTOR_BYTES
    span = int(((flat + width - 1) // SECTOR_BYTES - first).max(initial=0)) + 1
    secs = np.where(flat[..., None] >= 0, first[..., None] + np.arange(span), -1)
    ends = np.where(flat >= 0, (flat + width - 1) // SECTOR_BYTES, -1)[..., None]
    secs = np.where(secs <= ends, secs, -1).reshape(flat.shape[0], -1)
    secs = np.sort(secs, axis=-1)
    distinct = (secs >= 0) & np.concatenate([np.ones((secs.shape[0], 1), bool), secs[:, 1:] != secs[:, :-1]],
                                            axis=-1)
    out = distinct.sum(axis=-1).reshape(batch)
    return out[0] if scalar else out
