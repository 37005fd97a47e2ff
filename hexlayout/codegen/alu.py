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
``i2f16_magic`` / ``i2bf16_magic_narrow`` print pairs; a pair of ``u8`` elements that are the
two nibbles of one byte of a register array, or two of its consecutive bytes
(``hexlayout.codegen.byte_sources``), is converted from that 32-bit word (byte permute, mask
with the magic exponent, one packed f16 / bf16 operation): exact, so the same results.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from hexlayout.ir.expr import Expr
from hexlayout.ir.functions import CDomain, compute_domain
from hexlayout.ir.lowered import Alu, RegRef, Shfl
from hexlayout.ir.tile import ScalarParam

from .byte_sources import const_start
from .ctypes_map import c_type, float_literal, from_float, to_float
from .emitter import Emitter

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
    magic = _magic_pairs(em, ins)
    if magic is not None:
        return magic
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


#: the magic conversions printed two elements at a time: (destination, magic bits, packed type)
_MAGIC_PAIRS = {"i2f16_magic": ("f16", 0x6600, "__half2", "__ushort_as_half", "__half2half2"),
                "i2bf16_magic_narrow": ("bf16", 0x4300, "__nv_bfloat162", "__ushort_as_bfloat16",
                                        "__bfloat162bfloat162")}


def _bits16(x: float, dtype: str) -> int:
    """The bits of ``x`` (a value ``dtype`` holds exactly) as f16 / bf16."""
    if dtype == "f16":
        return int(np.float16(x).view(np.uint16))
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


def _pair_const(dtype: str, lo: float, hi: float) -> str:
    """A packed f16 / bf16 pair constant ``(lo, hi)`` (values the type holds exactly)."""
    pair = "__half2" if dtype == "f16" else "__nv_bfloat162"
    as_half = "__ushort_as_half" if dtype == "f16" else "__ushort_as_bfloat16"
    halves = "__halves2half2" if dtype == "f16" else "__halves2bfloat162"
    a, b = _bits16(lo, dtype), _bits16(hi, dtype)
    if a == b:
        bcast = "__half2half2" if dtype == "f16" else "__bfloat162bfloat162"
        return f"{bcast}({as_half}(static_cast<unsigned short>(0x{a:x})))"
    del pair
    return (f"{halves}({as_half}(static_cast<unsigned short>(0x{a:x})), "
            f"{as_half}(static_cast<unsigned short>(0x{b:x})))")


