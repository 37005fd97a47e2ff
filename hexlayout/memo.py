"""``memoized``: an ``lru_cache`` that falls back to the uncached call when an argument is
unhashable (a synthesis lowers and costs the same expressions under many candidate layouts,
but an expression may hold an unhashable value such as a numpy array). This module imports
only the standard library: every layer may use it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["memoized"]

F = TypeVar("F", bound=Callable[..., Any])


def memoized(maxsize: int) -> Callable[[F], F]:
    """Decorator: ``fn`` memoized in an ``lru_cache`` of ``maxsize`` entries; a call with an
    unhashable argument runs ``fn`` uncached. ``cache_info`` / ``cache_clear`` are those of
    the cache, ``__wrapped__`` is ``fn``."""
    def wrap(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            try:
                return cached(*args)
            except TypeError:         # an unhashable argument
                return fn(*args)

        call.cache_info = cached.cache_info      # type: ignore[attr-defined]
        call.cache_clear = cached.cache_clear    # type: ignore[attr-defined]
        return call                              # type: ignore[return-value]
    return wrap
