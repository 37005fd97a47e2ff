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


ADDING_AN_OP = GUIDE.parent / "adding-an-op.md"


def _section_blocks(path: pathlib.Path, heading: str) -> list[str]:
    """The Python blocks of the ``## heading`` section of ``path`` (up to the next ``## ``)."""
    text = path.read_text()
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end if end >= 0 else None], flags=re.S)


def test_adding_a_copy_instruction_example_runs() -> None:
    """docs/adding-an-op.md, "Adding a copy instruction": the new rule is chosen by synthesis,
    the kernel computes the right values in the emulator, and the rule is unregistered again."""
    from hexlayout.ir.lower.copy_rules import COPY_RULES

    before = list(COPY_RULES)
    blocks = _section_blocks(ADDING_AN_OP, "Adding a copy instruction")
    assert blocks
    ns: dict = {"__name__": "adding_an_op_copy"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{ADDING_AN_OP.name}[copy block {i}]", "exec"), ns)  # noqa: S102 - the doc's own example
    assert list(COPY_RULES) == before

