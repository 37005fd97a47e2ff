"""Printers of register arithmetic (``Alu``) and warp shuffles (``Shfl``).

``Alu`` computes ``dst[i] = op(srcs...)`` element by element (a ``#pragma unroll`` loop over
``i`` when the slice has several elements). Floating destinations compute in ``float``
(``double`` for f64) and round once to the destination type (``__float2half_rn``,
``__float2bfloat16_rn``, ``__nv_fp8_e4m3(x)`` which saturates); integer destinations compute
in ``int`` / ``long long`` unless a source is floating, then in ``float`` with rounding to
nearest even and saturation (``__float2int_rn``). Comparisons and logical ops give 0 / 1;
``select(c, a, b)`` is ``c != 0 ? a : b``; ``gelu`` is the tanh approximation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hexlayout.ir.expr import Expr
from hexlayout.ir.lowered import ALU_OPS, Alu, RegRef, Shfl
from hexlayout.ir.tile import ScalarParam

from .ctypes_map import c_type, float_literal, from_float, to_float
from .emitter import Emitter

__all__ = ["PRINTERS", "FLOAT_ONLY"]

#: ops that always compute in floating point (an integer destination gets the rounded result)
FLOAT_ONLY = {"exp2", "exp", "log2", "log", "rcp", "rsqrt", "sqrt", "silu", "gelu"}


def _float_ops(d: bool) -> dict[str, Callable[..., str]]:
    f = "" if d else "f"
    one = "1.0" if d else "1.0f"

    def lit(x: float) -> str:
        return float_literal(x, d)

    def b2f(x: str) -> str:
        return f"static_cast<{'double' if d else 'float'}>({x})"

    return {
        "mov": lambda a: a, "cvt": lambda a: a, "neg": lambda a: f"-({a})", "abs": lambda a: f"fabs{f}({a})",
        "exp2": lambda a: f"exp2{f}({a})", "exp": lambda a: f"exp{f}({a})", "log2": lambda a: f"log2{f}({a})",
        "log": lambda a: f"log{f}({a})", "rcp": lambda a: f"{one} / ({a})" if d else f"__frcp_rn({a})",
        "rsqrt": lambda a: f"rsqrt{f}({a})", "sqrt": lambda a: f"sqrt{f}({a})",
        "silu": lambda a: f"({a}) / ({one} + exp{f}(-({a})))",
        "gelu": lambda a: (f"{lit(0.5)} * ({a}) * ({one} + tanh{f}({lit(0.7978845608028654)} * (({a}) + "
                           f"{lit(0.044715)} * ({a}) * ({a}) * ({a}))))"),
        "add": lambda a, b: f"{a} + {b}", "sub": lambda a, b: f"{a} - ({b})",
        "mul": lambda a, b: f"({a}) * ({b})", "div": lambda a, b: f"({a}) / ({b})",
        "max": lambda a, b: f"fmax{f}({a}, {b})", "min": lambda a, b: f"fmin{f}({a}, {b})",
        "lt": lambda a, b: b2f(f"{a} < {b}"), "le": lambda a, b: b2f(f"{a} <= {b}"),
        "gt": lambda a, b: b2f(f"{a} > {b}"), "ge": lambda a, b: b2f(f"{a} >= {b}"),
        "eq": lambda a, b: b2f(f"{a} == {b}"), "ne": lambda a, b: b2f(f"{a} != {b}"),
        "and": lambda a, b: b2f(f"({a}) != 0 && ({b}) != 0"),
        "or": lambda a, b: b2f(f"({a}) != 0 || ({b}) != 0"),
        "not": lambda a: b2f(f"({a}) == 0"),
        "fma": lambda a, b, c: f"fma{f}({a}, {b}, {c})",
        "select": lambda c, a, b: f"({c}) != 0 ? ({a}) : ({b})",
    }


_INT_OPS: dict[str, Callable[..., str]] = {
    "mov": lambda a: a, "cvt": lambda a: a, "neg": lambda a: f"-({a})", "abs": lambda a: f"abs({a})",
    "add": lambda a, b: f"{a} + {b}", "sub": lambda a, b: f"{a} - ({b})",
    "mul": lambda a, b: f"({a}) * ({b})", "div": lambda a, b: f"({a}) / ({b})",
    "max": lambda a, b: f"max({a}, {b})", "min": lambda a, b: f"min({a}, {b})",
    "lt": lambda a, b: f"int({a} < {b})", "le": lambda a, b: f"int({a} <= {b})",
    "gt": lambda a, b: f"int({a} > {b})", "ge": lambda a, b: f"int({a} >= {b})",
    "eq": lambda a, b: f"int({a} == {b})", "ne": lambda a, b: f"int({a} != {b})",
    "and": lambda a, b: f"int(({a}) != 0 && ({b}) != 0)", "or": lambda a, b: f"int(({a}) != 0 || ({b}) != 0)",
    "not": lambda a: f"int(({a}) == 0)", "fma": lambda a, b, c: f"({a}) * ({b}) + {c}",
    "select": lambda c, a, b: f"({c}) != 0 ? ({a}) : ({b})",
}
_FLOAT_OPS = _float_ops(False)
_DOUBLE_OPS = _float_ops(True)


def _is_float_src(s: Any) -> bool:
    if isinstance(s, RegRef):
        return s.array.dtype.is_float
    if isinstance(s, ScalarParam):
        return s.dtype.is_float
    return isinstance(s, float)


def _src(em: Emitter, s: Any, idx: int | str, n: int, dom: str) -> str:
    """Element ``idx`` of source ``s`` in the compute domain ``dom`` (float, double, int, long long)."""
    flt = dom in ("float", "double")
    if isinstance(s, RegRef):
        if s.count != n:
            raise em.error(f"source {s.array.name} has {s.count} element(s), the destination {n}")
        em.check_reg_range(s)
        x = em.reg_index(s, idx)
        return to_float(s.array.dtype, x, dom == "double") if flt else x
    if isinstance(s, ScalarParam):
        x = em.expr(s.var)
        return f"static_cast<{dom}>({x})" if (flt != s.dtype.is_float) or dom == "double" else x
    if isinstance(s, Expr):
        x = em.expr(s)
        return f"static_cast<{dom}>({x})" if flt else f"({x})"
    if isinstance(s, (bool, int, float)) or hasattr(s, "__int__"):
        if flt:
            return float_literal(float(s), dom == "double")
        return str(int(s)) if int(s) >= 0 else f"({int(s)})"
    raise em.error(f"ALU source {s!r} is not a register slice, number, expression or scalar parameter")


def alu(em: Emitter, ins: Alu) -> list[str]:
    if ins.op not in ALU_OPS:
        raise em.error(f"unknown ALU op {ins.op!r}; known: {', '.join(sorted(ALU_OPS))}")
    if len(ins.srcs) != ALU_OPS[ins.op]:
        raise em.error(f"{ins.op} takes {ALU_OPS[ins.op]} operand(s), got {len(ins.srcs)}")
    dst = ins.dst
    em.check_reg_range(dst)
    dt = dst.array.dtype
    try:
        c_type(dt)
    except ValueError as e:
        raise em.error(str(e)) from None
    n = dst.count
    if dt.is_float:
        dom = "double" if dt.name == "f64" else "float"
    elif ins.op in FLOAT_ONLY or any(_is_float_src(s) for s in ins.srcs):
        dom = "float"
    else:
        dom = "long long" if dt.bits == 64 else "int"
    idx: int | str = "v" if n > 1 else 0
    vals = [_src(em, s, idx, n, dom) for s in ins.srcs]
    ops = _DOUBLE_OPS if dom == "double" else _FLOAT_OPS if dom == "float" else _INT_OPS
    r = ops[ins.op](*vals)
    if dom in ("float", "double"):
        out = from_float(dt, r) if dt.name != "pred" else f"({r}) != 0"
    else:
        out = f"({r}) != 0" if dt.name == "pred" else f"static_cast<{c_type(dt)}>({r})"
    stmt = f"{em.reg_index(dst, idx)} = {out};"
    if n == 1:
        return [stmt]
    return ["#pragma unroll", f"for (int v = 0; v < {n}; ++v) {stmt}"]


_DIRECT_SHFL = ("f32", "s32", "u32", "f16", "bf16")


def shfl(em: Emitter, ins: Shfl) -> list[str]:
    if ins.mode not in ("bfly", "idx"):
        raise em.error(f"shfl mode {ins.mode!r} is not 'bfly' or 'idx'")
    if ins.width not in (1, 2, 4, 8, 16, 32):
        raise em.error(f"shfl width {ins.width} is not a power of two up to 32")
    if ins.src.count != ins.dst.count or ins.src.array.dtype != ins.dst.array.dtype:
        raise em.error("shfl source and destination slices differ in size or type")
    if ins.src.array.dtype.bits > 32:
        raise em.error(f"shfl of {ins.src.array.dtype} elements (wider than 32 bits)")
    em.check_reg_range(ins.src)
    em.check_reg_range(ins.dst)
    n = ins.dst.count
    idx: int | str = "v" if n > 1 else 0
    src, dst, arg = em.reg_index(ins.src, idx), em.reg_index(ins.dst, idx), em.expr(ins.arg)
    if ins.src.array.dtype.name in _DIRECT_SHFL:
        fn = "__shfl_xor_sync" if ins.mode == "bfly" else "__shfl_sync"
        stmt = f"{dst} = {fn}(0xffffffffu, {src}, {arg}, {ins.width});"
    else:
        em.helpers.add("shfl")
        stmt = f"{dst} = hl_shfl({src}, {arg}, {ins.width}, {'true' if ins.mode == 'bfly' else 'false'});"
    if n == 1:
        return [stmt]
    return ["#pragma unroll", f"for (int v = 0; v < {n}; ++v) {stmt}"]


PRINTERS = {Alu: alu, Shfl: shfl}
