"""Source locations of traced operations.

Each op records the ``SourceLoc`` of the kernel-source line that created it: the
innermost frame running the kernel function's own code object (so an op issued from a
helper function the kernel calls points at the kernel line calling the helper). Outside
any kernel frame, the innermost frame outside ``hexlayout.lang`` is used.

``assigned_name`` reads the simple assignment target of that line (``sa = hl.shared(...)``
names the value ``sa``), which the tracer uses to name values.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from types import CodeType, FrameType

from hexlayout.ir.tile import SourceLoc

__all__ = ["capture", "loc_of_frame", "loc_of_frame_line", "assigned_name", "for_target"]

_LANG_DIR = os.path.dirname(os.path.abspath(__file__))
_ASSIGN = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)")
_FOR = re.compile(r"^\s*(?:async\s+)?for\s+\(?\s*([A-Za-z_]\w*)\s*(?:,[^=]*?)?\)?\s+in\b")


def loc_of_frame(frame: FrameType) -> SourceLoc:
    code = frame.f_code
    line = frame.f_lineno
    text = linecache.getline(code.co_filename, line).strip()
    return SourceLoc(code.co_filename, line, code.co_name, text)


def loc_of_frame_line(file: str, line: int) -> str:
    """The stripped text of ``file``'s line ``line`` ("" when unavailable)."""
    return linecache.getline(file, line).strip()


def _in_lang(frame: FrameType) -> bool:
    return os.path.dirname(os.path.abspath(frame.f_code.co_filename)).startswith(_LANG_DIR)


def capture(kernel_code: CodeType | None) -> SourceLoc | None:
    """The location of the kernel line being executed (see the module docstring)."""
    f: FrameType | None = sys._getframe(1)
    fallback: FrameType | None = None
    while f is not None:
        if kernel_code is not None and f.f_code is kernel_code:
            return loc_of_frame(f)
        if fallback is None and not _in_lang(f):
            fallback = f
        f = f.f_back
    return loc_of_frame(fallback) if fallback is not None else None


def assigned_name(loc: SourceLoc | None) -> str | None:
    """``x`` for a line ``x = ...`` (or ``x: T = ...``), else None."""
    if loc is None:
        return None
    m = _ASSIGN.match(loc.code)
    return m.group(1) if m else None


def for_target(loc: SourceLoc | None) -> str | None:
    """``k`` for a line ``for k in ...`` (or ``for k, s in ...``: the first name), else None."""
    if loc is None:
        return None
    m = _FOR.match(loc.code)
    return m.group(1) if m else None
