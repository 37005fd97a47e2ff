"""The sm_80 W4A16 decode k loop in steps of ``k_steps(16) = 4`` k-tiles (``wna16_kernels_sm80``):
the stage ring of 4-k-tile steps wraps, the last step reaches past ``KP`` (its k-tiles there are
skipped), group scales and zeros are loaded once per group (groups of 128 = 2 k-tiles: twice per
step) and AWQ's zeros are folded per group into the bias ``-z * s``. In the
emulator against the float64 reference of ``test_moe_wna16`` (dequantized from the checkpoint
tensors)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hexlayout.ops.moe.wna16 import fused_moe_wna16  # noqa: E402
from hexlayout.ops.moe.wna16_kernels_sm80 import k_steps  # noqa: E402
from test_moe_wna16 import _bound, reference_alignment  # noqa: E402
from test_moe_wna16_offline import _moe  # noqa: E402


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_80")
    monkeypatch.setattr("hexlayout.ops.moe.pipeline.run_moe_align", reference_alignment)


def test_decode_takes_four_k_tiles_per_step_prefill_one() -> None:
    assert (k_steps(16), k_steps(64)) == (4, 1)


def test_steps_wrap_the_ring_and_the_last_reaches_past_kp() -> None:
    fmt, group = "awq", 128  # the bias -z * s; the group's scales loaded twice per step
    # H = 896 = 14 k-tiles of 64: 3 steps of 4 and a last one holding 2 (the fourth step is read
    # from stage 0 again: the 3-stage ring wraps; the last step's k-tiles 2 and 3 lie past KP);
    # I = one group: the down GEMM's K
    x, p13, p2, tw, ids, want = _moe(fmt, 4, group, torch.float16, "sm_80", 1, 2, 1, 896, group, seed=5)
    out = fused_moe_wna16(x, p13, p2, tw, ids)
    assert out.isfinite().all()
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.float16) * want.abs().max().item(), err
