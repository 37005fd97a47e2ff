"""``OpRegistry``: one rule per op class, for passes that live outside the op classes.

A pass (printing, the layout-graph relations of synthesis, ...) registers one function per
tile-op class with a decorator instead of testing ``isinstance`` op by op::

    PRINT = OpRegistry("printing")

    @PRINT.register(Copy)
    def _copy(p, op): ...

``rule(cls)`` finds the function for ``cls`` or, failing that, for its nearest registered
base class (in method resolution order), so a subclass of an op inherits the op's rule.
``missing(classes)`` lists the classes without a rule: a test enumerates every ``Op``
subclass (``op_classes()``) against every registry, so an op added without its rules fails
there rather than in a user's kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from .tile import Op

__all__ = ["OpRegistry", "op_classes"]

F = TypeVar("F", bound=Callable)


class OpRegistry(Generic[F]):
    """A table ``op class -> rule`` for one pass (``name`` is used in error messages)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._rules: dict[type, F] = {}
        self._resolved: dict[type, F | None] = {}

    def register(self, *classes: type[Op]) -> Callable[[F], F]:
        """Decorator: the decorated function is the rule of every class in ``classes``."""

        def deco(fn: F) -> F:
            for cls in classes:
                if cls in self._rules:
                    raise ValueError(f"{self.name}: {cls.__name__} already has a rule "
                                     f"({self._rules[cls].__qualname__})")
                self._rules[cls] = fn
            self._resolved.clear()
            return fn

        return deco

    def rule(self, cls: type) -> F | None:
        """The rule of ``cls`` (or of its nearest registered base class), or None."""
        try:
            return self._resolved[cls]
        except KeyError:
            pass
        fn = next((self._rules[c] for c in cls.__mro__ if c in self._rules), None)
        self._resolved[cls] = fn
        return fn

    def __contains__(self, cls: type) -> bool:
        return self.rule(cls) is not None

    def missing(self, classes: Iterable[type]) -> list[type]:
        """The classes in ``classes`` that have no rule here."""
        return [c for c in classes if self.rule(c) is None]


def op_classes() -> list[type[Op]]:
    """Every concrete subclass of ``Op`` defined so far (recursively), by name. A private base
    (``_Unary``: the fields several ops share) is no op of its own and is left out."""
    out: list[type[Op]] = []
    todo = list(Op.__subclasses__())
    while todo:
        c = todo.pop()
        if c not in out:
            out.append(c)
            todo.extend(c.__subclasses__())
    ops = [c for c in out if not c.__name__.startswith("_")]
    return sorted(ops, key=lambda c: (c.__module__, c.__name__))
