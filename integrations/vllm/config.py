"""What the vLLM plugin swaps: ``HEXLAYOUT_VLLM`` and the device decision (importing it imports
neither vLLM nor torch; :func:`vllm_platform` asks vLLM when called).

``HEXLAYOUT_VLLM``:

- unset, empty, ``1`` or ``all``: every supported kernel (:data:`KERNELS`);
- ``0``: nothing (the plugin does nothing at all);
- a comma list drawn from :data:`KERNELS` (``moe``, ``attention``, ``mamba``; case and spaces ignored):
  only those. Anything else is a :class:`PluginConfigError` naming the variable and the word.

The device decision (:func:`device_decision`): on vLLM's CPU build hexlayout's kernels run in the
emulator, so only when ``HEXLAYOUT_EMULATE=1``; on CUDA, devices of compute capability 8.x,
9.0 and 10.0 (hexlayout's sm_80, sm_89, sm_90a and sm_100a); anything else leaves vLLM's
kernels in place, with the reason to log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hexlayout.errors import HexlayoutError

__all__ = [
    "KERNELS",
    "ENV",
    "EMULATE_ENV",
    "LOGGER",
    "PluginConfigError",
    "DeviceDecision",
    "selected_kernels",
    "vllm_platform",
    "device_decision",
]

#: The kernel families the plugin can swap.
KERNELS: tuple[str, ...] = ("moe", "attention", "mamba")
#: Which kernels to swap.
ENV = "HEXLAYOUT_VLLM"
#: The plugin's logger: a child of vLLM's ``vllm`` logger, so vLLM's handlers and format print it.
LOGGER = "vllm.hexlayout"
#: hexlayout's switch for running CPU tensors in the emulator (``hexlayout.runtime.torch_ops``).
EMULATE_ENV = "HEXLAYOUT_EMULATE"


class PluginConfigError(HexlayoutError, ValueError):
    """``HEXLAYOUT_VLLM`` holds something other than ``0``, ``1``, ``all`` or a kernel list."""


def selected_kernels(value: str | None = None) -> frozenset[str]:
    """The kernels ``HEXLAYOUT_VLLM`` selects (``value``, else the environment's)."""
    raw = os.environ.get(ENV) if value is None else value
    text = (raw or "").strip().lower()
    if text in ("", "1", "all"):
        return frozenset(KERNELS)
    if text == "0":
        return frozenset()
    words = [w.strip() for w in text.split(",")]
    bad = [w for w in words if w not in KERNELS]
    if bad:
        raise PluginConfigError(
            f"{ENV}={raw!r}: unknown kernel {bad[0]!r}; expected 0, 1, all or a comma list of "
            f"{', '.join(KERNELS)}"
        )
    return frozenset(words)


def vllm_platform() -> tuple[str, tuple[int, int] | None]:
    """vLLM's current platform as :func:`device_decision` takes it: ``("cpu", None)``,
    ``("cuda", (major, minor))`` or ``(device name, None)`` (imports vLLM when called)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu", None
    if current_platform.is_cuda():
        cap = current_platform.get_device_capability()
        return "cuda", (None if cap is None else (cap.major, cap.minor))
    return str(current_platform.device_name), None


@dataclass(frozen=True)
class DeviceDecision:
    """Whether hexlayout's kernels run on this device (``run``), how (``mode``: ``"emulate"``,
    ``"cuda"``) and why not (``reason``)."""

    run: bool
    mode: str
    reason: str


def device_decision(
    platform: str, capability: tuple[int, int] | None = None, emulate: str | None = None
) -> DeviceDecision:
    """The decision for vLLM's platform (``"cpu"``, ``"cuda"`` or another name), the CUDA
    device's compute capability and ``HEXLAYOUT_EMULATE`` (``emulate``, else the
    environment's)."""
    if platform == "cpu":
        flag = os.environ.get(EMULATE_ENV, "") if emulate is None else emulate
        if flag == "1":
            return DeviceDecision(True, "emulate", "")
        return DeviceDecision(
            False,
            "",
            f"vLLM runs on the CPU and hexlayout's kernels run there only in its emulator: set "
            f"{EMULATE_ENV}=1 to use them (tests, small models); keeping vLLM's CPU kernels",
        )
    if platform == "cuda":
        if capability is not None and (capability[0] == 8 or tuple(capability) in ((9, 0), (10, 0))):
            return DeviceDecision(True, "cuda", "")
        cap = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
        return DeviceDecision(
            False,
            "",
            f"CUDA device of compute capability {cap}: hexlayout targets 8.x (sm_80, sm_89), "
            f"9.0 (sm_90a) and 10.0 (sm_100a); keeping vLLM's kernels",
        )
    return DeviceDecision(
        False, "", f"vLLM platform {platform!r} is not supported by hexlayout; keeping vLLM's kernels"
    )
