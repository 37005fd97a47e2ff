"""The Python blocks of docs/fusion.md run, in order, in one namespace (in the emulator)."""

from __future__ import annotations

import pathlib
import re

import pytest

pytest.importorskip("torch")

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "fusion.md"


def test_fusion_doc_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 3
    ns: dict = {}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{DOC}:block{i}", "exec"), ns)  # noqa: S102 - the repository's own docs
        except Exception as e:
            raise AssertionError(f"docs/fusion.md block {i} failed: {type(e).__name__}: {e}\n{code}") from e
