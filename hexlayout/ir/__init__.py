"""The tile-level IR built by ``hexlayout.lang`` and the lowered per-thread program."""

from . import printer as _printer  # noqa: E402,F401 - str(TileKernel) is its format_kernel
