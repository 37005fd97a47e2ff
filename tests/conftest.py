"""Test configuration.

- ``gpu``-marked tests run only where a CUDA device is visible; elsewhere they are skipped
  with :data:`GPU_SKIP_REASON`.
- The ``pycute`` fixture gives NVIDIA's pycute (shipped inside ``nvidia-cutlass``) or fails
  with the install hint: a missing test dependency is an error, never a silent skip.
- Under ``CI=true`` every other skip (a missing compiler, module or tool) is reported as a
  failure, so the README's test command cannot quietly run fewer tests than CI expects.
- ``quick``: the modules of ``QUICK`` - every package's essentials - carry this marker;
  ``python -m pytest -m quick`` is the development tier (under 5 minutes on 2 cores).
- ``SLOW_FIRST``: the longest items run first, one per xdist worker in turn (``-n``).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from collections.abc import Generator
from types import ModuleType

import pytest

GPU_SKIP_REASON = "needs an NVIDIA GPU"
PYCUTE_INSTALL = "pip install --no-deps nvidia-cutlass==4.2.0.0"


def _have_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def _under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


#: The quick tier: per package, the modules that exercise its essentials in seconds.
QUICK = (
    "tests/test_structure.py", "tests/test_quickstart.py",
    "tests/layout/test_examples.py",
    "tests/arch/test_mma_sync.py", "tests/arch/test_banks.py",
    "tests/ir/test_expr.py", "tests/ir/test_lower_mma.py",
    "tests/lang/test_pipeline_blocks.py",
    "tests/synth/test_solver.py",
    "tests/emulator/test_mma.py", "tests/emulator/test_gemm_sm80.py",
    "tests/codegen/test_generate.py",
    "tests/runtime/test_emulate.py",
    "tests/e2e/test_softmax_explicit.py",
    "tests/fusion/test_mechanism_docs.py",
    "tests/ops/test_attention_args.py", "tests/ops/test_moe_kernel_lines.py",
    "tests/integrations/test_vllm_plugin_config.py",
    "tests/ptx/test_parse.py", "tests/ptx/test_semantics.py",
)


#: The longest items (node ids), longest first: the vLLM stage's groups (on 2 cores: models
#: ~250 s, mamba ~130 s, the others 25-110 s). They start first, dealt to different xdist
#: workers, so none of them is the tail of a parallel run.
SLOW_FIRST = tuple(f"tests/integrations/test_vllm_stage.py::test_vllm_tests[{g}]"
                   for g in ("models", "mamba", "tensor_parallel", "formats", "planted_register", "layers"))


def xdist_first_chunk(n_items: int, workers: int, maxschedchunk: int | None) -> int:
    """How many consecutive items pytest-xdist's ``load`` scheduler (``LoadScheduling.schedule``)
    first sends each worker: a quarter of each worker's share, at least 2 (at most
    ``--maxschedchunk``); one each, round robin, with fewer than two items per worker."""
    if n_items < 2 * workers:
        return 1
    return max(2, min(n_items // workers // 4, maxschedchunk or n_items))


def slow_first(items: list[pytest.Item], slow: tuple[str, ...], workers: int,
               chunk: int) -> list[pytest.Item]:
    """``items`` with those whose node ids are in ``slow`` first, in that order, dealt round robin
    to the heads of the ``workers`` first chunks of ``chunk`` items (worker ``w`` first runs items
    ``[w * chunk, (w + 1) * chunk)``; those that do not fit follow the chunks); the others keep
    their order."""
    rank = {nodeid: k for k, nodeid in enumerate(slow)}
    first = sorted((i for i in items if i.nodeid in rank), key=lambda i: rank[i.nodeid])
    rest = [i for i in items if i.nodeid not in rank]
    heads = [first[w::workers][:chunk] for w in range(workers)]
    later = [i for i in first if not any(i in h for h in heads)]  # more than fit in the chunks
    out: list[pytest.Item] = []
    for w in range(workers):
        take = chunk - len(heads[w]) if w < workers - 1 else 0
        out += heads[w] + rest[:take]
        rest = rest[take:]
    return out + later + rest


@pytest.hookimpl(trylast=True)  # after pytest's own reordering (by shared fixtures)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)  # on an xdist worker: each collects all
    if workerinput is not None:  # the chunks of ``--dist load``, -n's default (other modes: harmless)
        workers = int(workerinput["workercount"])
        chunk = xdist_first_chunk(len(items), workers, config.getoption("maxschedchunk", None))
    else:
        workers, chunk = 1, len(items)
    items[:] = slow_first(items, SLOW_FIRST, workers, chunk)
    root = config.rootpath
    for item in items:
        if item.path.relative_to(root).as_posix() in QUICK:
            item.add_marker(pytest.mark.quick)
    if _have_gpu():
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pycute() -> ModuleType:
    """NVIDIA's pycute, or a failure naming the command that installs it."""
    try:
        return importlib.import_module("pycute")
    except ImportError as err:
        pytest.fail(f"pycute is not installed ({err}); it ships in nvidia-cutlass, which the "
                    f"README's test command installs: {PYCUTE_INSTALL}", pytrace=False)


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_skip_under_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn a skip other than :data:`GPU_SKIP_REASON` into a failure (only under ``CI=true``)."""
    if not _under_ci() or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if GPU_SKIP_REASON in reason:
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true ({reason}): only tests marked `gpu` may be skipped in "
                       "CI; install what the test needs (the README's test command does)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None]:
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None]:
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())
