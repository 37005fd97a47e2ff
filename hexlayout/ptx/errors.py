"""Errors of the PTX executor: the emulator's error kinds, located by PTX line.

Each error names the kernel, the PTX line and instruction, the CUDA source line the
``.loc`` before it points to (with the hexlayout source line the code generator's comment
above it names), the block and thread, and the buffer or tensor and address involved. They
subclass the emulator's ``EmulationError`` kinds, so ``except OutOfBoundsError`` catches an
out-of-bounds access in either mode.
"""

from __future__ import annotations

from typing import Any

from hexlayout.emulator import errors as emulator_errors
from hexlayout.emulator.errors import EmulationError, part_attribute

__all__ = [
    "PtxError",
    "PtxOutOfBoundsError",
    "PtxMisalignedAccessError",
    "PtxDeadlockError", "PtxRaceError",
    "PtxDivergenceError",
    "PtxIllegalInstructionError",
    "UnsupportedInstructionError",
    "PtxSite",
]


class PtxSite:
    """Where an instruction is: PTX line and text, the CUDA line and its text, the hexlayout
    source line named by the generated code's comment (``file.py:NN [origin] code``)."""

    def __init__(
        self,
        ptx_line: int,
        opcode: str,
        text: str,
        cuda_line: int | None = None,
        cuda_text: str = "",
        source: str = "",
    ) -> None:
        self.ptx_line, self.opcode, self.text = ptx_line, opcode, text
        self.cuda_line, self.cuda_text, self.source = cuda_line, cuda_text, source

    def describe(self) -> str:
        s = f"PTX line {self.ptx_line}: `{_short(' '.join(self.text.split()))}`"
        if self.cuda_line is not None:
            s += f"\n  CUDA line {self.cuda_line}: `{_short(self.cuda_text.strip())}`"
        if self.source:
            s += f"\n  source: {self.source}"
        return s


def _short(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters (a wgmma names 128 registers)."""
    return text if len(text) <= limit else text[: limit - 5] + " ..."


class PtxError(EmulationError):
    """Base of the PTX executor's errors; ``site`` (a ``PtxSite``) says where."""

    kind = "PTX execution error"
    mode = " (PTX mode)"

    def __init__(self, detail: str, *, site: PtxSite | None = None, **kw: Any) -> None:
        self.site = site
        super().__init__(detail, **kw)

    ptx_line = part_attribute("site", "ptx_line", None, "The PTX line (``int | None``).")
    opcode = part_attribute("site", "opcode", "", "The PTX opcode (``str``).")
    cuda_line = part_attribute("site", "cuda_line", None, "The CUDA source line (``int | None``).")

    def _where(self) -> list[str]:
        return [] if self.site is None else [f"  at {self.site.describe()}"]


def _ptx_kind(kind: type[EmulationError]) -> type[PtxError]:
    """The PTX executor's error of the emulator's ``kind``: a subclass of both (``except
    kind`` catches it in either mode) with ``kind``'s name in the message and ``PtxError``'s
    site."""
    name = f"Ptx{kind.__name__}"
    doc = f"The emulator's ``{kind.__name__}`` in PTX mode, located by ``site``."
    return type(name, (kind, PtxError), {"__doc__": doc, "__module__": __name__, "__qualname__": name})


PtxOutOfBoundsError = _ptx_kind(emulator_errors.OutOfBoundsError)
PtxMisalignedAccessError = _ptx_kind(emulator_errors.MisalignedAccessError)
PtxRaceError = _ptx_kind(emulator_errors.RaceError)
PtxDeadlockError = _ptx_kind(emulator_errors.DeadlockError)
PtxDivergenceError = _ptx_kind(emulator_errors.DivergenceError)
PtxIllegalInstructionError = _ptx_kind(emulator_errors.IllegalInstructionError)


class UnsupportedInstructionError(PtxIllegalInstructionError):
    """An opcode (or a form of one) the executor does not implement."""

    kind = "unsupported PTX instruction"
