"""The persisted build cache is keyed on the tile program's structure, not its printed text."""

from __future__ import annotations

from hexlayout.ir.structural import structural_hash
from hexlayout.ir.tile import Mma, Value
from hexlayout.ir.walk import walk
from hexlayout.runtime.build import build_key, program_key
from tests.lang.kernels import simple_gemm


def _trace(**consts):  # type: ignore[no-untyped-def]
    simple_gemm._cache.clear()
    return simple_gemm.trace(**consts)


def test_program_key_is_the_structural_hash_and_equal_for_retraces() -> None:
    a, b = _trace(), _trace()
    assert program_key(a) == structural_hash(a) == program_key(b)
    assert build_key(a, "sm_80", False) == build_key(b, "sm_80", False)
    assert build_key(a, "sm_80", False) != build_key(_trace(BM=32), "sm_80", False)
    assert build_key(a, "sm_80", False) != build_key(a, "sm_90a", False)


def test_programs_that_print_alike_but_differ_get_different_keys() -> None:
    """Two buffers with one name print the same; the text was an ambiguous key."""
    ref, tk = _trace(), _trace()
    m = next(op for op in walk(tk) if isinstance(op, Mma))
    m.c = Value(m.c.name, m.c.type, m.c.loc)
    assert str(ref) == str(tk)
    assert build_key(ref, "sm_80", False) != build_key(tk, "sm_80", False)
