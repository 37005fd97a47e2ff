"""Architecture names and which ones include which.

Targets are ordered by compute capability; a target offers every instruction of the
targets below it (``sm_90a`` runs the ``sm_80`` mma.sync, the ``sm_75`` ldmatrix, the
``sm_89`` fp8 mma.sync) plus its own. ``sm_90a`` is ``sm_90`` with the
architecture-specific features (wgmma, setmaxnreg) that plain ``sm_90`` lacks; ``sm_100a``
(B200 / GB200) is ``sm_100`` with tcgen05 and tensor memory, and inherits the ``sm_90``
features (TMA, stmatrix, clusters) but not the ``sm_90a``-only wgmma.
"""

from __future__ import annotations

from hexlayout.errors import HexlayoutError

__all__ = ["SUPPORTED_ARCHS", "CAPABILITY", "RUNS_ON", "UnsupportedArchError", "archs_offering",
           "check_arch_name", "arch_advice"]

#: The architectures hexlayout targets, oldest first.
SUPPORTED_ARCHS: tuple[str, ...] = ("sm_80", "sm_89", "sm_90a", "sm_100a")

#: Compute capability times ten of every architecture an atom may require.
CAPABILITY: dict[str, int] = {"sm_75": 75, "sm_80": 80, "sm_89": 89, "sm_90": 90, "sm_90a": 90, "sm_100": 100,
                              "sm_100a": 100}


#: The supported build that runs on a GPU architecture which has no build of its own: a cubin
#: runs on devices of its major version with an equal or higher minor version, so the
#: sm_80 build runs on sm_86 (GA10x: RTX 30xx, A10, A40) and sm_87 (Jetson Orin); plain
#: sm_90 is the Hopper device that the sm_90a build (wgmma, TMA, setmaxnreg) targets, plain
#: sm_100 the Blackwell device that the sm_100a build (tcgen05, tensor memory) targets.
RUNS_ON: dict[str, str] = {"sm_86": "sm_80", "sm_87": "sm_80", "sm_90": "sm_90a", "sm_100": "sm_100a"}


class UnsupportedArchError(HexlayoutError, ValueError):
    """An architecture name that is not one of ``SUPPORTED_ARCHS`` (a ``ValueError``); the
    message says which supported build runs on that GPU, or that none does."""


def _key(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    if key.startswith("sm") and not key.startswith("sm_"):
        key = "sm_" + key[2:]
    return key


def arch_advice(name: str) -> str:
    """Why ``name`` is not a build target and what to use instead (for error messages).

    ``"sm_86"`` -> the sm_80 build runs there; ``"sm_90"`` -> use ``sm_90a``; a newer GPU
    (``sm_120``) or an older one (``sm_75``) is not supported, and the message lists
    the builds that exist.

    Example:
        >>> arch_advice("sm_86")
        "'sm_86' has no build of its own: the sm_80 build runs on sm_86 GPUs; use 'sm_80'"
    """
    key = _key(name)
    builds = ", ".join(SUPPORTED_ARCHS)
    if key in SUPPORTED_ARCHS:
        return f"{key} is a build target"
    if key in RUNS_ON:
        use = RUNS_ON[key]
        return f"{name!r} has no build of its own: the {use} build runs on {key} GPUs; use {use!r}"
    digits = key.removeprefix("sm_").rstrip("af")
    if digits.isdigit() and len(digits) >= 2:
        if int(digits[:-1]) < 8:
            return (f"{name!r} is not supported: hexlayout needs sm_80 or newer (cp.async, bf16 "
                    f"mma.sync); the builds are {builds}")
        return (f"{name!r} is not supported: the builds are {builds}, and none runs on {key} (a build "
                "runs only on GPUs of its own major version; sm_90a only on sm_90, sm_100a only on sm_100)")
    return f"unknown architecture {name!r}; the builds are {builds}"


def check_arch_name(name: str) -> str:
    """Normalize ``"sm90a"``/``"SM_90A"``/``"sm_90a"`` to ``"sm_90a"``.

    Raises:
        UnsupportedArchError: any other name (a ``ValueError``), saying which supported build
            runs on that GPU (``arch_advice``).
    """
    key = _key(name)
    if key not in SUPPORTED_ARCHS:
        raise UnsupportedArchError(arch_advice(name))
    return key


def archs_offering(min_arch: str) -> tuple[str, ...]:
    """The supported targets that run an instruction first available on ``min_arch``.

    Architecture-specific instructions (``sm_90a``: wgmma; ``sm_100a``: tcgen05) are offered by
    that target alone.
    """
    if min_arch not in CAPABILITY:
        raise ValueError(f"unknown architecture {min_arch!r}")
    cap = CAPABILITY[min_arch]
    out = [a for a in SUPPORTED_ARCHS if CAPABILITY[a] >= cap]
    if min_arch.endswith("a"):
        out = [a for a in out if a == min_arch]
    return tuple(out)
