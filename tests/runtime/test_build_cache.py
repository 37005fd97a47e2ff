"""The persisted build cache: a new process loads the synthesized, compiled build instead of
redoing it; a damaged entry is rebuilt, never used; a different program gets another entry."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import json
from hexlayout.runtime import build
from hexlayout.lang.examples.explicit import gemm_sm80_explicit
b = build(gemm_sm80_explicit(BK={bk}), "sm_80", compile=False)
print(json.dumps(sorted(b.seconds), separators=(",", ":")), b.generated.name, len(b.generated.source))
"""


def _run(tmp_path, bk: int = 32) -> list[str]:
    out = subprocess.run([sys.executable, "-c", CODE.format(bk=bk)], capture_output=True, text=True,
                         env={**__import__("os").environ, "HEXLAYOUT_CACHE_DIR": str(tmp_path)}, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split(maxsplit=1)


@pytest.fixture
def cache(tmp_path):
    return tmp_path


def test_second_process_loads_the_build(cache) -> None:
    first = _run(cache)
    second = _run(cache)
    assert "synthesize" in first[0] and "load" not in first[0]
    assert "load" in second[0] and "synthesize" not in second[0]
    assert first[1] == second[1]                        # same kernel, same generated source length
    assert len(list((cache / "builds").glob("*.pkl"))) == 1


def test_damaged_entry_is_rebuilt(cache) -> None:
    _run(cache)
    (entry,) = (cache / "builds").glob("*.pkl")
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF
    entry.write_bytes(bytes(data))
    again = _run(cache)
    assert "synthesize" in again[0]
    assert len(list((cache / "builds").glob("*.pkl"))) == 1


def test_another_program_gets_another_entry(cache) -> None:
    _run(cache, 32)
    _run(cache, 64)
    assert len(list((cache / "builds").glob("*.pkl"))) == 2
