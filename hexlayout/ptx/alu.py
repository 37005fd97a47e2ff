"""Integer, floating-point, logic, comparison, move and conversion instructions (PTX ISA
"Integer / Floating-Point / Half Precision / Comparison and Selection / Logic and Shift /
Data Movement and Conversion Instructions"), vectorized over the executing threads.

Integer arithmetic wraps modulo 2^n (computed on the unsigned bits); ``.hi`` / ``.wide``
take the high half / the full 2n-bit product; ``div`` / ``rem`` truncate toward zero (C).
f32 / f64 arithmetic is IEEE round-to-nearest-even (numpy), ``.approx`` functions use the
exact function rounded to the type, ``.sat`` clamps to [0, 1]; ``f16`` / ``bf16`` (and the
packed ``x2`` forms, low half = first element) compute in f32 and round to the type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from .parse import Imm, Instruction, Pair, Reg, Vec
from .types import BITS, NP, SINT, UINT, is_float, is_signed, type_of

__all__ = ["HANDLERS"]

Handler = Callable[[Any, Instruction, Any], Any]
HANDLERS: dict[str, Handler] = {}


def _reg(*names: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = fn
        return fn

    return deco


def _wide(x: np.ndarray, t: str) -> np.ndarray:
    """Integer values as int64 (or uint64 for unsigned 64-bit)."""
    if t in ("u64", "b64"):
        return np.asarray(x, dtype=np.uint64)
    return np.asarray(x).astype(np.int64)


def _wrap(v: np.ndarray, t: str) -> np.ndarray:
    b = BITS[t]
    return np.asarray(v).astype(np.uint64 if b == 64 else np.int64).astype(UINT[b]).view(NP[t])


_PACKED = {"f16x2": np.float16, "bf16x2": ml_dtypes.bfloat16}


def _unpack(v: Any, t: str) -> np.ndarray:
    """``x2`` packed bits -> ``[n, 2]`` f32 (low half first)."""
    u = np.atleast_1d(np.asarray(v, dtype=np.uint32))
    return np.ascontiguousarray(u).view(np.uint16).reshape(-1, 2).view(_PACKED[t]).astype(np.float32)


def _pack(v: np.ndarray, t: str) -> np.ndarray:
    return (
        np.ascontiguousarray(v.astype(_PACKED[t])).view(np.uint16).reshape(-1, 2).view(np.uint32).reshape(-1)
    )


def _fmath(ins: Instruction, t: str, fn: Callable[..., Any], srcs: list[Any]) -> Any:
    """A float op on scalar types or packed x2 types, in f32 (f16/bf16) or the type itself."""
    parts = ins.parts
    if t in _PACKED:
        vals = [_unpack(s, t) for s in srcs]
        n = max(v.shape[0] for v in vals)
        vals = [np.broadcast_to(v, (n, 2)) for v in vals]
        out = fn(*vals).astype(np.float32)
        if "sat" in parts:
            out = np.clip(out, 0, 1)
        return _pack(out, t)
    if t in ("f16", "bf16"):
        out = np.asarray(fn(*[np.asarray(s).astype(np.float32) for s in srcs]), dtype=np.float32)
    else:
        with np.errstate(all="ignore"):
            out = np.asarray(fn(*[np.asarray(s) for s in srcs]))
    if "sat" in parts:
        out = np.where(np.isnan(out), 0, np.clip(out, 0, 1))
    return out.astype(NP[t])


def _srcs(m: Any, ins: Instruction, t: str, idx: Any, n: int) -> list[Any]:
    return [m.read(o, t, idx) for o in ins.operands[1 : 1 + n]]


# --- arithmetic ------------------------------------------------------------------------------------


def _int_binop(op: str, a: Any, b: Any, t: str) -> Any:
    if op == "add":
        return _wrap(_wide(a, t) + _wide(b, t), t)
    if op == "sub":
        return _wrap(_wide(a, t) - _wide(b, t), t)
    if op in ("min", "max"):
        return (np.minimum if op == "min" else np.maximum)(a, b)
    raise KeyError(op)


@_reg("add", "sub", "min", "max")
def _addsub(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    a, b = _srcs(m, ins, t, idx, 2)
    op = ins.parts[0]
    if is_float(t):
        fn = {"add": np.add, "sub": np.subtract, "min": np.fmin, "max": np.fmax}[op]
        out = _fmath(ins, t, fn, [a, b])
    elif "sat" in ins.parts and t == "s32":
        out = np.clip(
            _wide(a, t) + (_wide(b, t) if op == "add" else -_wide(b, t)), -(2**31), 2**31 - 1
        ).astype(np.int32)
    else:
        out = _int_binop(op, a, b, t)
    m.write(ins.operands[0], t, idx, out)


def _mul_int(a: Any, b: Any, t: str, mode: str) -> tuple[Any, str]:
    bits = BITS[t]
    if mode == "wide":
        wt = ("s" if is_signed(t) else "u") + str(2 * bits)
        if bits <= 32:
            return _wrap(_wide(a, t) * _wide(b, t), wt), wt
        raise NotImplementedError("mul.wide on 64-bit")
    if mode == "hi":
        if bits <= 32:
            p = _wide(a, t) * _wide(b, t)
            return _wrap(p >> bits, t), t
        sa = np.asarray(a).astype(object)
        sb = np.asarray(b).astype(object)
        p = np.broadcast_arrays(sa, sb)
        hi = np.array([(int(x) * int(y)) >> 64 for x, y in zip(p[0].ravel(), p[1].ravel())], dtype=object)
        return np.array([int(h) % (1 << 64) for h in hi], dtype=np.uint64).view(NP[t]), t
    if bits == 64:
        return (np.asarray(a).astype(np.uint64) * np.asarray(b).astype(np.uint64)).view(NP[t]) if np.ndim(
            a
        ) or np.ndim(b) else _wrap(int(a) * int(b) % (1 << 64), t), t
    return _wrap(_wide(a, t) * _wide(b, t), t), t


def _float_or_int(float_fn: Callable[..., Any]) -> Callable[[Callable[..., None]], Handler]:
    """The handler of a two-source op: for float types it writes ``float_fn(a, b)`` (through
    ``_fmath``: packed x2, .sat), for integer types it calls the decorated
    ``int_op(m, ins, idx, t, a, b)``."""

    def deco(int_op: Callable[..., None]) -> Handler:
        def handler(m: Any, ins: Instruction, idx: Any) -> None:
            t = type_of(ins.parts)
            a, b = _srcs(m, ins, t, idx, 2)
            if is_float(t):
                m.write(ins.operands[0], t, idx, _fmath(ins, t, float_fn, [a, b]))
            else:
                int_op(m, ins, idx, t, a, b)

        return handler

    return deco


def _mul_mode(ins: Instruction) -> str:
    """Which part of an integer product ``mul`` / ``mad`` keep: ``wide``, ``hi`` or ``lo``."""
    return "wide" if "wide" in ins.parts else "hi" if "hi" in ins.parts else "lo"


@_reg("mul")
@_float_or_int(np.multiply)
def _mul(m: Any, ins: Instruction, idx: Any, t: str, a: Any, b: Any) -> None:
    mode = _mul_mode(ins)
    if mode == "wide" and BITS[t] == 64:
        raise m.unsupported()
    out, ot = _mul_int(a, b, t, mode)
    m.write(ins.operands[0], ot, idx, out)


@_reg("mad", "fma")
def _mad(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    if is_float(t):
        a, b, c = _srcs(m, ins, t, idx, 3)
        if t in ("f32",):
            out = (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(
                np.float32
            )
            if "sat" in ins.parts:
                out = np.clip(out, 0, 1)
        else:
            out = _fmath(ins, t, lambda x, y, z: x.astype(np.float64) * y + z, [a, b, c])
        m.write(ins.operands[0], t, idx, out)
        return
    a, b = _srcs(m, ins, t, idx, 2)
    p, pt = _mul_int(a, b, t, _mul_mode(ins))
    c = m.read(ins.operands[3], pt, idx)
    m.write(ins.operands[0], pt, idx, _wrap(_wide(p, pt) + _wide(c, pt), pt))


@_reg("div", "rem")
@_float_or_int(np.divide)
def _div(m: Any, ins: Instruction, idx: Any, t: str, a: Any, b: Any) -> None:
    a, b = np.broadcast_arrays(_wide(a, t), _wide(b, t))
    safe = np.where(b == 0, 1, b)
    if is_signed(t):
        q = np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe)
    else:
        q = a // safe
    out = q if ins.parts[0] == "div" else a - q * safe
    m.write(ins.operands[0], t, idx, _wrap(np.where(b == 0, -1 if ins.parts[0] == "div" else a, out), t))


@_reg("abs", "neg")
def _absneg(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    (a,) = _srcs(m, ins, t, idx, 1)
    if is_float(t):
        out = _fmath(ins, t, np.abs if ins.parts[0] == "abs" else np.negative, [a])
    else:
        w = _wide(a, t)
        out = _wrap(np.abs(w) if ins.parts[0] == "abs" else -w, t)
    m.write(ins.operands[0], t, idx, out)


_UNARY_F: dict[str, Callable[[Any], Any]] = {
    "rcp": lambda x: 1.0 / x,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "ex2": np.exp2,
    "lg2": np.log2,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
}


@_reg(*_UNARY_F)
def _unary_f(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    (a,) = _srcs(m, ins, t, idx, 1)
    m.write(ins.operands[0], t, idx, _fmath(ins, t, _UNARY_F[ins.parts[0]], [a]))


# --- logic and shifts --------------------------------------------------------------------------------


@_reg("and", "or", "xor", "not", "cnot")
def _logic(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    op = ins.parts[0]
    if t == "pred":
        vals = [np.asarray(m.read(o, "pred", idx), dtype=bool) for o in ins.operands[1:]]
        out = {
            "and": lambda: vals[0] & vals[1],
            "or": lambda: vals[0] | vals[1],
            "xor": lambda: vals[0] ^ vals[1],
            "not": lambda: ~vals[0],
        }[op]()
        m.write(ins.operands[0], "pred", idx, out)
        return
    ut = "u" + str(BITS[t])
    vals = [m.read(o, ut, idx) for o in ins.operands[1:]]
    if op == "not":
        out = ~np.asarray(vals[0], dtype=NP[ut])
    elif op == "cnot":
        out = (np.asarray(vals[0]) == 0).astype(NP[ut])
    else:
        out = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op](vals[0], vals[1])
    m.write(ins.operands[0], ut, idx, out)


@_reg("shl", "shr")
def _shift(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    bits = BITS[t]
    a = m.read(ins.operands[1], t, idx)
    b = np.minimum(np.asarray(m.read(ins.operands[2], "u32", idx)).astype(np.int64), bits)
    if ins.parts[0] == "shl":
        ua = np.asarray(a).view(UINT[bits]) if np.ndim(a) else np.array(a).view(UINT[bits])
        out = np.where(b >= bits, 0, ua.astype(np.uint64) << np.minimum(b, bits - 1).astype(np.uint64))
        m.write(ins.operands[0], "u" + str(bits), idx, out.astype(np.uint64).astype(UINT[bits]))
        return
    if is_signed(t):
        out = np.asarray(a).astype(np.int64) >> np.minimum(b, 63)
        if bits == 64:
            out = np.asarray(a) >> np.minimum(b, 63).astype(np.int64)
        m.write(ins.operands[0], t, idx, _wrap(out, t))
    else:
        ua = np.asarray(a).astype(np.uint64)
        out = np.where(b >= bits, 0, ua >> np.minimum(b, bits - 1).astype(np.uint64))
        m.write(ins.operands[0], "u" + str(bits), idx, np.asarray(out).astype(UINT[bits]))


@_reg("lop3")
def _lop3(m: Any, ins: Instruction, idx: Any) -> None:
    a, b, c = (np.asarray(m.read(o, "u32", idx), dtype=np.uint32) for o in ins.operands[1:4])
    lut = (
        int(m.read(ins.operands[4], "u32", idx))
        if isinstance(ins.operands[4], Imm)
        else m.uniform(ins.operands[4], idx, "lop3 immLut")
    )
    out = np.zeros(np.broadcast(a, b, c).shape, dtype=np.uint32)
    for k in range(8):
        if lut >> k & 1:
            out |= (a if k & 4 else ~a) & (b if k & 2 else ~b) & (c if k & 1 else ~c)
    m.write(ins.operands[0], "u32", idx, out)


@_reg("prmt")
def _prmt(m: Any, ins: Instruction, idx: Any) -> None:
    if len(ins.parts) > 2 and ins.parts[1] != "b32":
        raise m.unsupported()
    a, b, c = (np.atleast_1d(np.asarray(m.read(o, "u32", idx), dtype=np.uint32)) for o in ins.operands[1:4])
    n = max(len(a), len(b), len(c))
    a, b, c = (np.broadcast_to(x, (n,)) for x in (a, b, c))
    src = np.stack([a, b], axis=1).astype(np.uint32).copy().view(np.uint8).reshape(n, 8)
    out = np.zeros((n, 4), dtype=np.uint8)
    for k in range(4):
        sel = (c >> np.uint32(4 * k)) & np.uint32(0xF)
        byte = src[np.arange(n), (sel & np.uint32(7)).astype(np.int64)]
        msb = np.where(byte & 0x80, 0xFF, 0).astype(np.uint8)
        out[:, k] = np.where(sel & np.uint32(8), msb, byte)
    m.write(ins.operands[0], "u32", idx, out.view(np.uint32).reshape(n))


@_reg("bfe")
def _bfe(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    bits = BITS[t]
    a = np.asarray(m.read(ins.operands[1], t, idx))
    pos = np.asarray(m.read(ins.operands[2], "u32", idx)).astype(np.int64) & 0xFF
    ln = np.asarray(m.read(ins.operands[3], "u32", idx)).astype(np.int64) & 0xFF
    ua = a.astype(np.int64).astype(np.uint64) if bits < 64 else a.view(np.uint64)
    mask = np.where(
        ln >= 64, ~np.uint64(0), (np.uint64(1) << np.minimum(ln, 63).astype(np.uint64)) - np.uint64(1)
    )
    field = (ua >> np.minimum(pos, 63).astype(np.uint64)) & mask
    field = np.where(pos >= bits, 0, field).astype(np.uint64)
    if is_signed(t):
        top = np.minimum(pos + ln, bits) - 1
        sbit = (ua >> np.maximum(top, 0).astype(np.uint64)) & np.uint64(1)
        sbit = np.where(ln == 0, 0, sbit)
        ext = np.where(sbit == 1, ~mask, np.uint64(0))
        field = field | np.where(ln >= bits, 0, ext).astype(np.uint64)
    m.write(ins.operands[0], t, idx, field.astype(UINT[bits]).view(NP[t]))


@_reg("bfi")
def _bfi(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    bits = BITS[t]
    f, b = (np.asarray(m.read(o, "u" + str(bits), idx)).astype(np.uint64) for o in ins.operands[1:3])
    pos = np.asarray(m.read(ins.operands[3], "u32", idx)).astype(np.int64) & 0xFF
    ln = np.asarray(m.read(ins.operands[4], "u32", idx)).astype(np.int64) & 0xFF
    ln = np.minimum(ln, np.maximum(bits - pos, 0))
    mask = ((np.uint64(1) << ln.astype(np.uint64)) - np.uint64(1)) << np.minimum(pos, 63).astype(np.uint64)
    out = (b & ~mask) | ((f << np.minimum(pos, 63).astype(np.uint64)) & mask)
    m.write(ins.operands[0], "u" + str(bits), idx, out.astype(UINT[bits]))


@_reg("popc", "clz", "brev", "bfind")
def _bits(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    bits = BITS[t]
    a = np.atleast_1d(np.asarray(m.read(ins.operands[1], t, idx)))
    ua = a.view(UINT[bits]).astype(np.uint64) if a.dtype.itemsize * 8 == bits else a.astype(np.uint64)
    op = ins.parts[0]
    if op == "popc":
        out = np.array([bin(int(x)).count("1") for x in ua], dtype=np.uint32)
    elif op == "clz":
        out = np.array([bits - int(x).bit_length() for x in ua], dtype=np.uint32)
    elif op == "brev":
        out = np.array([int(f"{int(x):0{bits}b}"[::-1], 2) for x in ua], dtype=np.uint64).astype(UINT[bits])
        m.write(ins.operands[0], "u" + str(bits), idx, out)
        return
    else:
        vals = [int(x) for x in ua]
        if is_signed(t):
            vals = [v ^ ((1 << bits) - 1) if v >> (bits - 1) else v for v in vals]
        out = np.array([(v.bit_length() - 1) % (1 << 32) if v else 0xFFFFFFFF for v in vals], dtype=np.uint32)
    m.write(ins.operands[0], "u32", idx, out)


# --- comparison and selection ------------------------------------------------------------------------


#: the ordered comparisons (float ``...u`` and unsigned ``lo ls hi hs`` forms map to these)
_RELATIONS = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _compare(cmp: str, a: Any, b: Any, t: str) -> np.ndarray:
    if is_float(t):
        a = np.asarray(a, np.float64) if t in ("f16", "bf16") else np.asarray(a)
        b = np.asarray(b, np.float64) if t in ("f16", "bf16") else np.asarray(b)
        nan = np.isnan(a) | np.isnan(b)
        base = cmp[:-1] if cmp.endswith("u") and cmp not in ("equ",) else cmp
        if cmp == "equ":
            base = "eq"
        if cmp == "num":
            return ~nan
        if cmp == "nan":
            return nan
        r = _RELATIONS[base](a, b)
        if cmp.endswith("u"):
            return r | nan
        return r & ~nan if base != "ne" else r & ~nan
    name = {"lo": "lt", "ls": "le", "hi": "gt", "hs": "ge"}.get(cmp, cmp)
    return _RELATIONS[name](a, b)


_CMPS = {
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "lo",
    "ls",
    "hi",
    "hs",
    "equ",
    "neu",
    "ltu",
    "leu",
    "gtu",
    "geu",
    "num",
    "nan",
}
_BOOL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


@_reg("setp", "set")
def _setp(m: Any, ins: Instruction, idx: Any) -> None:
    parts = ins.parts
    cmp = next(p for p in parts[1:] if p in _CMPS)
    t = type_of(parts)
    a, b = (m.read(o, t, idx) for o in ins.operands[1:3])
    r = _compare(cmp, a, b, t)
    boolop = next((p for p in parts[1:] if p in _BOOL), None)
    dst = ins.operands[0]
    if parts[0] == "set":
        dt = parts[-2] if parts[-2] in NP else "u32"
        if boolop:
            r = _BOOL[boolop](r, m.read(ins.operands[3], "pred", idx))
        val = np.where(r, np.float32(1.0), np.float32(0.0)) if dt == "f32" else np.where(r, 0xFFFFFFFF, 0)
        m.write(dst, dt, idx, np.asarray(val).astype(NP[dt]))
        return
    c = m.read(ins.operands[3], "pred", idx) if boolop else None
    p = _BOOL[boolop](r, c) if boolop else r
    if isinstance(dst, Pair):
        m.write(dst.first, "pred", idx, p)
        m.write(dst.second, "pred", idx, _BOOL[boolop](~r, c) if boolop else ~r)
    else:
        m.write(dst, "pred", idx, p)


@_reg("selp")
def _selp(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    a, b = (m.read(o, t, idx) for o in ins.operands[1:3])
    c = m.read(ins.operands[3], "pred", idx)
    m.write(ins.operands[0], t, idx, np.where(c, a, b))


# --- data movement ---------------------------------------------------------------------------------


@_reg("mov")
def _mov(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    dst, src = ins.operands[0], ins.operands[1]
    bits = BITS[t]
    if isinstance(src, Vec):  # pack {lo, ..., hi}
        k = len(src.items)
        sub = bits // k
        acc = np.zeros(len(m.tid[idx]), dtype=np.uint64)
        for i, it in enumerate(src.items):
            acc |= np.asarray(m.read(it, "u" + str(sub), idx)).astype(np.uint64) << np.uint64(i * sub)
        m.write(dst, "u" + str(bits), idx, acc.astype(UINT[bits]))
        return
    if isinstance(dst, Vec):  # unpack
        k = len(dst.items)
        sub = bits // k
        v = np.asarray(m.read(src, "u" + str(bits), idx)).astype(np.uint64)
        for i, it in enumerate(dst.items):
            m.write(
                it,
                "u" + str(sub),
                idx,
                ((v >> np.uint64(i * sub)) & np.uint64((1 << sub) - 1)).astype(UINT[sub]),
            )
        return
    if isinstance(src, Reg) and src.name.startswith("%") is not False and src.name in m.symbols:
        pass
    m.write(dst, t, idx, m.read(src, t, idx))


@_reg("cvta")
def _cvta(m: Any, ins: Instruction, idx: Any) -> None:
    from .machine import WINDOWS

    t = type_of(ins.parts)
    a = np.asarray(m.read(ins.operands[1], t, idx)).astype(np.uint64)
    parts = ins.parts
    to = "to" in parts
    space = next((p for p in parts[1:] if p in ("global", "shared", "local", "param", "const")), "global")
    off = np.uint64(WINDOWS.get(space, 0))
    out = a - off if to else a + off
    m.write(ins.operands[0], t, idx, out.astype(NP[t]))


# --- conversions -----------------------------------------------------------------------------------

_IRND = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}


def _to_float(v: np.ndarray, dt: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(v).astype(NP[dt])


def convert(v: Any, dt: str, st: str, parts: list[str]) -> np.ndarray:
    """``cvt`` of values ``v`` of type ``st`` to type ``dt`` with ``parts``' rounding / saturation."""
    v = np.asarray(v)
    sat = "sat" in parts
    if is_float(dt):
        if is_float(st):
            x = v.astype(np.float64) if st not in ("f64",) else v
            rnd = next((p for p in parts if p in _IRND), None)
            if rnd:
                x = _IRND[rnd](x)
            if "satfinite" in parts and dt in ("e4m3", "e5m2", "f16", "bf16"):
                lim = float(ml_dtypes.finfo(NP[dt]).max)
                x = np.where(np.isnan(x), x, np.clip(x, -lim, lim))
            out = (
                _to_float(
                    x
                    if dt == "f64" or st == "f64" or dt in ("e4m3", "e5m2")
                    else v.astype(np.float32)
                    if st in ("f16", "bf16", "e4m3", "e5m2")
                    else x,
                    dt,
                )
                if not rnd
                else _to_float(x, dt)
            )
        else:
            out = _to_float(v.astype(np.float64), dt)
        if sat:
            out = np.where(np.isnan(out), 0, np.clip(out, 0, 1)).astype(NP[dt])
        return out
    if is_float(st):
        x = v.astype(np.float64)
        rnd = next((p for p in parts if p in _IRND), "rzi")
        x = _IRND[rnd](x)
        bits = BITS[dt]
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if is_signed(dt) else (0, 2**bits - 1)
        x = np.where(np.isnan(x), 0, np.clip(x, lo, hi))
        return (
            x.astype(np.int64 if is_signed(dt) or bits < 64 else np.uint64).astype(NP[dt])
            if bits < 64
            else (x.astype(np.int64).astype(NP[dt]) if is_signed(dt) else x.astype(np.uint64))
        )
    # integer -> integer
    w = v.astype(np.int64) if (is_signed(st) or BITS[st] < 64) else v.astype(np.uint64)
    if sat:
        bits = BITS[dt]
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if is_signed(dt) else (0, 2**bits - 1)
        if st in ("u64", "b64"):
            w = np.minimum(w, np.uint64(hi)).astype(np.int64)
        else:
            w = np.clip(w, lo, hi)
    return _wrap(w, dt) if BITS[dt] <= 64 else w


