"""``KernelError``: every mistake a kernel author makes is reported as one.

The message names the kernel, the operation, the source line (``file:line`` and the
line's code) and then the detail, which names the tensors involved::

    gemm: mma at gemm.py:42 `hl.mma(ra, rb, acc)`: a %ra is f16(128,32) but b %rb is f16(64,16); K differs
"""

from __future__ import annotations

from hexlayout.errors import HexlayoutError
from hexlayout.ir.tile import SourceLoc

__all__ = ["KernelError", "format_error"]


class KernelError(HexlayoutError, ValueError):
    """A user error in a kernel definition (a ``ValueError``).

    Attributes: ``kernel`` (name), ``op`` (the operation, e.g. ``"mma"``), ``loc``
    (``SourceLoc`` or None) and ``detail`` (the message without the location prefix).
    """

    def __init__(self, kernel: str, op: str, loc: SourceLoc | None, detail: str) -> None:
        self.kernel = kernel
        self.op = op
        self.loc = loc
        self.detail = detail
        super().__init__(format_error(kernel, op, loc, detail))


def format_error(kernel: str, op: str, loc: SourceLoc | None, detail: str) -> str:
    where = f" at {loc.format(code='backticks')}" if loc is not None else ""
    head = f"{kernel}: {op}" if kernel else op
    return f"{head}{where}: {detail}"
