"""Errors of :mod:`hexlayout.draw`: a picture too large to draw, a file that cannot be written."""

from __future__ import annotations

from hexlayout.errors import HexlayoutError

__all__ = ["DrawError", "DrawOutputError"]


class DrawError(HexlayoutError, ValueError):
    """A layout, tile or option that cannot be drawn (too many cells, a bad element width);
    the message names the layout or option and the limit."""


class DrawOutputError(HexlayoutError, OSError):
    """The picture could not be written; the message names the output path and the reason."""
