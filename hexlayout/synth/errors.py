"""The error synthesis raises when no layout assignment satisfies a program."""

from __future__ import annotations

from hexlayout.errors import HexlayoutError
from hexlayout.ir.tile import Op

__all__ = ["SynthesisError"]


class SynthesisError(HexlayoutError, ValueError):
    """No layout assignment satisfies the program; names the conflicting ops and lines."""

    def __init__(self, kernel: str, message: str, ops: list[Op] | None = None) -> None:
        super().__init__(f"{kernel}: {message}")
        self.kernel = kernel
        self.ops = ops or []
