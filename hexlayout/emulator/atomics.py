"""``red.global.add``: atomic additions into global memory, exactly as the GPU rounds them.

Each active thread, in thread order, reads the element(s) at its address, adds its register
value(s) and writes the rounded sum back (a read-modify-write that no other access can
split; atomics do not race with each other, and the order between threads, which the
hardware leaves open, only changes the rounding of floating-point sums). Per element type:

- f32 (``red.global.add.f32``): IEEE single addition rounded to nearest even, with
  subnormal inputs and results flushed to sign-preserving zero (PTX: ``atom.add.f32``
  flushes subnormals);
- f16 / f16x2 and bf16 / bf16x2 (``.noftz``): each 16-bit element on its own, the exact sum
  rounded once to nearest even, subnormals kept.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from hexlayout.ir.atomic import RedGlobal

from .errors import IllegalInstructionError
from .machine import Active, Machine

__all__ = ["HANDLERS", "add_f32", "add_f16", "add_bf16"]

_F32_MIN_NORMAL = np.float32(2.0 ** -126)


def _ftz32(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < _F32_MIN_NORMAL, np.copysign(np.float32(0), x), x).astype(np.float32)


def add_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``red.add.f32``: ``ftz(ftz(a) + ftz(b))`` in float32, round to nearest even."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _ftz32(_ftz32(a.astype(np.float32)) + _ftz32(b.astype(np.float32)))


def add_f16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``red.add.noftz.f16``: the exact sum (float64 holds it) rounded once to f16."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (a.astype(np.float64) + b.astype(np.float64)).astype(np.float16)


def _round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd (truncate, then set the last bit if inexact): a
    second rounding to a narrower type then rounds as if from ``x`` itself."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
        inexact = np.isfinite(x) & (f.astype(np.float64) != x)
        away = inexact & (np.abs(f.astype(np.float64)) > np.abs(x))
        f = np.where(away, np.nextafter(f, np.float32(0)), f).astype(np.float32)
        bits = f.view(np.uint32) | np.where(inexact, np.uint32(1), np.uint32(0))
        return bits.astype(np.uint32).view(np.float32)


def add_bf16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``red.add.noftz.bf16``: the sum rounded once to bf16 (through round-to-odd float32)."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = a.astype(np.float64) + b.astype(np.float64)
    return _round_to_odd_f32(s).astype(ml_dtypes.bfloat16)


_ADD = {"f32": (np.float32, add_f32), "f16": (np.float16, add_f16), "bf16": (ml_dtypes.bfloat16, add_bf16)}


def red_global(m: Machine, ins: RedGlobal, x: Active) -> None:
    dt = ins.src.array.dtype
    entry = _ADD.get(dt.name)
    if ins.op != "add" or entry is None:
        m.fail(IllegalInstructionError, ins, f"red.global.{ins.op} of {dt} is not an instruction")
    npt, add = entry
    nb = ins.bits // 8
    if ins.bits not in (16, 32) or m.reg_bytes_of(ins.src) != nb or (dt.bits == 32 and ins.bits != 32):
        m.fail(IllegalInstructionError, ins, f"red.global.add.{dt}: {ins.bits} bits of {dt} elements")
    if not len(x.tids):
        return
    data = m.read_reg_bytes(ins.src, x.tids, x.env, ins)
    t, addr = m.global_addresses(ins.dst, x.env, x.tids, nb, ins)
    idx = m.byte_idx(addr, nb)
    for i in range(len(x.tids)):                       # one atomic read-modify-write per thread
        old = np.ascontiguousarray(t.raw[idx[i]]).view(npt)
        val = np.ascontiguousarray(data[i]).view(npt)
        t.raw[idx[i]] = add(old, val).astype(npt).view(np.uint8)
    m.count_gmem(ins, x.tids, addr, nb)


HANDLERS = {RedGlobal: red_global}
