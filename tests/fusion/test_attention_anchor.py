"""``scaled_dot_product_attention`` as a fusion anchor (the FlashAttention example kernel):
causal and not, vs eager within 1e-2 of max|eager| (f16, emulator, small shapes); its
output's transpose / reshape back to ``[B, S, H*D]`` are host views of the stored output;
attention the kernel cannot compute is left to torch with the reason."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hexlayout.fusion.explain import explain  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402

SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


def _merge_heads(causal: bool, scale: float | None = None):  # noqa: ANN202
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, t, d = q.shape
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return a.transpose(1, 2).reshape(b, t, h * d)
    return f


@pytest.mark.parametrize("causal,scale", [(False, None), (True, None), (True, 0.3)])
def test_sdpa_is_one_kernel_with_its_views(causal: bool, scale: float | None) -> None:
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 20, 16, dtype=torch.float16) for _ in range(3))
    f = _merge_heads(causal, scale)
    plan = explain(f, q, k, v)
    assert [k_.anchor for k_ in plan.kernels] == [SDPA] and plan.fallbacks == [], plan
    assert plan.kernels[0].prologue == [] and "aten.transpose.int" in plan.kernels[0].epilogue
    torch._dynamo.reset()
    c = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})
    with launch_log() as log:
        out = c(q, k, v)
    want = f(q, k, v)
    assert out.shape == want.shape == (2, 20, 64) and out.dtype == want.dtype
    err, top = (out.float() - want.float()).abs().max().item(), want.float().abs().max().item()
    assert err <= 1e-2 * top, (err, top)
    # against float64 too: softmax(q k^T * scale [+ mask]) v
    q64, k64, v64 = (t.double() for t in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) * (scale if scale is not None else 16 ** -0.5)
    if causal:
        s = s.masked_fill(torch.ones(20, 20, dtype=torch.bool).triu(1), float("-inf"))
    ref = (s.softmax(-1) @ v64).transpose(1, 2).reshape(2, 20, 64)
    assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    assert [r.anchor for r in log] == [SDPA] and log[0].prologue == ()


def test_attention_the_kernel_cannot_compute_goes_to_torch_with_reason() -> None:
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.bfloat16) for _ in range(3))
    plan = explain(_merge_heads(False), q, k, v)
    assert plan.kernels == [] and "f16" in {f.op: f.reason for f in plan.fallbacks}[SDPA], plan
    torch._dynamo.reset()
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16)
    k, v = (torch.randn(1, 2, 12, 16, dtype=torch.float16) for _ in range(2))
    plan = explain(_merge_heads(True), q, k, v)          # causal with 8 queries over 12 keys
    assert plan.kernels == [] and "causal" in {f.op: f.reason for f in plan.fallbacks}[SDPA], plan
