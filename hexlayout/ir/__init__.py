"""The tile-level IR built by ``hexlayout.lang`` and the lowered per-thread program."""
