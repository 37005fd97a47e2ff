"""Test configuration.

- ``gpu``-marked tests run only where a CUDA device is visible; elsewhere they are skipped
  with :data:`GPU_SKIP_REASON`.
- The ``pycute`` fixture gives NVIDIA's pycute (shipped inside ``nvidia-cutlass``) or fails
  with the install hint: a missing test dependency is an error, never a silent skip.
- Under ``CI=true`` every other skip (a missing compiler, module or tool) is reported as a
  failure, so the README's test command cannot quietly run fewer tests than CI expects.
- ``quick``: the modules of ``QUICK`` - every package's essentials - carry this marker;
  ``python -m pytest -m quick`` is the development tier (under 5 minutes on 2 cores).
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
