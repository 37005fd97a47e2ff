"""``backend="hexlayout"`` is found through torch's ``torch_dynamo_backends`` entry point, in a
process that never imports hexlayout itself; importing hexlayout (and its fusion layer)
does not import torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest


def _run(code: str, cwd: Path) -> str:
    # a fresh interpreter outside the source tree: the installed distribution's metadata
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_entry_point_is_declared() -> None:
    eps = entry_points(group="torch_dynamo_backends")
    assert "hexlayout" in eps.names
    assert eps["hexlayout"].value == "hexlayout.ops.compile_backend:hexlayout_backend"


def test_compile_by_name_without_importing_hexlayout(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = _run("""
        import os, sys
        os.environ["HEXLAYOUT_EMULATE"] = "1"
        import torch
        assert not any(m == "hexlayout" or m.startswith("hexlayout.") for m in sys.modules)
        torch.manual_seed(0)
        w = torch.randn(32, 16, dtype=torch.float16)
        b = torch.randn(32, dtype=torch.float16)

        def f(x):
            return torch.relu(torch.nn.functional.linear(x, w, b))

        x = torch.randn(8, 16, dtype=torch.float16)
        with torch.no_grad():
            out = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})(x)
        ref = f(x).float()
        err = (out.float() - ref).abs().max().item()
        assert err <= 1e-2 * ref.abs().max().item(), err
        assert "hexlayout.fusion.backend" in sys.modules and "hexlayout.ops.compile_backend" in sys.modules
        from hexlayout.fusion.fused_op import _KERNELS
        (k,) = _KERNELS.values()
        print(k.fused_calls, k.torch_calls, k.spec.anchor, k.spec.epilogue_ops())
    """, tmp_path)
    fused, in_torch, anchor, epilogue = out.split(maxsplit=3)
    assert (fused, in_torch, anchor) == ("1", "0", "aten.linear.default")
    assert "aten.relu.default" in epilogue


def test_import_hexlayout_stays_free_of_torch(tmp_path: Path) -> None:
    out = _run("""
        import sys
        import hexlayout, hexlayout.fusion, hexlayout.fusion.backend, hexlayout.fusion.explain
        print("torch" in sys.modules, any(m.startswith("hexlayout.ops") for m in sys.modules))
    """, tmp_path)
    assert out.split() == ["False", "False"]


def test_fusion_never_imports_the_kernels_layer(tmp_path: Path) -> None:
    """Fusion is below the kernels: without them registered, a fused kernel is refused with
    the reason (nothing imports hexlayout.ops behind the caller's back)."""
    pytest.importorskip("torch")
    out = _run("""
        import os, sys
        os.environ["HEXLAYOUT_EMULATE"] = "1"
        import torch
        from hexlayout.fusion import FusedSpec, FusionUnsupported, run_fused
        x, w = torch.randn(8, 16).half(), torch.randn(32, 16).half()
        try:
            run_fused(FusedSpec("aten.linear.default"), [x, w], [])
        except FusionUnsupported as e:
            print("refused:", e.reason)
        assert not any(m.startswith("hexlayout.ops") for m in sys.modules)
        import hexlayout.ops
        (y,) = run_fused(FusedSpec("aten.linear.default"), [x, w], [])
        ref = torch.nn.functional.linear(x.float(), w.float())
        print("ran", (y.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item())
    """, tmp_path)
    assert "refused: aten.linear.default is not an anchor any registered anchor record runs" in out, out
    assert "import hexlayout.ops" in out, out
    assert "ran True" in out, out
