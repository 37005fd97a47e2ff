"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import re
from typing import Any

from . import CLIError

__all__ = ["layout_arg", "tile_arg", "load_atom", "elem_bits_arg"]


def layout_arg(text: str) -> Any:
    """A ``Layout`` / ``ComposedLayout`` from CuTe notation, or a ``CLIError`` naming the input."""
    from hexlayout.layout.parse import parse_layout

    try:
        return parse_layout(text)
    except ValueError as e:
        raise CLIError(str(e)) from None
    except RecursionError:
        raise CLIError(f"cannot parse layout {text[:40]!r}...: nested too deeply") from None


_TILE = re.compile(r"^\(?\s*(\d+)\s*(?:[x,X*]\s*(\d+)\s*)?\)?$")


def tile_arg(text: str) -> tuple[int, int]:
    """``"16x8"``, ``"16,8"``, ``"(16,8)"`` -> ``(16, 8)``; ``"32"`` -> ``(1, 32)``."""
    m = _TILE.match(text.strip())
    if not m:
        raise CLIError(f"bad tile {text!r}: expected MxN, e.g. 16x8")
    a, b = int(m.group(1)), m.group(2)
    dims = (1, a) if b is None else (a, int(b))
    if min(dims) <= 0:
        raise CLIError(f"bad tile {text!r}: extents must be positive")
    return dims


def load_atom(name: str) -> Any:
    """``hexlayout.arch.get_atom(name)``, with a clear error if the name is unknown."""
    try:
        from hexlayout.arch import get_atom
    except ImportError as e:  # pragma: no cover - only while hexlayout.arch is incomplete
        raise CLIError(f"instruction atoms are not available (hexlayout.arch: {e})") from None
    try:
        return get_atom(name)
    except (KeyError, ValueError) as e:
        msg = e.args[0] if e.args else str(e)
        raise CLIError(msg if name in str(msg) else f"unknown atom {name!r}: {msg}") from None


def elem_bits_arg(text: str) -> int:
    """``--elem-bits``: a power of two from 1 to 128, else a ``CLIError`` naming the option."""
    from hexlayout.draw import DrawError, check_elem_bits

    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise CLIError(f"--elem-bits {text!r} is not an integer: expected a power of two from 1 to 128 "
                       "bits, e.g. --elem-bits 16") from None
    try:
        return check_elem_bits(value, "--elem-bits")
    except DrawError as e:
        raise CLIError(str(e)) from None
