"""Per-thread arithmetic (``Alu``), warp shuffles (``Shfl``), ``setmaxnreg`` and no-ops.

``Alu``: ``dst[i] = op(srcs[0][i], ...)`` over the register slices of every active thread
(a Python number broadcasts). The function ``op`` (``hexlayout.ir.functions``) gives the
semantics; this module evaluates it as the printed CUDA code does: the operands are
converted into the compute domain (``float`` for floating destinations up to 32 bits,
``double`` for f64, ``float`` for integer destinations of floating functions or operands,
else ``int`` / ``long long``, here int64), the function is evaluated step by step in that
precision, and the result is converted to the destination type: floats round to nearest
even (fp8 saturates to the largest finite value, as ``cvt.rn.satfinite``), float -> int
rounds to nearest even and saturates (NaN -> 0), int -> int wraps. A function with
``integer_domain`` computes on the integers and gives the destination's values itself; one
``on_bits`` (``bitcast``) maps the operands' bit patterns to the destination's.

``Shfl``: ``shfl.sync`` within segments of ``width`` lanes: "bfly" reads lane ``lane ^ arg``,
"idx" lane ``arg``, "up" lane ``lane - arg`` and "down" lane ``lane + arg`` (of the segment;
"up" / "down" past its first / last lane read the thread's own value); the source lane must
be executing the shuffle too.
``SetMaxNReg``: the count must be a multiple of 8 in [24, 256], executed by whole warp groups.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from hexlayout.ir.expr import Expr, evaluate
from hexlayout.ir.functions import NUMPY_DOMAIN, compute_domain
from hexlayout.ir.lowered import SHFL_MODES, Alu, Comment, FenceProxyAsync, RegRef, SetMaxNReg, Shfl
from hexlayout.ir.tile import ScalarParam

from .errors import DivergenceError, IllegalInstructionError
from .machine import Active, Machine
from .warps import whole_units

__all__ = ["HANDLERS", "round_to", "to_integer"]

_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd (exact results stay exact)."""
    t = x.astype(np.float32)
    over = np.abs(t.astype(np.float64)) > np.abs(x)
    t = np.where(over & np.isfinite(t), np.nextafter(t, np.float32(0)), t).astype(np.float32)
    inexact = (t.astype(np.float64) != x) & np.isfinite(x)
    bits = t.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def round_to(x: np.ndarray, npd: np.dtype, name: str) -> np.ndarray:
    """float64 values rounded to nearest even in the (float) type ``npd``."""
    x = np.asarray(x, dtype=np.float64)
    if name in _FP8_MAX:
        x = np.where(np.isnan(x), x, np.clip(x, -_FP8_MAX[name], _FP8_MAX[name]))
    if npd in (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)):
        return x.astype(npd)
    return _round_to_odd_f32(x).astype(npd)


def to_integer(x: np.ndarray, npd: np.dtype) -> np.ndarray:
    """Floating values rounded to nearest even and saturated to the integer type ``npd``
    (NaN -> 0), as ``cvt.rni.sat`` / ``__float2int_rn``."""
    info = np.iinfo(npd)
    r = np.rint(np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0))
    hi = r >= float(info.max) + 1.0            # exact powers of two: 2**31, 2**63, ...
    lo = r <= float(info.min)
    mid = np.where(hi | lo, 0.0, r)
    return np.where(hi, info.max, np.where(lo, info.min, mid.astype(np.int64))).astype(npd)


def _source(m: Machine, ins: Alu, x: Active, s: Any) -> tuple[Any, bool]:
    """Operand ``s`` as an array (or scalar) of the compute domain, and whether it is floating."""
    if isinstance(s, RegRef):
        if s.count != ins.dst.count:
            m.fail(IllegalInstructionError, ins, f"{ins.op}: source {s.array.name} has {s.count} element(s), "
                                                 f"the destination {ins.dst.count}")
        return m.read_regs(s, x.tids, x.env, ins), s.array.dtype.is_float
    if isinstance(s, ScalarParam):
        return np.asarray(x.env[s.var]), s.dtype.is_float
    if isinstance(s, Expr):
        v = np.asarray(evaluate(s, m.with_registers(s, x.env)))   # a float scalar stays a float
        return (v.reshape(-1, 1) if v.ndim else v), v.dtype.kind == "f"
    return np.asarray(s), isinstance(s, float)