@_reg("cvt")
def _cvt(m: Any, ins: Instruction, idx: Any) -> None:
    types = [p for p in ins.parts[1:] if p in NP]
    dt, st = types[0], types[1]
    parts = ins.parts
    if dt in ("f16x2", "bf16x2", "e4m3x2", "e5m2x2") and st == "f32":
        hi = convert(m.read(ins.operands[1], "f32", idx), dt[:-2], "f32", parts)
        lo = convert(m.read(ins.operands[2], "f32", idx), dt[:-2], "f32", parts)
        hi, lo = np.broadcast_arrays(np.atleast_1d(hi), np.atleast_1d(lo))
        sub = BITS[dt] // 2
        pair = np.stack([lo, hi], axis=1).copy().view(UINT[sub]).reshape(-1, 2).astype(np.uint64)
        out = pair[:, 0] | (pair[:, 1] << np.uint64(sub))
        m.write(ins.operands[0], "u" + str(BITS[dt]), idx, out.astype(UINT[BITS[dt]]))
        return
    if st in ("e4m3x2", "e5m2x2") and dt in ("f16x2", "bf16x2"):
        v = np.atleast_1d(np.asarray(m.read(ins.operands[1], "u16", idx), dtype=np.uint16))
        el = v.copy().view(np.uint8).reshape(-1, 2).view(NP[st[:-2]]).astype(np.float32)
        m.write(ins.operands[0], "u32", idx, _pack(el, dt))
        return
    if dt in ("e4m3x2", "e5m2x2") and st in ("f16x2", "bf16x2"):   # half i -> byte i, rounded once
        v = np.atleast_1d(np.asarray(m.read(ins.operands[1], "u32", idx), dtype=np.uint32))
        halves = v.copy().view(np.uint16).reshape(-1, 2)
        el = (halves.view(np.float16).astype(np.float32) if st == "f16x2"
              else (halves.astype(np.uint32) << np.uint32(16)).view(np.float32))
        q = np.stack([np.atleast_1d(convert(el[:, j], dt[:-2], "f32", parts)) for j in (0, 1)], axis=1)
        pair = q.copy().view(np.uint8).reshape(-1, 2).astype(np.uint16)
        m.write(ins.operands[0], "u16", idx, pair[:, 0] | (pair[:, 1] << np.uint16(8)))
        return
    if "x2" in dt or "x2" in st:
        raise m.unsupported()
    v = m.read(ins.operands[1], st, idx)
    m.write(ins.operands[0], dt, idx, convert(v, dt, st, parts))


@_reg("copysign")
def _copysign(m: Any, ins: Instruction, idx: Any) -> None:
    t = type_of(ins.parts)
    a, b = _srcs(m, ins, t, idx, 2)
    m.write(ins.operands[0], t, idx, np.copysign(b, a).astype(NP[t]))


_ = SINT
