"""``torch.compile(..., backend="hexlayout", options={"report": True})`` and
``HEXLAYOUT_FUSION_REPORT=1``: each compiled graph's plan printed once, at compile time,
with the ops left to torch grouped by reason (each reason once, with its count)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hexlayout.fusion.backend import REPORT_ENV, BackendOptionError, hexlayout_backend  # noqa: E402
from hexlayout.fusion.plan import Fallback, FusionPlan, KernelPlan  # noqa: E402


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv(REPORT_ENV, raising=False)
    torch._dynamo.reset()


class LinearCumsum(nn.Module):
    """A Linear (one fused kernel) and two cumulative sums (no anchor fuses a scan: both are
    left to torch for one reason)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return torch.cumsum(y, -1) + torch.cumsum(x, 0)


def _compile_run(model: nn.Module, x: torch.Tensor, **options: object) -> torch.Tensor:
    c = torch.compile(model, backend="hexlayout", options={"fallback": "eager", **options})
    with torch.no_grad():
        return c(x)


def test_report_option_prints_each_graph_once(capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    m = LinearCumsum().half().eval()
    x = torch.randn(16, 64, dtype=torch.float16)
    out = _compile_run(m, x, report=True)
    _compile_run(m, x, report=True)          # the cached graph: not compiled, not printed again
    err = capsys.readouterr().err
    with torch.no_grad():
        ref = m(x)
    assert (out.float() - ref.float()).abs().max() <= 1e-2 * ref.float().abs().max()
    assert err.count("hexlayout fusion plan of compiled graph") == 1, err
    assert "1 fused kernel(s)" in err and "kernel fused_linear: anchor aten.mm.default" in err, err
    grouped = [ln for ln in err.splitlines() if "aten.cumsum.default x 2" in ln]
    assert len(grouped) == 1 and grouped[0].strip().startswith("2 op(s)"), err
    assert err.count("a reduction: neither") == 1, err   # the reason is not repeated per op
    assert "1 op(s) [aten.add.Tensor]: reads a fused kernel's output through an op left to torch" in err, err


def test_report_environment_variable(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    m = LinearCumsum().half().eval()
    x = torch.randn(16, 64, dtype=torch.float16)
    monkeypatch.setenv(REPORT_ENV, "1")
    _compile_run(m, x)
    assert "hexlayout fusion plan of compiled graph" in capsys.readouterr().err
    torch._dynamo.reset()
    _compile_run(m, x, report=False)                    # the option wins over the variable
    assert "hexlayout fusion plan" not in capsys.readouterr().err
    monkeypatch.setenv(REPORT_ENV, "yes")
    gm = torch.fx.symbolic_trace(lambda t: t + 1)
    with pytest.raises(BackendOptionError, match=REPORT_ENV):
        hexlayout_backend(gm, [torch.zeros(2)])
    with pytest.raises(BackendOptionError, match="'report'"):
        hexlayout_backend(gm, [torch.zeros(2)], options={"report": "yes"})


def test_report_groups_reasons() -> None:
    plan = FusionPlan([KernelPlan("k", "aten.mm.default", [], ["aten.add.Tensor"])],
                      [Fallback("aten.select.int", "r1"), Fallback("aten.neg.default", "r2"),
                       Fallback("aten.select.int", "r1"), Fallback("aten.cat.default", "r1" + "x" * 400)])
    lines = plan.report().splitlines()
    assert lines[0] == "hexlayout fusion plan: 1 fused kernel(s), 4 op(s) left to torch"
    assert lines[1] == "  kernel k: anchor aten.mm.default; prologue []; epilogue [aten.add.Tensor]"
    assert lines[2] == "  left to torch (3 reason(s)):"
    assert lines[3] == "    2 op(s) [aten.select.int x 2]: r1"
    assert lines[4] == "    1 op(s) [aten.neg.default]: r2"
    assert lines[5].endswith("...") and len(lines[5]) < 260
