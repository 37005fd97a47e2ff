"""Magic-number conversions of unpacked integers to f16 / bf16, printed two at a time.

``hexlayout.ir.functions.convert`` defines them (an integer add to a float's bit pattern and
one floating subtraction, exact in their range); the lowering picks them for ``hl.cast``.
Here they are printed a pair per 32-bit word: ``i2f16_magic`` / ``i2bf16_magic_narrow`` as
the bit patterns of two elements in one word and one packed subtraction, and, when the two
elements were unpacked from one loaded word (``hexlayout.codegen.byte_sources``), straight
from that word (a byte permute or a shift, one ``lop3.b32`` with the mask and the magic
exponent as immediates, one packed ``__hsub2`` / ``__hfma2``); ``i2bf16_magic`` of bytes
as ``PRMT`` of the byte into the f32 magic pattern, an f32 subtraction and one paired
rounding to bf16. A constant zero point folded into the conversion
(``hexlayout.codegen.fold_zero``) changes only the subtracted constant. Every printed value
is bit for bit the function's (every step exact).
"""

from __future__ import annotations

import struct

import numpy as np

from hexlayout.ir.lowered import Alu, RegRef

from .byte_sources import const_start
from .emitter import Emitter

__all__ = ["even_start", "magic_conversion"]


def even_start(ref: RegRef) -> bool:
    try:
        return int(ref.start) % 2 == 0
    except (TypeError, ValueError):
        return False


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
    as_half = "__ushort_as_half" if dtype == "f16" else "__ushort_as_bfloat16"
    halves = "__halves2half2" if dtype == "f16" else "__halves2bfloat162"
    a, b = _bits16(lo, dtype), _bits16(hi, dtype)
    if a == b:
        bcast = "__half2half2" if dtype == "f16" else "__bfloat162bfloat162"
        return f"{bcast}({as_half}(static_cast<unsigned short>(0x{a:x})))"
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
    if n < 2 or n % 2 or src.count != n or not (even_start(src) and even_start(dst)):
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
                f"__hsub2(*reinterpret_cast<const {pair}*>(&hl_w), "
                f"{_pair_const(dtype, bias + z[0], bias + z[1])}); }}")

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
    if xa is not xb or xa.dtype.name != "u8" or ja - ja % 4 + 4 > xa.count:
        return None     # (unpacked from another array, the word inside it; else the pair form)
    if xa is src.array and (pa, pb) != ("byte", "byte"):
        return None     # (the bytes themselves, as loaded: an ``hl.offline`` 8-bit tile, from their word)
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
    if pa == pb and pa in ("lo", "hi") and jb == ja + 2 and k < 2:
        return _interleaved_pair(em, w, 8 * k, pa == "hi", dtype, z)
    if (pa, pb) == ("byte", "byte") and jb == ja + 1 and ja % 2 == 0 and dtype == "f16":
        sel = k | 4 << 4 | (k + 1) << 8 | 4 << 12
        return ("([&] { const unsigned hl_w = __byte_perm(" + w + f", 0x64u, 0x{sel:04x}u); "
                "return __hsub2(*reinterpret_cast<const __half2*>(&hl_w), "
                + _pair_const("f16", 1024 + z[0], 1024 + z[1]) + "); }())")
    return None


