"""Element types as kernel authors spell them: ``hl.f16``, ``hl.bf16``, ``hl.i32`` ...

They are the one ``DType`` of ``hexlayout.arch`` (equal and hashing alike), plus
subscription for annotations: ``hl.f16["M", "K"]`` is a global tensor type
(``hexlayout.lang.Tensor``); a bare ``hl.i32`` annotates a scalar argument.
``i8``/``i32``/``i64``/``i4`` are CuTe's ``s8``/``s32``/``s64``/``s4``; ``bool_`` is ``pred``.
"""

from __future__ import annotations

from typing import Any

from hexlayout.arch.dtypes import DTYPES, DType, get_dtype

from .spec import Tensor

__all__ = [
    "ElemType", "canonical", "f16", "bf16", "f32", "f64", "tf32", "e4m3", "e5m2", "e2m1", "ue4m3",
    "i4", "u4", "i8", "u8",
    "s8", "i32", "s32", "u32", "i64", "s64", "b16", "bool_",
]


class ElemType(DType):
    """A ``DType`` that can be subscripted to form a global tensor type."""

    def __getitem__(self, shape: Any) -> Tensor:
        return Tensor(canonical(self), shape if isinstance(shape, tuple) else (shape,))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DType):
            return NotImplemented
        return other.name == self.name and other.bits == self.bits

    __hash__ = DType.__hash__


def canonical(dt: Any) -> DType:
    """The ``hexlayout.arch`` ``DType`` for ``dt`` (an ``ElemType``, a name, a numpy dtype...)."""
    return DTYPES[dt.name] if isinstance(dt, DType) else get_dtype(dt)


def _e(name: str) -> ElemType:
    d = DTYPES[name]
    return ElemType(d.name, d.bits, d.ptx, d.cute, d.kind, d.c_name)


f16, bf16, f32, f64, tf32 = _e("f16"), _e("bf16"), _e("f32"), _e("f64"), _e("tf32")
e4m3, e5m2, e2m1, ue4m3 = _e("e4m3"), _e("e5m2"), _e("e2m1"), _e("ue4m3")
i4, u4, i8, u8, i32, u32, i64 = _e("s4"), _e("u4"), _e("s8"), _e("u8"), _e("s32"), _e("u32"), _e("s64")
s8, s32, s64 = i8, i32, i64
b16, bool_ = _e("b16"), _e("pred")
