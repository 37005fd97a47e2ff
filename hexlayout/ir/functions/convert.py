"""Fast integer -> half / bfloat16 conversions by magic numbers.

An integer ``v`` added to the bit pattern of a float whose ulp is 1 is that float plus ``v``;
subtracting the float again leaves ``v``, exactly, with an integer add and one floating
subtraction instead of a conversion instruction (``I2F``, a quarter-rate unit on sm_80 /
sm_90). The lowering picks these for ``hl.cast`` when the operand's value range is inside
the exact range (``hexlayout.ir.lower.conversions``); outside it the functions are still
defined (the bit pattern wraps), and the emulator computes what the printed code computes.

- ``i2f16_magic(v)``: the f16 of bits ``(0x6600 + v) mod 2**16`` minus ``1536``, in f16
  (``__hsub``: rounded once). ``0x6600`` is ``1536.0``, in ``[1024, 2048)`` where the f16
  ulp is 1, so ``v`` itself for ``-512 <= v < 512``.
- ``i2bf16_magic_narrow(v)``: the bf16 of bits ``(0x4300 + v) mod 2**16`` minus ``128``, in
  bf16 (``__hsub``: rounded once). ``0x4300`` is ``128.0``, in ``[128, 256)`` where the bf16
  ulp is 1, so ``v`` itself for ``0 <= v < 128`` (unsigned 4-bit values): no detour through
  f32, and the code generator converts two elements with one 32-bit add and one packed
  subtraction.
- ``i2bf16_magic(v)``: the f32 of bits ``(0x4B400000 + v) mod 2**32`` minus ``12582912.0``
  (``1.5 * 2**23``, f32 ulp 1), rounded to bf16 (nearest even): ``bf16(v)`` for
  ``-2**22 <= v < 2**22``.

And the conversions of OCP FP4 (``e2m1``) codes, a bit trick each (``E2m1F16``,
``E2m1Bf16``; the only way an ``e2m1`` tile converts).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from hexlayout.arch.dtypes import DTYPES

from .base import AluFunction, CDomain, function_class
from .bits import INTEGERS

__all__ = ["I2F16Magic", "I2Bf16MagicNarrow", "I2Bf16Magic", "EXACT_RANGE", "E2m1F16", "E2m1Bf16",
           "FROM_E2M1"]


class _Magic16(AluFunction):
    """``t(bits = (magic + v) mod 2**16) - bias``, rounded once to the 16-bit float type ``t``
    (``result``; ``__hsub``), where ``bias`` is the value of the bits ``magic``, a number of the
    binade in which ``t``'s ulp is 1: ``v`` for ``v`` in ``EXACT_RANGE``."""

    accepts = INTEGERS
    integer_domain = True
    magic: ClassVar[int] = 0
    bias: ClassVar[float] = 0.0
    c_name: ClassVar[str] = ""             # CUDA's ``__ushort_as_<c_name>``

    def numpy(self, v: Any) -> Any:
        t = DTYPES[self.result].numpy()
        bits = ((np.asarray(v, dtype=np.int64) + self.magic) & 0xFFFF).astype(np.uint16)
        return (bits.view(t).astype(np.float64) - self.bias).astype(t)

    def cuda(self, c: CDomain, v: str) -> str:
        as_t = f"__ushort_as_{self.c_name}"
        return (f"__hsub({as_t}(static_cast<unsigned short>({self.magic:#x} + (" + v + "))), "
                f"{as_t}(static_cast<unsigned short>({self.magic:#x})))")

    def issue(self, count: int) -> float:
        return max(1.0, count / 8)          # an integer add and half a packed 16-bit subtraction


class I2F16Magic(_Magic16):
    """``f16(bits = (0x6600 + v) mod 2**16) - 1536``, rounded once to f16: ``v`` for
    ``-512 <= v < 512``."""

    name = "i2f16_magic"
    result = "f16"
    magic = 0x6600
    bias = 1536.0
    c_name = "half"


class I2Bf16MagicNarrow(_Magic16):
    """``bf16(bits = (0x4300 + v) mod 2**16) - 128``, rounded once to bf16: ``v`` for
    ``0 <= v < 128``."""

    name = "i2bf16_magic_narrow"
    result = "bf16"
    magic = 0x4300
    bias = 128.0
    c_name = "bfloat16"