def _interleaved_pair(em: Emitter, w: str, shift: int, hi: bool, dtype: str, z: tuple[float, ...]) -> str:
    """The pair of nibbles ``p`` and ``p + 4`` of the word ``w`` (the same nibble of bytes ``k``
    and ``k + 2``, ``shift = 8 k``: an interleaved offline layout such as Marlin's), minus
    ``z``, with one ``LOP3`` and no byte permute:

    - f16 low nibbles: ``((w >> shift) & 0x000f000f) | 0x64006400`` is ``(1024 + a, 1024 + b)``,
      minus ``(1024 + z0, 1024 + z1)`` by ``__hsub2``;
    - f16 high nibbles: ``& 0x00f000f0`` gives ``(1024 + 16 a, 1024 + 16 b)``, one ``__hfma2``
      by ``1/16`` plus ``(-64 - z0, -64 - z1)``;
    - bf16: ``((w >> (shift + 4 hi)) & 0x000f000f) | 0x43004300`` is ``(128 + a, 128 + b)``,
      minus ``(128 + z0, 128 + z1)``. Every step exact."""
    em.helpers.add("lop3_and_or")
    if dtype == "bf16":
        sh = shift + (4 if hi else 0)
        word = f"({w} >> {sh})" if sh else w
        return ("([&] { const unsigned hl_w = hl_lop3_and_or<0x000f000fu, 0x43004300u>(" + word + "); "
                "return __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&hl_w), "
                + _pair_const("bf16", 128 + z[0], 128 + z[1]) + "); }())")
    word = f"({w} >> {shift})" if shift else w
    if hi:
        return ("([&] { const unsigned hl_w = hl_lop3_and_or<0x00f000f0u, 0x64006400u>(" + word + "); "
                "return __hfma2(*reinterpret_cast<const __half2*>(&hl_w), "
                + _pair_const("f16", 1 / 16, 1 / 16)
                + ", " + _pair_const("f16", -64 - z[0], -64 - z[1]) + "); }())")
    return ("([&] { const unsigned hl_w = hl_lop3_and_or<0x000f000fu, 0x64006400u>(" + word + "); "
            "return __hsub2(*reinterpret_cast<const __half2*>(&hl_w), "
            + _pair_const("f16", 1024 + z[0], 1024 + z[1]) + "); }())")


def magic_conversion(em: Emitter, ins: Alu) -> list[str] | None:
    """The magic conversion ``ins`` printed a pair at a time (see the module docstring), or
    None (not a magic conversion, or not in pairs: the per-element form)."""
    if str(ins.op) == "i2bf16_magic":
        return _bf16_bytes(em, ins)
    return _magic_pairs(em, ins)


#: ``i2bf16_magic``: the f32 bits ``0x4B400000 + v`` are ``12582912 + v`` (f32 ulp 1)
_F32_MAGIC, _F32_BIAS = 0x4B400000, 12582912.0


def _bf16_bytes(em: Emitter, ins: Alu) -> list[str] | None:
    """``i2bf16_magic`` of ``u8`` elements into bf16 pairs: ``f32(bits 0x4B400000 + v) -
    (12582912 + z)`` per element (a byte loaded in a word is placed in the pattern by one
    ``PRMT``, else an integer add), the pair rounded by one ``__floats2bfloat162_rn``
    (nearest even, as ``__float2bfloat16_rn``). ``z``: a folded constant zero point (0 else;
    ``v - z`` is an integer of at most 8 bits, exact in bf16: the same bits as ``bf16(v) - z``)."""
    src, fold = ins.srcs[0], em.folds.get(id(ins))
    dst, n = (fold.dst if fold else ins.dst), ins.dst.count
    if not isinstance(src, RegRef) or src.array.dtype.name != "u8" or ins.dst.array.dtype.name != "bf16" \
            or n % 2 or src.count != n or not even_start(dst) or const_start(src) is None:
        if fold:
            raise em.error(f"a folded zero point needs bf16 pairs of u8 elements, got {src!r}")
        return None
    em.check_reg_range(src)
    em.check_reg_range(dst)
    s0, zeros = const_start(src), (fold.zeros if fold else (0.0,) * n)

    def pattern(i: int) -> str:
        xa, ja, part = em.bytes.source(src.array, s0 + i)
        if part == "byte" and xa.dtype.name == "u8" and ja - ja % 4 + 4 <= xa.count:  # (its own word too)
            k = ja % 4
            w = f"*reinterpret_cast<const unsigned*>(&{em.reg_index(RegRef(xa, 0, xa.count), ja - k)})"
            return f"__byte_perm({w}, 0x{_F32_MAGIC:x}u, 0x{k | 5 << 4 | 6 << 8 | 7 << 12:04x}u)"
        return f"0x{_F32_MAGIC:x}u + static_cast<unsigned>({em.reg_index(src, i)})"

    out = []
    for v in range(n // 2):
        a, b = (f"__int_as_float({pattern(2 * v + h)}) - {_F32_BIAS + zeros[2 * v + h]:.1f}f" for h in (0, 1))
        out.append(f"*reinterpret_cast<__nv_bfloat162*>(&{em.reg_index(dst, 2 * v)}) = "
                   f"__floats2bfloat162_rn({a}, {b});")
    return out
