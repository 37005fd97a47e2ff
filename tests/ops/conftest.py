"""Fixtures shared by the op tests.

``built``: the op runs in the emulator as sm_100a (``HEXLAYOUT_EMULATE``,
``HEXLAYOUT_EMULATE_ARCH``) and the fixture's list collects the name of every kernel the op's
launchers build (``hexlayout.ops.host.launch.build_for``), in order.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the kernels the op launchers build (emulated sm_100a)."""
    from hexlayout.ops.host import launch

    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_100a")
    names: list[str] = []
    real = launch.build_for

    def spy(kernel, device, consts):
        b = real(kernel, device, consts)
        names.append(b.generated.name)
        return b

    monkeypatch.setattr(launch, "build_for", spy)
    return names
