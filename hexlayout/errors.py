"""``HexlayoutError``: the one base class of every error hexlayout reports to a user.

Each concrete error also derives from the builtin it has always been (``ValueError`` for a
wrong kernel, synthesis, lowering or argument; ``RuntimeError`` for a compiler, launch or
device failure), so ``except ValueError`` keeps working while ``except HexlayoutError``
catches everything hexlayout raises on purpose. This module imports nothing: every layer
may derive from it.
"""

from __future__ import annotations

__all__ = ["HexlayoutError"]


class HexlayoutError(Exception):
    """Base of every user-facing hexlayout error (kernel, synthesis, lowering, codegen,
    argument, compile, launch and emulation errors)."""
