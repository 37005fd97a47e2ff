"""RMSNorm of the activation as the GEMM's A prologue: ``linear(rmsnorm(x), W)`` written as HF
writes it compiles to one GEMM launch. Rows that fit a tile (``K <= NORM_MAX_K``) are loaded
whole and the row's ``mean(x * x)`` is computed in the load; longer rows take the norm as a
row factor of the product (``hexlayout.fusion.row_scale``): the row sums accumulate over the
k-loop and ``rsqrt(mean + eps)`` scales the product's rows. A long-row prologue that is not a
row factor (a mean subtracted) keeps the norm as a row-reduction kernel and the plan notes
``norm: two kernels (K=... > 128)``."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hexlayout.fusion.plan import GraphPlan  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


class NormLinear(nn.Module):
    """``Linear(RMSNorm(x))``: HF's Llama norm (``w * (x * rsqrt(mean(x^2) + eps)).to(dtype)``,
    f32 inside) or Gemma's (``((x * rsqrt(...)) * (1 + w)).to(dtype)``); with ``x +`` when
    ``k == n`` (``x`` read in the A prologue's frame and the epilogue's: two inputs)."""

    def __init__(self, k: int, n: int, gemma: bool) -> None:
        super().__init__()
        self.w = nn.Parameter((0.0 if gemma else 1.0) + 0.1 * torch.randn(k))
        self.lin = nn.Linear(k, n, bias=False)
        self.gemma = gemma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = (normed * (1.0 + self.w.float())).to(x.dtype) if self.gemma else self.w * normed.to(x.dtype)
        y = self.lin(h)
        return x + y if y.shape == x.shape else y


def _run(m: nn.Module, x: torch.Tensor) -> tuple:
    plans: list[GraphPlan] = []
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad():
        with launch_log() as log:
            out = c(x)
        ref = m(x)
        want = copy.deepcopy(m).double()(x.double())
    return out, ref, want, list(log), GraphPlan.merge(plans)


@pytest.mark.parametrize("dtype,gemma,k", [(torch.float16, False, 64), (torch.bfloat16, True, 96)],
                         ids=["llama-f16-k64", "gemma-bf16-k96"])
def test_rmsnorm_is_the_gemm_a_prologue(dtype: torch.dtype, gemma: bool, k: int) -> None:
    torch.manual_seed(0)
    m = NormLinear(k, 64, gemma).to(dtype).eval()
    x = torch.randn(2, 5, k, dtype=dtype) * 3
    out, ref, want, log, plan = _run(m, x)
    assert len(log) == len(plan.kernels) == 1, plan        # no row-reduction kernel
    (rec,) = log
    assert "aten.mean.dim" in rec.prologue and "aten.rsqrt.default" in rec.prologue, rec
    assert ("aten.add.Tensor" in rec.epilogue) == (k == 64), rec           # the residual
    assert not plan.notes and not plan.fallbacks, plan
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


@pytest.mark.parametrize("dtype,gemma,k,n",
                         [(torch.float16, False, 256, 16), (torch.bfloat16, True, 320, 320)],
                         ids=["llama-f16-k256", "gemma-bf16-k320-residual"])
def test_long_rows_scale_the_product(dtype: torch.dtype, gemma: bool, k: int, n: int) -> None:
    """Rows longer than a tile: one launch; the prologue runs without the row factor, the row
    sums of ``x * x`` accumulate over the k-loop (several k-tiles, 4 and 5 here; 15 rows: a
    ragged row tile), and ``rsqrt(mean + eps)`` scales the product's rows."""
    torch.manual_seed(0)
    m = NormLinear(k, n, gemma).to(dtype).eval()
    x = torch.randn(3, 5, k, dtype=dtype) * 3
    out, ref, want, log, plan = _run(m, x)
    assert len(log) == len(plan.kernels) == 1, plan.report()
    (rec,) = log
    assert "aten.mean.dim" in rec.prologue and "aten.rsqrt.default" in rec.prologue, rec
    assert ("aten.add.Tensor" in rec.epilogue) == (k == n), rec
    assert not plan.notes and not plan.fallbacks, plan.report()
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


