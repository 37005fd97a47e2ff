"""C identifiers for the names of a kernel: kept as written where legal and unique."""

from __future__ import annotations

import re

__all__ = ["NameTable", "RESERVED"]

#: C++ keywords, CUDA built-ins and the names the generated code itself uses.
RESERVED = frozenset("""
alignas alignof and asm auto bool break case catch char class const constexpr continue decltype default
delete do double else enum explicit extern false float for friend goto if inline int long namespace new
noexcept not nullptr operator or private protected public register return short signed sizeof static
struct switch template this throw true try typedef typename union unsigned using virtual void volatile
while xor half uint2 uint4 min max threadIdx blockIdx blockDim gridDim warpSize smem smem_base v in
""".split())

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class NameTable:
    """Hands out unique C identifiers, preferring the requested spelling."""

    def __init__(self) -> None:
        self._used: set[str] = set(RESERVED)

    def take(self, want: str) -> str:
        """A fresh identifier based on ``want`` (invalid characters become ``_``)."""
        base = re.sub(r"[^A-Za-z0-9_]", "_", want) or "x"
        if not _IDENT.match(base):
            base = "_" + base
        if base.startswith("hl_") or base.startswith("__"):
            base = "k" + base
        name, k = base, 0
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name
