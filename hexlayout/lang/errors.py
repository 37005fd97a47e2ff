"""``KernelError``: every mistake a kernel author makes is reported as one.

The message names the kernel, the operation, the source line (``file:line`` and the
line's code) and then the detail, which names the tensors involved::

    gemm: mma at gemm.py:42 `hl.mma(ra, rb, acc)`: a %ra is f16(128,32) but b %rb is f16(64,16); K differs
"""

from __future__ import annotations

from hexlayout.errors import HexlayoutError
from hexlayout.ir.source import SourceLoc

__all__ = ["KernelError", "format_error"]


class KernelError(HexlayoutError, ValueError):
    """A mistake in a kernel definition or in the use of ``hexlayout.lang`` (a ``ValueError``).

    Raised while a kernel is decorated or traced. The message names the kernel, the
    operation, the source line (``file:line`` and the line's code, formatted by
    ``SourceLoc.format``) and the detail, which names the tensors involved:
    ``"<kernel>: <op> at <file>:<line> `<code>`: <detail>"``.

    Attributes:
        kernel (str): the kernel's name ("" outside a kernel).
        op (str): the operation, e.g. ``"mma"``.
        loc (SourceLoc | None): the kernel-source line.
        detail (str): the message without the location prefix.

    Example:
        >>> @hl.kernel(threads=128)
        ... def bad():
        ...     hl.zeros((64, 32), hl.f32).T.T + hl.zeros((32, 64), hl.f32)
        >>> try:
        ...     bad.trace()
        ... except hl.KernelError as e:
        ...     print(e.kernel, e.op, isinstance(e, ValueError))
        bad + True
    """

    def __init__(self, kernel: str, op: str, loc: SourceLoc | None, detail: str) -> None:
        self.kernel = kernel
        self.op = op
        self.loc = loc
        self.detail = detail
        super().__init__(format_error(kernel, op, loc, detail))


def format_error(kernel: str, op: str, loc: SourceLoc | None, detail: str) -> str:
    """The message of a ``KernelError``: ``"<kernel>: <op> at <file>:<line> `<code>`: <detail>"``.

    Args:
        kernel (str): the kernel's name; ``""`` drops the ``"<kernel>: "`` prefix.
        op (str): the operation.
        loc (SourceLoc | None): the source line; ``None`` drops the ``" at ..."`` part.
        detail (str): what is wrong.

    Returns:
        str: the message.

    Example:
        >>> from hexlayout.ir.source import SourceLoc
        >>> loc = SourceLoc("/src/gemm.py", 42, "gemm", "hl.mma(ra, rb, acc)")
        >>> format_error("gemm", "mma", loc, "K differs")
        'gemm: mma at gemm.py:42 `hl.mma(ra, rb, acc)`: K differs'
    """
    where = f" at {loc.format(code='backticks')}" if loc is not None else ""
    head = f"{kernel}: {op}" if kernel else op
    return f"{head}{where}: {detail}"
