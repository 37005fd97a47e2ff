"""Every ``>>>`` example in a docstring of the installed tree runs and prints what it shows
(``doctest``, with ``hl`` = ``hexlayout.lang``, ``torch`` and ``ops`` = ``hexlayout.ops`` in
scope as the docs write them; the ops' examples run in the emulator): a docstring's example is
a claim about the code, checked like any other."""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: source folder -> the module name it installs as
SOURCES = {ROOT / "hexlayout": "hexlayout", ROOT / "ops": "hexlayout.ops",
           ROOT / "integrations": "hexlayout.integrations"}


def _modules() -> list[str]:
    out = []
    for folder, pkg in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            if "tests" in rel.parts or ">>>" not in path.read_text():
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.append(".".join((pkg, *parts)))
    return out


MODULES = _modules()


def test_examples_are_found() -> None:
    assert {"hexlayout.synth.umma_choice", "hexlayout.arch.tmem", "hexlayout.ops.mamba.ssd"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import hexlayout.ops as ops
    import torch

    import hexlayout.lang as hl

    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"hl": hl, "torch": torch, "ops": ops}, report=True,
                             verbose=False,
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name}: no example ran"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples fail (see above)"
