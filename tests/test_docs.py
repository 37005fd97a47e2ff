"""The Python blocks of docs/guide.md run, in order, in one namespace."""

from __future__ import annotations

import pathlib
import re

import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide.md"


@pytest.mark.nvrtc
def test_guide_examples_run(monkeypatch) -> None:
    # the guide sets HEXLAYOUT_EMULATE itself; monkeypatch restores the environment afterwards
    monkeypatch.delenv("HEXLAYOUT_EMULATE", raising=False)
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) >= 7
    ns: dict = {"__name__": "guide"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{GUIDE.name}[block {i}]", "exec"), ns)  # noqa: S102 - the guide's own examples
        except Exception as e:  # noqa: BLE001 - name the failing block
            raise AssertionError(f"docs/guide.md block {i} failed: {type(e).__name__}: {e}\n{code}") from e
