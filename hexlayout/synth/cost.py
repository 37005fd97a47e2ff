"""Static cost of lowered instructions: issue slots, shared-memory wavefronts, global sectors.

Each instruction is weighted by ``8 ** loop_depth`` of the tile op it came from (trip
counts are unknown at synthesis time; deeper loops dominate). Addresses are evaluated
for every thread of the region with loop variables at 0:

- shared accesses (ld/st.shared, ldmatrix/stmatrix rows, cp.async destinations): the
  wavefronts of each warp-wide request under the bank model of ``hexlayout.arch``;
- global accesses (ld/st.global, cp.async sources): the 32-byte sectors per warp request
  (``hexlayout.arch.sectors``);
- atomics (``red.global``): the sectors of the same store, twice (each sector is read,
  modified and written back at L2);
- TMA boxes (``SM90_TMA_LOAD`` / ``SM90_TMA_STORE``): the box's bytes in whole 32-byte sectors
  on the global side, and on the shared side the box's bytes in conflict-free 128-byte
  wavefronts (the TMA unit moves whole swizzled lines: no bank conflicts, but the traffic of
  a conflict-free ``cp.async`` or ``ld.shared`` of the same bytes);
- issue: one slot per instruction (mma.sync 2, wgmma 4, an ALU op its function's ``issue``,
  one per 4 elements).

``cost = issue + wavefronts + sectors``; ``CostBreakdown`` keeps the parts for ``explain``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexlayout.arch.banks import bank_conflicts
from hexlayout.arch.sectors import SECTOR_BYTES, global_sectors
from hexlayout.ir.atomic import RedGlobal
from hexlayout.ir.expr import Expr, Var, evaluate, free_vars, reg_reads
from hexlayout.ir.lowered import (
    Alu,
    CpAsync,
    Instr,
    LdGlobal,
    Ldmatrix,
    LdShared,
    MmaSync,
    StGlobal,
    Stmatrix,
    StShared,
    TmaLoad,
    TmaStore,
    Wgmma,
)
from hexlayout.memo import memoized

__all__ = ["CostBreakdown", "instr_cost"]


@dataclass
class CostBreakdown:
    issue: float = 0.0
    wavefronts: float = 0.0
    ideal_wavefronts: float = 0.0
    sectors: float = 0.0

    @property
    def total(self) -> float:
        return self.issue + self.wavefronts + self.sectors

    @property
    def bank_conflicts(self) -> float:
        return self.wavefronts - self.ideal_wavefronts

    def add(self, other: CostBreakdown, weight: float = 1.0) -> None:
        self.issue += weight * other.issue
        self.wavefronts += weight * other.wavefronts
        self.ideal_wavefronts += weight * other.ideal_wavefronts
        self.sectors += weight * other.sectors

    def as_dict(self) -> dict[str, float]:
        return {"total": self.total, "issue": self.issue, "smem_wavefronts": self.wavefronts,
                "bank_conflicts": self.bank_conflicts, "gmem_sectors": self.sectors}


def _addresses(e: Any, tid: Any, tids: np.ndarray) -> np.ndarray:
    """Element offsets of ``e`` for threads ``tids`` (a read-only array; memoized per
    expression and thread range: a synthesis costs the same addresses under many candidates)."""
    if not isinstance(e, Expr):
        return np.full(tids.shape, int(e), dtype=np.int64)
    return _addresses_memo(e, tid, int(tids[0]) if tids.size else 0, int(tids.size))


@memoized(1 << 15)
def _addresses_memo(e: Expr, tid: Any, lo: int, n: int) -> np.ndarray:
    """``_evaluate_addresses`` for the threads ``lo .. lo + n - 1`` (a read-only array)."""
    out = _evaluate_addresses(e, tid, np.arange(lo, lo + n, dtype=np.int64))
    out.flags.writeable = False
    return out


def _evaluate_addresses(e: Expr, tid: Any, tids: np.ndarray) -> np.ndarray:
    # sizes at a generic large multiple of 128 (strides keep their alignment), indices at 0;
    # gathered row indices (register values) distinct per thread and slot
    env: dict[Any, Any] = {v: (4096 if v.kind == "size" else 0) for v in free_vars(e)}
    env[tid] = tids
    for r in reg_reads(e):
        env[r.array] = tids[:, None] * 131 + np.arange(max(1, r.array.count))[None, :]
    try:
        with np.errstate(divide="raise"):  # a zero divisor over per-thread arrays raises too
            val = evaluate(e, env)
    except (ZeroDivisionError, FloatingPointError):
        # a divisor is 0 at these values (a scalar argument as the divisor): evaluate with
        # every variable at 1 instead, where the quotient means something
        env = {v: (1 if isinstance(v, Var) else env[v]) for v in env}
        env[tid] = tids
        val = evaluate(e, env)
    return np.array(np.broadcast_to(np.asarray(val, dtype=np.int64), tids.shape))


def _smem_cost(byte_addr: np.ndarray, width: int) -> tuple[float, float]:
    """(wavefronts, conflict-free wavefronts) of the warps' accesses (memoized by address)."""
    a = np.ascontiguousarray(byte_addr, dtype=np.int64)
    return _smem_cost_memo(a.tobytes(), width)


