"""Printers of register arithmetic (``Alu``) and warp shuffles (``Shfl``).

``Alu`` computes ``dst[i] = op(srcs...)`` element by element (a ``#pragma unroll`` loop over
``i`` when the slice has several elements). The function ``op`` (``hexlayout.ir.functions``)
prints its expression in the compute domain: floating destinations compute in ``float``
(``double`` for f64) and round once to the destination type (``__float2half_rn``,
``__float2bfloat16_rn``, ``__nv_fp8_e4m3(x)`` which saturates); integer destinations compute
in ``int`` / ``long long`` unless the function is floating or a source is floating, then in
``float`` with rounding to nearest even and saturation (``__float2int_rn``). Predicate
destinations are ``result != 0``. A function with ``integer_domain`` computes in ``int``
and prints a value of the destination's C type; one ``on_bits`` (``bitcast``) maps the
operands' bit patterns (``unsigned long long``) to the destination's. ``cvt`` between fp8
and f16 prints the paired hardware conversions (two elements per call where it can); ``+ - *``
of f16 registers print ``__hadd`` / ``__hsub`` / ``__hmul`` (the float route rounds them
correctly: f32 has more than twice f16's precision, so the results are the same).
The magic conversions (``i2f16_magic``, ``i2bf16_magic_narrow``, ``i2bf16_magic``) print
pairs, from the loaded 32-bit words where the unpack allows (``hexlayout.codegen.magic``);
a ``sub`` of a constant zero point folded into one prints nothing
(``hexlayout.codegen.fold_zero``).
"""

from __future__ import annotations

from typing import Any

from hexlayout.ir.expr import Expr
from hexlayout.ir.functions import CDomain, compute_domain
from hexlayout.ir.lowered import Alu, RegRef, Shfl
from hexlayout.ir.tile import ScalarParam

from .ctypes_map import c_type, float_literal, from_float, is_fp8, to_float
from .emitter import Emitter
from .magic import even_start, magic_conversion

__all__ = ["PRINTERS", "c_domain"]


def c_domain(ctype: str) -> CDomain:
    """The ``CDomain`` of a C compute type, with this code generator's float literals."""
    double = ctype == "double"
    return CDomain(ctype, lambda x: float_literal(x, double))


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
        lit = f"{int(s)}ll" if dom == "long long" else str(int(s))   # max(long long, int) is ambiguous
        return lit if int(s) >= 0 else f"({lit})"
    raise em.error(f"ALU source {s!r} is not a register slice, number, expression or scalar parameter")


def alu(em: Emitter, ins: Alu) -> list[str]:
    fn = ins.op
    if id(ins) in em.folded:
        return []           # a constant zero point folded into the conversion before it
    if len(ins.srcs) != fn.arity:
        raise em.error(f"{fn} takes {fn.arity} operand(s), got {len(ins.srcs)}")
    dst = ins.dst
    em.check_reg_range(dst)
    dt = dst.array.dtype
    try:
        c_type(dt)
    except ValueError as e:
        raise em.error(str(e)) from None
    n = dst.count
    idx: int | str = "v" if n > 1 else 0
    if fn.on_bits:
        stmt = _on_bits(em, ins, idx)
        return [stmt] if n == 1 else ["#pragma unroll", f"for (int v = 0; v < {n}; ++v) {stmt}"]
    fp8 = _fp8_half(em, ins)
    if fp8 is not None:
        return fp8
    magic = magic_conversion(em, ins)
    if magic is not None:
        return magic
    src0 = ins.srcs[0]
    if fn.name in ("mov", "cvt") and isinstance(src0, RegRef) and src0.array.dtype.name == dt.name \
            and not is_fp8(dt):
        # a copy within one element type: bits as they are (no round trip through float, which
        # ptxas keeps for 16-bit floats: a NaN's payload may change); fp8 keeps its round trip,
        # which saturates (e5m2's infinities become its largest finite value)
        if src0.count != n:
            raise em.error(f"source {src0.array.name} has {src0.count} element(s), the destination {n}")
        em.check_reg_range(src0)
        stmt = f"{em.reg_index(dst, idx)} = {em.reg_index(src0, idx)};"
        return [stmt] if n == 1 else ["#pragma unroll", f"for (int v = 0; v < {n}; ++v) {stmt}"]
    if fn in _HALF_OPS and dt.name in ("f16", "bf16") and all(
            isinstance(s, RegRef) and s.array.dtype.name == dt.name for s in ins.srcs):
        # f32 holds 2 * 11 + 2 bits (2 * 8 + 2 for bf16): the float route rounds f16 / bf16 +, -, *
        # correctly, as HADD2 / HMUL2 (HFMA2.BF16 with 1 or -0 on sm_80) do
        for s in ins.srcs:
            if s.count != n:
                raise em.error(f"source {s.array.name} has {s.count} element(s), the destination {n}")
            em.check_reg_range(s)
        a, b = (em.reg_index(s, idx) for s in ins.srcs)
        stmt = f"{em.reg_index(dst, idx)} = {_HALF_OPS[fn]}({a}, {b});"
        return [stmt] if n == 1 else ["#pragma unroll", f"for (int v = 0; v < {n}; ++v) {stmt}"]
    dom = compute_domain(fn, dt, any(_is_float_src(s) for s in ins.srcs))
    vals = [_src(em, s, idx, n, dom) for s in ins.srcs]
    r = fn.cuda(c_domain(dom), *vals)
    if fn.helper:
        em.helpers.add(fn.helper)
    if dom in ("float", "double"):
        out = from_float(dt, r) if dt.name != "pred" else f"({r}) != 0"
    else:
        out = f"({r}) != 0" if dt.name == "pred" else f"static_cast<{c_type(dt)}>({r})"
    stmt = f"{em.reg_index(dst, idx)} = {out};"
    if n == 1:
        return [stmt]
    return ["#pragma unroll", f"for (int v = 0; v < {n}; ++v) {stmt}"]


