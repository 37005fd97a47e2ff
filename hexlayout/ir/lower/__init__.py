"""Lowering: a tile program with every layout and instruction fixed -> the lowered per-thread program."""
