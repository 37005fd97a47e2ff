"""``hexlayout.memo.memoized``: cached for hashable arguments, uncached (same result) for
unhashable ones."""

from __future__ import annotations

from hexlayout.memo import memoized


def test_memoized_caches_hashable_and_falls_back_for_unhashable() -> None:
    calls: list[object] = []

    @memoized(8)
    def f(x: object) -> int:
        calls.append(x)
        return len(str(x))

    assert f((1, 2)) == f((1, 2)) == 6 and len(calls) == 1
    assert f([1, 2]) == f([1, 2]) == 6 and len(calls) == 3      # a list: not cached
    assert f.cache_info().hits == 1
    f.cache_clear()
    assert f.cache_info().currsize == 0
    assert f.__wrapped__ is not f
