"""The emulation switch: ``HEXLAYOUT_EMULATE`` says whether CPU tensors run through the
emulator (``1``: the IR emulator, the lowered program; ``ptx``: the PTX executor, the PTX that
NVRTC made from the printed source), read at each call."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["EMULATE_ENV", "emulation_enabled", "emulation_mode"]

EMULATE_ENV = "HEXLAYOUT_EMULATE"

_ENVIRON_TYPE = type(os.environ)
try:
    _EMULATE_RAW: Any = os.environ.encodekey(EMULATE_ENV)  # type: ignore[attr-defined]
    _ONE_RAW: Any = os.environ.encodevalue("1")  # type: ignore[attr-defined]
    _PTX_RAW: Any = os.environ.encodevalue("ptx")  # type: ignore[attr-defined]
except AttributeError:  # pragma: no cover - a platform without the encoded mapping
    _EMULATE_RAW = None


def emulation_enabled() -> bool:
    """Whether CPU tensors may run through the emulator (``HEXLAYOUT_EMULATE=1``: the IR
    emulator; ``HEXLAYOUT_EMULATE=ptx``: the PTX executor), read at each call (from
    ``os.environ``'s encoded mapping where it has one: no decoding per call)."""
    env = os.environ
    if type(env) is _ENVIRON_TYPE and _EMULATE_RAW is not None:
        v = env._data.get(_EMULATE_RAW)  # type: ignore[attr-defined]
        return v == _ONE_RAW or v == _PTX_RAW
    return env.get(EMULATE_ENV, "") in ("1", "ptx")


def emulation_mode() -> str | None:
    """``"ir"`` (``HEXLAYOUT_EMULATE=1``), ``"ptx"`` (``HEXLAYOUT_EMULATE=ptx``) or ``None``."""
    v = os.environ.get(EMULATE_ENV, "")
    return "ir" if v == "1" else "ptx" if v == "ptx" else None
