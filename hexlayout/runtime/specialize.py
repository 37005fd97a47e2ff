"""Builds specialized on the divisibility facts of a launch (Triton's 16-divisibility
specialization, up to 16 bytes / 16 elements).

A ``Build`` assumes alignments its vector accesses need (``Requirement``: 16-byte data
pointers, strides, extents and origin sizes multiples of the vector width) and every launch
checks them (``args``). A call that breaks one (``MisalignedArgumentError``: an odd row
length, a view with an offset, a storage offset off 16 bytes) is not refused: its facts
(``_Plan.facts``: per tensor the power of two dividing its data pointer, per size or stride
variable the one dividing its value) specialize the build's tile program
(``hexlayout.ir.divisibility.specialize``: vectors no wider than the facts allow, down to
one element), which is synthesized, generated and compiled like any build and cached side by
side with it: in memory per (build, specialization), on disk under its own ``build_key``
(the program key includes the facts). The specialized build's own requirements are checked
at each of its launches, so a launch with facts weaker than a build assumed never reuses it,
and an aligned launch keeps the build it always had (same program, same vectors).
"""

from __future__ import annotations

from typing import Any

from hexlayout.ir.divisibility import DivisibilityFacts, Specialization, specialization, specialize
from hexlayout.synth.solve import SynthesisError

from .args import MisalignedArgumentError

__all__ = ["specialized_build", "build_for_call", "clear_specialized"]

_SPECIAL: dict[tuple[int, Specialization], tuple[Any, Any]] = {}


def specialized_build(b: Any, facts: DivisibilityFacts) -> Any:
    """``b`` specialized on ``facts``: ``b`` itself when they weaken none of its assumptions,
    else the build of the specialized program (same architecture, compiled when ``b`` is)."""
    spec = specialization(b.tile_kernel, facts)
    if not spec:
        return b
    key = (id(b), spec)
    hit = _SPECIAL.get(key)
    if hit is not None and hit[0] is b:
        return hit[1]
    from .build import build

    out = build(specialize(b.tile_kernel, spec), b.generated.arch, compile=b.compiled is not None)
    _SPECIAL[key] = (b, out)
    return out


def build_for_call(b: Any, plan: Any, vals: list[Any], device: str, err: MisalignedArgumentError) -> Any:
    """The build that runs a call ``b`` refused with ``err`` (``vals``: one per parameter, as
    ``plan.collect`` gives them). Raises ``err`` where there is none: ``b`` is a bare lowered
    program (no tile program to specialize) or the facts weaken nothing ``b`` assumed; and
    ``err`` with the reason when the specialized program does not synthesize."""
    if getattr(b, "tile_kernel", None) is None:
        raise err
    facts = plan.facts(vals, device)
    try:
        out = specialized_build(b, facts)
    except SynthesisError as e:
        raise MisalignedArgumentError(err.kernel, err.arg, f"{err.detail}; a build specialized on the call's "
                                      f"alignment ({facts}) does not synthesize: {e}") from e
    if out is b:
        raise err
    return out


def clear_specialized() -> None:
    """Forget the in-memory specialized builds (the disk cache keeps them)."""
    _SPECIAL.clear()
