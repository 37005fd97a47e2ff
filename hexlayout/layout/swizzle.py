"""CuTe's ``Swizzle<B, M, S>``: an XOR permutation of integer offsets.

``Swizzle(B, M, S)(x) = x ^ ((x & yyy_mask) >> S)`` with ``yyy_mask`` the B bits at
``[M+S, M+S+B)`` (for ``S >= 0``): the low M bits are kept, the B bits at ``[M, M+B)``
are XORed with the B bits S positions above them. A negative S swaps the roles. The
swizzle is a bijection on ``[0, 2^(B+M+|S|))`` and periodic beyond it; it acts in
the unit of the layout it is composed with (elements, or bytes for Hopper's modes).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Swizzle"]


class Swizzle:
    __slots__ = ("bits", "base", "shift")

    def __init__(self, bits: int, base: int, shift: int) -> None:
        if bits < 0 or base < 0:
            raise ValueError(f"Swizzle({bits},{base},{shift}): bits and base must be non-negative")
        if abs(shift) < bits:
            raise ValueError(f"Swizzle({bits},{base},{shift}): |shift| must be at least bits (masks overlap)")
        self.bits = int(bits)
        self.base = int(base)
        self.shift = int(shift)

    @property
    def yyy_mask(self) -> int:
        """The bits read: ``[M + max(0,S), M + max(0,S) + B)``."""
        return ((1 << self.bits) - 1) << (self.base + max(0, self.shift))

    @property
    def zzz_mask(self) -> int:
        """The bits written: ``[M - min(0,S), M - min(0,S) + B)``."""
        return ((1 << self.bits) - 1) << (self.base - min(0, self.shift))

    def period(self) -> int:
        """``2^(B + M + |S|)``: the swizzle repeats with this period."""
        return 1 << (self.bits + self.base + abs(self.shift))

    def __call__(self, x: Any) -> Any:
        if self.shift >= 0:
            return x ^ ((x & self.yyy_mask) >> self.shift)
        return x ^ ((x & self.yyy_mask) << -self.shift)

    def size(self) -> int:
        return self.period()

    def cosize(self) -> int:
        return self.period()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Swizzle) and (self.bits, self.base, self.shift) == (
            other.bits, other.base, other.shift)

    def __hash__(self) -> int:
        return hash(("Swizzle", self.bits, self.base, self.shift))

    def __str__(self) -> str:
        return f"Sw<{self.bits},{self.base},{self.shift}>"

    def __repr__(self) -> str:
        return f"Swizzle({self.bits}, {self.base}, {self.shift})"

    def is_identity(self) -> bool:
        return self.bits == 0
