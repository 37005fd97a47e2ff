"""CUDA-graph capture: what may not happen inside one, and warming builds up before it.

A kernel launched inside a CUDA-graph capture must already be built and loaded: tracing,
synthesis and NVRTC take seconds, and loading a module is not a capturable operation. So

* ``capturing()`` is true while torch's current CUDA stream is capturing, or inside
  ``mock_capture()`` (tests on machines without a GPU use it to stand for a capture);
* ``build`` raises ``CaptureError`` (naming the kernel and its constants) when a capture
  needs a build that is not in the process's memo, and a ``Launcher`` refuses to load its
  module during one;
* reading tensor contents for argument checks (a host synchronization) is skipped while
  capturing (``ops.host.launch.content_checks``);
* ``prebuild()`` is the warm-up: inside it, every ``run_build`` builds its kernel and, for
  CUDA tensors, loads it on the device, but launches nothing (CPU tensors: nothing is
  emulated), so running an op once per shape under ``prebuild()`` before a capture makes
  every build the capture will need resident. The op's outputs are then meaningless.

Example::

    from hexlayout.runtime import prebuild, mock_capture
    with prebuild():
        hexlayout.ops.fused_moe(x, w13, w2, tw, ids)   # builds, launches nothing
    with mock_capture():
        hexlayout.ops.fused_moe(x, w13, w2, tw, ids)   # same shapes: no build needed
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from hexlayout.errors import HexlayoutError

__all__ = ["CaptureError", "capturing", "mock_capture", "prebuild", "prebuilding"]

_STATE = threading.local()


class CaptureError(HexlayoutError, RuntimeError):
    """A kernel needed a build (or a module load) inside a CUDA-graph capture."""


def _depth(name: str) -> int:
    return getattr(_STATE, name, 0)


@contextlib.contextmanager
def _flag(name: str) -> Iterator[None]:
    setattr(_STATE, name, _depth(name) + 1)
    try:
        yield
    finally:
        setattr(_STATE, name, _depth(name) - 1)


def mock_capture() -> contextlib.AbstractContextManager[None]:
    """A stand-in for a CUDA-graph capture (this thread): ``capturing()`` is true inside."""
    return _flag("mock")


def prebuild() -> contextlib.AbstractContextManager[None]:
    """Warm-up mode (this thread): ``run_build`` builds and loads but launches nothing."""
    return _flag("prebuild")


def prebuilding() -> bool:
    """Whether this thread is inside ``prebuild()``."""
    return _depth("prebuild") > 0


def capturing() -> bool:
    """Whether a CUDA-graph capture is under way on torch's current stream (or mocked)."""
    if _depth("mock") > 0:
        return True
    import sys

    torch = sys.modules.get("torch")  # never import torch here: no torch, no capture
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    return bool(torch.cuda.is_current_stream_capturing())


def refuse_during_capture(what: str, consts: dict[str, Any] | None = None) -> None:
    """Raise ``CaptureError`` for ``what`` (a kernel needing a build or a load) when capturing."""
    if not capturing():
        return
    shown = "" if not consts else " with " + ", ".join(f"{k}={v!r}" for k, v in sorted(consts.items()))
    raise CaptureError(
        f"{what}{shown}: not built before the CUDA-graph capture; run the op once for these shapes "
        "under hexlayout.runtime.prebuild() (or eagerly) before capturing"
    )
