"""Errors the emulator raises: one ``EmulationError`` subclass per kind of failure.

Every error carries structured fields (the kernel, the instruction, its source line and
origin, the block, and where relevant the thread, the buffer or tensor, the offending
address and the *other* instruction involved in a race or hazard) and a message that
names all of them, so a failure in a synthesized kernel points back to the source line.
"""

from __future__ import annotations

from typing import Any

from hexlayout.errors import HexlayoutError
from hexlayout.ir.lowered import Instr

__all__ = [
    "EmulationError",
    "OutOfBoundsError",
    "MisalignedAccessError",
    "RaceError",
    "AsyncHazardError",
    "DeadlockError",
    "DivergenceError",
    "IllegalInstructionError",
    "ArgumentError",
    "describe_instr",
]


def describe_instr(ins: Instr | None) -> str:
    """``Opname [origin] at file:line (`code`)`` for messages."""
    if ins is None:
        return "<unknown instruction>"
    s = ins.opname
    if ins.origin:
        s += f" [{ins.origin}]"
    if ins.loc is not None:
        s += f" at {ins.loc.format(full_path=True, code='parens')}"
    return s


def part_attribute(part: str, attr: str, default: Any, doc: str) -> property:
    """A read-only property: ``self.<part>.<attr>``, or ``default`` where ``self.<part>`` is ``None``."""

    def get(self: Any) -> Any:
        p = getattr(self, part)
        return default if p is None else getattr(p, attr)

    return property(get, doc=doc)


class EmulationError(HexlayoutError):
    """Base class. Fields: ``kernel``, ``instr``, ``loc``, ``origin``, ``block``, ``thread``,
    ``buffer`` (tensor or shared buffer name), ``address`` (element offset or byte address, as
    the message says), ``other_instr`` / ``other_loc`` / ``other_thread`` (the conflicting
    access of a race or hazard), ``detail`` (the problem in words)."""

    kind = "emulation error"
    #: said after the kind in the message head (the PTX executor's errors: ``" (PTX mode)"``)
    mode = ""

    def __init__(
        self,
        detail: str,
        *,
        kernel: str = "",
        instr: Instr | None = None,
        block: tuple[int, ...] | None = None,
        thread: int | None = None,
        buffer: str | None = None,
        address: int | None = None,
        other_instr: Instr | None = None,
        other_thread: int | None = None,
        **extra: Any,
    ) -> None:
        self.detail = detail
        self.kernel = kernel
        self.instr = instr
        self.block = block
        self.thread = thread
        self.buffer = buffer
        self.address = address
        self.other_instr = other_instr
        self.other_thread = other_thread
        self.extra = extra
        super().__init__(self._format())

    loc = part_attribute("instr", "loc", None, "The instruction's source line (``SourceLoc | None``).")
    origin = part_attribute("instr", "origin", "", "The instruction's origin (``str``).")
    other_loc = part_attribute("other_instr", "loc", None, "The conflicting instruction's source line.")

    def _format(self) -> str:
        """``kind [mode] in kernel K, block B, thread T:``, the detail, then ``_where()``'s lines."""
        head = f"{self.kind}{self.mode}"
        if self.kernel:
            head += f" in kernel {self.kernel!r}"
        if self.block is not None:
            head += f", block {self.block}"
        if self.thread is not None:
            head += f", thread {self.thread}"
        return "\n".join([head + ":", f"  {self.detail}", *self._where()])

    def _where(self) -> list[str]:
        """The message lines that locate the error: the instruction and the conflicting one."""
        lines = []
        if self.instr is not None:
            lines.append(f"  instruction: {describe_instr(self.instr)}")
        if self.other_instr is not None:
            who = f" (thread {self.other_thread})" if self.other_thread is not None else ""
            lines.append(f"  conflicting: {describe_instr(self.other_instr)}{who}")
        return lines


class OutOfBoundsError(EmulationError):
    """A global or shared access outside its tensor / buffer."""

    kind = "out-of-bounds access"


class MisalignedAccessError(EmulationError):
    """A vector access whose address is not a multiple of its width."""

    kind = "misaligned access"


class RaceError(EmulationError):
    """Two accesses to the same shared-memory bytes by different threads, at least one a
    write, not ordered by happens-before (bar.sync, mbarrier arrive -> wait)."""

    kind = "shared-memory race"


class AsyncHazardError(EmulationError):
    """Use of data an asynchronous operation (cp.async, TMA, wgmma) has not finished with:
    reading shared memory before its cp.async / TMA write completed, reading or writing
    registers of an in-flight wgmma, writing shared memory an in-flight wgmma / TMA store reads."""

    kind = "asynchronous hazard"


class DeadlockError(EmulationError):
    """Every remaining thread group waits (bar.sync / mbarrier) and none can proceed."""

    kind = "deadlock"


class DivergenceError(EmulationError):
    """A value that must be thread-uniform (loop bound, register index, barrier) is not, or a
    warp / warp-group collective instruction runs with part of its warp(group) inactive."""

    kind = "divergence"


class IllegalInstructionError(EmulationError):
    """An instruction whose operands PTX does not allow (widths, counts, register sizes, atoms)."""

    kind = "illegal instruction"


class ArgumentError(EmulationError, ValueError):
    """Kernel arguments that do not match the kernel's parameters (a ``ValueError`` too, as the
    launcher's)."""

    kind = "bad kernel argument"
