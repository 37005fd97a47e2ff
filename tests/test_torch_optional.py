"""Without torch, ``import hexlayout.ops`` works and every op says in one error what to install.

A fresh interpreter with torch made unimportable (``sys.modules["torch"] = None``) imports
``hexlayout.ops``, finds each public function, and calling any op raises ``TorchMissingError``
naming the op and the install command; the kernels themselves still trace without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, sys
sys.modules["torch"] = None                  # import torch now raises ImportError
import hexlayout.ops as ops
from hexlayout.ops.host.torch import HAVE_TORCH, TorchMissingError
calls = {
    "gemm": lambda: ops.gemm([[1.0]], [[1.0]]),
    "gemm_fp8": lambda: ops.gemm_fp8(*[None] * 4),
    "paged_attention": lambda: ops.paged_attention(*[None] * 6, 1, 1),
    "attention_varlen": lambda: ops.attention_varlen(*[None] * 5, 1, 1),
    "reshape_and_cache": lambda: ops.reshape_and_cache(*[None] * 5),
    "fused_moe": lambda: ops.fused_moe(*[None] * 5),
    "fused_moe_wna16": lambda: ops.fused_moe_wna16(*[None] * 5),
    "fused_moe_fp8": lambda: ops.fused_moe_fp8(*[None] * 5),
    "moe_align": lambda: ops.moe_align(None, num_experts=2, block_m=16),
    "prepare_wna16": lambda: ops.prepare_wna16(None, None, quant_format="awq", bits=4, group_size=32),
    "prepare_fp8": lambda: ops.prepare_fp8(None, None),
    "prepare_mxfp4": lambda: ops.prepare_mxfp4(None, None, dtype=None),
    "mla_decode": lambda: ops.mla_decode(*[None] * 5, 1, 1),
    "mla_reshape_and_cache": lambda: ops.mla_reshape_and_cache(*[None] * 4),
    "causal_conv1d": lambda: ops.causal_conv1d(None, None),
    "causal_conv1d_update": lambda: ops.causal_conv1d_update(None, None, None),
    "ssd_scan": lambda: ops.ssd_scan(*[None] * 5),
}
calls["selective_scan"] = lambda: ops.selective_scan(*[None] * 5)
calls["selective_state_update"] = lambda: ops.selective_state_update(*[None] * 6)
out = {"have_torch": HAVE_TORCH, "all": sorted(ops.__all__), "errors": {}}
for name, call in calls.items():
    try:
        call()
        out["errors"][name] = None
    except TorchMissingError as e:
        out["errors"][name] = ["TorchMissingError", str(e)]
    except BaseException as e:
        out["errors"][name] = [type(e).__name__, str(e)]
from hexlayout.lang import f16
from hexlayout.ops.gemm.kernels import ARCH_KERNELS
out["traced"] = type(ARCH_KERNELS["sm_80"](f16).trace()).__name__
print(json.dumps(out))
"""


def test_ops_without_torch_name_the_install() -> None:
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["have_torch"] is False
    assert {"gemm", "fused_moe", "paged_attention"} <= set(out["all"])
    assert set(out["errors"]) == {n for n in out["all"] if n[0].islower()}, "an op is missing from the calls"
    for name, err in out["errors"].items():
        assert err is not None, f"hexlayout.ops.{name} ran without torch"
        kind, msg = err
        assert kind == "TorchMissingError", f"hexlayout.ops.{name}: {kind}: {msg}"
        assert f"hexlayout.ops.{name}" in msg and "torch is not installed" in msg, msg
        assert "pip install" in msg and "[torch,cuda]" in msg, msg
    assert out["traced"]


def test_torch_missing_error_is_an_import_error() -> None:
    from hexlayout.ops.host.torch import TorchMissingError

    assert issubclass(TorchMissingError, ImportError)