@functools.lru_cache(maxsize=1 << 14)
def _smem_cost_memo(addr_bytes: bytes, width: int) -> tuple[float, float]:
    byte_addr = np.frombuffer(addr_bytes, dtype=np.int64)
    n = byte_addr.size // 32 * 32
    if n == 0:
        return 0.0, 0.0
    rep = bank_conflicts(byte_addr[:n].reshape(-1, 32), width)
    return float(np.sum(rep.wavefronts)), float(np.sum(rep.min_wavefronts))


def _sectors(byte_addr: np.ndarray, width: int) -> float:
    n = byte_addr.size
    pad = (-n) % 32
    a = np.pad(byte_addr.astype(np.int64), (0, pad), constant_values=-1) if pad else byte_addr
    return float(np.sum(global_sectors(a.reshape(-1, 32), width)))


#: cost of an atomic's sector relative to a plain store's (read, modify, write back at L2)
ATOMIC_SECTOR_FACTOR = 2.0
#: bytes of one conflict-free shared-memory wavefront (32 banks x 4 bytes)
WAVEFRONT_BYTES = 128


def _tma_cost(c: CostBreakdown, desc: Any) -> None:
    """A TMA box: whole sectors on the global side, conflict-free wavefronts on the shared side."""
    nbytes = max(1, desc.param.dtype.bits // 8)
    for b in desc.box:
        nbytes *= b
    c.sectors = float(-(-nbytes // SECTOR_BYTES))
    c.wavefronts = c.ideal_wavefronts = float(-(-nbytes // WAVEFRONT_BYTES))


def instr_cost(ins: Instr, tid: Any, lo: int, hi: int) -> CostBreakdown:
    """Cost of one execution of ``ins`` by threads ``[lo, hi)``."""
    c = CostBreakdown()
    tids = np.arange(lo, hi, dtype=np.int64)
    if isinstance(ins, MmaSync):
        c.issue = 2
    elif isinstance(ins, Wgmma):
        c.issue = 4
    elif isinstance(ins, Alu):
        c.issue = ins.op.issue(ins.dst.count)
    else:
        c.issue = 1
    if isinstance(ins, (LdShared, StShared)):
        ref = ins.src if isinstance(ins, LdShared) else ins.dst
        eb = ref.buffer.dtype.bits // 8
        addr = ref.buffer.offset + _addresses(ref.offset, tid, tids) * eb
        c.wavefronts, c.ideal_wavefronts = _smem_cost(addr, ins.bits // 8)
    elif isinstance(ins, (Ldmatrix, Stmatrix)):
        ref = ins.src if isinstance(ins, Ldmatrix) else ins.dst
        eb = ref.buffer.dtype.bits // 8
        addr = ref.buffer.offset + _addresses(ref.offset, tid, tids) * eb
        c.wavefronts, c.ideal_wavefronts = _smem_cost(addr, 16)
    elif isinstance(ins, CpAsync):
        eb = ins.dst.buffer.dtype.bits // 8
        addr = ins.dst.buffer.offset + _addresses(ins.dst.offset, tid, tids) * eb
        c.wavefronts, c.ideal_wavefronts = _smem_cost(addr, ins.nbytes)
        c.sectors = _sectors(_addresses(ins.src.offset, tid, tids) * eb, ins.nbytes)
    elif isinstance(ins, (LdGlobal, StGlobal)):
        ref = ins.src if isinstance(ins, LdGlobal) else ins.dst
        eb = max(1, ref.param.dtype.bits // 8)
        c.sectors = _sectors(_addresses(ref.offset, tid, tids) * eb, ins.bits // 8)
        if isinstance(ins, RedGlobal):
            c.sectors *= ATOMIC_SECTOR_FACTOR
    elif isinstance(ins, (TmaLoad, TmaStore)):
        _tma_cost(c, ins.desc)
    return c
