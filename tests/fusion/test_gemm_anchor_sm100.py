"""The fusion GEMM anchors on sm_100a: ``torch.compile(backend="hexlayout")`` of a small MLP
under ``HEXLAYOUT_EMULATE_ARCH=sm_100a`` fuses each ``linear`` with its epilogue into the tcgen05
GEMM (kernels ``fused_linear_*__gemm_sm100_*``), run in the emulator against float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hexlayout.ops  # noqa: E402,F401 - registers the anchor kernels with hexlayout.fusion

from hexlayout.fusion.planning import arch_of  # noqa: E402
from hexlayout.runtime import launch_log  # noqa: E402


def test_mlp_fuses_into_the_sm100_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_100a")
    g = torch.Generator().manual_seed(100)
    w1, b1 = (torch.randn(96, 64, generator=g) / 8).half(), torch.randn(96, generator=g).half()
    w2, b2 = (torch.randn(64, 96, generator=g) / 10).half(), torch.randn(64, generator=g).half()
    x = torch.randn(40, 64, generator=g).half()                # 40 rows: a ragged M tile

    def mlp(x):
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1))
        return torch.nn.functional.linear(h, w2, b2) + x

    torch._dynamo.reset()
    with launch_log() as log, torch.no_grad():
        out = torch.compile(mlp, backend="hexlayout", options={"fallback": "eager"})(x)
    names = [r.name for r in log]
    assert len(names) == 2 and all("__gemm_sm100_f16" in n for n in names), names
    xd = x.double()
    h = torch.nn.functional.gelu(xd @ w1.double().T + b1.double()).half().double()
    want = h @ w2.double().T + b2.double() + xd
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=1e-2)


def test_arch_of_names_the_gemm_architectures(monkeypatch: pytest.MonkeyPatch) -> None:
    from hexlayout.fusion.spec import FusionUnsupported

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_100a")
    assert arch_of(torch.device("cpu"), False) == "sm_100a"
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_75")
    with pytest.raises(FusionUnsupported, match="sm_100a"):
        arch_of(torch.device("cpu"), False)
