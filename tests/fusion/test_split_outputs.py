"""A fused QKV projection split the ways models write it - ``split([q, kv, kv], -1)``,
slicing, ``view(..., 3, heads, hd).unbind(2)`` - each part viewed into heads: one GEMM
launch (its bias fused), the parts views of its stored output that torch makes without a
kernel or a copy (the plan says so, once), values and strides as eager's and within 1e-2
of max|eager| of float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hexlayout.fusion.partition import _VIEW_REASON  # noqa: E402
from hexlayout.fusion.plan import GraphPlan  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


class QKV(nn.Module):
    """GQA projections: 4 query heads and 2 key / value heads of 16 from one Linear (bias)."""

    def __init__(self, form: str, h: int = 64, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.form, self.heads, self.kv_heads, self.hd = form, heads, kv_heads, h // heads
        self.qkv = nn.Linear(h, (heads + 2 * kv_heads) * self.hd)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        y = self.qkv(x)
        q_n, kv_n = self.heads * self.hd, self.kv_heads * self.hd
        if self.form == "split":
            parts = y.split([q_n, kv_n, kv_n], dim=-1)
        else:
            parts = (y[..., :q_n], y[..., q_n:q_n + kv_n], y[..., q_n + kv_n:])
        return tuple(p.view(b, t, -1, self.hd).transpose(1, 2) for p in parts)


class Unbind(nn.Module):
    """``qkv.view(b, t, 3, heads, hd).unbind(2)`` (multi-head, no GQA)."""

    def __init__(self, h: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(h, 3 * h, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, h = x.shape
        parts = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).unbind(2)
        return tuple(p.transpose(1, 2) for p in parts)


@pytest.mark.parametrize("form,dtype", [("split", torch.float16), ("slice", torch.bfloat16),
                                        ("unbind", torch.float16)])
def test_qkv_parts_are_views_of_one_fused_gemm(form: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    m = (Unbind() if form == "unbind" else QKV(form)).to(dtype).eval()
    x = torch.randn(2, 8, 64, dtype=dtype)
    plans: list[GraphPlan] = []
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad():
        with launch_log() as log:
            out = c(x)
        ref = m(x)
        y64 = torch.nn.functional.linear(x.double(), m.qkv.weight.double(),
                                         None if m.qkv.bias is None else m.qkv.bias.double())
        want = (Unbind.forward if form == "unbind" else QKV.forward)(_Identity(m, y64), x)
    plan = GraphPlan.merge(plans)
    assert len(log) == 1 and len(plan.kernels) == 1, plan
    assert {f.reason for f in plan.fallbacks} == {_VIEW_REASON}, plan
    for o, r, w in zip(out, ref, want):
        assert o.shape == r.shape and o.stride() == r.stride() and o.dtype == r.dtype
        tol = 1e-2 * r.float().abs().max().item()
        assert (o.float() - r.float()).abs().max().item() <= tol
        assert (o.double() - w).abs().max().item() <= tol


class _Identity:
    """``m`` whose projection returns the float64 product ``y`` (the float64 reference)."""

    def __init__(self, m: nn.Module, y: torch.Tensor) -> None:
        self.__dict__.update({k: getattr(m, k) for k in ("heads", "form", "kv_heads", "hd") if hasattr(m, k)})
        self.qkv = lambda x: y
