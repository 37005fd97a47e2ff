"""The W4A16 / W8A16 dequantization as printed (``hexlayout.codegen.alu``, ``fold_zero``): the
PTX that NVRTC made from it runs in the executor and matches the float64 reference. GPTQ's
constant zero point is folded into the magic constants (f16 nibbles: the ``hfma2`` addend,
bf16 nibbles and f16 bytes: the ``hsub2`` constant), the mask and magic exponent are one
``lop3.b32``; per-channel scales are applied after the k loop."""

from __future__ import annotations

import pytest
import torch

from tests.ptx.test_ops import ptx_runs  # noqa: F401  (the fixture: HEXLAYOUT_EMULATE=ptx, runs counted)


@pytest.mark.parametrize(("bits", "group", "dtype", "name"), [
    (4, 64, torch.float16, "moe_wna16_gate_up_f16_w4"),      # folded hfma2 addend
    (8, 64, torch.float16, "moe_wna16_gate_up_f16_w8"),      # folded hsub2 of the 0x64 bytes
    (4, -1, torch.bfloat16, "moe_wna16_gate_up_bf16_w4"),    # folded bf16 hsub2, per-channel scales
    (8, 64, torch.bfloat16, "moe_wna16_gate_up_bf16_w8"),    # bytes into the f32 pattern, folded
])
def test_gptq_dequantization_runs_from_its_ptx(ptx_runs: list[str], bits, group, dtype, name) -> None:  # noqa: F811
    from tests.ops.test_moe_wna16 import _bound, _run

    out, want = _run("gptq", bits, group, dtype, 3, 8, 2, "silu", "random", seed=5)
    assert (out.double() - want).abs().max().item() <= _bound(dtype) * want.abs().max().item()
    assert any(r.startswith(name) for r in ptx_runs), ptx_runs