class MeanCenteredLinear(nn.Module):
    """``Linear`` of ``(x - mean(x)) * w`` (f32 inside): the row value is subtracted, not a
    factor of the row, so a long row cannot be scaled after the product."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(1.0 + 0.1 * torch.randn(k))
        self.lin = nn.Linear(k, n, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.lin(((xf - xf.mean(-1, keepdim=True)) * self.w.float()).to(x.dtype))


def test_long_rows_that_are_no_row_factor_keep_two_kernels_and_say_so() -> None:
    torch.manual_seed(0)
    m = MeanCenteredLinear(256, 16).half().eval()
    x = torch.randn(4, 256, dtype=torch.float16) + 1
    out, ref, _, log, plan = _run(m, x)
    assert [r.anchor for r in log] == ["aten.mean.dim", "aten.linear.default"], log
    assert any("norm: two kernels (K=256 > 128)" in n for n in plan.notes), plan
    assert "note: norm: two kernels (K=256 > 128)" in plan.report()
    assert (out.float() - ref.float()).abs().max().item() <= 1e-2 * ref.float().abs().max().item()


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_row_scaled_norm_compiles_without_spills(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 4096 at the 128 x 128 x 64 tile (8 warps): no spills, the activation loaded in
    16-byte vectors (the norm weight's broadcast row does not decide the load's layout)."""
    from hexlayout.ops.gemm.fusion import anchor_consts, fused_build
    from hexlayout.ops.gemm.fusion_plan import plan_call

    from hexlayout.fusion import FusedSpec, Node, Prologue
    from hexlayout.runtime.stats import build_stats

    def cast(ref: tuple, dt: str) -> Node:
        return Node("aten._to_copy.default", (ref,), (("dtype", dt),))

    k = 4096
    spec = FusedSpec("aten.linear.default", prologues=(Prologue(0, (
        cast(("input", 0), "f32"), Node("aten.pow.Tensor_Scalar", (("node", 0), ("const", 2))),
        Node("aten.mean.dim", (("node", 1), ("const", (-1,)), ("const", True))),
        Node("aten.add.Tensor", (("node", 2), ("const", 1e-6))), Node("aten.rsqrt.default", (("node", 3),)),
        Node("aten.mul.Tensor", (("node", 0), ("node", 4))), cast(("node", 5), "f16"),
        Node("aten.mul.Tensor", (("input", 1), ("node", 6)))), 7),))
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    call = plan_call(spec, [None, torch.randn(4096, k).half()],
                     [torch.randn(64, k).half(), torch.randn(k).half()])
    assert call.plan.row_scale
    call.m = call.n = 4096
    consts = anchor_consts(call)
    assert consts["BK"] < k, consts                     # a k-loop of many tiles
    bld, _ = fused_build(spec, call, consts, compile=True)
    res = bld.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0, res
    loop = build_stats(bld).main_loop
    assert loop is not None and loop.mma == 64, loop
    assert 0 < loop.mix.get("LDG", 0) <= 8, loop.mix           # x and w: 16-byte vectors
    assert loop.non_mma_per_mma < 6, loop


class LayerNormLinear(nn.Module):
    """``Linear(LayerNorm(x))``: ``nn.LayerNorm`` (aten ``native_layer_norm``) or written out
    with the mean and the variance (f32 inside, as eager computes it for f16 / bf16)."""

    def __init__(self, k: int, n: int, written: bool) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(k)
        with torch.no_grad():
            self.ln.weight.add_(0.1 * torch.randn(k))
            self.ln.bias.add_(0.1 * torch.randn(k))
        self.lin = nn.Linear(k, n)
        self.written = written

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.written:
            return self.lin(self.ln(x))
        xf = x.float()
        mu = xf.mean(-1, keepdim=True)
        var = ((xf - mu) ** 2).mean(-1, keepdim=True)
        h = (xf - mu) * torch.rsqrt(var + self.ln.eps) * self.ln.weight.float() + self.ln.bias.float()
        return self.lin(h.to(x.dtype))


@pytest.mark.parametrize("dtype,written,k", [(torch.float16, False, 64), (torch.bfloat16, False, 96),
                                             (torch.bfloat16, True, 96)],
                         ids=["layer_norm-f16-k64", "layer_norm-bf16-k96", "written-bf16-k96"])
def test_layernorm_is_the_gemm_a_prologue(dtype: torch.dtype, written: bool, k: int) -> None:
    torch.manual_seed(1)
    m = LayerNormLinear(k, 32, written).to(dtype).eval()
    x = torch.randn(2, 5, k, dtype=dtype) * 2 + 0.5          # rows of nonzero mean
    out, ref, want, log, plan = _run(m, x)
    assert len(log) == len(plan.kernels) == 1, plan.report()           # no norm kernel, nothing in torch
    assert not plan.notes and not plan.fallbacks, plan.report()
    (rec,) = log
    assert rec.prologue.count("aten.mean.dim") == 2 and "aten.rsqrt.default" in rec.prologue, rec
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


def test_long_layernorm_rows_stay_in_torch_and_say_so() -> None:
    torch.manual_seed(1)
    m = LayerNormLinear(256, 16, False).half().eval()
    x = torch.randn(4, 256, dtype=torch.float16)
    out, ref, _, log, plan = _run(m, x)
    assert [r.anchor for r in log] == ["aten.linear.default"], log
    assert [f.op for f in plan.fallbacks] == ["aten.native_layer_norm.default"], plan.report()
    assert "norm: two kernels (K=256 > 128): native_layer_norm in torch" in plan.report()
    assert (out.float() - ref.float()).abs().max().item() <= 1e-2 * ref.float().abs().max().item()
