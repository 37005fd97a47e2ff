"""The graph front end: ``torch.compile(model, backend="hexlayout")`` and ``explain``.

CPU tensors in the emulator (``HEXLAYOUT_EMULATE=1``), small shapes. Every model is compared
with eager torch (within 1e-2 of max|eager|); ``hexlayout.runtime.launch_log`` proves which
fused kernels ran (one launch per planned kernel, nothing else launched), and the plan
accounts for every aten op of the graph: in a kernel, or left to torch with a reason.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from hexlayout.fusion.backend import GRAD_REASON, BackendOptionError, hexlayout_backend  # noqa: E402
from hexlayout.fusion.explain import explain  # noqa: E402
from hexlayout.fusion.fused_op import FusionWarning  # noqa: E402
from hexlayout.fusion.plan import FusionPlan, GraphPlan  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    scale = ref.float().abs().max().item()
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= 1e-2 * scale, f"max |out - eager| = {err} > 1e-2 * {scale}"


def _compile_run(model: nn.Module, *inputs: torch.Tensor, fallback: str = "eager",
                 **compile_kw: object) -> tuple[torch.Tensor, FusionPlan, list]:
    """Compile with the hexlayout backend, run once under a launch log: (out, plan, log)."""
    plans: list[GraphPlan] = []
    c = torch.compile(model, backend="hexlayout", options={"fallback": fallback, "on_plan": plans.append},
                      **compile_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FusionWarning)     # a kernel that fails to build is a bug
        with launch_log() as log:
            out = c(*inputs)
    return out, GraphPlan.merge(plans), list(log)


def _check_ran(plan: FusionPlan, log: list) -> None:
    """Exactly the planned kernels launched (no separate elementwise kernel), each once (a
    bmm: one launch per batch entry, of one build), with the spec's anchor and fused ops."""
    runs: list = []
    for rec in log:
        if runs and runs[-1].name == rec.name and runs[-1].anchor == "aten.bmm.default":
            assert rec.build_key == runs[-1].build_key
            continue
        runs.append(rec)
    assert len(runs) == len(plan.kernels), (plan, [r.name for r in log])
    left = list(plan.kernels)
    for rec in runs:
        k = next((k for k in left if rec.name.startswith(k.name + "__") and rec.anchor == k.spec.anchor
                  and list(rec.epilogue) == k.spec.epilogue_ops()
                  and list(rec.prologue) == k.spec.prologue_ops()), None)
        assert k is not None, (rec, plan)
        left.remove(k)
    for f in plan.fallbacks:
        assert f.op.startswith("aten.") and f.reason.strip(), f


class MLP(nn.Module):
    """Linear -> bias -> GELU -> Linear -> residual add."""

    def __init__(self, h: int = 64, inter: int = 128) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(h, inter), nn.Linear(inter, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x), approximate="tanh"))