_FP8 = {"e4m3": "__NV_E4M3", "e5m2": "__NV_E5M2"}
_HALF_OPS = {"add": "__hadd", "sub": "__hsub", "mul": "__hmul"}


def _fp8_half(em: Emitter, ins: Alu) -> list[str] | None:
    """``cvt`` between fp8 and f16 as the hardware's paired conversions (``cvt.rn.f16x2.e4m3x2``
    and ``cvt.rn.satfinite.e4m3x2.f16x2`` on sm_89+): two elements per call where the slices
    hold pairs, else one. Bit for bit what the float route computes (fp8 -> f16 is exact; f16
    -> fp8 rounds once from the f16 value, saturating), without the detour through f32."""
    if ins.op != "cvt" or not isinstance(ins.srcs[0], RegRef):
        return None
    src, dst = ins.srcs[0], ins.dst
    sn, dn = src.array.dtype.name, dst.array.dtype.name
    if not ((sn in _FP8 and dn == "f16") or (sn == "f16" and dn in _FP8)):
        return None
    em.check_reg_range(src)
    n = dst.count
    if src.count != n:
        raise em.error(f"source {src.array.name} has {src.count} element(s), the destination {n}")

    def one(i: int | str) -> str:
        s, d = em.reg_index(src, i), em.reg_index(dst, i)
        if sn in _FP8:
            return f"{d} = __half(__nv_cvt_fp8_to_halfraw({s}.__x, {_FP8[sn]}));"
        return f"{d}.__x = __nv_cvt_halfraw_to_fp8({s}, __NV_SATFINITE, {_FP8[dn]});"

    def two(i: str) -> str:
        s, d = em.reg_index(src, i), em.reg_index(dst, i)
        if sn in _FP8:
            return (f"*reinterpret_cast<__half2*>(&{d}) = __half2(__nv_cvt_fp8x2_to_halfraw2("
                    f"*reinterpret_cast<const __nv_fp8x2_storage_t*>(&{s}), {_FP8[sn]}));")
        return (f"*reinterpret_cast<__nv_fp8x2_storage_t*>(&{d}) = __nv_cvt_halfraw2_to_fp8x2("
                f"*reinterpret_cast<const __half2*>(&{s}), __NV_SATFINITE, {_FP8[dn]});")

    if n == 1:
        return [one(0)]
    if n % 2 or not (even_start(src) and even_start(dst)):
        return ["#pragma unroll", f"for (int v = 0; v < {n}; ++v) {one('v')}"]
    return ["#pragma unroll", f"for (int v = 0; v < {n // 2}; ++v) {two('2 * v')}"]


_UNSIGNED = {8: "unsigned char", 16: "unsigned short", 32: "unsigned", 64: "unsigned long long"}


def _on_bits(em: Emitter, ins: Alu, idx: int | str) -> str:
    """A function of bit patterns (``bitcast``): each operand element's bits as an unsigned
    long long, the low bits of the result stored as the destination's type."""
    pats = []
    for s in ins.srcs:
        if not isinstance(s, RegRef) or s.count != ins.dst.count:
            raise em.error(f"{ins.op} needs register slices of {ins.dst.count} element(s), got {s!r}")
        em.check_reg_range(s)
        u = _UNSIGNED.get(max(8, s.array.dtype.bits))         # e2m1: a code held in a byte
        if u is None:
            raise em.error(f"{ins.op} of {s.array.dtype} elements ({s.array.dtype.bits} bits)")
        reg = em.reg_index(s, idx)
        pats.append(f"static_cast<unsigned long long>(*reinterpret_cast<const {u}*>(&{reg}))")
    dt = ins.dst.array.dtype
    ud = _UNSIGNED.get(max(8, dt.bits))
    if ud is None:
        raise em.error(f"{ins.op} to {dt} elements ({dt.bits} bits)")
    r = ins.op.cuda(c_domain("unsigned long long"), *pats)
    return (f"{{ const {ud} hl_bits = static_cast<{ud}>({r}); "
            f"{em.reg_index(ins.dst, idx)} = *reinterpret_cast<const {c_type(dt)}*>(&hl_bits); }}")


_DIRECT_SHFL = ("f32", "s32", "u32", "f16", "bf16")
#: Shfl mode -> the CUDA intrinsic (the order is ``hl_shfl``'s ``mode`` argument)
_SHFL_FN = {"bfly": "__shfl_xor_sync", "idx": "__shfl_sync", "up": "__shfl_up_sync",
            "down": "__shfl_down_sync"}


def shfl(em: Emitter, ins: Shfl) -> list[str]:
    if ins.mode not in _SHFL_FN:
        raise em.error(f"shfl mode {ins.mode!r} is not one of {', '.join(_SHFL_FN)}")
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
        stmt = f"{dst} = {_SHFL_FN[ins.mode]}(0xffffffffu, {src}, {arg}, {ins.width});"
    else:
        em.helpers.add("shfl")
        stmt = f"{dst} = hl_shfl({src}, {arg}, {ins.width}, {tuple(_SHFL_FN).index(ins.mode)});"
    if n == 1:
        return [stmt]
    return ["#pragma unroll", f"for (int v = 0; v < {n}; ++v) {stmt}"]


PRINTERS = {Alu: alu, Shfl: shfl}
