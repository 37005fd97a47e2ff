"""Small decoder layers written as HF writes them (RMSNorm, one QKV projection split into
GQA heads, rotate-half RoPE with cos / sin tables gathered by position ids, causal SDPA,
gated MLP of separate gate / up projections) compiled whole: the launch count per layer, the
QKV projection fused with its RoPE (its split parts views of its output), what is left to
torch listed with reasons (only those views); within 1e-2 of max|eager| of eager and of the
float64 layer. Both norms are A prologues of the GEMMs they feed, and gate / up one GEMM over
their concatenated weight."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from hexlayout.fusion.fused_op import FusionWarning  # noqa: E402
from hexlayout.fusion.partition import _VIEW_REASON  # noqa: E402
from hexlayout.fusion.plan import GraphPlan  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


class RMSNorm(nn.Module):
    """HF's ``LlamaRMSNorm``: ``w * (x / rms(x))`` computed in f32, cast back before ``* w``;
    ``gemma``: ``GemmaRMSNorm``, ``(x / rms(x)) * (1 + w)`` all in f32, then cast."""

    def __init__(self, h: int, gemma: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter((0.0 if gemma else 1.0) + 0.1 * torch.randn(h))
        self.gemma = gemma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        if self.gemma:
            return (normed * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * normed.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF's RoPE helper: ``cat(-x2, x1)`` of the halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer(nn.Module):
    """``kind``: ``"llama"``; ``"qwen2"`` (the QKV projection has a bias); ``"gemma"``
    (``1 + w`` norms, GELU tanh gate). 4 query and 2 key / value heads of 16, hidden 64,
    intermediate 128."""

    def __init__(self, kind: str, h: int = 64, heads: int = 4, kv_heads: int = 2, inter: int = 128) -> None:
        super().__init__()
        self.kind, self.heads, self.kv_heads, self.hd = kind, heads, kv_heads, h // heads
        self.norm1, self.norm2 = RMSNorm(h, kind == "gemma"), RMSNorm(h, kind == "gemma")
        self.qkv = nn.Linear(h, (heads + 2 * kv_heads) * self.hd, bias=kind == "qwen2")
        self.o = nn.Linear(heads * self.hd, h, bias=False)
        self.gate, self.up = nn.Linear(h, inter, bias=False), nn.Linear(h, inter, bias=False)
        self.down = nn.Linear(inter, h, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        freqs = torch.outer(torch.arange(64).float(), inv)
        emb = torch.cat((freqs, freqs), -1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([self.heads * self.hd, self.kv_heads * self.hd,
                                                 self.kv_heads * self.hd], -1)
        q, k, v = (p.view(b, t, -1, self.hd).transpose(1, 2) for p in (q, k, v))
        cos, sin = self.cos[pos].unsqueeze(1).to(x.dtype), self.sin[pos].unsqueeze(1).to(x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        x = x + self.o(self.attend(q, k, v).transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.norm2(x))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal GQA attention of ``[B, heads, T, D]`` queries, keys and values."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        """The gated MLP of the normed ``h``: ``down(act(gate(h)) * up(h))``."""
        gate = F.gelu(self.gate(h), approximate="tanh") if self.kind == "gemma" else F.silu(self.gate(h))
        return self.down(gate * self.up(h))


@dataclass
class Compiled:
    """What :func:`compile_and_run` ran: the compiled module, its merged plan, its launches,
    and its output beside eager's (``ref``) and float64's (``want``)."""

    fn: Any
    plan: GraphPlan
    log: Any
    out: torch.Tensor
    ref: torch.Tensor
    want: torch.Tensor


def compile_and_run(m: nn.Module, *args: torch.Tensor, strict: bool = True) -> Compiled:
    """``m`` compiled with the hexlayout backend (eager fallback) and run on ``args`` under
    ``launch_log``, beside eager ``m`` and a float64 copy of ``m`` on the float64 of the floating
    ``args`` (no grad); ``strict``: a ``FusionWarning`` fails the test."""
    plans: list[GraphPlan] = []
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad(), warnings.catch_warnings():
        if strict:
            warnings.simplefilter("error", FusionWarning)
        with launch_log() as log:
            out = c(*args)
        ref = m(*args)
        want = copy.deepcopy(m).double()(*(a.double() if a.is_floating_point() else a for a in args))
    return Compiled(c, GraphPlan.merge(plans), log, out, ref, want)


def close(out: torch.Tensor, ref: torch.Tensor, want: torch.Tensor) -> None:
    """The compiled ``out`` within 1e-2 of max|eager| of eager ``ref`` and of float64 ``want``."""
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


ROPE = "hexlayout.rope.default"
#: launches per layer now (the ideal): QKV with the input norm as its A prologue and RoPE in its
#: epilogue, attention,
#: o_proj + residual, gate and up as ONE GEMM over the concatenated weight with the
#: post-attention norm as its A prologue and act(gate) * up in its epilogue, down + residual
LAUNCHES = 5


@pytest.mark.parametrize("kind,dtype", [(k, d) for k in ("llama", "qwen2", "gemma")
                                        for d in (torch.float16, torch.bfloat16)],
                         ids=[f"{k}-{d}" for k in ("llama", "qwen2", "gemma") for d in ("f16", "bf16")])
def test_decoder_layer_launches_and_values(kind: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    m = Layer(kind).to(dtype).eval()
    x = torch.randn(2, 8, 64, dtype=dtype)
    run = compile_and_run(m, x, torch.arange(8)[None].expand(2, 8))
    plan, log = run.plan, run.log
    assert len(log) == len(plan.kernels) == LAUNCHES, plan
    anchors = [r.anchor.split(".")[1] for r in log]
    assert anchors.count("mean") == 0 and anchors.count("linear") == 4, anchors   # the QKV GEMM among them
    normed = [r for r in log if "aten.mean.dim" in r.prologue]      # both norms: GEMMs' A prologues
    assert len(normed) == 2 and normed[0] is log[0], log
    gate = "aten.gelu.default" if kind == "gemma" else "aten.silu.default"
    assert gate in normed[1].epilogue and normed[1].epilogue.count("aten.slice.Tensor") == 2, normed[1]
    assert any(n.startswith("gate and up: one GEMM") for n in plan.notes), plan
    assert all(f.reason.strip() for f in plan.fallbacks), plan
    left = {f.op for f in plan.fallbacks}
    assert not left & {"aten.mm.default", "aten.addmm.default", "aten.mean.dim", "aten.silu.default",
                       "aten.gelu.default", "aten.pow.Tensor_Scalar", "aten.rsqrt.default"}, plan
    # RoPE (the tables gathered by position ids, rotate-half, mul / add) is in the QKV GEMM's
    # epilogue; torch only makes the q / k / v views of its output
    assert ROPE in log[0].epilogue, log[0]
    note = "rope: rotate-half RoPE of columns [0, 96) (6 heads of 16)"
    assert any(n.startswith(note) for n in plan.notes), plan
    assert {f.reason for f in plan.fallbacks} == {_VIEW_REASON}, plan
    assert {f.op for f in plan.fallbacks} == {"aten.split_with_sizes.default", "aten.view.default",
                                              "aten.transpose.int"}, plan
    if kind == "gemma":      # 1 + w of the norm weights: in the norms' epilogues, not in torch
        assert "aten._to_copy.default" not in left, plan
    close(run.out, run.ref, run.want)


class GemmaMLP(nn.Module):
    """Gemma's MLP block: ``x + down(gelu_tanh(gate(norm(x))) * up(norm(x)))``, ``1 + w`` norm."""

    def __init__(self, h: int = 64, inter: int = 128) -> None:
        super().__init__()
        self.norm = RMSNorm(h, gemma=True)
        self.gate, self.up = nn.Linear(h, inter, bias=False), nn.Linear(h, inter, bias=False)
        self.down = nn.Linear(inter, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.gelu(self.gate(h), approximate="tanh") * self.up(h))


