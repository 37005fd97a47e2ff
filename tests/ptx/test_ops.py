"""Serving ops under ``HEXLAYOUT_EMULATE=ptx``: their kernels' PTX runs in the executor (each
launch counted) and the results match float64 / exact references."""

from __future__ import annotations

import pytest
import torch

import hexlayout.ptx.execute as X
from tests.ops.test_kv_cache import _caches, _reference
from tests.ops.test_paged_attention_op import _check, make_case, reference


@pytest.fixture
def ptx_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``HEXLAYOUT_EMULATE=ptx``, and the kernels the PTX executor ran."""
    runs: list[str] = []
    real = X.run_ptx

    def counting(*args, **kw):
        runs.append(kw.get("kernel", ""))
        return real(*args, **kw)

    monkeypatch.setattr(X, "run_ptx", counting)
    monkeypatch.setattr("hexlayout.ptx.run_ptx", counting)
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "ptx")
    return runs


def test_reshape_and_cache_hnd_halves(ptx_runs: list[str]) -> None:
    from hexlayout.ops.kv_cache import reshape_and_cache

    g = torch.Generator().manual_seed(1)
    t, kvh, nb, bs, d = 21, 2, 4, 16, 64
    qkv = torch.randn(t, 4 * kvh, d, generator=g).bfloat16()
    key, value = qkv[:, 2 * kvh: 3 * kvh], qkv[:, 3 * kvh:]
    slots = torch.randperm(nb * bs, generator=g)[:t]
    slots[[0, 7]] = -1
    kc, vc = _caches("HND", nb, bs, kvh, d, torch.bfloat16)
    want_k, want_v = _reference(kc, key, slots, "HND"), _reference(vc, value, slots, "HND")
    reshape_and_cache(key, value, kc, vc, slots, kv_layout="HND")
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert ptx_runs and all(r.startswith("reshape_and_cache") for r in ptx_runs)


def test_paged_attention_gqa_causal(ptx_runs: list[str]) -> None:
    from hexlayout.ops.attention import paged_attention

    a = make_case(11, [1, 3], [9, 20], 2, 1, 64, 16, "NHD", torch.float16)
    out, lse = paged_attention(**a, return_lse=True)
    _check(out, lse, reference(a), a["q"].shape[0], 2e-3)
    assert ptx_runs
