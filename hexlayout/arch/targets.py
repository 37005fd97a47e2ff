"""Architecture names and which ones include which.

Targets are ordered by compute capability; a target offers every instruction of the
targets below it (``sm_90a`` runs the ``sm_80`` mma.sync, the ``sm_75`` ldmatrix, the
``sm_89`` fp8 mma.sync) plus its own. ``sm_90a`` is ``sm_90`` with the
architecture-specific features (wgmma, setmaxnreg) that plain ``sm_90`` lacks.
"""

from __future__ import annotations

__all__ = ["SUPPORTED_ARCHS", "CAPABILITY", "archs_offering", "check_arch_name"]

#: The architectures hexlayout targets, oldest first.
SUPPORTED_ARCHS: tuple[str, ...] = ("sm_80", "sm_89", "sm_90a")

#: Compute capability times ten of every architecture an atom may require.
CAPABILITY: dict[str, int] = {"sm_75": 75, "sm_80": 80, "sm_89": 89, "sm_90": 90, "sm_90a": 90}


def check_arch_name(name: str) -> str:
    """Normalize ``"sm90a"``/``"SM_90A"``/``"sm_90a"`` to ``"sm_90a"``; unknown names raise ``ValueError``."""
    key = name.strip().lower().replace("-", "_")
    if key.startswith("sm") and not key.startswith("sm_"):
        key = "sm_" + key[2:]
    if key not in SUPPORTED_ARCHS:
        raise ValueError(f"unknown architecture {name!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    return key


def archs_offering(min_arch: str) -> tuple[str, ...]:
    """The supported targets that run an instruction first available on ``min_arch``.

    ``sm_90a``-only instructions (wgmma) are offered by ``sm_90a`` alone.
    """
    if min_arch not in CAPABILITY:
        raise ValueError(f"unknown architecture {min_arch!r}")
    cap = CAPABILITY[min_arch]
    out = [a for a in SUPPORTED_ARCHS if CAPABILITY[a] >= cap]
    if min_arch.endswith("a"):
        out = [a for a in out if a == min_arch]
    return tuple(out)
