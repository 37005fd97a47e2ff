"""From a PTX ``.loc`` to the CUDA source line and the hexlayout source line behind it.

The code generator precedes each lowered operation with a comment
``// <file>.py:<line>  [<origin>]  <code>``; the nearest such comment at or above a CUDA
line names the kernel source line that produced it.
"""

from __future__ import annotations

import re

__all__ = ["SourceMap"]

_SITE = re.compile(r"^\s*//\s+(\S+\.py:\d+)\s+(\[[^\]]*\])?\s*(.*)$")


class SourceMap:
    """``cuda_text(line)`` and ``source(line)`` for the CUDA text NVRTC compiled."""

    def __init__(self, cuda_source: str = "") -> None:
        self.lines = cuda_source.split("\n")
        self._site: list[str] = []
        cur = ""
        for ln in self.lines:
            m = _SITE.match(ln)
            if m:
                cur = " ".join(x for x in (m.group(1), m.group(2) or "", m.group(3).strip()) if x)
            self._site.append(cur)

    def cuda_text(self, line: int) -> str:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else ""

    def source(self, line: int) -> str:
        return self._site[line - 1] if 0 < line <= len(self._site) else ""