class GatedMLP(nn.Module):
    """SiLU(gate) * up from one concatenated gate/up projection, then down."""

    def __init__(self, h: int = 64, inter: int = 64) -> None:
        super().__init__()
        self.gate_up = nn.Linear(h, 2 * inter, bias=False)
        self.down = nn.Linear(inter, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Heads(nn.Module):
    """A projection reshaped and permuted into attention heads ``[B, heads, T, head_dim]``."""

    def __init__(self, h: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.proj, self.heads = nn.Linear(h, h), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        return self.proj(x).view(b, t, self.heads, h // self.heads).permute(0, 2, 1, 3)


class Dequant(nn.Module):
    """W8A16: int8 weights with per-output-channel scales, dequantized right before the GEMM."""

    def __init__(self, n: int = 64, k: int = 64) -> None:
        super().__init__()
        self.register_buffer("wq", torch.randint(-127, 128, (n, k), dtype=torch.int8))
        self.register_buffer("scale", torch.rand(n) * 0.02 + 0.005)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.wq.to(x.dtype) * self.scale.to(x.dtype)[:, None]
        return F.linear(x, w)


class RMSNorm(nn.Module):
    def __init__(self, h: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(h))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class DecoderLayer(nn.Module):
    """A small Llama-style layer: RMSNorm, fused QKV, causal SDPA, output projection with
    residual, RMSNorm, gated MLP with residual."""

    def __init__(self, h: int = 64, heads: int = 4, inter: int = 128) -> None:
        super().__init__()
        self.heads, self.hd = heads, h // heads
        self.norm1, self.norm2 = RMSNorm(h), RMSNorm(h)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.gate_up = nn.Linear(h, 2 * inter, bias=False)
        self.down = nn.Linear(inter, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def _model(cls: type, dtype: torch.dtype, **kw: int) -> nn.Module:
    torch.manual_seed(0)
    return cls(**kw).to(dtype).eval()


def test_mlp_block_two_kernels_and_explain() -> None:
    m = _model(MLP, torch.float16)
    x = torch.randn(2, 8, 64, dtype=torch.float16)
    with torch.no_grad():
        plan = explain(m, x)
        assert [k.anchor for k in plan.kernels] == ["aten.addmm.default"] * 2, plan
        assert plan.fallbacks == [], plan
        first, second = plan.kernels
        assert "aten.gelu.default" in first.epilogue and "aten.add.Tensor" in second.epilogue
        assert "aten.t.default" in first.prologue and "aten.t.default" in second.prologue
        text = str(plan)
        assert all(k.name in text and k.anchor in text for k in plan.kernels)
        assert repr(plan) == text

        torch._dynamo.reset()
        out, plan2, log = _compile_run(m, x)
        _close(out, m(x))
    assert [(k.name, k.anchor, k.prologue, k.epilogue) for k in plan2.kernels] == \
        [(k.name, k.anchor, k.prologue, k.epilogue) for k in plan.kernels]
    _check_ran(plan2, log)
    assert [r.epilogue for r in log] == [("aten.gelu.default",), ("aten.add.Tensor",)]


class LinearGelu(nn.Module):
    """Linear -> GELU of the given ``approximate`` (torch's spelling)."""

    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.lin, self.approximate = nn.Linear(64, 64), approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.lin(x), approximate=self.approximate)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_in_an_epilogue_keeps_its_form(approximate: str) -> None:
    """``F.gelu(x)`` fuses as the exact (erf) GELU and ``F.gelu(x, approximate="tanh")`` as the
    tanh form, told apart on pre-activations in [-3.6, -2.9] (the forms differ by 8-28 %
    there): the fused result is within 1e-2 relative of float64 of its own form, elementwise."""
    g = torch.Generator().manual_seed(20)
    m = LinearGelu(approximate)
    with torch.no_grad():
        m.lin.weight.copy_(torch.randn(64, 64, generator=g) * 0.01)
        m.lin.weight[:, 0] = 1.0
        m.lin.bias.copy_(torch.rand(64, generator=g) * 0.7 - 3.6)
    m = m.half()
    x = (torch.randn(8, 64, generator=g) * 0.01).half()
    x[:, 0] = 0.0
    with torch.no_grad():
        out, plan, log = _compile_run(m, x)
        z = F.linear(x.double(), m.lin.weight.double(), m.lin.bias.double())
    assert [r.epilogue for r in log] == [("aten.gelu.default",)] and plan.fallbacks == [], plan
    want = F.gelu(z, approximate=approximate)
    other = F.gelu(z, approximate="tanh" if approximate == "none" else "none")
    assert ((other - want).abs() / want.abs()).min().item() > 0.08      # the forms differ here
    rel = ((out.double() - want).abs() / want.abs()).max().item()
    assert rel < 1e-2, rel


def test_gated_mlp_concatenated_gate_up() -> None:
    m = _model(GatedMLP, torch.bfloat16)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out, plan, log = _compile_run(m, x)
        _close(out, m(x))
    _check_ran(plan, log)
    assert len(plan.kernels) == 2 and plan.fallbacks == [], plan
    gate_up = plan.kernels[0]
    assert {"aten.split.Tensor", "aten.silu.default", "aten.mul.Tensor"} <= set(gate_up.epilogue)
    assert log[0].epilogue.count("aten.slice.Tensor") == 2 and "aten.silu.default" in log[0].epilogue


def test_linear_permuted_into_heads() -> None:
    m = _model(Heads, torch.float16)
    x = torch.randn(2, 8, 64, dtype=torch.float16)
    with torch.no_grad():
        out, plan, log = _compile_run(m, x)
        ref = m(x)
    _close(out, ref)
    assert out.shape == (2, 4, 8, 16)
    _check_ran(plan, log)
    assert len(plan.kernels) == 1 and plan.fallbacks == [], plan
    assert "aten.permute.default" in plan.kernels[0].epilogue


class ContiguousHeads(Heads):
    """The heads made contiguous (``.contiguous()``, as attention code does before a kernel)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).contiguous()


def test_linear_output_stored_into_heads_by_the_kernel() -> None:
    """The projection's output permuted into heads and made contiguous: one kernel that
    stores [B, heads, T, head_dim] itself (its 4-D output in the launch record), strides and
    values as eager's, for two sequence lengths."""
    m = _model(ContiguousHeads, torch.float16)
    with torch.no_grad():
        for t in (8, 11):
            torch._dynamo.reset()
            x = torch.randn(2, t, 64, dtype=torch.float16)
            out, plan, log = _compile_run(m, x)
            ref = m(x)
            _close(out, ref)
            assert out.stride() == ref.stride() == (4 * t * 16, t * 16, 16, 1)
            _check_ran(plan, log)
            assert len(plan.kernels) == 1 and plan.fallbacks == [], plan
            assert {"aten.permute.default", "aten.clone.default"} <= set(plan.kernels[0].epilogue), plan
            assert (2, 4, t, 16) in log[0].shapes


def test_int8_dequantization_prologue() -> None:
    m = _model(Dequant, torch.float16)
    x = torch.randn(2, 20, 64, dtype=torch.float16)
    with torch.no_grad():
        out, plan, log = _compile_run(m, x)
        _close(out, m(x))
    _check_ran(plan, log)
    assert len(plan.kernels) == 1, plan
    assert {"aten._to_copy.default", "aten.mul.Tensor"} <= set(log[0].prologue)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_llama_decoder_layer(dtype: torch.dtype) -> None:
    m = _model(DecoderLayer, dtype)
    x = torch.randn(2, 20, 64, dtype=dtype)
    with torch.no_grad():
        out, plan, log = _compile_run(m, x)
        _close(out, m(x))
    _check_ran(plan, log)
    # every projection is an anchor of a fused kernel, and each norm (hidden 64: whole rows in
    # one A tile) is the A prologue of the GEMM it feeds (cast, square, mean, rsqrt, scale,
    # cast, weight in the QKV and the gate-up projections' A loads): 5 kernels, no row
    # reduction of its own, nothing of the norms left to torch. Attention is the attention
    # anchor kernel in f16 and bf16 (its output transposed back to [B, S, H*D] by host views)
    sdpa = "aten._scaled_dot_product_flash_attention_for_cpu.default"
    assert len(plan.kernels) == 5, plan
    assert [k.anchor for k in plan.kernels].count("aten.mean.dim") == 0, plan
    normed = [k for k in plan.kernels if "aten.mean.dim" in k.prologue]
    assert len(normed) == 2, plan
    for k in normed:
        assert {"aten._to_copy.default", "aten.pow.Tensor_Scalar", "aten.rsqrt.default"} <= set(k.prologue), \
            plan
    left = {f.op: f.reason for f in plan.fallbacks}
    assert not {"aten.mean.dim", "aten.pow.Tensor_Scalar", "aten.rsqrt.default",
                "aten._to_copy.default"} & set(left), plan
    assert len(log) == 5 and sum("aten.mean.dim" in r.prologue for r in log) == 2, log
    assert sdpa not in left and [r.anchor for r in log].count(sdpa) == 1, plan
    attn = next(k for k in plan.kernels if k.anchor == sdpa)
    assert "aten.transpose.int" in attn.epilogue, plan
    # what is left to torch, each with its reason (printed in the failure message)
    assert all(f.reason.strip() for f in plan.fallbacks), plan


def test_graph_that_needs_gradients_goes_to_torch() -> None:
    m = _model(MLP, torch.float32)
    x = torch.randn(2, 8, 64, requires_grad=True)
    plan = explain(m, x)
    assert plan.kernels == [] and plan.fallbacks
    assert {f.reason for f in plan.fallbacks} == {GRAD_REASON}
    assert "aten.addmm.default" in {f.op for f in plan.fallbacks}

    torch._dynamo.reset()
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager"})
    with launch_log() as log:
        out = c(x)
    out.sum().backward()
    assert log == []
    ref_x = x.detach().clone().requires_grad_(True)
    m.zero_grad()
    m(ref_x).sum().backward()
    assert torch.allclose(out, m(x), atol=1e-5) and torch.allclose(x.grad, ref_x.grad, atol=1e-5)


def test_unsupported_shapes_and_dtypes_fall_back_with_reason() -> None:
    # K = 12 is not a multiple of 8; f32 has no fused GEMM: torch computes both, with reasons
    for dtype, k in ((torch.float16, 12), (torch.float32, 64)):
        m = _model(MLP, dtype, h=k, inter=64)
        x = torch.randn(2, 4, k, dtype=dtype)
        torch._dynamo.reset()
        with torch.no_grad():
            out, plan, log = _compile_run(m, x)
            _close(out, m(x))
        assert log == [] and plan.fallbacks, plan
        assert all("could not fuse" in f.reason for f in plan.fallbacks if f.op == "aten.addmm.default")
        assert any(("multiple" in f.reason) if dtype == torch.float16 else ("f16" in f.reason)
                   for f in plan.fallbacks), plan


def test_dynamic_sequence_lengths_reuse_kernels() -> None:
    m = _model(MLP, torch.float16)
    plans: list[GraphPlan] = []
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    keys = []
    with torch.no_grad():
        for t in (16, 24, 32):
            x = torch.randn(2, t, 64, dtype=torch.float16)
            with launch_log() as log:
                out = c(x)
            _close(out, m(x))
            assert len(log) == 2, [r.name for r in log]
            keys.append(tuple(r.build_key for r in log))
    # one static compile, then one with a symbolic length serving every later length; the
    # specs hold no sizes, so all three lengths (M = 32, 48, 64: one tile configuration)
    # launch the same two builds
    assert len(plans) == 2
    assert len(set(keys)) == 1, keys


def test_inductor_runs_what_is_left() -> None:
    # attention with an additive mask is fused (was left to torch before masks were taken);
    # the cumulative sum after it is no fused op, so inductor runs it
    class SelfAttention(Heads):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mask", torch.full((8, 8), -1e4).triu(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = super().forward(x)
            return torch.cumsum(F.scaled_dot_product_attention(q, q, q, attn_mask=self.mask), -1)

    m = _model(SelfAttention, torch.float16)
    x = torch.randn(2, 8, 64, dtype=torch.float16)
    with torch.no_grad():
        out, plan, log = _compile_run(m, x, fallback="inductor")
        _close(out, m(x))
    _check_ran(plan, log)
    assert [k.anchor for k in plan.kernels] == ["aten.addmm.default",
                                                "aten._scaled_dot_product_flash_attention_for_cpu.default"]
    assert [f.op for f in plan.fallbacks] == ["aten.cumsum.default"]


def test_backend_options_are_checked() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(BackendOptionError, match="'fallback'"):
        hexlayout_backend(gm, [torch.zeros(2)], options={"fallback": "nvfuser"})
    with pytest.raises(BackendOptionError, match="unknown option"):
        hexlayout_backend(gm, [torch.zeros(2)], options={"fusion": True})


def test_documented_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/torch-compile.md's example, printing what the page says it prints."""
    import pathlib
    import re

    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "torch-compile.md").read_text()
    code, printed = re.findall(r"```(?:python)?\n(.*?)```", page, flags=re.S)[:2]
    ns: dict = {"__name__": "torch_compile_doc"}
    exec(compile(code, "torch-compile.md", "exec"), ns)  # noqa: S102 - the doc's own example
    torch.testing.assert_close(ns["y"], ns["model"](ns["x"]), atol=1e-2 * ns["y"].abs().max().item(), rtol=0)
    assert capsys.readouterr().out.strip() == printed.strip()


def test_hexlayout_gemm_op_and_bmm_are_anchors() -> None:
    import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.gemm

    torch.manual_seed(0)
    w, bias = torch.randn(64, 32, dtype=torch.float16) * 0.2, torch.randn(64, dtype=torch.float16)

    def gemm_then_scale(x: torch.Tensor) -> torch.Tensor:
        return (torch.ops.hexlayout.gemm(x, w, bias=bias, activation="gelu") * 0.5).float()

    def batched(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.matmul(a, b))

    x = torch.randn(40, 32, dtype=torch.float16)
    a, b = torch.randn(3, 16, 32, dtype=torch.float16), torch.randn(3, 32, 64, dtype=torch.float16)
    with torch.no_grad():
        out, plan, log = _compile_run(gemm_then_scale, x)
        _close(out, gemm_then_scale(x))
        _check_ran(plan, log)
        assert [k.anchor for k in plan.kernels] == ["hexlayout.gemm.default"] and plan.fallbacks == []
        # the op's own epilogue (bias, GELU) and the graph's (scale, cast) run in one kernel
        assert log[0].epilogue == ("aten.add.Tensor", "aten.gelu.default", "aten.mul.Tensor",
                                   "aten._to_copy.default")

        torch._dynamo.reset()
        out, plan, log = _compile_run(batched, a, b)
        _close(out, batched(a, b))
        _check_ran(plan, log)
        assert [k.anchor for k in plan.kernels] == ["aten.bmm.default"] and plan.fallbacks == []
        assert "aten.relu.default" in log[0].epilogue


def test_kernels_never_wait_on_each_other() -> None:
    """Two GEMMs whose epilogues would each read the other's output through ops left to
    torch: one of those reads stays in torch, so the compiled graph has no cycle."""
    torch.manual_seed(0)
    w1, w2 = torch.randn(8, 32, dtype=torch.float16) * 0.2, torch.randn(64, 32, dtype=torch.float16) * 0.2

    def f(x: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, z = x @ w1.t(), x2 @ w2.t()
        r = y * z[:, :8].sum(-1, keepdim=True)          # y's kernel reads z (through torch)
        e = z * y.sum(-1, keepdim=True).relu()           # z's kernel would read y (through torch)
        return r, e, z[:, :8] + y

    x, x2 = torch.randn(40, 32, dtype=torch.float16), torch.randn(40, 32, dtype=torch.float16)
    with torch.no_grad():
        outs, plan, log = _compile_run(f, x, x2)
        for out, ref in zip(outs, f(x, x2)):
            _close(out, ref)
    _check_ran(plan, log)
    # two GEMM kernels (the row sums over rows of 8 are row-reduction kernels of their own)
    assert [k.anchor for k in plan.kernels].count("aten.mm.default") == 2, plan
    assert "aten.mul.Tensor" in {f.op for f in plan.fallbacks}