def _magic_pairs(em: Emitter, ins: Alu) -> list[str] | None:
    """``i2f16_magic`` / ``i2bf16_magic_narrow`` of an integer register slice into f16 / bf16
    pairs: the two elements of each aligned pair get their bit patterns ``M + v`` (mod 2^16,
    ``M`` the magic number's bits) in the halves of one 32-bit word and one ``__hsub2``
    removes the magic number from both (HADD2 / HFMA2.BF16), instead of a 16-bit add, a
    scalar subtraction and a PRMT per element. Bit for bit the function: the same patterns,
    the same subtraction rounded once per half. With a folded constant zero point
    (``hexlayout.codegen.fold_zero``): into the ``sub``'s destination, the subtracted
    constant ``b + z`` (exact) instead of ``b``."""
    spec = _MAGIC_PAIRS.get(str(ins.op))
    if spec is None or not isinstance(ins.srcs[0], RegRef) or ins.dst.array.dtype.name != spec[0]:
        return None
    dtype, magic, pair, _, _ = spec
    fold = em.folds.get(id(ins))
    src, dst, n = ins.srcs[0], (fold.dst if fold else ins.dst), ins.dst.count
    zeros = fold.zeros if fold else (0.0,) * n
    bias = float(_bits16_value(magic, dtype))
    if n < 2 or n % 2 or src.count != n or not (_even_start(src) and _even_start(dst)):
        if fold:
            raise em.error(f"a folded zero point needs pairs, {src.array.name} has {n} element(s)")
        return None
    em.check_reg_range(src)
    em.check_reg_range(dst)

    def generic(v: int | str) -> str:
        i = f"2 * {v}" if isinstance(v, str) else 2 * v
        a, b, d = em.reg_index(src, i), em.reg_index(src, f"{i} + 1" if isinstance(v, str) else i + 1), \
            em.reg_index(dst, i)
        z = (zeros[0], zeros[0]) if isinstance(v, str) else (zeros[2 * v], zeros[2 * v + 1])
        word = (f"((0x{magic:x}u + static_cast<unsigned>({a})) & 0xffffu) | "
                f"((0x{magic:x}u + static_cast<unsigned>({b})) << 16)")
        return (f"{{ const unsigned hl_w = {word}; "
                f"*reinterpret_cast<{pair}*>(&{d}) = "
                f"__hsub2(*reinterpret_cast<const {pair}*>(&hl_w), {_pair_const(dtype, bias + z[0], bias + z[1])}); }}")

    s0 = const_start(src) if src.array.dtype.name == "u8" else None
    if s0 is not None:
        words = [_word_pair(em, src, s0 + 2 * v, dtype, zeros[2 * v:2 * v + 2]) for v in range(n // 2)]
        if any(w is not None for w in words):
            out = []
            for v, w in enumerate(words):
                if w is None:
                    out.append(generic(v))
                    continue
                d = em.reg_index(dst, 2 * v)
                out.append(f"*reinterpret_cast<{pair}*>(&{d}) = {w};")
            return out
    if len(set(zeros)) > 1:
        return [generic(v) for v in range(n // 2)]
    return ["#pragma unroll", f"for (int v = 0; v < {n // 2}; ++v) {generic('v')}"]


def _bits16_value(bits: int, dtype: str) -> float:
    """The f16 / bf16 value of the 16-bit pattern ``bits``."""
    if dtype == "f16":
        return float(np.uint16(bits).view(np.float16))
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def _word_pair(em: Emitter, src: RegRef, i: int, dtype: str, z: tuple[float, ...]) -> str | None:
    """The f16 / bf16 pair ``(src[i], src[i + 1])`` minus the zero points ``z`` (0 unless a
    constant one is folded in) converted from the 32-bit word of the bytes they were unpacked
    from (``hexlayout.codegen.byte_sources``), or None: the printed value is the magic
    conversion's (exact: every value is an integer below 256, 16 for bf16), with one byte
    permute or mask per pair instead of extracting and placing each value. The mask and the
    magic exponent are one ``lop3.b32`` with both as immediates (``hl_lop3_and_or``).

    - f16, the low and high nibble of byte ``k`` of word ``W``: ``t = PRMT(W)`` puts the byte
      in bytes 0 and 2, ``(t & 0x00f0000f) | 0x64006400`` is ``(1024 + lo, 1024 + 16 hi)``
      and one ``__hfma2`` by ``(1, 1/16)`` plus ``(-1024 - z0, -64 - z1)`` gives ``(lo - z0,
      hi - z1)`` exactly;
    - bf16, the same nibbles (bf16 has no room for ``16 hi``): ``t = PRMT(W, W >> 4)`` puts
      byte ``k`` of ``W`` in byte 0 and byte ``k`` of ``W >> 4`` in byte 2 (one shift per word),
      ``(t & 0x000f000f) | 0x43004300`` is ``(128 + lo, 128 + hi)``, minus ``(128 + z0, 128 +
      z1)`` by ``__hsub2``;
    - f16, bytes ``k`` and ``k + 1`` (``k`` even) of ``W``: ``PRMT(W, 0x64)`` gives
      ``(1024 + b0, 1024 + b1)``, minus ``(1024 + z0, 1024 + z1)`` by ``__hsub2``."""
    (xa, ja, pa), (xb, jb, pb) = em.bytes.source(src.array, i), em.bytes.source(src.array, i + 1)
    if xa is not xb or xa is src.array or xa.dtype.name != "u8" or ja - ja % 4 + 4 > xa.count:
        return None     # (unpacked from another array, the word inside it; else the pair form)
    ref = RegRef(xa, 0, xa.count)
    k = ja % 4
    w = f"*reinterpret_cast<const unsigned*>(&{em.reg_index(ref, ja - k)})"
    if (pa, pb) == ("lo", "hi") and ja == jb:
        em.helpers.add("lop3_and_or")
        if dtype == "f16":
            sel = k | 4 << 4 | k << 8 | 4 << 12
            return ("([&] { const unsigned hl_w = hl_lop3_and_or<0x00f0000fu, 0x64006400u>(__byte_perm(" + w
                    + f", 0u, 0x{sel:04x}u)); return __hfma2(*reinterpret_cast<const __half2*>(&hl_w), "
                    + _pair_const("f16", 1.0, 1.0 / 16) + ", " + _pair_const("f16", -1024 - z[0], -64 - z[1])
                    + "); }())")
        return ("([&] { const unsigned hl_t = " + w + "; const unsigned hl_w = hl_lop3_and_or<0x000f000fu, "
                f"0x43004300u>(__byte_perm(hl_t, hl_t >> 4, 0x{k | (4 + k) << 8:04x}u)); "
                "return __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&hl_w), "
                + _pair_const("bf16", 128 + z[0], 128 + z[1]) + "); }())")
    if (pa, pb) == ("byte", "byte") and jb == ja + 1 and ja % 2 == 0 and dtype == "f16":
        sel = k | 4 << 4 | (k + 1) << 8 | 4 << 12
        return ("([&] { const unsigned hl_w = __byte_perm(" + w + f", 0x64u, 0x{sel:04x}u); "
                "return __hsub2(*reinterpret_cast<const __half2*>(&hl_w), "
                + _pair_const("f16", 1024 + z[0], 1024 + z[1]) + "); }())")
    return None


_FP8 = {"e4m3": "__NV_E4M3", "e5m2": "__NV_E5M2"}
_HALF_OPS = {"add": "__hadd", "sub": "__hsub", "mul": "__hmul"}


def _even_start(ref: RegRef) -> bool:
    try:
        return int(ref.start) % 2 == 0
    except (TypeError, ValueError):
        return False


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
    if n % 2 or not (_even_start(src) and _even_start(dst)):
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
        u = _UNSIGNED.get(s.array.dtype.bits)
        if u is None:
            raise em.error(f"{ins.op} of {s.array.dtype} elements ({s.array.dtype.bits} bits)")
        reg = em.reg_index(s, idx)
        pats.append(f"static_cast<unsigned long long>(*reinterpret_cast<const {u}*>(&{reg}))")
    dt = ins.dst.array.dtype
    ud = _UNSIGNED.get(dt.bits)
    if ud is None:
        raise em.error(f"{ins.op} to {dt} elements ({dt.bits} bits)")
    r = ins.op.cuda(c_domain("unsigned long long"), *pats)
    return (f"{{ const {ud} hl_bits = static_cast<{ud}>({r}); "
            f"{em.reg_index(ins.dst, idx)} = *reinterpret_cast<const {c_type(dt)}*>(&hl_bits); }}")


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
