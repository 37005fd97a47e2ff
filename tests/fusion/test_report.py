"""``torch.compile(..., backend="hexlayout", options={"report": True})`` and
``HEXLAYOUT_FUSION_REPORT=1``: each compiled graph's plan printed once, after its first run
(what ran: the kernels in the launch log, a group refused at run time left to torch with its
reason), with the ops left to torch grouped by reason (each reason once, with its count)."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hexlayout.fusion.backend import REPORT_ENV, BackendOptionError, hexlayout_backend  # noqa: E402
from hexlayout.fusion.plan import Fallback, FusionPlan, KernelPlan  # noqa: E402
from hexlayout.runtime import launch_log  # noqa: E402

F = torch.nn.functional


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
    with launch_log() as log:
        out = _compile_run(m, x, report=True)
        _compile_run(m, x, report=True)      # the cached graph: not compiled, not printed again
    assert [r.name.split("__gemm")[0] for r in log] == ["fused_linear"] * 2, log   # what the report says ran
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


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Two linears whose weights are cast to the activation's dtype inside the compiled function."""
    return F.gelu(x @ w1.to(x.dtype).t()) @ w2.to(x.dtype).t()


@pytest.mark.parametrize("case", ["no_emulation", "f32_activation"])
def test_report_lists_kernels_refused_at_run_time_as_torch(case: str, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups the partition fuses but the mechanism refuses when they run (CPU tensors without
    ``HEXLAYOUT_EMULATE=1``; an f32 GEMM after casting the weights to an f32 activation) run
    in torch: no launch, and the report says so with the reason - not two fused kernels."""
    torch.manual_seed(0)
    x = torch.randn(8, 32, dtype=torch.float16 if case == "no_emulation" else torch.float32)
    w1, w2 = torch.randn(64, 32) * 0.2, torch.randn(32, 64) * 0.2
    if case == "no_emulation":
        monkeypatch.delenv("HEXLAYOUT_EMULATE")
        reason = "CPU tensors run hexlayout kernels only in the emulator (HEXLAYOUT_EMULATE=1)"
    else:
        w1, w2 = w1.half(), w2.half()
        reason = "float32 x torch.float32 (fused GEMMs take f16 or bf16"
    fallback = "eager" if case == "no_emulation" else "inductor"     # (inductor: a boxed compiled graph)
    c = torch.compile(_mlp, backend="hexlayout", options={"fallback": fallback, "report": True})
    with torch.no_grad(), launch_log() as log:
        out = c(x, w1, w2)
    err = capsys.readouterr().err
    ref = _mlp(x.double(), w1.double(), w2.double())
    assert (out.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
    assert log == []
    header = r"hexlayout fusion plan of compiled graph \d+: 0 fused kernel\(s\), 7 op\(s\) left to torch\n"
    assert len(re.findall(header, err)) == 1, err          # printed once, after the first run
    assert err.count(reason) == 2, err
    assert "kernel fused_linear" not in err.replace("could not fuse kernel fused_linear", ""), err
    if case == "no_emulation":             # the refusal is not kept once the emulator is on
        monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
        with torch.no_grad(), launch_log() as log:
            again = c(x, w1, w2)
        ran = [r.name.split("__gemm")[0] for r in log]
        assert ran == ["fused_linear__to_copy_gelu", "fused_linear__to_copy"], log
        assert (again.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
        err = capsys.readouterr().err
        assert "(what runs changed): 2 fused kernel(s), 0 op(s) left to torch" in err, err


class _Kernel:
    """What ``GraphPlan.resolve`` reads of a ``FusedKernel``: a kernel refusing the calls in
    ``refuse`` (argument signatures) at run time."""

    def __init__(self, refuse: set[int]) -> None:
        self.spec = type("Spec", (), {"name": "fused_k"})()
        self.ops = ("aten.mm.default", (), ("aten.gelu.default",))
        self.latest: str | None = None
        self.refuse = refuse

    def fallback_reason(self) -> str | None:
        return self.latest

    def __call__(self, n: int) -> int:
        self.latest = f"size {n} refused" if n in self.refuse else None
        return n


def test_report_printed_again_when_what_runs_changes(capsys: pytest.CaptureFixture[str]) -> None:
    from hexlayout.fusion.backend import reported
    from hexlayout.fusion.plan import GraphPlan

    k = _Kernel({3})
    run = reported(lambda args: k(args[0]), GraphPlan([k], []))
    boxed = reported(type("Boxed", (), {"_boxed_call": True, "__call__": lambda s, a: a})(), GraphPlan())
    assert getattr(boxed, "_boxed_call", False) and not getattr(run, "_boxed_call", False)
    assert [run([n]) for n in (1, 2, 3, 3, 2)] == [1, 2, 3, 3, 2]
    reports = [r for r in capsys.readouterr().err.split("hexlayout fusion plan of compiled graph") if r]
    assert len(reports) == 3, reports           # the first run, the refusal, the kernel running again
    for r in (reports[0], reports[2]):
        assert "1 fused kernel(s), 0 op(s)" in r and "kernel fused_k: anchor aten.mm.default" in r, reports
    assert "(what runs changed): 0 fused kernel(s), 2 op(s) left to torch" in reports[1], reports
    assert "hexlayout could not fuse kernel fused_k: size 3 refused" in reports[1], reports
