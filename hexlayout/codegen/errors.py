"""``CodegenError``: a lowered kernel that cannot be printed as CUDA C++."""

from __future__ import annotations

from hexlayout.errors import HexlayoutError
from hexlayout.ir.lowered import Instr

__all__ = ["CodegenError"]


class CodegenError(HexlayoutError, ValueError):
    """Raised for an instruction the printer cannot express; names the kernel, the
    instruction, the tile op it came from and its source line."""

    def __init__(self, kernel: str, message: str, instr: Instr | None = None) -> None:
        where = ""
        if instr is not None:
            where = f" {instr.opname}"
            if instr.origin:
                where += f" (from {instr.origin})"
            if instr.loc is not None:
                where += f" at {instr.loc.format(full_path=True, code='backticks')}"
        super().__init__(f"{kernel}:{where}: {message}" if where else f"{kernel}: {message}")
        self.kernel = kernel
        self.instr = instr
