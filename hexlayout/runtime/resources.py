"""Resource usage of a compiled kernel: registers, spills, stack, shared memory.

Parsed from ptxas' ``-v`` report (both compilers pass it on) or, failing that, from
``cuobjdump -res-usage``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ResourceUsage", "parse_ptxas", "parse_res_usage"]


@dataclass(frozen=True)
class ResourceUsage:
    """Per-thread registers, bytes of stack frame / spill stores / spill loads, static shared
    memory bytes and constant bank 0 bytes of one kernel."""

    registers: int
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    shared_static: int = 0
    constant: int = 0
    barriers: int = 0

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ResourceUsage:
        return ResourceUsage(**{k: int(v) for k, v in d.items()})


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")
_BARS = re.compile(r"used (\d+) barriers")


def parse_ptxas(log: str, name: str | None = None) -> ResourceUsage | None:
    """The ``ptxas -v`` report of entry ``name`` (the first entry if ``None``)."""
    current: str | None = None
    found: dict[str, int] = {}
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            if found and "registers" in found:
                break
            current = m.group("name")
            continue
        if current is None or (name is not None and current != name):
            continue
        if (m := _FRAME.search(line)):
            found.update(stack_frame=int(m.group(1)), spill_stores=int(m.group(2)),
                         spill_loads=int(m.group(3)))
        if (m := _USED.search(line)):
            found["registers"] = int(m.group(1))
            if (s := _SMEM.search(line)):
                found["shared_static"] = int(s.group(1))
            if (c := _CMEM.search(line)):
                found["constant"] = int(c.group(1))
            if (b := _BARS.search(line)):
                found["barriers"] = int(b.group(1))
    return ResourceUsage(**found) if "registers" in found else None


_RES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)\s+CONSTANT\[0\]:(\d+)")


def parse_res_usage(text: str, name: str | None = None) -> ResourceUsage | None:
    """``cuobjdump -res-usage`` output (no spill counts there: ``LOCAL`` is reported as stack)."""
    current = None
    for line in text.splitlines():
        if line.strip().startswith("Function "):
            current = line.strip()[len("Function "):].rstrip(":")
            continue
        m = _RES.search(line)
        if m and (name is None or current == name):
            reg, stack, shared, local, const = (int(x) for x in m.groups())
            return ResourceUsage(registers=reg, stack_frame=max(stack, local), shared_static=shared,
                                 constant=const)
    return None
