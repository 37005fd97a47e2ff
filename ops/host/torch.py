"""Whether torch is importable, and the one error a torch op raises without it."""

from __future__ import annotations

import importlib.util

__all__ = ["HAVE_TORCH", "TorchMissingError", "require_torch"]

#: torch is installed (the torch ops, ``torch.ops.hexlayout.*``, are registered only then)
HAVE_TORCH = importlib.util.find_spec("torch") is not None

INSTALL_HINT = "pip install 'hexlayout[torch,cuda]' (or pip install -e '.[torch,cuda]' in a checkout)"


class TorchMissingError(ImportError):
    """A hexlayout op that takes torch tensors was called where torch is not installed."""


def require_torch(op: str) -> None:
    """Raise ``TorchMissingError`` naming ``op`` when torch is not installed."""
    if not HAVE_TORCH:
        raise TorchMissingError(f"{op} takes torch tensors, but torch is not installed: {INSTALL_HINT}")
