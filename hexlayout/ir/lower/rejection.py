"""Why an op cannot be lowered with the layouts and instruction it was given: a value.

A ``Rejection`` records the requirement that does not hold together with what it concerns:
the instruction (atom, ``TiledMma``, copy family) that was tried, the operand of the op
(``"a"``, ``"b"``, ``"c"``, ``"src"``, ``"dst"``), the layouts involved and, for a choice
among several instructions, the rejection of each one tried. Its text is formatted once,
here, as ``instruction: OPERAND operand: requirement`` (the parts that are set), or for a
choice ``requirement: alt1; alt2; ...``.

``Rejection`` is a ``str`` (its formatted text), so every place that reports a reason as
text keeps working; code that needs the parts (synthesis diagnostics) reads the fields
instead of parsing the text.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Rejection", "OPERAND_NAMES"]

#: How an operand role is named in a message.
OPERAND_NAMES = {"a": "A operand", "b": "B operand", "c": "C operand", "src": "source", "dst": "destination"}


class Rejection(str):
    """A structured reason (see the module docstring); ``str(r)`` is its message."""

    requirement: str
    instruction: str | None
    operand: str | None
    layouts: tuple[tuple[str, Any], ...]
    alternatives: tuple[Rejection, ...]

    def __new__(cls, requirement: str, *, instruction: str | None = None, operand: str | None = None,
                layouts: tuple[tuple[str, Any], ...] = (),
                alternatives: tuple[Rejection, ...] = ()) -> Rejection:
        if alternatives:
            text = f"{requirement}: " + "; ".join(str(a) for a in alternatives)
        else:
            text = requirement
            if operand is not None:
                text = f"{OPERAND_NAMES.get(operand, operand)}: {text}"
            if instruction is not None:
                text = f"{instruction}: {text}"
        self = super().__new__(cls, text)
        self.requirement = requirement
        self.instruction = instruction
        self.operand = operand
        self.layouts = tuple(layouts)
        self.alternatives = tuple(alternatives)
        return self

    @staticmethod
    def of(reason: str) -> Rejection:
        """``reason`` as a ``Rejection`` (a plain string becomes its requirement)."""
        return reason if isinstance(reason, Rejection) else Rejection(reason)

    def tried(self, instruction: str) -> Rejection:
        """This rejection attributed to ``instruction`` (unless it already names one)."""
        if self.instruction is not None or self.alternatives:
            return self
        return Rejection(self.requirement, instruction=instruction, operand=self.operand,
                         layouts=self.layouts)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.requirement, self.instruction, self.operand, self.layouts, self.alternatives))


def _rebuild(requirement: str, instruction: str | None, operand: str | None,
             layouts: tuple[tuple[str, Any], ...], alternatives: tuple[Rejection, ...]) -> Rejection:
    return Rejection(requirement, instruction=instruction, operand=operand, layouts=layouts,
                     alternatives=alternatives)
