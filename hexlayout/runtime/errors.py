"""Errors of the compile step, with the generated source and kernel source lines they concern."""

from __future__ import annotations

import re

from hexlayout.errors import HexlayoutError

__all__ = ["CompileError", "ToolchainError", "explain_log"]

_FRONTEND = re.compile(r"^(?P<file>[^\s()]+)\((?P<line>\d+)\): (?P<kind>error|catastrophic error|warning)"
                       r"(?P<rest>.*)$")
_SITE = re.compile(r"^\s*// (?P<site>\S+:\d+.*)$")


class ToolchainError(HexlayoutError, RuntimeError):
    """No compiler is usable (NVRTC not installed or not loadable, no nvcc), or a tool is missing."""


class CompileError(HexlayoutError, RuntimeError):
    """The CUDA compiler rejected generated source; ``log`` is its full output."""

    def __init__(self, message: str, log: str = "", source: str = "", arch: str = "",
                 compiler: str = "") -> None:
        super().__init__(message)
        self.log = log
        self.source = source
        self.arch = arch
        self.compiler = compiler


def _kernel_site(lines: list[str], lineno: int) -> str | None:
    """The nearest ``// file:line ...`` comment at or above generated line ``lineno`` (1-based)."""
    for i in range(min(lineno, len(lines)) - 1, -1, -1):
        m = _SITE.match(lines[i])
        if m:
            return m.group("site")
    return None


def explain_log(log: str, source: str, limit: int = 5) -> str:
    """For each front-end error in ``log`` (up to ``limit``): the message, the offending line of
    generated source and the kernel source line of its instruction group."""
    src_lines = source.splitlines()
    out: list[str] = []
    for raw in log.splitlines():
        m = _FRONTEND.match(raw.strip())
        if not m or m.group("kind") == "warning":
            continue
        n = int(m.group("line"))
        text = src_lines[n - 1].strip() if 0 < n <= len(src_lines) else "<no such line>"
        if len(text) > 200:
            text = text[:200] + " ..."
        entry = f"  generated line {n}: {m.group('kind')}{m.group('rest')}\n      {text}"
        site = _kernel_site(src_lines, n)
        if site:
            entry += f"\n      from kernel source {site}"
        out.append(entry)
        if len(out) >= limit:
            break
    return "\n".join(out)