def alu(m: Machine, ins: Alu, x: Active) -> None:
    fn = ins.op
    if len(ins.srcs) != fn.arity:
        m.fail(IllegalInstructionError, ins, f"{fn} takes {fn.arity} operand(s), got {len(ins.srcs)}")
    if not len(x.tids):
        return
    dst_t = ins.dst.array.dtype
    npd = np.dtype(dst_t.numpy())
    if fn.on_bits:
        return _on_bits(m, ins, x, npd)
    raw = [_source(m, ins, x, s) for s in ins.srcs]
    dom = compute_domain(fn, dst_t, any(f for _, f in raw))
    npdom = NUMPY_DOMAIN[dom]
    with np.errstate(all="ignore"):
        vals = [np.asarray(v).astype(npdom) for v, _ in raw]
        r = np.asarray(fn.numpy(*vals))
        r = np.broadcast_to(r, (len(x.tids), ins.dst.count))
        if fn.integer_domain and dst_t.is_float:
            out = r.astype(npd)                 # numpy gave the destination's values
        elif dst_t.is_float:
            out = round_to(r.astype(npdom).astype(np.float64), npd, dst_t.name)
        elif npd == np.dtype(np.bool_):
            out = r != 0
        elif dom in ("float", "double"):
            out = to_integer(r, npd)
        else:
            out = r.astype(np.int64).astype(npd)
    m.write_regs(ins.dst, x.tids, x.env, ins, out)


def _on_bits(m: Machine, ins: Alu, x: Active, npd: np.dtype) -> None:
    """A function of bit patterns (``bitcast``): each operand element's bytes as a uint64
    (zero-extended), the result's low bytes into the destination."""
    n = ins.dst.count
    pats = []
    for s in ins.srcs:
        if not isinstance(s, RegRef):
            m.fail(IllegalInstructionError, ins, f"{ins.op}: operand {s!r} is not a register slice")
        if s.count != n:
            m.fail(IllegalInstructionError, ins, f"{ins.op}: source {s.array.name} has {s.count} element(s), "
                                                 f"the destination {n}")
        b = m.read_reg_bytes(s, x.tids, x.env, ins).reshape(len(x.tids), n, -1)
        wide = np.zeros((len(x.tids), n, 8), dtype=np.uint8)
        wide[:, :, :min(8, b.shape[2])] = b[:, :, :8]
        pats.append(wide.view("<u8")[:, :, 0])
    r = np.broadcast_to(np.asarray(ins.op.numpy(*pats), dtype=np.uint64), (len(x.tids), n))
    out = np.ascontiguousarray(r).astype("<u8").view(np.uint8).reshape(len(x.tids), n, 8)[:, :, :npd.itemsize]
    m.write_reg_bytes(ins.dst, x.tids, x.env, ins, np.ascontiguousarray(out).reshape(len(x.tids), -1))


def shfl(m: Machine, ins: Shfl, x: Active) -> None:
    if not len(x.tids):
        return
    if ins.mode not in SHFL_MODES:
        m.fail(IllegalInstructionError, ins, f"shfl mode {ins.mode!r} (this IR has {', '.join(SHFL_MODES)})")
    w = ins.width
    if w not in (1, 2, 4, 8, 16, 32):
        m.fail(IllegalInstructionError, ins, f"shfl width {w} is not a power of two <= 32")
    if ins.src.count != ins.dst.count:
        m.fail(IllegalInstructionError, ins, "shfl source and destination slices differ in size")
    src = m.read_reg_bytes(ins.src, x.tids, x.env, ins)
    arg = m.ev_vec(ins.arg, x.env, len(x.tids))
    lane = x.tids & 31
    seg = lane - lane % w
    own = lane % w
    if ins.mode == "bfly":
        j = own ^ arg
    elif ins.mode == "idx":
        j = arg % w
    else:
        j = own - arg if ins.mode == "up" else own + arg
        j = np.where((j >= 0) & (j < w), j, own)
    src_tid = (x.tids - lane) + seg + (j % w)
    pos = np.full(m.T, -1, dtype=np.int64)
    pos[x.tids] = np.arange(len(x.tids))
    p = pos[src_tid]
    if (p < 0).any():
        i = int(np.flatnonzero(p < 0)[0])
        m.fail(
            DivergenceError,
            ins,
            f"shfl.sync: thread {int(x.tids[i])} reads lane {int(src_tid[i]) & 31}, "
            f"which is not executing the shuffle",
            thread=int(x.tids[i]),
        )
    m.write_reg_bytes(ins.dst, x.tids, x.env, ins, src[p])


def set_max_nreg(m: Machine, ins: SetMaxNReg, x: Active) -> None:
    if ins.count % 8 or not 24 <= ins.count <= 256:
        m.fail(
            IllegalInstructionError,
            ins,
            f"setmaxnreg.{'inc' if ins.increase else 'dec'} {ins.count}: the "
            f"count must be a multiple of 8 in [24, 256]",
        )
    if not len(x.tids):
        return
    grid = whole_units(m, ins, x.tids, 128, "setmaxnreg")
    regs = m.state.setdefault("maxnreg", {})
    for row in grid:
        regs[int(row[0]) // 128] = ins.count


def nop(m: Machine, ins: Any, x: Active) -> None:
    return None


HANDLERS = {Alu: alu, Shfl: shfl, SetMaxNReg: set_max_nreg, Comment: nop, FenceProxyAsync: nop}

assert ml_dtypes  # bf16 / fp8 numpy types come from ml_dtypes (imported for their registration)