def test_gemma_mlp_block_is_two_launches() -> None:
    torch.manual_seed(0)
    m = GemmaMLP().to(torch.bfloat16).eval()
    run = compile_and_run(m, torch.randn(2, 8, 64, dtype=torch.bfloat16), strict=False)
    log = run.log
    assert len(log) == 2 and not run.plan.fallbacks, run.plan  # gate-up with the norm, down + residual
    assert "aten.mean.dim" in log[0].prologue and "aten.gelu.default" in log[0].epilogue, log[0]
    close(run.out, run.ref, run.want)


def test_wide_llama_layer_is_five_launches() -> None:
    """Hidden 256 (rows longer than a tile): both norms still fuse as the GEMMs' A prologues
    (the row factor scales the product), 4 heads of 64, intermediate 256: 5 launches."""
    torch.manual_seed(2)
    m = Layer("llama", h=256, heads=4, kv_heads=2, inter=256).to(torch.bfloat16).eval()
    x = torch.randn(1, 6, 256, dtype=torch.bfloat16)
    run = compile_and_run(m, x, torch.arange(6)[None], strict=False)
    log, plan = run.log, run.plan
    assert len(log) == len(plan.kernels) == LAUNCHES, plan.report()
    assert [r for r in log if "aten.mean.dim" in r.prologue] == [log[0], log[3]], log
    assert not any(n.startswith("norm:") for n in plan.notes), plan.report()
    close(run.out, run.ref, run.want)
