"""The Python blocks of docs/guide.md run, in order, in one namespace."""

from __future__ import annotations

import pathlib
import re
import sys

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


def _load_registry_test():
    """tests/ir/test_alu_registry.py as a module (the tests directories are not packages)."""
    import importlib.util

    path = pathlib.Path(__file__).resolve().parent / "ir" / "test_alu_registry.py"
    spec = importlib.util.spec_from_file_location("alu_registry_check", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod            # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.nvrtc
def test_adding_an_elementwise_function_example_runs(tmp_path) -> None:
    """docs/adding-an-op.md, "Adding an elementwise function": the blocks run, and the function
    they define passes the registry test's check (its printed code compiled on the host and
    compared with the emulator); the function is unregistered again."""
    from hexlayout.ir.functions import ALU_FUNCTIONS
    from hexlayout.lang.math import FUNCTIONS

    blocks = _section_blocks(ADDING_AN_OP, "Adding an elementwise function")
    assert len(blocks) >= 2
    saved, saved_lang = dict(ALU_FUNCTIONS), dict(FUNCTIONS)
    try:
        ns: dict = {"__name__": "adding_an_op_elementwise"}
        for i, code in enumerate(blocks):
            exec(compile(code, f"{ADDING_AN_OP.name}[elementwise block {i}]", "exec"), ns)  # noqa: S102 - the doc's own example
        new = [fn for name, fn in ALU_FUNCTIONS.items() if name not in saved]
        assert new, "the section defines no ALU function"
        registry = _load_registry_test()
        if registry._include_dir() is None:
            pytest.skip("needs the CUDA headers to run the printed code on the host")
        failures = registry.check(registry.cases_of(new), tmp_path)
        assert not failures, "\n".join(failures)
    finally:                        # the doc's function must not leak into other tests
        ALU_FUNCTIONS.clear()
        ALU_FUNCTIONS.update(saved)
        FUNCTIONS.clear()
        FUNCTIONS.update(saved_lang)
