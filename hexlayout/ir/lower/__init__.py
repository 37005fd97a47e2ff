"""Lowering: a tile program with every layout and instruction fixed -> the lowered per-thread program."""

from . import tma_store as _tma_store  # noqa: F401  (registers the TMA store copy rule)
