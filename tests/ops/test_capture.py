"""CUDA-graph capture safety of the ops, in the emulator: inside ``mock_capture()`` (what a
capture is on a machine without a GPU) an op whose kernels were not built fails with a
``CaptureError`` naming the kernel, before anything runs; ``prebuild()`` builds every kernel an
op needs for its shapes without running any; after it, the same shapes run inside the mocked
capture with no build, and the result matches float64. Content checks (host syncs) are off
inside a capture."""

from __future__ import annotations

import pytest
import torch
from hexlayout.ops import fused_moe
from hexlayout.ops.host.launch import content_checks
from test_moe_op import close, make, reference  # noqa: E402

from hexlayout.runtime import CaptureError, capturing, clear_builds, launch_log, mock_capture, prebuild


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def test_capture_flags_nest_and_turn_off() -> None:
    assert not capturing()
    with mock_capture():
        with mock_capture():
            assert capturing()
        assert capturing()
    assert not capturing()


def test_a_build_inside_a_capture_is_an_error_naming_the_kernel() -> None:
    x, w13, w2, tw, ids = make(3, 64, 32, 4, 2, torch.bfloat16, seed=11)
    clear_builds()
    with mock_capture(), pytest.raises(CaptureError, match=r"kernel moe_\w+ for sm_\d+.*prebuild"):
        fused_moe(x, w13, w2, tw, ids)


def test_prebuild_then_the_capture_runs_without_building() -> None:
    x, w13, w2, tw, ids = make(3, 64, 32, 4, 2, torch.bfloat16, seed=12)
    clear_builds()
    with launch_log() as ran, prebuild():
        fused_moe(x, w13, w2, tw, ids)
    assert ran == [], "prebuild launched or emulated a kernel"
    with launch_log() as ran, mock_capture():
        out = fused_moe(x, w13, w2, tw, ids)
    assert ran, "the captured call ran no kernel"
    close(out, reference(x, w13, w2, tw, ids), torch.bfloat16)


def test_content_checks_are_off_inside_a_capture() -> None:
    ids = torch.zeros(2, 2, dtype=torch.int32)
    assert content_checks(ids)
    with mock_capture():
        assert not content_checks(ids)