class I2Bf16Magic(AluFunction):
    """``bf16(f32(bits = (0x4B400000 + v) mod 2**32) - 12582912)``: ``bf16(v)`` for
    ``-2**22 <= v < 2**22``."""

    name = "i2bf16_magic"
    accepts = INTEGERS
    result = "bf16"
    integer_domain = True

    def numpy(self, v: Any) -> Any:
        bits = ((np.asarray(v, dtype=np.int64) + 0x4B400000) & 0xFFFFFFFF).astype(np.uint32)
        import ml_dtypes

        f = bits.view(np.float32) - np.float32(12582912.0)
        return f.astype(ml_dtypes.bfloat16)       # nearest even, as __float2bfloat16_rn

    def cuda(self, c: CDomain, v: str) -> str:
        return ("__float2bfloat16_rn(__int_as_float(static_cast<int>(0x4B400000u + static_cast<unsigned>("
                + v + "))) - 12582912.0f)")

    def issue(self, count: int) -> float:
        return max(1.0, count / 6)          # integer add, float subtraction, pack


#: the operand values each function converts exactly: [lo, hi)
EXACT_RANGE = {"i2f16_magic": (-512, 512), "i2bf16_magic_narrow": (0, 128),
               "i2bf16_magic": (-(1 << 22), 1 << 22)}


class _E2m1(AluFunction):
    """e2m1 (OCP FP4) code -> a 16-bit float by a bit trick, no lookup table: the sign to bit
    15 and the 3 exponent-mantissa bits ``c & 7`` to the bits just below the destination's
    exponent field's top bits (``shift``), which reads as the value times ``2^-scale_log2``
    (a normal or, for code 1, a subnormal of the destination), then one exact multiplication
    by ``2^scale_log2`` (``__hmul``). ``on_bits``: the operand is the code's register byte
    (low nibble), the result the destination's bit pattern."""

    accepts = frozenset({"float"})
    on_bits = True
    shift: ClassVar[int] = 0
    scale_bits: ClassVar[int] = 0          # the bit pattern of 2^scale_log2 in the result type
    c_name: ClassVar[str] = ""             # CUDA's ``__ushort_as_<c_name>`` / ``__<c_name>_as_ushort``

    def numpy(self, p: Any) -> Any:
        p = np.asarray(p, dtype=np.uint64)
        bits = (((p & 8) << 12) | ((p & 7) << self.shift)).astype(np.uint16)
        t = DTYPES[self.result].numpy()
        scale = np.array([self.scale_bits], dtype=np.uint16).view(t)[0]
        v = (bits.view(t).astype(np.float64) * scale.astype(np.float64)).astype(t)   # exact
        return v.view(np.uint16).astype(np.uint64)

    def cuda(self, c: CDomain, p: str) -> str:
        pat = f"static_cast<unsigned short>(((({p}) & 8ull) << 12) | ((({p}) & 7ull) << {self.shift}))"
        one = f"__ushort_as_{self.c_name}(static_cast<unsigned short>({self.scale_bits:#x}))"
        return (f"static_cast<unsigned long long>(__{self.c_name}_as_ushort("
                f"__hmul(__ushort_as_{self.c_name}({pat}), {one})))")

    def issue(self, count: int) -> float:
        return max(1.0, count / 2)          # two bit operations and half a packed multiplication


def _e2m1(cls: str, result: str, shift: int, scale_log2: int, scale_bits: int, c_name: str) -> type[_E2m1]:
    """The e2m1 -> ``result`` conversion ``cls`` (named ``e2m1_<result>``): the code's fields at
    ``shift``, times ``2^scale_log2`` (bits ``scale_bits``). ``cls`` is also the module attribute
    it is bound to: the build cache stores a build's classes by module and qualified name."""
    doc = (f"{result} of the e2m1 code ``c``: ``{result}(bits = (c & 8) << 12 | (c & 7) << {shift}) * "
           f"2^{scale_log2}`` (``{scale_bits:#x}``): ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` for codes ``0 .. 7``, "
           "negated for ``8 .. 15``.")
    return function_class(cls, _E2m1, doc, __name__, name=f"e2m1_{result}", result=result, shift=shift,
                          scale_bits=scale_bits, c_name=c_name)


E2m1F16 = _e2m1("E2m1F16", "f16", 9, 14, 0x7400, "half")
E2m1Bf16 = _e2m1("E2m1Bf16", "bf16", 6, 126, 0x7E80, "bfloat16")


#: the conversion of an e2m1 tile to each destination type
FROM_E2M1 = {"f16": "e2m1_f16", "bf16": "e2m1_bf16"}
