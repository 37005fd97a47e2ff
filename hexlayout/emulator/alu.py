"""Per-thread arithmetic (``Alu``), warp shuffles (``Shfl``), ``setmaxnreg`` and no-ops.

``Alu``: ``dst[i] = op(srcs[0][i], ...)`` over the register slices of every active thread
(a Python number broadcasts). Floating results are computed in float64 and rounded once to
the destination type (round to nearest even; for + - * / sqrt this equals the correctly
rounded operation in the destination precision; bf16 / fp8 go through round-to-odd float32
so that no double rounding occurs). Integer results are computed in int64 and wrapped.
``cvt`` converts to the destination type: float -> float rounds to nearest even (fp8
saturates to the largest finite value, as ``cvt.rn.satfinite``), float -> int rounds to
nearest even and saturates (NaN -> 0), int -> int wraps. ``gelu`` is the tanh
approximation; ``silu(x) = x / (1 + exp(-x))``; ``select(c, a, b) = c != 0 ? a : b``.

``Shfl``: ``shfl.sync`` within segments of ``width`` lanes: "bfly" reads lane ``lane ^ arg``,
"idx" lane ``arg`` (of the segment); the source lane must be executing the shuffle too.
``SetMaxNReg``: the count must be a multiple of 8 in [24, 256], executed by whole warp groups.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from hexlayout.ir.expr import Expr, evaluate
from hexlayout.ir.lowered import ALU_OPS, Alu, Comment, FenceProxyAsync, RegRef, SetMaxNReg, Shfl
from hexlayout.ir.tile import ScalarParam

from .errors import DivergenceError, IllegalInstructionError
from .machine import Active, Machine
from .warps import whole_units

__all__ = ["HANDLERS", "round_to"]

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


def _to_int(x: np.ndarray, npd: np.dtype, from_float: bool) -> np.ndarray:
    if from_float:
        info = np.iinfo(npd)
        r = np.rint(np.nan_to_num(x, nan=0.0, posinf=info.max, neginf=info.min))
        return np.clip(r, info.min, info.max).astype(npd)
    return np.asarray(x).astype(np.int64).astype(npd)


def _gelu(a: np.ndarray) -> np.ndarray:
    return 0.5 * a * (1.0 + np.tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))


_UNARY = {
    "mov": lambda a: a,
    "cvt": lambda a: a,
    "neg": np.negative,
    "abs": np.abs,
    "exp2": np.exp2,
    "exp": np.exp,
    "log2": np.log2,
    "log": np.log,
    "rcp": lambda a: 1.0 / a,
    "rsqrt": lambda a: 1.0 / np.sqrt(a),
    "sqrt": np.sqrt,
    "silu": lambda a: a / (1.0 + np.exp(-a)),
    "gelu": _gelu,
    "not": np.logical_not,
}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
           "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
           "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or}


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe)
    return np.where(b == 0, 0, np.where((a < 0) != (safe < 0), -q, q))


def alu(m: Machine, ins: Alu, x: Active) -> None:
    if ins.op not in ALU_OPS:
        m.fail(
            IllegalInstructionError, ins, f"unknown ALU op {ins.op!r}; known: {', '.join(sorted(ALU_OPS))}"
        )
    if len(ins.srcs) != ALU_OPS[ins.op]:
        m.fail(
            IllegalInstructionError, ins, f"{ins.op} takes {ALU_OPS[ins.op]} operand(s), got {len(ins.srcs)}"
        )
    if not len(x.tids):
        return
    dst_t = ins.dst.array.dtype
    npd = np.dtype(dst_t.numpy())
    dst_float = dst_t.is_float
    vals: list[Any] = []
    any_float_src = False
    for s in ins.srcs:
        if isinstance(s, RegRef):
            if s.count != ins.dst.count:
                m.fail(
                    IllegalInstructionError,
                    ins,
                    f"{ins.op}: source {s.array.name} has {s.count} element(s), "
                    f"the destination {ins.dst.count}",
                )
            v = m.read_regs(s, x.tids, x.env, ins)
            any_float_src |= s.array.dtype.is_float
            vals.append(v.astype(np.float64) if (dst_float or s.array.dtype.is_float) else v.astype(np.int64))
        elif isinstance(s, ScalarParam):
            v = x.env[s.var]
            any_float_src |= s.dtype.is_float
            vals.append(float(v) if dst_float or s.dtype.is_float else int(v))
        elif isinstance(s, Expr):
            v = np.asarray(evaluate(s, m.with_registers(s, x.env)))   # a float scalar stays a float
            is_float = v.dtype.kind == "f"
            any_float_src |= is_float
            v = v.astype(np.float64 if is_float else np.int64)
            v = np.broadcast_to(v.reshape(-1, 1) if v.ndim else v, (len(x.tids), 1))
            vals.append(v.astype(np.float64) if dst_float else v)
        else:
            any_float_src |= isinstance(s, float)
            vals.append(float(s) if dst_float or isinstance(s, float) else int(s))
    op = ins.op
    with np.errstate(all="ignore"):
        if op in _UNARY:
            r = _UNARY[op](vals[0])
            if not dst_float and op not in ("mov", "cvt", "neg", "abs", "not"):
                r = np.asarray(r, dtype=np.float64)
                any_float_src = True
        elif op in _BINARY:
            r = _BINARY[op](vals[0], vals[1])
        elif op == "div":
            r = (
                vals[0] / vals[1]
                if (dst_float or any_float_src)
                else _int_div(np.asarray(vals[0]), np.asarray(vals[1]))
            )
        elif op == "fma":
            r = vals[0] * vals[1] + vals[2]
        else:  # select
            r = np.where(np.asarray(vals[0]) != 0, vals[1], vals[2])
        r = np.broadcast_to(np.asarray(r), (len(x.tids), ins.dst.count))
        if dst_float:
            out = round_to(r, npd, dst_t.name)
        elif npd == np.dtype(np.bool_):
            out = np.asarray(r) != 0
        else:
            out = _to_int(r, npd, from_float=any_float_src or r.dtype.kind == "f")
    m.write_regs(ins.dst, x.tids, x.env, ins, out)


def shfl(m: Machine, ins: Shfl, x: Active) -> None:
    if not len(x.tids):
        return
    if ins.mode not in ("bfly", "idx"):
        m.fail(IllegalInstructionError, ins, f"shfl mode {ins.mode!r} (this IR has 'bfly' and 'idx')")
    w = ins.width
    if w not in (1, 2, 4, 8, 16, 32):
        m.fail(IllegalInstructionError, ins, f"shfl width {w} is not a power of two <= 32")
    if ins.src.count != ins.dst.count:
        m.fail(IllegalInstructionError, ins, "shfl source and destination slices differ in size")
    src = m.read_reg_bytes(ins.src, x.tids, x.env, ins)
    arg = m.ev_vec(ins.arg, x.env, len(x.tids))
    lane = x.tids & 31
    seg = lane - lane % w
    j = (lane % w) ^ arg if ins.mode == "bfly" else arg % w
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
