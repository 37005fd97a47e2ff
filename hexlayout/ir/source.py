"""``SourceLoc``: the kernel-source line an op or instruction came from, and its one formatter.

Every message, comment and report that points back to kernel source formats the location
with ``SourceLoc.format``, so the spelling is decided here once:

========================================  ==========================================
``loc.format()``                          ``gemm.py:42``
``loc.format(code="backticks")``          ``gemm.py:42 `hl.mma(ra, rb, acc)```
``loc.format(code="parens")``             ``gemm.py:42 (`hl.mma(ra, rb, acc)`)``
``loc.format(full_path=True)``            ``/home/me/gemm.py:42`` (also ``str(loc)``)
========================================  ==========================================

``loc.filename`` (the file's base name) and ``loc.text`` (the line's code without
surrounding white space, ``""`` when unknown) are the pieces, for structured output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

__all__ = ["SourceLoc", "CodeStyle"]

CodeStyle = Literal["none", "backticks", "parens"]


@dataclass(frozen=True)
class SourceLoc:
    """A source line: ``file`` (path as the interpreter saw it), 1-based ``line``, the
    enclosing function ``func`` and the line's ``code`` (may be empty)."""

    file: str
    line: int
    func: str = ""
    code: str = ""

    @property
    def filename(self) -> str:
        """The base name of ``file`` (``gemm.py`` for ``/src/gemm.py``)."""
        return os.path.basename(self.file)

    @property
    def text(self) -> str:
        """The line's code stripped of surrounding white space (``""`` when unknown)."""
        return (self.code or "").strip()

    def format(self, *, full_path: bool = False, code: CodeStyle = "none") -> str:
        """``file:line``, optionally followed by the line's code.

        Args:
            full_path: the whole ``file`` path instead of its base name.
            code: ``"none"``; ``"backticks"`` appends `` `code` ``; ``"parens"`` appends
                ``(`code`)``. Nothing is appended when the code is unknown.

        Returns:
            The location text, e.g. ``gemm.py:42 `hl.mma(ra, rb, acc)```.

        Raises:
            ValueError: ``code`` is not one of the three styles.

        Example:
            >>> loc = SourceLoc("/src/gemm.py", 42, "gemm", "    hl.mma(ra, rb, acc)")
            >>> loc.format(code="backticks")
            'gemm.py:42 `hl.mma(ra, rb, acc)`'
            >>> loc.format(full_path=True, code="parens")
            '/src/gemm.py:42 (`hl.mma(ra, rb, acc)`)'
        """
        if code not in ("none", "backticks", "parens"):
            raise ValueError(f"SourceLoc.format: code={code!r} is not 'none', 'backticks' or 'parens'")
        where = f"{self.file if full_path else self.filename}:{self.line}"
        text = self.text
        if code == "none" or not text:
            return where
        return f"{where} `{text}`" if code == "backticks" else f"{where} (`{text}`)"

    def __str__(self) -> str:
        return self.format(full_path=True)
