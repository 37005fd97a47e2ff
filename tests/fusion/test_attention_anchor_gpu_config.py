"""The attention anchor (``ops/attention/sdpa_anchor.py``) at the configuration a GPU runs, in
the emulator: the anchor's own chooser (``sdpa_consts``, as the attention record's planner
``ops/attention/sdpa_fusion.py`` calls it) asked for ``emulated=False`` - 64 x 64 tiles over
4 warps at head dim 64, not the emulator's one-warp 16 x 16 - through
``torch.compile(backend="hexlayout")`` on fresh random data, against float64 (within 1e-2 of
max |reference|): f16 and bf16, causal (top-left, also with fewer queries than keys) and not,
grouped-query heads, sequence lengths that are not multiples of the 64-row tiles. The anchor's
output reaches the kernel NaN-filled (the CPU's ``hexlayout.runtime.alloc.fresh``), so every
position the result holds was written."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import hexlayout.ops  # noqa: E402,F401 - registers the anchors
from hexlayout.ops.attention import sdpa_fusion  # noqa: E402
from hexlayout.ops.attention.sdpa_anchor import sdpa_consts  # noqa: E402

emulate_mod = importlib.import_module("hexlayout.runtime.emulate")

D = 64


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


@pytest.fixture
def gpu_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The attention planner with its chooser asked for the GPU configuration
    (``emulated=False``) whatever the device; restored afterwards. Yields the real chooser."""

    def on_gpu(sq: int, sk: int, d: int, causal: bool, emulated: bool) -> dict[str, Any]:
        return sdpa_consts(sq, sk, d, causal, False)

    monkeypatch.setattr(sdpa_fusion, "sdpa_consts", on_gpu)
    yield sdpa_consts
    torch._dynamo.reset()


def _ref64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) [causal: top-left, key j <= query i]) v in float64."""
    q64, k64, v64 = (t.double() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k64, v64 = k64.repeat_interleave(rep, 1), v64.repeat_interleave(rep, 1)
    s = q64 @ k64.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).tril().logical_not(), float("-inf"))
    return s.softmax(-1) @ v64


@pytest.mark.parametrize(
    ("causal", "dtype", "b", "h", "kvh", "sq", "sk"),
    [
        (False, torch.float16, 2, 2, 2, 100, 100),   # 100 rows: one full 64-row tile and a partial one
        (True, torch.bfloat16, 1, 4, 2, 100, 100),   # grouped-query heads
        (True, torch.float16, 1, 2, 1, 40, 130),     # fewer queries than keys; 130 keys: 3 key blocks
        (False, torch.bfloat16, 1, 2, 2, 70, 33),    # fewer keys than one key block
    ],
)
def test_gpu_config_in_the_emulator_matches_float64(
    gpu_config: Any, monkeypatch: pytest.MonkeyPatch, causal: bool, dtype: torch.dtype, b: int, h: int,
    kvh: int, sq: int, sk: int,
) -> None:
    runs: list[tuple[dict[str, Any], bool]] = []
    real_emulate = emulate_mod.emulate

    def spy(bld: Any, *args: Any, **kwargs: Any) -> Any:
        o = args[3]                                     # q, k, v, o, qk_scale
        runs.append((dict(bld.tile_kernel.consts), bool(o.isnan().all())))
        return real_emulate(bld, *args, **kwargs)

    monkeypatch.setattr(emulate_mod, "emulate", spy)
    g = torch.Generator().manual_seed(sq * 7 + sk + h)
    q = torch.randn(b, h, sq, D, generator=g).to(dtype)
    k, v = (torch.randn(b, kvh, sk, D, generator=g).to(dtype) for _ in range(2))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kvh != h)

    out = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})(q, k, v)

    want = gpu_config(sq, sk, D, causal, False)        # what a GPU would launch
    assert want != gpu_config(sq, sk, D, causal, True)  # ... which is not the emulator's
    assert len(runs) == 1, runs                               # the anchor ran, once, in the emulator
    consts, arrived_nan = runs[0]
    assert {c: consts[c] for c in want} == want, consts
    assert arrived_nan                                        # its output reached it NaN-filled
    assert sq % want["BM"] and out.shape == (b, h, sq, D) and out.dtype == dtype
    assert torch.isfinite(out).all()
    ref = _ref64(q, k, v, causal)
    err, top = (out.double() - ref).abs().max().item(), ref.abs().max().item()
    assert err <= 1e-2 * top, (err, top)
