"""The cost model evaluates per-thread addresses at stand-in values (sizes 4096, indices and
scalar arguments 0); an address divided by a scalar argument (``x[pos // g]``) has a zero
divisor there: it is evaluated again with every variable at 1, never a numpy ``RuntimeWarning``
("divide by zero") on the first build, and the kernel still computes the right thing."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.ir.expr import Var
from hexlayout.lang import f32, i32
from hexlayout.runtime import build, clear_builds, emulate
from hexlayout.synth.cost import _addresses

N, M = hl.dims("N M")


@hl.kernel(threads=128)
def grouped_rows(x: f32[N], y: f32[M], g: i32):
    pos = hl.iota((128,), 0)
    r = hl.register(f32, (128,))
    hl.copy(x[pos // g], r)          # each group of g rows reads one element of x
    hl.copy(r, y[0:128])


def test_a_fresh_build_emits_no_runtime_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path / "cache"))      # nothing cached: synthesized
    clear_builds()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        b = build(grouped_rows, "sm_80", compile=False)
    assert b.seconds.get("synthesize", 0) > 0
    rng = np.random.default_rng(5)
    for g in (1, 3, 7):
        x = rng.standard_normal(128).astype(np.float32)
        y = np.full(128, np.nan, np.float32)
        emulate(b, x, y, g)
        np.testing.assert_array_equal(y, x[np.arange(128) // g])


@pytest.mark.parametrize("op", ["//", "%"])
def test_an_address_with_a_zero_divisor_is_costed_at_one(op: str) -> None:
    tid, g = Var("threadIdx.x", 0, 128, kind="thread"), Var("g", None, None, kind="scalar")
    tids = np.arange(32, dtype=np.int64)
    e = tid // g * 4 if op == "//" else tid % g * 4
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        addr = _addresses(e, tid, tids)
    np.testing.assert_array_equal(addr, tids // 1 * 4 if op == "//" else tids % 1 * 4)


def test_the_paged_attention_kernel_builds_without_runtime_warning() -> None:
    """The serving kernel that printed it: paged attention's query rows are (token, head of the
    GQA group) = (row // G, row % G), G a scalar argument."""
    from hexlayout.ops.attention.paged_kernels_sm80 import paged_attention_kernel

    from hexlayout.synth.solve import synthesize

    consts = {"BLOCK": 16, "BM": 64, "BN": 32, "CAUSAL": True, "HEAD_DIM": 64, "SOFTCAP": False, "TILES": 1,
              "WARPS": 4, "WINDOW": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        syn = synthesize(paged_attention_kernel(hl.f16).trace(**consts), "sm_80")
    assert syn.cost.bank_conflicts == 0
