"""What ran: a log of hexlayout kernel launches, and profiler ranges around them.

``with launch_log() as log:`` appends a ``LaunchRecord`` to ``log`` for every hexlayout
kernel launch in the process while the block runs, on CUDA (``Launcher.launch``) or in the
emulator (``emulate``); blocks may nest (each open log gets every record). A record has

- ``name``: the kernel's name (as in the generated code);
- ``anchor``: the aten op the kernel was scheduled for (e.g. ``aten.addmm.default``), or
  ``None`` for a kernel built without the fusion mechanism;
- ``prologue`` / ``epilogue``: the aten op names fused into its operand loads and store;
- ``shapes``: the shapes of its tensor arguments, in parameter order;
- ``build_key``: the build's key (``runtime.build.build_key``: sources, architecture,
  compiler, the tile program's structural hash); two launches of one build share it, and
  sizes that are symbolic in the program (``M``, ``N``, ``K``) do not change it.

Every launch also runs inside ``torch.profiler.record_function(f"hexlayout::{name}")`` when
torch's profiler is enabled (no cost otherwise).

``describe(build, anchor=..., prologue=..., epilogue=...)`` attaches the fusion facts of a
build (the fusion layer calls it when it builds a fused kernel). This module imports nothing
outside the standard library; torch only when the profiler is on.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LaunchRecord", "launch_log", "describe", "record", "profiled", "logging_active"]


@dataclass(frozen=True)
class LaunchRecord:
    """One kernel launch (see the module docstring)."""

    name: str
    anchor: str | None
    prologue: tuple[str, ...]
    epilogue: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    build_key: str
    device: str = "cuda"


@dataclass
class _Info:
    anchor: str | None = None
    prologue: tuple[str, ...] = ()
    epilogue: tuple[str, ...] = ()
    key: str | None = None
    ref: Any = field(default=None, repr=False)


_LOGS: list[list[LaunchRecord]] = []
_LOCK = threading.Lock()
_INFO: dict[int, _Info] = {}


def logging_active() -> bool:
    """Whether a ``launch_log`` block is open (a cheap check for the launch paths)."""
    return bool(_LOGS)


@contextlib.contextmanager
def launch_log() -> Iterator[list[LaunchRecord]]:
    """Collect a ``LaunchRecord`` per hexlayout kernel launch while the block runs."""
    log: list[LaunchRecord] = []
    with _LOCK:
        _LOGS.append(log)
    try:
        yield log
    finally:
        with _LOCK:
            for i in range(len(_LOGS) - 1, -1, -1):
                if _LOGS[i] is log:
                    del _LOGS[i]
                    break


def _info(build: Any) -> _Info:
    info = _INFO.get(id(build))
    if info is None or info.ref is not build:
        info = _INFO[id(build)] = _Info(ref=build)
    return info


def describe(build: Any, *, anchor: str | None, prologue: tuple[str, ...] | list[str] = (),
             epilogue: tuple[str, ...] | list[str] = ()) -> None:
    """Attach the fusion facts of ``build`` (shown by later launch records)."""
    info = _info(build)
    info.anchor, info.prologue, info.epilogue = anchor, tuple(prologue), tuple(epilogue)


def _build_key(build: Any, info: _Info) -> str:
    if info.key is None:
        from .build import build_key

        try:
            gen = build.generated
            info.key = build_key(build.tile_kernel, gen.arch, build.compiled is not None)
        except AttributeError:           # a lowered program without a Build (emulate's other inputs)
            info.key = ""
    return info.key


def record(build: Any, name: str, shapes: tuple[tuple[int, ...], ...], device: str) -> None:
    """Append a record of one launch of ``build`` to every open log."""
    if not _LOGS:
        return
    info = _info(build)
    rec = LaunchRecord(name, info.anchor, info.prologue, info.epilogue, shapes, _build_key(build, info),
                       device)
    with _LOCK:
        for log in _LOGS:
            log.append(rec)


def profiled(name: str) -> Any:
    """``torch.profiler.record_function(f"hexlayout::{name}")`` when torch's profiler is on,
    else a no-op context (torch is not imported when it is not loaded)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            on = torch.autograd.profiler._is_profiler_enabled
        except AttributeError:  # pragma: no cover - older torch
            on = True
        if on:
            return torch.profiler.record_function(f"hexlayout::{name}")
    return contextlib.nullcontext()


def param_shapes(tile_kernel: Any, sizes: dict[str, int]) -> tuple[tuple[int, ...], ...]:
    """The shapes of ``tile_kernel``'s tensor parameters for size values ``sizes`` (by name)."""
    from hexlayout.ir.expr import evaluate, free_vars
    from hexlayout.ir.tile import GlobalParam

    out = []
    for p in tile_kernel.params:
        if isinstance(p, GlobalParam):
            dims = []
            for s in p.shape:
                env = {v: sizes.get(v.name, 0) for v in free_vars(s)}
                dims.append(int(evaluate(s, env)))
            out.append(tuple(dims))
    return tuple(out)


def launched(build: Any, name: str, bound: Any, device: str) -> None:
    """The launch paths' hook: a record of ``build``'s launch with checked arguments ``bound``."""
    if _LOGS:
        record(build, name, param_shapes(build.tile_kernel, bound.sizes), device)
