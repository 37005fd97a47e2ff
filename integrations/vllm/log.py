"""The plugin's log lines, through vLLM's logger (``vllm.hexlayout``, a child of ``vllm``).

vLLM installs its log handlers when it sets up an engine, which in the front-end process (and
with an in-process engine) is after it loads plugins. So :func:`announce` prints a line at once
when vLLM's handlers are there, and otherwise keeps it until :func:`flush`, which the plugin's
layers call when vLLM builds them (by then logging is set up); each line is printed once.
"""

from __future__ import annotations

import logging

from vllm.logger import init_logger

from .config import LOGGER

__all__ = ["logger", "announce", "flush"]

logger = init_logger(LOGGER)
_pending: list[str] = []


def _ready() -> bool:
    """Whether a handler would print the plugin's lines (vLLM's, or any the application set)."""
    return logging.getLogger(LOGGER).hasHandlers()


def announce(message: str) -> None:
    """Log ``message`` (INFO) now, or at the first :func:`flush` after vLLM's logging is set up."""
    if _ready():
        logger.info("%s", message)
    else:
        _pending.append(message)


def flush() -> None:
    """Log the lines :func:`announce` kept, once vLLM's logging is set up."""
    while _pending and _ready():
        logger.info("%s", _pending.pop(0))
