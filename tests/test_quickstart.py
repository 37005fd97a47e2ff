"""The README's test command is what CI runs, installs every test dependency, and skips only
``gpu`` tests: under ``CI=true`` tests/conftest.py turns any other skip into a failure."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _quick_start_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README: no bash block under '## Quick start'"
    return [ln for ln in block.group(1).splitlines() if ln.strip()]


def test_quick_start_is_two_lines_and_the_second_installs_pycute() -> None:
    lines = _quick_start_lines()
    assert len(lines) == 2, lines
    test_line = lines[1]
    assert test_line.startswith("pip install -e '.[test]' && ")
    assert test_line.endswith("python -m pytest -q -n auto")
    assert re.search(r"pip install --no-deps nvidia-cutlass==[\d.]+ ", test_line), test_line


def test_the_first_line_installs_torch_and_runs_the_demo() -> None:
    """The ops need torch: the first quick-start line installs the ``torch`` and ``cuda`` extras
    (both declared in pyproject.toml) and runs ``hexlayout demo``, the declared console script."""
    import tomllib

    assert _quick_start_lines()[0] == "pip install -e '.[torch,cuda]' && hexlayout demo"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert any(dep.startswith("torch") for dep in extras["torch"]), extras["torch"]
    assert any(dep.startswith("nvidia-cuda-nvrtc") for dep in extras["cuda"]), extras["cuda"]
    assert project["scripts"]["hexlayout"] == "hexlayout.cli:main"


def test_ci_runs_the_readme_test_command_last() -> None:
    test_line = _quick_start_lines()[1]
    script = (ROOT / ".ci" / "run").read_text()
    commands = [ln.strip() for ln in script.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert commands[0] == "set -euo pipefail"
    # the last command: its exit status is the script's, so a failed install or test fails CI
    assert commands[-1] == test_line


def test_conftest_pins_the_same_pycute_install_as_the_readme() -> None:
    # loaded from its path: ``import conftest`` may find another test folder's conftest module
    import importlib.util

    spec = importlib.util.spec_from_file_location("hexlayout_root_conftest", ROOT / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert conftest.PYCUTE_INSTALL in _quick_start_lines()[1]


_SAMPLE = '''
import sys
import pytest

def test_passes():
    assert True

def test_skips_for_a_missing_tool():
    pytest.skip("frobnicator is not installed")

@pytest.mark.gpu
def test_on_gpu():
    assert True

@pytest.mark.xfail(reason="known", strict=True)
def test_xfails():
    assert False
'''

_MODULE_SKIP = '''
import pytest
pytest.importorskip("hexlayout_no_such_module_xyz")

def test_never_collected():
    assert True
'''

_NO_PYCUTE = '''
import sys
sys.modules["pycute"] = None  # importing it now raises ImportError

def test_wants_pycute(pycute):
    assert pycute is not None
'''


def _run(tmp_path: Path, ci: bool) -> dict[str, str]:
    """Run the sample tests with a copy of tests/conftest.py; outcome per test name."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(_SAMPLE)
    (tmp_path / "test_module_skip.py").write_text(_MODULE_SKIP)
    (tmp_path / "test_no_pycute.py").write_text(_NO_PYCUTE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    junit = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--continue-on-collection-errors", f"--junitxml={junit}",
                           str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    outcomes: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        name = case.get("name") or ""
        outcomes[name or case.get("classname", "")] = kinds[0] if kinds else "passed"
        if kinds and kinds[0] in ("failure", "error"):
            outcomes[name + ".text"] = "".join(c.get("message", "") + (c.text or "") for c in case)
    outcomes["rc"] = str(proc.returncode)
    return outcomes


def test_non_gpu_skips_fail_under_ci(tmp_path: Path) -> None:
    out = _run(tmp_path, ci=True)
    assert out["test_passes"] == "passed"
    assert out["test_skips_for_a_missing_tool"] == "failure"
    assert "frobnicator is not installed" in out["test_skips_for_a_missing_tool.text"]
    assert "CI=true" in out["test_skips_for_a_missing_tool.text"]
    assert out["test_on_gpu"] in ("skipped", "passed")  # skipped without a GPU, run with one
    assert out["test_xfails"] == "skipped"  # an expected failure is not a skip
    module_skip = [k for k, v in out.items() if "module_skip" in k and not k.endswith(".text")]
    assert module_skip and all(out[k] == "error" for k in module_skip), out
    assert out["rc"] == "1"


def test_skips_stay_skips_outside_ci(tmp_path: Path) -> None:
    out = _run(tmp_path, ci=False)
    assert out["test_skips_for_a_missing_tool"] == "skipped"
    assert out["test_on_gpu"] in ("skipped", "passed")
    assert all(v != "error" for k, v in out.items() if "module_skip" in k)


def test_missing_pycute_fails_with_the_install_command(tmp_path: Path) -> None:
    for ci in (False, True):
        out = _run(tmp_path, ci=ci)
        assert out["test_wants_pycute"] == "error", out  # a fixture failure: an error, not a skip
        assert "pip install --no-deps nvidia-cutlass==" in out["test_wants_pycute.text"]
