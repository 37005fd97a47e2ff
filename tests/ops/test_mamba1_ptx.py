"""The Mamba-1 ops under ``HEXLAYOUT_EMULATE=ptx``: the PTX that NVRTC made from the printed CUDA
source of ``selective_scan`` and ``selective_state_update`` runs in the PTX executor (so the
printing is checked too, not only the lowered program) and matches the float64 references of the
op tests (f16 scan with every option on a ragged L; Mamba-2 state update with a skipped row)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from tests.ops.test_mamba_selective_scan import _inputs  # noqa: E402
from tests.ops.test_mamba_selective_scan import reference as scan_reference  # noqa: E402
from tests.ops.test_mamba_state_update import _mamba2  # noqa: E402
from tests.ops.test_mamba_state_update import reference as update_reference  # noqa: E402
from tests.ptx import test_ops as _ptx_ops  # noqa: E402

ptx_runs = _ptx_ops.ptx_runs  # the fixture: HEXLAYOUT_EMULATE=ptx, the kernels the executor ran


@pytest.mark.nvrtc
def test_selective_scan_ptx(ptx_runs: list[str]) -> None:
    from hexlayout.ops import selective_scan

    u, delta, A, B, C, D, z, bias = _inputs(1, 8, 6, 21, 2, torch.float16, seed=3)
    out, last = selective_scan(u, delta, A, B, C, D, z, bias, delta_softplus=True, return_last_state=True)
    want, want_h = scan_reference(u, delta, A, B, C, D, z, bias, True)
    assert (out.double() - want).abs().max() <= 2e-2 * max(1.0, want.abs().max().item())
    assert (last.double() - want_h).abs().max() <= 1e-4 * max(1.0, want_h.abs().max().item())
    assert ptx_runs and all(r.startswith("selective_scan") for r in ptx_runs)


@pytest.mark.nvrtc
def test_selective_state_update_ptx(ptx_runs: list[str]) -> None:
    from hexlayout.ops import selective_state_update

    args = _mamba2(2, 3, 2, 4, 8, 1, torch.float32, torch.float32, seed=4)
    idx = torch.tensor([2, -1], dtype=torch.int32)
    want_state, want_y = update_reference(**args, softplus=True, idx=idx)
    y = selective_state_update(**args, dt_softplus=True, state_batch_indices=idx)
    assert torch.allclose(y.double(), want_y, atol=1e-4) and not y[1].any()
    assert torch.allclose(args["state"].double(), want_state, atol=1e-4)
    assert ptx_runs and all(r.startswith("selective_state_update") for r in ptx_runs)
