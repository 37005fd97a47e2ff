"""The proxy-fence pass (``hexlayout.ir.passes.insert_proxy_fences``) finds nothing missing in
shipped sm_90a kernels that fence where they must themselves (``hl.fence_proxy_async`` after
their cp.async waits, the TMA store's own fence): their lowered programs, built with the pass
bypassed, come back from it unchanged, so their printed code is what it was before the pass
existed - no double fences."""

from __future__ import annotations

import pytest

import hexlayout.ir.passes as passes
import hexlayout.lang as hl
from hexlayout.ir.lowered import FenceProxyAsync
from hexlayout.synth.solve import synthesize


def _gemm():
    from hexlayout.ops.gemm.config import CONFIGS
    from hexlayout.ops.gemm.kernels import gemm_sm90_kernel

    return gemm_sm90_kernel(hl.bf16, "nk", stage_epilogue=True), CONFIGS["sm_90a"][0].consts(4096, 4096)


def _moe():
    from hexlayout.ops.moe import kernels_sm90 as k90

    return k90.moe_gate_up_sm90_kernel(hl.bf16, "gelu"), {**k90.sm90_consts(16), "TOPK": 8, "SCALE_IN": True}


def _paged_attention():
    from hexlayout.ops.attention.kernels_sm90 import paged_attention_sm90_kernel
    from hexlayout.ops.attention.paged import paged_attention_sm90_consts

    consts = paged_attention_sm90_consts(64, 16, 8, 1, True, False, False)
    return paged_attention_sm90_kernel(hl.f16, False), consts


def _fences(body) -> int:
    n = 0
    for i in body:
        n += isinstance(i, FenceProxyAsync)
        for sub in ("body", "then_body", "else_body"):
            n += _fences(getattr(i, sub, None) or [])
    return n


@pytest.mark.parametrize("make", [_gemm, _moe, _paged_attention],
                         ids=["gemm", "moe_gate_up_bm16", "paged_attention"])
def test_shipped_sm90_kernels_need_no_inserted_fence(monkeypatch: pytest.MonkeyPatch, make) -> None:
    kernel, consts = make()
    real = passes.insert_proxy_fences
    monkeypatch.setattr(passes, "insert_proxy_fences", lambda k: k)
    lowered = synthesize(kernel.trace(**consts), "sm_90a").lowered.kernel
    assert _fences(lowered.body) >= 1                    # the kernel's own fences
    assert real(lowered) is lowered                      # none missing, none added
