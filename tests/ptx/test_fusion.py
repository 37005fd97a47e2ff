"""Fusion anchors under ``HEXLAYOUT_EMULATE=ptx``: graphs compiled with the ``hexlayout``
torch.compile backend run every fused kernel from the PTX of its printed source (a GEMM
with a prologue and an epilogue, a row reduction, the SDPA anchor), against float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hexlayout.runtime.launch_log import launch_log

from .test_ops import ptx_runs  # noqa: F401  (fixture)

F = torch.nn.functional


def _compiled(f):  # noqa: ANN001, ANN202
    torch._dynamo.reset()
    return torch.compile(f, backend="hexlayout", options={"fallback": "eager"})


class Block(nn.Module):
    """RMSNorm -> linear -> exact GELU + residual: one GEMM, the norm its A prologue (its
    row reduction in the A load), GELU and the residual its epilogue."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(64))
        self.up = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.w
        return x + F.gelu(self.up(h))


def test_block_of_gemms_and_a_row_reduction(ptx_runs: list[str]) -> None:  # noqa: F811
    torch.manual_seed(2)
    m = Block().half()
    x = torch.randn(2, 9, 64, dtype=torch.float16)
    with torch.no_grad(), launch_log() as log:
        out = _compiled(m)(x)
        m64 = Block().double()
        m64.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
        want = m64(x.double())
    anchors = [r.anchor for r in log]
    assert anchors == ["aten.linear.default"], anchors      # the norm: the GEMM's A prologue (K = 64)
    assert "aten.mean.dim" in log[0].prologue and "aten.gelu.default" in log[0].epilogue
    assert len(ptx_runs) == len(log)                 # every launch ran in the PTX executor
    assert (out.double() - want).abs().max().item() <= 2e-2 * want.abs().max().item()


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_anchor_head_dim_64(ptx_runs: list[str], causal: bool) -> None:  # noqa: F811
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 37, 64, generator=g).half() for _ in range(3))
    with launch_log() as log:
        out = _compiled(f)(q, k, v)
    s = q.double() @ k.double().transpose(-1, -2) / 8
    if causal:
        s = s.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
    want = s.softmax(-1) @ v.double()
    assert [r.anchor for r in log] == ["aten._scaled_dot_product_flash_attention_for_cpu.default"]
    assert len(ptx_runs) == 1
    assert (out.double() - want).abs().max().item() <= 1e-2 * want.abs().max().item()
